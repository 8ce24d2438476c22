"""Records hidden by a deletion, on both stores: a record pending deletion and every record merged into it
(directly or not) are hidden with it. No read reaches through them and no write reaches them: a caller's
answers are the same as in a copy of the org that never held them, but for what the caller names itself.

Each question is asked as a caller of the org in two stores, one holding the hidden records, one without
them, and the responses must be identical (the call's id and timings aside).
"""

from __future__ import annotations

import copy
from typing import Any, Iterator

import pytest

import dossier
from dossier.errors import Forbidden
from dossier.service import Principal, Service

LOW, ADMIN = Principal(org="acme", caller="low"), Principal(org="acme", caller="admin")
EMAIL = "ann@acme-rockets.com"


def _record(rid: str, **fields: Any) -> dict[str, Any]:
    return {"id": rid, "org": "acme", "kind": "contact", **fields}


def _edge(eid: str, src: str, dst: str) -> dict[str, Any]:
    return {"id": eid, "org": "acme", "src": src, "dst": dst, "type": "knows"}


PLAIN: dict[str, Any] = {
    "orgs": [{"id": "acme", "name": "Acme"}],
    "callers": [{"id": "low", "org": "acme", "roles": ["sales"]}, {"id": "admin", "org": "acme", "roles": ["admin"]}],
    "records": [
        _record("rec-a", identifiers={"email": EMAIL, "phone": "+1 415 555 0101"}, properties={"name": "Ann"}),
        _record("rec-b", properties={"name": "Bo"}),
        _record("rec-c", properties={"name": "Cy"}),
        {"id": "rec-v", "org": "acme", "kind": "company", "identifiers": {"website": "vendor.com"},
         "properties": {"industry": "Aerospace rockets and satellite launch services"}},
    ],
    "memories": [{"id": "m-a", "org": "acme", "record": "rec-a", "text": "Ann asked about launch pricing.",
                  "created_at": "2026-01-05T10:00:00Z"}],
    "edges": [_edge("e-ab", "rec-a", "rec-b")],
}
# rec-0del sorts before rec-a and shares her email and phone; rec-mm and twelve more are merged into it
HIDDEN: dict[str, Any] = {
    "records": [
        _record("rec-0del", pending_deletion=True, identifiers={"email": EMAIL, "phone": "+1 415 555 0101"}),
        _record("rec-mm", merged_into="rec-0del", properties={"name": "Mo"}),
        *[{"id": f"rec-h{n}", "org": "acme", "kind": "company", "merged_into": "rec-0del",
           "properties": {"industry": f"Aerospace rockets launch {n}"}} for n in range(12)],
    ],
    "memories": [{"id": "m-mm", "org": "acme", "record": "rec-mm", "text": "Mo said the board approved the layoffs.",
                  "created_at": "2026-01-06T10:00:00Z"}],
    "edges": [_edge("e-c-mm", "rec-c", "rec-mm"), _edge("e-mm-a", "rec-mm", "rec-a")],
}
QUESTIONS = [
    {"mode": "brief", "record": {"id": "rec-c"}, "message": "Who is Cy connected to?", "trace": True},
    {"mode": "brief", "record": {"email": EMAIL}, "message": "What did Ann ask about?", "trace": True},
    {"mode": "brief", "record": {"phone": "+1 415 555 0101"}, "message": "What did she ask?", "trace": True},
    {"mode": "scout", "message": "Aerospace rockets", "sources": {"properties": True}, "trace": True},
]


def _in(org: str, bundle: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(bundle)
    for items in out.values():
        for item in items:
            item["org" if "org" in item else "id"] = org  # an org's own id, or an item's org
    return out


@pytest.fixture
def engine(store_url: str, embedder: Any) -> Iterator[dossier.Engine]:
    """Org ``acme`` with the hidden records, and its twin ``twin`` without them, in one store."""
    with dossier.open(store_url, embedder=embedder) as engine:
        both = copy.deepcopy(PLAIN)
        for name, items in HIDDEN.items():
            both[name] = [*both[name], *copy.deepcopy(items)]
        engine.load_bundle(both)
        engine.load_bundle(_in("twin", PLAIN))
        yield engine


def _comparable(value: Any) -> Any:
    if isinstance(value, dict):
        timings = ("call_id", "layers")  # route.deadline.detail.layers: milliseconds per layer
        return {k: _comparable(v) for k, v in value.items() if k not in timings and not k.endswith("_ms")}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


@pytest.mark.parametrize("question", QUESTIONS, ids=["graph", "email", "phone", "properties"])
def test_a_caller_reads_the_same_as_in_an_org_that_never_held_the_hidden_records(
    engine: dossier.Engine, question: dict[str, Any]
) -> None:
    answers = [_comparable(engine.retrieve(copy.deepcopy(question), org=org, caller="low").model_dump(mode="json"))
               for org in ("acme", "twin")]  # fmt: skip
    assert answers[0] == answers[1]
    text = str(answers[0])
    assert "rec-0del" not in text and "rec-mm" not in text and "rec-h" not in text


def test_the_questions_find_what_the_twin_holds(engine: dossier.Engine) -> None:
    """The comparison above is of answers that hold something: rec-c has no edge of its own, Ann is found by
    her email, and the company is discovered by its industry."""
    ask = lambda n: engine.retrieve(copy.deepcopy(QUESTIONS[n]), org="twin", caller="low")  # noqa: E731
    graph = ask(0)
    assert graph.sources["graph"].items == []  # rec-c's only edges run through rec-mm
    ann = ask(1)
    assert ann.record is not None and ann.record.id == "rec-a" and not ann.record.tombstone
    found = ask(3)
    assert {i.record_id for i in found.sources["properties"].items} == {"rec-v"}


def test_nothing_is_written_to_moved_off_or_attached_to_a_record_merged_into_one_pending_deletion(
    engine: dossier.Engine,
) -> None:
    service, store = Service(engine), engine.store
    with pytest.raises(Forbidden, match="memory 'm-mm' exists and this caller may not change it") as caught:
        service.add_memories(LOW, [{"id": "m-mm", "record": "rec-a", "text": "moved"}])
    assert "rec-mm" not in str(caught.value) and "rec-0del" not in str(caught.value)  # its owner is not named
    for write in (
        lambda: service.add_memories(LOW, [{"record": "rec-mm", "text": "a new memory"}]),
        lambda: service.add_records(LOW, [_record("rec-b", merged_into="rec-mm")]),
        lambda: service.add_records(LOW, [_record("rec-mm", properties={"name": "Mo again"})]),
        lambda: service.add_documents(LOW, [{"id": "note-mm", "title": "Mo", "markdown": "# Mo\n\nx", "attached_record": "rec-mm"}]),
    ):
        with pytest.raises(dossier.UsageError, match="record 'rec-mm' is merged into a record pending deletion"):
            write()
    assert [m.record for m in store.get_memories(["m-mm"], org="acme")] == ["rec-mm"]
    assert store.get_records(["rec-b"], org="acme")[0].merged_into is None
    assert store.get_documents(["note-mm"], org="acme") == []
    with pytest.raises(dossier.UsageError, match="pending deletion"):  # every caller's remember() stops there too
        service.remember(ADMIN, {"id": "rec-mm"}, "remembered")
    service.add_memories(ADMIN, [{"id": "m-mm", "record": "rec-a", "text": "moved by the admin"}])  # the admin's to do
    assert [m.record for m in store.get_memories(["m-mm"], org="acme")] == ["rec-a"]


def test_a_remember_by_a_shared_identifier_reaches_the_live_record(engine: dossier.Engine) -> None:
    memory = Service(engine).remember(LOW, {"email": EMAIL}, "Ann wants a call on Friday.")
    assert memory.record == "rec-a"


def test_an_expand_page_after_a_merge_into_a_deleted_record_reads_its_tombstone(engine: dossier.Engine) -> None:
    engine.load_bundle({"memories": [{"id": f"m-b{n}", "org": "acme", "record": "rec-b", "created_at": "2026-01-07T10:00:00Z",
                                      "text": f"Bo asked about launch slot {n} and its insurance terms."} for n in range(20)]})  # fmt: skip
    first = engine.retrieve({"mode": "brief", "record": {"id": "rec-b"}, "message": "What did Bo ask about?",
                             "budget": {"totalTokens": 400}}, org="acme", caller="low")  # fmt: skip
    assert first.continuation is not None and first.record is not None and first.record.id == "rec-b"
    Service(engine).add_records(ADMIN, [_record("rec-b", merged_into="rec-mm", properties={"name": "Bo"})])
    page = engine.retrieve({"continuation": first.continuation}, org="acme", caller="low")
    assert page.record is not None and page.record.tombstone and page.record.id == "rec-0del"
    assert not any(result.items for result in page.sources.values())


def test_a_walk_crowded_by_edges_to_hidden_records_reads_further(engine: dossier.Engine) -> None:
    """60 strong edges to records merged into a deleted one, 5 weaker ones to live records: a read cut at the
    walk's limit would hold only hidden ends."""
    hidden = [_record(f"rec-x{n:02d}", merged_into="rec-0del") for n in range(60)]
    live = [_record(f"rec-y{n}") for n in range(5)]
    edges = [{**_edge(f"e-x{n:02d}", "rec-c", f"rec-x{n:02d}"), "confidence": 0.99} for n in range(60)]
    edges += [{**_edge(f"e-y{n}", "rec-c", f"rec-y{n}"), "confidence": 0.5} for n in range(5)]
    engine.load_bundle({"records": hidden + live, "edges": edges})
    walked = engine.store.edges_around(["rec-c"], org="acme", max_hops=1, limit=50)
    assert sorted(h.edge.id for h in walked) == [f"e-y{n}" for n in range(5)]


def test_remember_resolves_an_identifier_as_a_retrieve_does(engine: dossier.Engine) -> None:
    """A company and a contact share an email: both reach the contact, as resolution ranks a contact first."""
    engine.load_bundle({"records": [{"id": "rec-a-co", "org": "acme", "kind": "company", "identifiers": {"email": "info@acme-rockets.com"}},
                                    _record("rec-info", identifiers={"email": "info@acme-rockets.com"})]})  # fmt: skip
    asked = engine.retrieve({"record": {"email": "info@acme-rockets.com"}, "message": "Who is this?"}, org="acme", caller="low")
    assert asked.record is not None and asked.record.id == "rec-info"
    assert Service(engine).remember(LOW, {"email": "info@acme-rockets.com"}, "They called.").record == "rec-info"
