"""Budget: UTF-8 bytes, default shares, empty sources' shares redistributed, cut items marked."""

from __future__ import annotations

import dossier
from dossier.layers.budget import packed_text, size

JANE = {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "What pricing did we discuss?"}


def ask(engine: dossier.Engine, **extra) -> dossier.RetrieveResponse:  # type: ignore[no-untyped-def]
    return engine.retrieve({**JANE, **extra}, org="northwind", caller="ana")


def test_default_shares_over_active_sources(sample_engine: dossier.Engine) -> None:
    response = ask(sample_engine, budget={"totalTokens": 10_000})
    share = response.budget.share
    # external is off, so its 20% is spread over the other four in proportion
    assert share["external"] == 0
    assert share == {"properties": 1250, "memories": 4375, "documents": 3750, "graph": 625, "external": 0}


def test_shares_of_empty_sources_go_to_the_others(sample_engine: dossier.Engine) -> None:
    response = ask(sample_engine, budget={"totalTokens": 10_000}, sources={"graph": False, "properties": False})
    assert response.budget.share["graph"] == 0 and response.budget.share["properties"] == 0
    assert response.budget.share["memories"] + response.budget.share["documents"] >= 9_998


def test_caller_shares_override_defaults(sample_engine: dossier.Engine) -> None:
    response = ask(sample_engine, budget={"totalTokens": 10_000, "shares": {"documents": 0.9, "memories": 0.1}})
    assert response.budget.share["documents"] > response.budget.share["memories"]


def test_utf8_bytes_not_characters(sample_engine: dossier.Engine) -> None:
    response = ask(sample_engine, mode="scout", record={"website": "globex.com"}, message="EUR price list and VAT")
    for result in response.sources.values():
        assert result.bytes_used == sum(len(packed_text(i).encode("utf-8")) + 1 for i in result.items)
    text = "".join(packed_text(i) for r in response.sources.values() for i in r.items)
    assert "€" in text or "£" in text  # multi-byte characters are present, and counted as bytes above


def test_a_cut_item_is_marked_truncated_and_fits(sample_engine: dossier.Engine) -> None:
    response = ask(sample_engine, budget={"totalTokens": 300}, sources={"memories": False, "graph": False, "properties": False})
    items = response.sources["documents"].items
    assert items, "a section is cut to fit rather than dropped"
    cut = [i for i in items if i.truncated]
    assert cut and all(i.text.endswith("…") for i in cut)
    assert response.sources["documents"].bytes_used <= 300
    full = sample_engine.store.get_documents([cut[0].document_id], org="northwind")[0]
    original = next(s.text for s in full.sections if s.id == cut[0].section_id)
    assert len(cut[0].text) < len(original)


def test_tiny_budget_drops_and_counts(sample_engine: dossier.Engine) -> None:
    response = ask(sample_engine, budget={"totalTokens": 1})
    assert sum(response.budget.used.values()) == 0
    assert sum(response.budget.dropped.values()) > 0
    assert all(r.status in ("ok", "skipped") for r in response.sources.values())


def test_leftover_bytes_go_to_sources_still_waiting(sample_engine: dossier.Engine) -> None:
    response = ask(sample_engine, budget={"totalTokens": 4000})
    graph = response.sources["graph"]
    # graph's own share is 5% (~250 B) but documents left bytes unused: graph packs beyond its share
    assert response.budget.used["documents"] < response.budget.share["documents"]
    assert graph.bytes_used > response.budget.share["graph"]
    assert sum(response.budget.used.values()) <= 4000
    assert all(size(i) > 0 for r in response.sources.values() for i in r.items)


def test_every_source_keeps_its_order_whatever_the_budget(sample_engine: dossier.Engine) -> None:
    """A pass skips an item that does not fit to pack a smaller one after it, and a later pass adds what an
    earlier one left: the items still come out in the source's own order (best first, nearest edges first),
    each source's packed items an ordered subset of what the full budget returns."""
    full = ask(sample_engine, budget={"totalTokens": 50_000})
    order = {s: [i.model_dump_json(exclude={"text", "truncated"}) for i in full.sources[s].items] for s in full.sources}
    checked = 0
    for total in range(150, 6000, 97):
        response = ask(sample_engine, budget={"totalTokens": total})
        for source, result in response.sources.items():
            keys = [i.model_dump_json(exclude={"text", "truncated"}) for i in result.items]
            positions = [order[source].index(k) for k in keys if k in order[source]]
            assert positions == sorted(positions), (total, source, positions)
            checked += len(positions) > 1
    assert checked > 20
