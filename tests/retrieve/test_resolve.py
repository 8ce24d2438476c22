"""Resolve: normalised identifiers, contact vs company, merges, tombstones, aliases."""

from __future__ import annotations

import dossier

from .conftest import all_ids, ids
from .faults import FaultyStore, always

JANE_ALIASES = {"rec-acme", "rec-raj", "rec-li", "rec-stub-mark"}


def ask(engine: dossier.Engine, record: dict, message: str = "what did we discuss?", **extra) -> dossier.RetrieveResponse:  # type: ignore[no-untyped-def]
    return engine.retrieve({"mode": "brief", "record": record, "message": message, **extra}, org="northwind", caller="ana")


def test_identifiers_are_normalised_before_lookup(sample_engine: dossier.Engine) -> None:
    for record in ({"email": "  JANE@Acme.COM"}, {"phone": "+1 (415) 555-0100"}, {"profile_url": "linkedin.com/in/jane-doe/"},
                   {"id": "rec-jane"}):  # fmt: skip
        response = ask(sample_engine, record)
        assert response.record is not None and response.record.id == "rec-jane", record
        assert response.record.kind == "contact"


def test_a_website_resolves_to_the_company(sample_engine: dossier.Engine) -> None:
    response = ask(sample_engine, {"website": "https://acme.com/pricing?x=1"})
    assert response.record is not None and (response.record.id, response.record.kind) == ("rec-acme", "company")
    assert {"rec-jane", "rec-raj", "rec-li"} <= set(response.record.aliases)


def test_merged_record_resolves_to_the_survivor_with_its_memories(sample_engine: dossier.Engine) -> None:
    response = ask(sample_engine, {"email": "jane.doe@acme.com"}, "What did Jane originally sign up for as a lead?")
    assert response.record is not None and response.record.id == "rec-jane"
    assert response.record.merged_from == ["rec-jane-old"]
    # the merged-away record's memories are searched with the survivor's
    assert any(m.record_id == "rec-jane-old" for m in response.sources["memories"].items)


def test_pending_deletion_is_a_bare_tombstone(sample_engine: dossier.Engine) -> None:
    response = ask(sample_engine, {"email": "george@vandelay.com"}, "What did George ask for?")
    assert response.record is not None
    assert response.record.model_dump() == {"id": "rec-george", "kind": "contact", "aliases": [], "merged_from": [], "tombstone": True}
    for source in ("properties", "memories", "graph"):
        assert response.sources[source].items == [] and response.sources[source].status == "skipped"
    returned = all_ids(response)
    assert not any(i.startswith("doc-note-george") for i in returned)
    assert not {f"mem-{n:04d}" for n in range(158, 164)} & returned


def test_same_domain_aliases_are_capped(fresh_engine: dossier.Engine) -> None:
    fresh_engine.org_settings["northwind"] = fresh_engine.settings.replace(max_aliases=2)
    response = ask(fresh_engine, {"email": "jane@acme.com"})
    assert response.record is not None and len(response.record.aliases) == 2
    assert set(response.record.aliases) <= JANE_ALIASES


def test_failed_alias_lookup_is_reported_not_fatal(fresh_engine: dossier.Engine) -> None:
    fresh_engine.store = FaultyStore(fresh_engine.store, {"records_by_domain": always})  # type: ignore[assignment]
    response = ask(fresh_engine, {"email": "jane@acme.com"})
    assert response.record is not None and response.record.id == "rec-jane" and response.record.aliases == []
    assert response.route["resolve"].fallback_reason == "alias_error"
    assert response.route["resolve"].detail["alias_error"] == "InjectedFault"  # the class, never the message
    assert response.partial is True
    assert ids(response, "memories"), "memories of the record itself still come back"


def test_unknown_record_returns_no_record_sources(sample_engine: dossier.Engine) -> None:
    response = ask(sample_engine, {"email": "nobody@nowhere.org"})
    assert response.record is None
    assert response.sources["memories"].status == "skipped"
    assert response.route["resolve"].detail["not_found"]
