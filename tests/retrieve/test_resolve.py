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


def test_an_identifier_naming_several_live_records_says_which_others(fresh_engine: dossier.Engine) -> None:
    """Two live contacts share an email: the call is about the first by id, and the route names the other.
    One merged into the first, one pending deletion and a company sharing the address are no other."""
    def contact(rid: str, **fields: object) -> dict:
        return {"id": rid, "org": "northwind", "kind": "contact", "identifiers": {"email": "desk@acme.com"}, **fields}

    fresh_engine.load_bundle({"records": [
        contact("rec-desk-b"), contact("rec-desk-a"), contact("rec-desk-old", merged_into="rec-desk-a"),
        contact("rec-desk-gone", pending_deletion=True), contact("rec-desk-co", kind="company"),
    ]})  # fmt: skip
    response = ask(fresh_engine, {"email": "Desk@Acme.com"})
    assert response.record is not None and response.record.id == "rec-desk-a"
    assert response.route["resolve"].detail["ambiguous"] == ["rec-desk-b"]
    assert response.partial is False  # said, not a failure


def test_an_identifier_whose_matches_are_one_record_is_not_ambiguous(sample_engine: dossier.Engine) -> None:
    for record in ({"email": "jane@acme.com"}, {"email": "jane.doe@acme.com"}, {"website": "acme.com"}):
        assert "ambiguous" not in ask(sample_engine, record).route["resolve"].detail, record


def test_people_who_share_a_mail_provider_are_not_aliases_until_a_company_has_the_domain(fresh_engine: dossier.Engine) -> None:
    people = [
        {"id": "rec-alice-sm", "org": "northwind", "kind": "contact", "identifiers": {"email": "alice@smallmail.net"}},
        {"id": "rec-bob-sm", "org": "northwind", "kind": "contact", "identifiers": {"email": "bob@smallmail.net"}},
    ]
    said = {"id": "mem-bob-sm", "org": "northwind", "record": "rec-bob-sm", "text": "Bob disclosed his diagnosis.",
            "created_at": "2026-01-01T00:00:00Z"}  # fmt: skip
    note = {"id": "doc-note-bob-sm", "org": "northwind", "title": "Notes: Bob", "doc_type": "note",
            "attached_record": "rec-bob-sm",
            "sections": [{"id": "doc-note-bob-sm-s1", "heading": "Private", "text": "Bob's diagnosis and treatment plan."}]}  # fmt: skip
    fresh_engine.load_bundle({"records": people, "memories": [said], "documents": [note]})
    question = "What did the patient disclose about the diagnosis and treatment plan?"
    response = ask(fresh_engine, {"email": "alice@smallmail.net"}, question)
    assert response.record is not None and response.record.id == "rec-alice-sm" and response.record.aliases == []
    assert not {"mem-bob-sm", "doc-note-bob-sm-s1"} & all_ids(response)
    # a company of the org with that website makes the domain a company's: its people are aliases
    fresh_engine.load_bundle({"records": [{"id": "rec-smallmail", "org": "northwind", "kind": "company",
                                           "identifiers": {"website": "smallmail.net"}}]})  # fmt: skip
    response = ask(fresh_engine, {"email": "alice@smallmail.net"}, question)
    assert response.record is not None and {"rec-bob-sm", "rec-smallmail"} <= set(response.record.aliases)
    assert "mem-bob-sm" in all_ids(response)


def test_free_mail_and_shared_hosts_name_no_company() -> None:
    from dossier.identifiers import email_domain, normalize_website

    for email in ("a@hotmail.co.uk", "a@yahoo.co.uk", "a@qq.com", "a@mail.ru", "a@pm.me", "a@t-online.de"):
        assert email_domain(email) is None, email
    assert email_domain("jane@sales.acme.co.uk") == "acme.co.uk"
    assert normalize_website("https://acme.github.io/team") == "acme.github.io"
    assert normalize_website("https://blog.acme.com") == "acme.com"


def test_a_merged_away_record_pending_deletion_is_hidden_with_everything_merged_into_it(fresh_engine: dossier.Engine) -> None:
    def record(rid: str, email: str, **extra) -> dict:  # type: ignore[no-untyped-def, type-arg]
        return {"id": rid, "org": "northwind", "kind": "contact", "identifiers": {"email": email}, **extra}

    fresh_engine.load_bundle({
        "records": [record("rec-pd-s", "s@pd-example.com"),
                    record("rec-pd-p", "p@pd-example.com", merged_into="rec-pd-s", pending_deletion=True),
                    record("rec-pd-a", "a@pd-example.com", merged_into="rec-pd-p"),
                    record("rec-pd-b", "b@pd-example.com", merged_into="rec-pd-s")],
        "memories": [{"id": f"mem-pd-{r}", "org": "northwind", "record": f"rec-pd-{r}", "created_at": "2026-01-02T00:00:00Z",
                      "text": f"{r} asked about a pricing discount for the renewal."} for r in ("p", "a", "b")],
        "documents": [{"id": "doc-note-pd-p", "org": "northwind", "title": "Notes on P", "doc_type": "note",
                       "attached_record": "rec-pd-p",
                       "sections": [{"id": "doc-note-pd-p-1", "heading": "Pricing", "text": "P was offered 40% off."}]}],
    })  # fmt: skip
    question = "What pricing discount did they ask about?"
    survivor = ask(fresh_engine, {"email": "s@pd-example.com"}, question)
    assert survivor.record is not None and survivor.record.merged_from == ["rec-pd-b"]
    returned = all_ids(survivor)
    assert "mem-pd-b" in returned and not {"mem-pd-p", "mem-pd-a", "doc-note-pd-p-1"} & returned
    fetched = fresh_engine.retrieve({"fetch": ["doc-note-pd-p"], "record": {"id": "rec-pd-s"}}, org="northwind", caller="ana")
    assert not fetched.sources["documents"].items
    for email in ("p@pd-example.com", "a@pd-example.com"):  # the record pending deletion, or one merged into it
        response = ask(fresh_engine, {"email": email}, question)
        assert response.record is not None and response.record.tombstone and response.record.id == "rec-pd-p", email
        assert not {"mem-pd-p", "mem-pd-a", "mem-pd-b", "doc-note-pd-p-1"} & all_ids(response)
