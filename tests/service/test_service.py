"""Layer 10 in-process (no sockets): keys, billing, audit, feedback and scoped loading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import dossier
from dossier.errors import Forbidden, InvalidRequest, NotFound, Unauthorized
from dossier.service import FeedbackRequest, Service, split_key

from .conftest import BRIEF, principal, table_text


def net(service: Service, org: str = "northwind") -> dict[str, tuple[int, int, int]]:
    return {u.item: (u.calls, u.charged, u.refunded) for u in service.usage(org)}


# -- keys --------------------------------------------------------------------------------------------
def test_a_key_is_shown_once_stored_hashed_and_decides_org_and_caller(service: Service, db_path: Path) -> None:
    row, key = service.create_key("southwind", "zoe", name="agent-1")
    key_id, secret = split_key(key)  # type: ignore[misc]
    assert key_id == row.id and secret not in table_text(db_path, "api_keys")
    assert service.authenticate(key) == dossier.service.Principal(org="southwind", caller="zoe", key_id=row.id)
    assert [k.id for k in service.list_keys(org="southwind")] == [row.id]
    for bad in (None, "", "nonsense", f"dk_{key_id}_wrong", f"dk_unknown_{secret}", key + "x"):
        with pytest.raises(Unauthorized):
            service.authenticate(bad)
    service.revoke_key(row.id)
    with pytest.raises(Unauthorized, match="revoked"):
        service.authenticate(key)
    with pytest.raises(NotFound):
        service.revoke_key(row.id)


@pytest.mark.parametrize(("org", "caller"), [("nowhere", "ana"), ("northwind", "zoe"), ("southwind", "nobody")])
def test_keys_are_only_made_for_known_callers_of_their_org(service: Service, org: str, caller: str) -> None:
    with pytest.raises(NotFound):
        service.create_key(org, caller)


# -- billing -----------------------------------------------------------------------------------------
def test_a_call_is_charged_up_front_and_audited(service: Service) -> None:
    response = service.retrieve(principal("ana"), BRIEF)
    assert net(service) == {"standard": (1, 2, 0)}
    row = service.store.get_audit(response.call_id)
    assert row is not None and (row.org, row.caller, row.outcome, row.units, row.front_end) == (
        "northwind", "ana", "ok", 2, "python")  # fmt: skip
    shape = json.loads(row.shape)
    assert shape["sources"]["documents"]["items"] == len(response.sources["documents"].items)
    assert shape["record_kind"] == "email" and shape["message_bytes"] == len(BRIEF["message"].encode())


def test_a_call_that_throws_was_charged_before_it_ran_and_is_refunded(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def boom(*args: Any, **kwargs: Any) -> None:
        seen.append(net(service))  # the charge is already on the ledger while the call runs
        raise RuntimeError("the engine broke")

    monkeypatch.setattr(service.engine, "retrieve", boom)
    with pytest.raises(RuntimeError):
        service.retrieve(principal("ana"), {**BRIEF, "depth": "deep"})
    assert seen == [{"deep": (1, 5, 0)}]
    assert net(service) == {"deep": (1, 5, 5)}
    [row] = service.store.audit_rows(org="northwind", limit=5)
    assert (row.outcome, row.error_type, row.units) == ("error", "RuntimeError", 0)


def test_a_call_that_cannot_be_audited_fails_and_is_refunded(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    def down(row: Any) -> None:
        raise dossier.StoreError("audit table unavailable")

    monkeypatch.setattr(service.store, "add_audit", down)
    with pytest.raises(dossier.StoreError):
        service.retrieve(principal("ana"), {**BRIEF, "depth": "deep"})  # deep runs as standard: 3 back, then 2
    assert [(u.charged, u.refunded) for u in service.usage("northwind")] == [(5, 5)]


def test_what_did_not_run_is_given_back(service: Service) -> None:
    service.retrieve(principal("ana"), {**BRIEF, "depth": "deep"})  # no model: runs as standard
    service.retrieve(principal("ana"), {**BRIEF, "depth": "fast", "synthesize": True})  # no model: no synthesis
    lines = {u.item: (u.charged, u.refunded, u.net) for u in service.usage("northwind")}
    assert lines == {"deep": (5, 3, 2), "fast+synthesis": (6, 5, 1)}


def test_synthesis_over_an_expand_page_is_charged_as_on_any_call(service: Service) -> None:
    first = service.retrieve(principal("ana"), {**BRIEF, "budget": {"totalTokens": 1500}})
    assert first.continuation
    service.retrieve(principal("ana"), {"continuation": first.continuation, "message": "What are the list prices?",
                                        "synthesize": True})  # fmt: skip
    lines = {u.item: (u.charged, u.refunded, u.net) for u in service.usage("northwind")}
    assert lines["expand+synthesis"] == (6, 5, 1)  # no model: the synthesis charged up front is given back


def test_an_invalid_request_is_audited_by_field_and_not_charged(service: Service) -> None:
    with pytest.raises(InvalidRequest):
        service.retrieve(principal("ana"), {"budget": {"totalTokens": 10**9}, "message": "secret question"})
    assert service.usage("northwind") == []
    [row] = service.store.audit_rows(org="northwind", limit=5)
    assert row.outcome == "error" and json.loads(row.shape) == {"invalid_field": "budget.totalTokens"}


def test_the_audit_holds_the_shape_of_calls_never_their_bodies(service: Service, db_path: Path) -> None:
    ana = principal("ana")
    response = service.retrieve(ana, BRIEF)
    first = service.retrieve(ana, {**BRIEF, "budget": {"totalTokens": 900}})
    service.retrieve(ana, {"continuation": first.continuation})
    service.retrieve(principal("zoe"), {**BRIEF, "record": {"phone": "+1 415 555 0100"}})
    for bad in ({**BRIEF, "record": {"email": "jane@acme.com"}, "colour": "red"}, {**BRIEF, "mode": "fetch"}):
        with pytest.raises(InvalidRequest):
            service.retrieve(ana, bad)
    audit = table_text(db_path, "audit")
    assert audit.count("\n") + 1 == 6
    texts = [item.text for r in response.sources.values() for item in r.items if hasattr(item, "text")]
    secrets_ = [BRIEF["message"], "jane@acme.com", "jane", "Jane", "rec-jane", "+1 415 555 0100", "4155550100", *texts[:5]]
    for secret in secrets_:
        assert secret not in audit, secret


# -- calls and feedback ------------------------------------------------------------------------------
def test_feedback_and_results_belong_to_the_org_of_the_call(service: Service) -> None:
    call_id = service.retrieve(principal("ana"), BRIEF).call_id
    row = service.feedback(principal("admin"), {"call_id": call_id, "rating": 4, "comment": "pricing rules were there"})
    assert (row.org, row.caller, row.rating) == ("northwind", "admin", 4)
    service.feedback(principal("ana"), {"call_id": call_id, "rating": 5})
    # the caller reads its own feedback on its call; the admin's comment may quote what ana may not see
    assert [(f.caller, f.rating) for f in service.feedback_for(principal("ana"), call_id)] == [("ana", 5)]
    assert [(f.caller, f.rating) for f in service.feedback_for(principal("admin"), call_id)] == [("admin", 4), ("ana", 5)]
    assert service.call(principal("ana"), call_id)["summary"]["mode"] == "brief"
    assert service.call(principal("admin"), call_id)["summary"]["caller"] == "ana"
    for action in (
        lambda p: service.feedback(p, FeedbackRequest(call_id=call_id, rating=1)),
        lambda p: service.feedback_for(p, call_id),
        lambda p: service.call(p, call_id),
    ):
        # another org's call, and another caller's of the same org (its shape was governed for that caller),
        # read like an unknown one
        for other in ("zoe", "ben"):
            with pytest.raises(NotFound, match=f"no call '{call_id}'"):
                action(principal(other))
    assert [f.rating for f in service.feedback_for(principal("admin"), call_id)] == [4, 5]  # nothing added by them
    with pytest.raises(NotFound):
        service.call(principal("ana"), "0" * 32)
    for body, field in (({"call_id": call_id, "rating": 9}, "rating"), ({"call_id": call_id, "rating": 3, "org": "x"}, "org")):
        with pytest.raises(InvalidRequest) as caught:
            service.feedback(principal("ana"), body)
        assert caught.value.field == field


# -- loading -----------------------------------------------------------------------------------------
def test_a_bundle_needs_the_admin_role_and_stays_in_its_org(service: Service) -> None:
    bundle = {"records": [{"id": "rec-new", "kind": "contact", "identifiers": {"email": "new@acme.com"}}]}
    with pytest.raises(Forbidden, match="admin"):
        service.load_bundle(principal("ana"), bundle)
    for foreign in ({"orgs": [{"id": "southwind"}]}, {"records": [{**bundle["records"][0], "org": "southwind"}]},
                    {"callers": [{"id": "eve", "org": "southwind", "roles": ["admin"]}]}):  # fmt: skip
        with pytest.raises(Forbidden):
            service.load_bundle(principal("admin"), foreign)
    report = service.load_bundle(principal("admin"), bundle)
    assert report.inserted == {"records": 1}
    assert service.engine.store.get_records(["rec-new"], org="northwind")[0].org == "northwind"
    assert service.engine.store.get_records(["rec-new"], org="southwind") == []


def test_remember_follows_merges_and_the_memory_is_retrieved(service: Service) -> None:
    memory = service.remember(principal("ana"), {"email": "jane.doe@acme.com"}, "Jane asked for invoices in EUR from May on.")
    assert memory.record == "rec-jane" and memory.org == "northwind"  # rec-jane-old was merged into rec-jane
    response = service.retrieve(principal("ana"), {**BRIEF, "message": "Which currency does Jane want invoices in?"})
    assert memory.id in [m.id for m in response.sources["memories"].items]
    with pytest.raises(NotFound):
        service.remember(principal("zoe"), {"email": "jane.doe@acme.com"}, "southwind has no such record")
    with pytest.raises(dossier.UsageError, match="pending deletion"):
        service.remember(principal("ana"), {"id": "rec-george"}, "George is being deleted")


def test_a_record_pending_deletion_cannot_be_written_back_to_life(service: Service) -> None:
    """rec-george is pending deletion: an upsert would store pending_deletion false and its data be read again."""
    ask = {"mode": "brief", "record": {"id": "rec-george"}, "message": "What do we know about George?"}
    assert service.retrieve(principal("ana"), ask).record.tombstone  # type: ignore[union-attr]
    with pytest.raises(dossier.UsageError, match="pending deletion"):
        service.add_records(principal("ana"), [{"id": "rec-george", "kind": "contact", "properties": {"name": "probe"}}])
    with pytest.raises(dossier.UsageError, match="pending deletion"):
        service.add_memories(principal("ana"), [{"record": "rec-george", "text": "a memory for a deleted record"}])
    after = service.retrieve(principal("ana"), ask)
    assert after.record is not None and after.record.tombstone and not after.sources["memories"].items
    service.add_records(principal("admin"), [{"id": "rec-george", "kind": "contact", "pending_deletion": True}])  # the admin's


def test_an_identifier_of_a_live_record_goes_to_another_record_by_the_admin_alone(service: Service) -> None:
    """A second record holding jane@acme.com would be resolved for her (the first by id): a caller who may
    write records must not be able to put one in front of her. Her own record, a record merged into hers and
    an identifier only a record pending deletion holds stay writable; the admin may do it."""
    ask = {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "What discount did we agree?"}
    before = service.retrieve(principal("ben"), ask).record
    assert before is not None and before.id == "rec-jane"
    fake = {"id": "rec-a-jane", "kind": "contact", "identifiers": {"email": "Jane@ACME.com"}, "properties": {"plan": "Starter"}}
    with pytest.raises(Forbidden, match="email .* already names record 'rec-jane': only the admin role"):
        service.add_records(principal("ana"), [fake])
    with pytest.raises(Forbidden):  # nor by giving an existing record her email
        service.add_records(principal("ana"), [{"id": "rec-raj", "kind": "contact", "identifiers": {"email": "jane@acme.com"}}])
    assert service.engine.store.get_records(["rec-a-jane"], org="northwind") == []
    assert service.retrieve(principal("ben"), ask).record.id == "rec-jane"  # type: ignore[union-attr]
    [jane] = service.engine.store.get_records(["rec-jane"], org="northwind")
    service.add_records(principal("ana"), [{**jane.model_dump(mode="json"), "properties": {**jane.properties, "plan": "Pro"}}])
    service.add_records(principal("ana"), [{"id": "rec-jane-dup", "kind": "contact", "merged_into": "rec-jane",
                                           "identifiers": {"email": "jane@acme.com"}}])  # fmt: skip
    service.add_records(principal("admin"), [fake])  # the admin's decision (and the ``ambiguous`` rule's)
    assert service.engine.store.get_records(["rec-a-jane"], org="northwind")
    # two contacts the admin loaded with one office phone stay writable: each holds it already
    office = {"kind": "contact", "identifiers": {"phone": "+1 415 555 0199"}}
    service.add_records(principal("admin"), [{"id": "rec-o1", **office}, {"id": "rec-o2", **office}])
    service.add_records(principal("ana"), [{"id": "rec-o1", **office, "properties": {"desk": "3F"}}])
    with pytest.raises(Forbidden, match="given to two records in one request"):
        service.add_records(principal("ana"), [{"id": "rec-n1", "kind": "contact", "identifiers": {"email": "new@x.example"}},
                                               {"id": "rec-n2", "kind": "contact", "identifiers": {"email": "new@x.example"}}])  # fmt: skip
    assert service.engine.store.get_records(["rec-n1", "rec-n2"], org="northwind") == []


def test_a_deletion_committed_after_the_services_checks_still_refuses_the_write(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service checks a non-admin write before it loads it; a deletion another worker commits between
    that check and the write would be undone by it (the record written back as not pending deletion). The
    store checks again inside its write, so the write is refused whole and the deletion stands. Here the
    service's own checks are passed by, as when they ran before the deletion landed."""
    store = service.engine.store
    monkeypatch.setattr(service, "_refuse_hidden_by_deletion", lambda *_: None)
    monkeypatch.setattr(service, "_refuse_taken_identifiers", lambda *_: None)
    [george] = store.get_records(["rec-george"], org="northwind")
    assert george.pending_deletion
    with pytest.raises(dossier.UsageError, match="record 'rec-george' is pending deletion"):
        service.add_records(principal("ana"), [{"id": "rec-george", "kind": "contact", "properties": {"name": "back"}}])
    with pytest.raises(dossier.UsageError, match="record 'rec-george' is pending deletion"):
        service.add_records(principal("ana"), [{"id": "rec-new", "kind": "contact", "merged_into": "rec-george"}])
    with pytest.raises(dossier.UsageError, match="record 'rec-george' is pending deletion"):
        service.add_memories(principal("ana"), [{"record": "rec-george", "text": "a memory for a deleted record"}])
    from dossier.loading import load_bundle

    moved = {"memories": [{"id": "mem-0163", "org": "northwind", "record": "rec-raj", "text": "moved off him",
                           "created_at": "2026-01-05T10:00:00Z"}]}  # as the write the service passes on  # fmt: skip
    with pytest.raises(Forbidden, match="memory 'mem-0163' exists and this caller may not change it") as caught:
        load_bundle(store, service.engine.embedder, moved, guard=True)
    assert "george" not in str(caught.value)
    assert store.get_records(["rec-george"], org="northwind")[0].pending_deletion
    assert store.get_records(["rec-new"], org="northwind") == []
    assert store.get_memories(["mem-0163"], org="northwind")[0].record == "rec-george"
    service.add_records(principal("admin"), [{**george.model_dump(mode="json"), "properties": {"name": "kept"}}])  # the admin's


def test_nothing_is_moved_off_merged_into_or_attached_to_a_record_pending_deletion(service: Service) -> None:
    """rec-george is pending deletion; mem-0163 is one of his memories. A caller who is not the admin can no
    more reach his data through an existing id, a merge or a new note than by writing to him directly."""
    store = service.engine.store
    [george_memory] = store.get_memories(["mem-0163"], org="northwind")
    assert george_memory.record == "rec-george"
    with pytest.raises(Forbidden, match="memory 'mem-0163' exists and this caller may not change it") as caught:
        service.add_memories(principal("ana"), [{"id": "mem-0163", "record": "rec-raj", "text": "overwritten"}])
    assert "george" not in str(caught.value)  # rewritten under another record, it would move off his; he is not named
    with pytest.raises(dossier.UsageError, match="pending deletion"):  # merged into him
        service.add_records(principal("ana"), [{"id": "rec-jane-old", "kind": "contact", "merged_into": "rec-george"}])
    with pytest.raises(dossier.UsageError, match="pending deletion"):  # a new note about him
        service.add_documents(principal("ana"), [{"id": "doc-note-george-new", "title": "George", "markdown": "# George\n\nx",
                                                  "attached_record": "rec-george"}])  # fmt: skip
    assert store.get_memories(["mem-0163"], org="northwind") == [george_memory]
    assert store.get_records(["rec-jane-old"], org="northwind")[0].merged_into == "rec-jane"
    assert store.get_documents(["doc-note-george-new"], org="northwind") == []
    # the admin's to do
    service.add_memories(principal("admin"), [{"id": "mem-0163", "record": "rec-raj", "text": "moved by the admin"}])
    assert store.get_memories(["mem-0163"], org="northwind")[0].record == "rec-raj"


def test_the_route_tells_nothing_of_sections_the_caller_may_not_see(service: Service) -> None:
    """Words only a legal-only document holds (doc-redlines), or a tag only finance-only documents carry: the
    route reads as for words and tags nothing holds."""
    def route(request: dict) -> dict:  # type: ignore[type-arg]
        return service.retrieve(principal("ana"), request).route["documents"].model_dump()

    hidden = route({"mode": "scout", "message": "Wilmington"})
    assert not {"vector_candidates", "text_candidates"} & set(hidden["detail"]), hidden  # counted before governance
    tagged = route({"mode": "filter", "filters": {"tags": ["commission"]}, "message": "what is the rate"})
    assert tagged == route({"mode": "filter", "filters": {"tags": ["no-such-tag"]}, "message": "what is the rate"})


def test_documents_are_added_in_the_org_and_hidden_ones_cannot_be_replaced(service: Service) -> None:
    [doc] = service.add_documents(principal("ana"), [{"markdown": "# Visit policy\n\n## Parking\nPark in bay 4.\n",
                                                      "tags": ["office"]}])  # fmt: skip
    assert doc.id == "visit-policy" and doc.org == "northwind" and [s.heading for s in doc.sections] == ["Parking"]
    with pytest.raises(Forbidden, match="may not see"):  # doc-commission is finance-only; ana is sales
        service.add_documents(principal("ana"), [{"id": "doc-commission", "title": "Mine now", "markdown": "## x\ny"}])
    for hidden in ("doc-sys-crm-fields", "doc-note-george"):  # a system document; a note about a record pending deletion
        with pytest.raises(Forbidden, match="may not see"):
            service.add_documents(principal("ana"), [{"id": hidden, "title": "Mine now", "markdown": "## x\ny"}])
    # a write that is broken anyway is told so first, the same way whether a hidden document has the id or none
    broken = {"id": "probe-2", "title": "x", "markdown": "# x\n\ny", "attached_record": "rec-nobody"}
    answers = []
    for probe in ("doc-commission", "doc-no-such-document"):
        with pytest.raises(dossier.BundleError) as caught:
            service.add_documents(principal("ana"), [{"id": probe, "title": "x", "markdown": "# x\n\ny"}, broken])
        answers.append(str(caught.value))
    assert answers[0] == answers[1] and "rec-nobody" in answers[0]
    assert service.engine.store.get_documents(["doc-no-such-document"], org="northwind") == []
    service.add_documents(principal("admin"), [{"id": "doc-sys-crm-fields", "title": "CRM fields", "markdown": "## x\ny"}])
    with pytest.raises(Forbidden):
        service.add_documents(principal("ana"), [{"org": "southwind", "title": "T", "markdown": "## x\ny"}])
    with pytest.raises(InvalidRequest) as caught:
        service.add_documents(principal("ana"), [{"title": "T"}])
    assert "exactly one of" in str(caught.value)


def test_a_bundle_org_without_an_id_is_a_broken_bundle_not_another_org(service: Service) -> None:
    with pytest.raises(dossier.BundleError):
        service.load_bundle(principal("admin"), {"orgs": [{"name": "no id"}]})
    with pytest.raises(dossier.Forbidden):
        service.load_bundle(principal("admin"), {"orgs": [{"id": "southwind", "name": "another org"}]})


def test_a_record_merged_into_one_pending_deletion_stays_hidden_in_writes_remember_and_the_graph(service: Service) -> None:
    """P is pending deletion; A is merged into P; S is live with an edge to A. A caller without the admin role
    cannot take A out from under the deletion by rewriting it, remember() does not reach past P, and the
    graph around S does not show A."""
    admin = principal("admin")
    service.load_bundle(admin, {
        "records": [{"id": "rec-md-s", "kind": "contact", "identifiers": {"email": "s@md-example.com"}},
                    {"id": "rec-md-p", "kind": "contact", "identifiers": {"email": "p@md-example.com"},
                     "merged_into": "rec-md-s", "pending_deletion": True},
                    {"id": "rec-md-a", "kind": "contact", "identifiers": {"email": "a@md-example.com"}, "merged_into": "rec-md-p"}],
        "memories": [{"id": "mem-md-a", "record": "rec-md-a", "text": "A asked about the renewal discount.",
                      "created_at": "2026-01-02T00:00:00Z"}],
        "edges": [{"id": "e-md-sa", "src": "rec-md-s", "dst": "rec-md-a", "type": "knows", "active": True,
                   "confidence": 0.9, "weight": 1.0, "dst_is_stub": False}],
    })  # fmt: skip
    with pytest.raises(dossier.UsageError, match="pending deletion"):
        service.add_records(principal("ana"), [{"id": "rec-md-a", "kind": "contact", "merged_into": "rec-md-s"}])
    with pytest.raises(dossier.UsageError, match="pending deletion"):
        service.add_records(principal("ana"), [{"id": "rec-md-a", "kind": "contact"}])
    assert service.engine.store.get_records(["rec-md-a"], org="northwind")[0].merged_into == "rec-md-p"
    with pytest.raises(dossier.UsageError, match="pending deletion"):  # as a retrieve: P's tombstone, not S
        service.remember(principal("ana"), {"email": "a@md-example.com"}, "a new fact")
    about_s = service.retrieve(principal("ana"), {"mode": "brief", "record": {"id": "rec-md-s"},
                                                  "message": "What discount did they ask about?"})  # fmt: skip
    returned = {getattr(i, "id", None) for r in about_s.sources.values() for i in r.items}
    assert not {"mem-md-a", "e-md-sa"} & returned


def test_a_nul_character_is_refused_by_every_service_method_before_the_store_is_asked(service: Service) -> None:
    """The same rule as the HTTP bodies', for MCP tools and in-process callers (PostgreSQL cannot store one)."""
    from dossier.schema import RetrieveRequest

    ana = principal("ana")
    call_id = service.retrieve(ana, BRIEF).call_id
    attempts = [
        (lambda: service.add_memories(ana, [{"record": "rec-jane", "text": "a\x00b", "id": "mem-nul"}]), "text"),
        (lambda: service.add_records(ana, [{"id": "rec-\x00", "kind": "contact"}]), "0.id"),
        (lambda: service.remember(ana, {"id": "rec-\x00jane"}, "x"), "record.id"),
        (lambda: service.remember(ana, {"id": "rec-jane"}, "x\x00"), "text"),
        (lambda: service.feedback(ana, {"call_id": call_id, "rating": 3, "comment": "\x00"}), "comment"),
        (lambda: service.add_documents(ana, [{"title": "T\x00", "markdown": "# T\n\nx"}]), "title"),
        (lambda: service.retrieve(ana, RetrieveRequest(continuation="ab\x00c")), "continuation"),
    ]
    for attempt, field in attempts:
        with pytest.raises(InvalidRequest) as caught:
            attempt()
        assert caught.value.field == field and "NUL" in str(caught.value), (field, str(caught.value))
    assert service.engine.store.get_memories(["mem-nul"], org="northwind") == []
