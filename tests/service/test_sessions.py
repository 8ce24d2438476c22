"""Expand sessions (layer 10) through the Python API: pages, ownership, expiry, governance on every page."""

from __future__ import annotations

from typing import Any

import pytest

import dossier
from dossier.errors import InvalidRequest
from dossier.schema import item_key
from dossier.settings import ServiceSettings

from .conftest import BRIEF


def keys(response: dossier.RetrieveResponse) -> list[str]:
    return [f"{s}:{item_key(i)}" for s, r in response.sources.items() for i in r.items]


def pages(engine: dossier.Engine, first: dossier.RetrieveResponse, caller: str = "ana", **extra: Any) -> list[dossier.RetrieveResponse]:
    out, continuation = [], first.continuation
    while continuation:
        page = engine.retrieve({"continuation": continuation, "budget": {"totalTokens": 1500}, **extra},
                               org="northwind", caller=caller)  # fmt: skip
        out.append(page)
        continuation = page.continuation
        assert len(out) < 100
    return out


def test_expand_pages_through_everything_that_did_not_fit_exactly_once(sample: dossier.Engine) -> None:
    everything = sample.retrieve({**BRIEF, "budget": {"totalTokens": 50_000}}, org="northwind", caller="ana")
    assert everything.continuation is None and not any(everything.budget.dropped.values())
    first = sample.retrieve({**BRIEF, "budget": {"totalTokens": 1500}}, org="northwind", caller="ana")
    assert first.continuation and sum(first.budget.dropped.values()) > 0
    rest = pages(sample, first)
    assert rest and all(p.mode == "expand" and p.record == first.record for p in rest)
    seen = keys(first) + [k for p in rest for k in keys(p)]
    assert len(seen) == len(set(seen))  # nothing twice
    assert set(seen) == set(keys(everything))  # nothing lost
    assert rest[-1].continuation is None and rest[-1].route["session"].detail["page"] == len(rest) + 1
    with pytest.raises(InvalidRequest, match="unknown or has expired") as caught:  # used up: the session is gone
        sample.retrieve({"continuation": first.continuation}, org="northwind", caller="ana")
    assert caught.value.field == "continuation"


def test_a_session_belongs_to_its_org(sample: dossier.Engine) -> None:
    first = sample.retrieve({**BRIEF, "budget": {"totalTokens": 1500}}, org="northwind", caller="ana")
    with pytest.raises(InvalidRequest) as other_org:  # another org's continuation reads like an unknown one
        sample.retrieve({"continuation": first.continuation}, org="southwind", caller="zoe")
    with pytest.raises(InvalidRequest) as unknown:
        sample.retrieve({"continuation": "0" * len(first.continuation or "")}, org="southwind", caller="zoe")
    assert str(other_org.value).replace(first.continuation or "", "ID") == str(unknown.value).replace("0" * len(first.continuation or ""), "ID")
    page = sample.retrieve({"continuation": first.continuation, "budget": {"totalTokens": 300}}, org="northwind",
                           caller="ben")  # same org: fine  # fmt: skip
    assert page.mode == "expand" and page.continuation is not None
    # nothing of ana's call, nor how much waits in her session
    assert not {"opened_by", "page", "returned_before", "remaining"} & set(page.route["session"].detail)
    own = sample.retrieve({"continuation": page.continuation}, org="northwind", caller="ana")
    assert own.route["session"].detail["opened_by"] == first.call_id and own.route["session"].detail["page"] == 3
    assert own.continuation is None or own.route["session"].detail["remaining"] > 0


def test_a_session_expires_when_idle(sample: dossier.Engine) -> None:
    first = sample.retrieve({**BRIEF, "budget": {"totalTokens": 1500}}, org="northwind", caller="ana")
    sample.org_settings["northwind"] = sample.settings.replace(service=ServiceSettings(session_idle_seconds=0.0))
    with pytest.raises(InvalidRequest, match="unknown or has expired"):
        sample.retrieve({"continuation": first.continuation}, org="northwind", caller="ana")


def test_an_explicit_false_keeps_a_source_out_of_the_page_but_in_the_session(sample: dossier.Engine) -> None:
    first = sample.retrieve({**BRIEF, "budget": {"totalTokens": 1500}}, org="northwind", caller="ana")
    assert first.budget.dropped["memories"] > 0
    page = sample.retrieve({"continuation": first.continuation, "sources": {"memories": False}},
                           org="northwind", caller="ana")  # fmt: skip
    assert page.sources["memories"].items == []
    later = pages(sample, page)
    assert any(p.sources["memories"].items for p in later)


def test_every_page_is_governed_again(sample: dossier.Engine) -> None:
    first = sample.retrieve({**BRIEF, "budget": {"totalTokens": 1500}}, org="northwind", caller="ana")
    jane = sample.store.get_records(["rec-jane"], org="northwind")[0]
    sample.load_bundle({"records": [{**jane.model_dump(mode="json"), "pending_deletion": True}]})
    page = sample.retrieve({"continuation": first.continuation}, org="northwind", caller="ana")
    assert page.record is not None and page.record.tombstone
    assert not any(r.items for r in page.sources.values()) and page.continuation is None


def test_a_caller_with_fewer_roles_does_not_page_into_documents_it_may_not_see(sample: dossier.Engine) -> None:
    restricted = ["doc-commission", "doc-redlines"]  # finance, legal
    first = sample.retrieve({"fetch": [*restricted, "doc-pricing"], "budget": {"totalTokens": 800}},
                            org="northwind", caller="admin")  # fmt: skip
    assert first.continuation
    ana_pages = pages(sample, first, caller="ana")
    documents = {i.document_id for p in ana_pages for i in p.sources["documents"].items}
    assert documents and not documents & set(restricted)


def test_another_caller_paging_a_session_takes_nothing_of_the_openers_it_may_not_see(sample: dossier.Engine) -> None:
    fetch = {"fetch": ["doc-commission", "doc-pricing"], "budget": {"totalTokens": 1000}}  # commission: finance
    alone = sample.retrieve(fetch, org="northwind", caller="admin")
    shared = sample.retrieve(fetch, org="northwind", caller="admin")
    assert alone.continuation and shared.continuation and keys(alone) == keys(shared)
    everything = {k for p in pages(sample, alone, caller="admin") for k in keys(p)}
    hidden = {k for k in everything if k.startswith("documents:doc-commission-")}
    assert hidden and everything - hidden  # the premise: the opener's leftovers hold both kinds
    # ana pages the shared session with room for all: she gets what she may see, is told nothing of the rest
    page = sample.retrieve({"continuation": shared.continuation, "trace": True, "budget": {"totalTokens": 50_000}},
                           org="northwind", caller="ana")  # fmt: skip
    assert set(keys(page)) == everything - hidden
    assert page.continuation is None and not page.withheld
    assert not {"remaining", "opened_by", "page", "returned_before"} & set(page.route["session"].detail)
    # a second page for her reads exactly like an unknown continuation, though the opener's items wait
    with pytest.raises(InvalidRequest) as again:
        sample.retrieve({"continuation": shared.continuation}, org="northwind", caller="ana")
    with pytest.raises(InvalidRequest) as unknown:
        sample.retrieve({"continuation": "0" * len(shared.continuation)}, org="northwind", caller="ana")
    assert str(again.value).replace(shared.continuation, "ID") == str(unknown.value).replace("0" * len(shared.continuation), "ID")
    # the opener still gets every item ana was not given, once
    rest = pages(sample, shared, caller="admin")
    got = [k for p in rest for k in keys(p)]
    assert len(got) == len(set(got)) and set(got) == hidden
    assert rest[-1].continuation is None


def test_an_expand_call_without_a_continuation_says_it_is_missing(sample: dossier.Engine) -> None:
    with pytest.raises(InvalidRequest, match="continuation is missing") as caught:
        sample.retrieve({"mode": "expand"}, org="northwind", caller="ana")
    assert caught.value.field == "continuation"


def test_a_merged_away_record_marked_pending_deletion_after_the_first_page_is_not_paged_into(sample: dossier.Engine) -> None:
    first = sample.retrieve({**BRIEF, "budget": {"totalTokens": 600}}, org="northwind", caller="ana")
    assert first.continuation and first.record is not None and "rec-jane-old" in first.record.merged_from
    old = sample.store.get_records(["rec-jane-old"], org="northwind")[0]
    sample.load_bundle({"records": [{**old.model_dump(mode="json"), "pending_deletion": True}]})
    rest = pages(sample, first, budget={"totalTokens": 50_000})
    # the page's record no longer counts it, so governance judges its items as another record's
    assert rest and all(p.record is not None and "rec-jane-old" not in p.record.merged_from for p in rest)


def test_leaving_sources_out_does_not_tell_another_caller_that_hidden_items_wait(sample: dossier.Engine) -> None:
    fetch = {"fetch": ["doc-commission", "doc-pricing"], "budget": {"totalTokens": 1000}}  # commission: finance
    first = sample.retrieve(fetch, org="northwind", caller="admin")
    assert first.continuation
    page = sample.retrieve({"continuation": first.continuation, "budget": {"totalTokens": 50_000}}, org="northwind",
                           caller="ana")  # everything she may see  # fmt: skip
    assert page.continuation is None
    probes = [{"continuation": first.continuation, "sources": {"documents": False}}, {"continuation": first.continuation}]
    for probe in probes:  # the opener's hidden sections wait; to her the id reads as unknown, whatever she asks
        with pytest.raises(InvalidRequest, match="unknown or has expired"):
            sample.retrieve(probe, org="northwind", caller="ana")
    rest = pages(sample, first, caller="admin")
    assert {i.document_id for p in rest for i in p.sources["documents"].items} == {"doc-commission"}


def test_an_item_no_page_can_hold_ends_paging_and_a_page_too_small_says_what_it_needs(sample: dossier.Engine) -> None:
    """A property of eight long list entries is larger than the largest budget and has no text to cut: it
    used to stay in the session for ever (every page empty, the same continuation), so a caller paging while
    there is a continuation never stopped. It is dropped and counted; and a page whose budget fits nothing
    that waits says the budget the next item needs."""
    notes = [f"note {n}: " + "x" * 9_000 for n in range(8)]
    sample.load_bundle({"records": [{"id": "rec-big", "org": "northwind", "kind": "contact",
                                     "identifiers": {"email": "big@bigcorp.example"},
                                     "properties": {"name": "Big", "notes": notes}}]})  # fmt: skip
    ask = {"mode": "brief", "record": {"email": "big@bigcorp.example"}, "message": "What do we know about Big?",
           "sources": {"properties": True, "memories": False, "documents": False, "graph": False}}  # fmt: skip
    first = sample.retrieve({**ask, "budget": {"totalTokens": 50_000}}, org="northwind", caller="ana")
    assert [i.name for i in first.sources["properties"].items] == ["name"] and first.budget.dropped["properties"] == 1
    assert first.continuation is None and first.route["session"].detail["unpackable"] == 1
    small = sample.retrieve({**BRIEF, "budget": {"totalTokens": 400}}, org="northwind", caller="ana")
    assert small.continuation
    page = sample.retrieve({"continuation": small.continuation, "budget": {"totalTokens": 1}}, org="northwind", caller="ana")
    assert not any(r.items for r in page.sources.values()) and page.continuation == small.continuation
    needs = page.route["session"].detail["needs_budget"]
    assert needs > 1
    bigger = sample.retrieve({"continuation": small.continuation, "budget": {"totalTokens": needs}}, org="northwind", caller="ana")
    assert any(r.items for r in bigger.sources.values())  # that budget makes progress


def test_later_pages_serve_what_the_waiting_items_are_now(sample: dossier.Engine) -> None:
    """A memory rewritten after the first page comes as it is now; one moved to another record since is that
    record's and not paged into this call; a document's section comes with its current text."""
    store = sample.store
    first = sample.retrieve({**BRIEF, "budget": {"totalTokens": 1200}}, org="northwind", caller="ana")
    assert first.continuation
    shown = {i.id for i in first.sources["memories"].items}
    jane = [m for m in store.get_memories([f"mem-{n:04d}" for n in range(1, 400)], org="northwind") if m.record == "rec-jane"]
    waiting = [m for m in jane if m.id not in shown]
    assert len(waiting) >= 2
    moved, kept = waiting[0], waiting[1:]
    sample.load_bundle({"memories": [
        {**moved.model_dump(mode="json"), "record": "rec-marta"},
        *[{**m.model_dump(mode="json"), "text": m.text + " (edited)"} for m in kept],
    ]})  # fmt: skip
    later = pages(sample, first)
    memories = [i for p in later for i in p.sources["memories"].items]
    assert memories and moved.id not in {i.id for i in memories}
    edited = {m.id for m in kept}
    rewritten = [i for i in memories if i.id in edited]
    assert rewritten and all(i.text.endswith("(edited)") or i.truncated for i in rewritten)
    assert all(i.record_id != "rec-marta" for i in memories)


def test_the_budget_a_page_says_it_needs_packs_the_item_and_one_byte_less_does_not() -> None:
    from dossier.layers.budget import _cut, size
    from dossier.layers.session import _needs
    from dossier.schema import PropertyItem, SectionItem

    section = SectionItem(document_id="d", section_id="s", title="T" * 120, heading="H" * 80, text="x" * 2_000)
    prop = PropertyItem(record_id="rec-big", name="notes", value=["y" * 900])
    for item in (section, prop):
        needs = _needs(item.model_dump(mode="json"))
        fits = size(item) <= needs or _cut(item, needs) is not None
        assert fits, item.kind
        assert size(item) > needs - 1 and _cut(item, needs - 1) is None  # nothing less packs it


def test_an_edge_deactivated_after_the_first_page_is_not_paged_into(sample: dossier.Engine) -> None:
    """Later pages walk the graph again as the first call did: an edge set inactive since is not served."""
    import json as json_
    from pathlib import Path

    ask = {**BRIEF, "sources": {"graph": True, "memories": False, "documents": False, "properties": False},
           "budget": {"totalTokens": 200}}  # fmt: skip
    first = sample.retrieve(ask, org="northwind", caller="ana")
    assert first.continuation
    shown = {i.id for i in first.sources["graph"].items}
    full = sample.retrieve({**ask, "budget": {"totalTokens": 50_000}}, org="northwind", caller="ana")
    waiting = [i.id for i in full.sources["graph"].items if i.id not in shown]
    assert len(waiting) >= 2
    edges = json_.loads((Path(__file__).resolve().parents[2] / "examples" / "sample-org.json").read_text())["edges"]
    gone = next(e for e in edges if e["id"] == waiting[0])
    sample.load_bundle({"edges": [{**gone, "active": False}]})
    later = [i.id for p in pages(sample, first, sources={"graph": True}) for i in p.sources["graph"].items]
    assert gone["id"] not in later and set(waiting[1:]) <= set(later)
