"""The trace reveals nothing the caller may not see, property-based on both stores.

Generated requests with ``trace: true`` (every caller and role, records of every kind including one
pending deletion and another org's, questions that match role-restricted, system and attached
documents, fetch lists naming them, failing reads that force the fail-closed paths, and the next page
of a result): no trace entry, route detail or error names an item the caller may not see, and what
was withheld is counted per layer and reason only. "May see" is worked out here from the bundle
itself (org, roles, system, attached record, pending deletion), never by the engine's governance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import dossier
from dossier.schema import ResolvedRecord, item_key

from .faults import FaultyStore, always, kind_is

CALLERS = [("northwind", c) for c in ("ana", "ben", "carla", "dev", "fiona", "admin")] + [
    ("southwind", c) for c in ("zoe", "b-admin")
]
RECORDS = [
    None, {"email": "jane@acme.com"}, {"email": "jane.doe@acme.com"}, {"website": "acme.com"}, {"id": "rec-acme"},
    {"website": "globex.com"}, {"email": "george@vandelay.com"}, {"id": "rec-george"}, {"website": "vandelay.com"},
    {"id": "b-jane"}, {"id": "b-acme"}, {"email": "samir@initech.com"}, {"email": "nobody@example.org"},
]  # fmt: skip
MESSAGES = [
    "What is our commission rate on multi-year deals?", "How should we answer a liability cap redline?",
    "What does the CRM field health mean?", "What are the agent's internal instructions?",
    "What is the account plan and next steps for Acme?", "Globex account plan", "What did George ask for?",
    "What is George's title and preferred channel?", "How do we beat Contoso?", "Southwind pricing", "NW-EDU-40",
    "What pricing did we discuss, and what discount rules apply?", "refund window", "",
]  # fmt: skip
FETCH_IDS = ["doc-commission", "doc-redlines", "doc-battlecard", "doc-sys-agent", "doc-sys-crm-fields", "doc-note-acme",
             "doc-note-george", "doc-note-globex", "b-doc-pricing", "doc-refund", "doc-pricing", "missing-doc"]  # fmt: skip
FAULTS = {
    "visibility": ("get_documents", always),  # the document re-check fails: every document dropped
    "records": ("get_records", lambda ids, **_: len(ids) > 1),  # the owners' re-check, not resolve's lookup
    "vector": ("search_vectors", kind_is("section", parents=False)),
    "text": ("search_text", kind_is("section")),
}
WORD = re.compile(r"[a-z_]+")
TOKEN = re.compile(r"[\w.@+-]+(?:/[\w.@+-]+)?")


@dataclass
class World:
    """Who owns what, read straight from the sample bundle."""

    org_of: dict[str, str] = field(default_factory=dict)  # every id (and property key) -> its org
    records: set[str] = field(default_factory=set)
    documents: dict[str, dict] = field(default_factory=dict)  # document or section id -> the document
    property_record: dict[str, str] = field(default_factory=dict)  # "record/name" -> record
    memory_record: dict[str, str] = field(default_factory=dict)
    edge_ends: dict[str, tuple[str, str]] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    roles: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"World({len(self.org_of)} ids)"

    @classmethod
    def of(cls, bundle: dict) -> "World":
        w = cls()
        for r in bundle["records"]:
            w.org_of[r["id"]] = r["org"]
            w.records.add(r["id"])
            if r.get("pending_deletion"):
                w.deleted.add(r["id"])
            for name in r.get("properties", {}):
                w.org_of[f"{r['id']}/{name}"] = r["org"]
                w.property_record[f"{r['id']}/{name}"] = r["id"]
        for m in bundle["memories"]:
            w.org_of[m["id"]] = m["org"]
            w.memory_record[m["id"]] = m["record"]
        for e in bundle["edges"]:
            w.org_of[e["id"]] = e["org"]
            w.edge_ends[e["id"]] = (e["src"], e["dst"])
        for d in bundle["documents"]:
            for key in [d["id"], *(s["id"] for s in d["sections"])]:
                w.org_of[key] = d["org"]
                w.documents[key] = d
        w.roles = {(c["org"], c["id"]): set(c["roles"]) for c in bundle["callers"]}
        return w

    def hidden(self, key: str, *, org: str, caller: str, resolved: ResolvedRecord | None) -> bool:
        """Whether ``caller`` of ``org``, in a call about ``resolved``, may not see the item ``key``. An id
        that names nothing in the bundle hides nothing."""
        owner = self.org_of.get(key)
        if owner is None:
            return False
        if owner != org:
            return True
        about = set() if resolved is None or resolved.tombstone else {resolved.id, *resolved.aliases, *resolved.merged_from}
        if key in self.records:  # a record pending deletion shows only as the tombstone the caller asked for
            return key in self.deleted and not (resolved is not None and key == resolved.id)
        if key in self.property_record:
            return self.property_record[key] in self.deleted
        if key in self.memory_record:
            return self.memory_record[key] in self.deleted or self.memory_record[key] not in about
        if key in self.edge_ends:
            return any(end in self.deleted for end in self.edge_ends[key])
        document = self.documents[key]
        roles = document.get("visible_to_roles")
        attached = document.get("attached_record")
        return bool(
            document.get("is_system")
            or (roles is not None and not set(roles) & self.roles[(org, caller)])
            or (attached is not None and attached not in about)
        )


@pytest.fixture(scope="module")
def world(sample_bundle: dict) -> World:
    return World.of(sample_bundle)


def strings(value: Any) -> list[str]:
    """Every string in a JSON-like value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*strings(k), *strings(v))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in strings(v)]
    return []


def check(world: World, response: dossier.RetrieveResponse, body: dict, *, org: str, caller: str, faults: set[str]) -> None:
    """Nothing in ``response`` names an item this caller may not see, except what the caller itself sent."""
    resolved = response.record
    if resolved is not None:  # the resolution the visibility rules depend on stays in the caller's org
        assert world.org_of[resolved.id] == org
        assert all(world.org_of[a] == org and a not in world.deleted for a in resolved.aliases)
        assert all(world.org_of[m] == org for m in resolved.merged_from)

    def hidden(key: str) -> bool:
        return world.hidden(key, org=org, caller=caller, resolved=resolved)

    assert response.trace is not None and response.withheld is not None
    for entry in response.trace:
        assert not hidden(entry.id), f"the trace names {entry.id} ({entry.layer} {entry.decision} {entry.reason})"
    for layer, counts in response.withheld.items():  # counts only: no id, score or title
        assert WORD.fullmatch(layer), layer
        assert all(WORD.fullmatch(reason) and isinstance(n, int) and n > 0 for reason, n in counts.items()), counts
    for source, result in response.sources.items():
        for item in result.items:
            assert not hidden(item_key(item)), f"{source} returned {item_key(item)}"
    echoed = set(body.get("fetch", [])) | set((body.get("record") or {}).values())  # the caller's own words
    forbidden = {key for key in world.org_of if hidden(key)} - echoed
    said = strings({name: route.model_dump(mode="json") for name, route in response.route.items()})
    said += [r.error for r in response.sources.values() if r.error]
    for text in said:
        named = {text, *TOKEN.findall(text)} & forbidden
        assert not named, f"{sorted(named)} named in {text!r}"
    documents = response.route.get("documents")
    if body.get("mode") == "fetch" and documents is not None and documents.ran and not faults & {"visibility"}:
        # an id this caller may not see reads exactly like one that does not exist
        unseen = [i for i in dict.fromkeys(body["fetch"]) if i not in world.documents or hidden(i)]
        assert documents.detail.get("not_found", []) == unseen


requests = st.fixed_dictionaries(
    {
        "mode": st.sampled_from([None, "brief", "scout", "fetch", "filter"]),
        "record": st.sampled_from(RECORDS),
        "message": st.sampled_from(MESSAGES),
        "depth": st.sampled_from(["fast", "standard", "deep"]),
        "budget": st.builds(lambda n: {"totalTokens": n}, st.sampled_from([150, 1500, 8000, 50_000])),
        "fetch": st.lists(st.sampled_from(FETCH_IDS), min_size=1, max_size=5),
        "filters": st.sampled_from([None, {"tags": ["commission"]}, {"doc_types": ["system"]}, {"tags": ["account", "pricing"]}]),
        "sources": st.fixed_dictionaries({"graph": st.sampled_from([None, True]), "properties": st.sampled_from([None, True])}),
        "infer_filters": st.booleans(),
    }
)


def shape(raw: dict) -> dict:
    body = {k: v for k, v in raw.items() if v is not None}
    if body.get("mode") != "fetch":
        body.pop("fetch")
    if body.get("mode") == "filter" and "filters" not in body:
        body["filters"] = {"tags": ["commission"]}
    if not body["message"]:
        body.pop("message")
    return {**body, "trace": True}


#: Per store (about 15 s on SQLite, 25 s on PostgreSQL), plus the next pages some of them open.
EXAMPLES = 2000


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=requests, who=st.sampled_from(CALLERS), faults=st.sets(st.sampled_from(sorted(FAULTS)), max_size=1),
       expand=st.booleans())  # fmt: skip
def test_the_trace_names_nothing_the_caller_may_not_see(sample_engine: dossier.Engine, world: World, raw: dict, who, faults, expand) -> None:  # type: ignore[no-untyped-def]
    org, caller = who
    body = shape(raw)
    original = sample_engine.store
    if faults:
        sample_engine.store = FaultyStore(original, dict(FAULTS[f] for f in faults))  # type: ignore[assignment]
    try:
        response = sample_engine.retrieve(body, org=org, caller=caller)
    finally:
        sample_engine.store = original
    check(world, response, body, org=org, caller=caller, faults=faults)
    event(f"withheld at {sorted(response.withheld or {}) or 'no layer'}")  # --hypothesis-show-statistics
    if expand and response.continuation:  # the next page is governed by the session: its trace too
        page = sample_engine.retrieve({"continuation": response.continuation, "trace": True}, org=org, caller=caller)
        check(world, page, {}, org=org, caller=caller, faults=set())


# -- exists but not visible reads like unknown ---------------------------------------------------------
UNSEEN = [  # (caller, id of a document that caller may not see, why)
    ("ana", "doc-commission", "outside the caller's roles"),
    ("carla", "doc-battlecard", "outside the caller's roles"),
    ("admin", "doc-sys-agent", "system document"),
    ("ana", "doc-note-globex", "attached to another record"),
    ("admin", "doc-note-george", "attached to a record pending deletion"),
    ("ana", "b-doc-pricing", "another org's"),
]


def _comparable(response: dossier.RetrieveResponse, *, rename: tuple[str, str]) -> str:
    """The response as the caller reads it, but for its call id, session id and timings, with one id renamed."""
    data = response.model_dump(mode="json", exclude={"call_id", "continuation"})
    data["route"].pop("session", None)
    for timing in ("elapsed_ms", "layers", "steps"):  # how long each layer took differs from call to call
        data["route"]["deadline"]["detail"].pop(timing, None)
    return str(data).replace(*rename)


@pytest.mark.parametrize("message", [None, "What are the rules?"])
@pytest.mark.parametrize(("caller", "unseen", "why"), UNSEEN)
def test_a_fetch_id_the_caller_may_not_see_reads_exactly_like_an_unknown_one(
    sample_engine: dossier.Engine, caller: str, unseen: str, why: str, message: str | None
) -> None:
    assert sample_engine.store.get_documents([unseen], org="southwind" if unseen.startswith("b-") else "northwind"), "it exists"
    for fetch in ([unseen], ["doc-refund", unseen, "doc-pricing"]):
        body: dict[str, Any] = {"fetch": fetch, "trace": True, "budget": {"totalTokens": 2000}}
        if message:
            body["message"] = message
        hidden = sample_engine.retrieve(body, org="northwind", caller=caller)
        unknown = sample_engine.retrieve({**body, "fetch": [i if i != unseen else "no-such-doc" for i in fetch]},
                                         org="northwind", caller=caller)  # fmt: skip
        assert hidden.route["documents"].detail["not_found"] == [unseen], why
        assert _comparable(hidden, rename=(unseen, "no-such-doc")) == _comparable(unknown, rename=("", "")), why


# -- the caller's trace against the operator's full evidence ------------------------------------------
def test_restricted_sections_are_never_candidates_of_a_caller_who_may_not_see_them(sample_engine: dossier.Engine) -> None:
    """The searches take their places among what the caller may see: the finance-only policy the question
    matches is no candidate of a sales caller, so nothing about it is withheld (not even a count); the
    operator's full evidence says where the searches found it (dropped as governance would have); a
    finance caller recalls it."""
    body = {"mode": "scout", "message": "What is our commission rate on multi-year deals?", "trace": True}
    response = sample_engine.retrieve(body, org="northwind", caller="ana")
    full = sample_engine.retrieve(body, org="northwind", caller="ana", full_trace=True)
    hidden = [t for t in full.trace or [] if t.id.startswith("doc-commission")]
    assert hidden and {(t.layer, t.decision, t.reason) for t in hidden} == {("govern", "dropped", "not_visible")}
    assert not [t for t in response.trace or [] if t.id.startswith("doc-commission")]
    assert response.withheld is not None and "not_visible" not in response.withheld.get("govern", {})
    assert full.withheld is None
    shown = [t for t in full.trace or [] if t.id in {e.id for e in response.trace or []}]
    assert response.trace == shown, "what the caller may see keeps every decision, in order"
    assert sample_engine.retrieve({**body, "trace": False}, org="northwind", caller="ana").withheld is None
    finance = sample_engine.retrieve(body, org="northwind", caller="fiona")
    assert any(t.id.startswith("doc-commission") and t.layer == "recall" for t in finance.trace or [])


def test_only_the_python_call_can_ask_for_the_full_trace(fresh_engine: dossier.Engine) -> None:
    """HTTP and MCP reach the engine through ``Service.retrieve``, which takes a request and nothing more:
    a request naming ``full_trace`` is refused, and what it returns is the caller's trace."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from dossier.http import create_app
    from dossier.service import Service

    service = Service(fresh_engine)
    _, key = service.create_key("northwind", "ana")
    body = {"fetch": ["doc-commission", "doc-refund"], "message": "What is the commission rate?", "trace": True}
    with TestClient(create_app(service, mcp=False)) as client:
        auth = {"Authorization": f"Bearer {key}"}
        refused = client.post("/v1/retrieve", json={**body, "full_trace": True}, headers=auth)
        assert refused.status_code == 422 and "full_trace" in refused.text
        answered = client.post("/v1/retrieve", json=body, headers=auth).json()
    assert answered["route"]["documents"]["detail"]["not_found"] == ["doc-commission"]
    assert not [t for t in answered["trace"] if t["id"].startswith("doc-commission")]
    assert answered["withheld"] == {"recall": {"not_found": 1}}


def test_mcp_has_no_way_to_the_full_trace(fresh_engine: dossier.Engine) -> None:
    pytest.importorskip("mcp")
    import asyncio
    import json

    from mcp import Client

    from dossier.mcp import build_server
    from dossier.service import Principal, Service

    server = build_server(Service(fresh_engine), lambda ctx: Principal(org="northwind", caller="ana", key_id="k"))
    body = {"fetch": ["doc-commission", "doc-refund"], "message": "What is the commission rate?", "trace": True}

    async def work() -> tuple[Any, Any]:
        async with Client(server) as client:
            tool = next(t for t in (await client.list_tools()).tools if t.name == "retrieve_unified")
            result = await client.call_tool("retrieve_unified", {**body, "full_trace": True})
            return tool, result

    tool, result = asyncio.run(work())
    assert "full_trace" not in json.dumps(tool.input_schema)
    text = result.content[0].text  # type: ignore[union-attr]
    if not result.is_error:  # an unknown argument is refused or ignored, never obeyed
        answered = json.loads(text)
        assert not [t for t in answered["trace"] if t["id"].startswith("doc-commission")]
        assert answered["withheld"] == {"recall": {"not_found": 1}}


def test_the_evaluation_still_sees_where_governance_dropped_gold(sample_engine: dossier.Engine, sample_bundle: dict) -> None:
    """``dossier eval`` runs in process with the full trace: a gold section the caller may not see is
    reported lost at ``govern: not_visible`` (the caller's own trace would only count it)."""
    from dossier.evaluation.dataset import Dataset, Question
    from dossier.evaluation.metrics import losses
    from dossier.evaluation.runner import run
    from dossier.loading import read_bundle

    question = Question.model_validate({
        "id": "commission", "org": "northwind", "caller": "ana", "message": "What is our commission rate on multi-year deals?",
        "gold": {"documents": ["doc-commission"], "sections": ["doc-commission-s2", "doc-commission-s3"]},
    })  # fmt: skip
    report = run(sample_engine, Dataset("one", read_bundle(sample_bundle), [question], sample_bundle))
    found = {(l.id, l.layer, l.reason) for l in report.results[0].losses}
    assert found == {("doc-commission-s2", "govern", "not_visible"), ("doc-commission-s3", "govern", "not_visible")}
    assert report.leakage == 0
    as_caller = sample_engine.retrieve({"message": question.message, "trace": True}, org="northwind", caller="ana")
    assert {(l.layer, l.reason) for l in losses(question, as_caller)} == {("recall", "never_recalled")}
