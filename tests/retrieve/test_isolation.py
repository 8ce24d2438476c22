"""Isolation, property-based: over thousands of generated requests (every mode, depth, budget, caller,
and injected failures that force the fallback paths), nothing of another org, nothing outside the
caller's roles, nothing of a record pending deletion, no system or foreign-attached document."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dossier

from .conftest import all_ids
from .faults import FaultyStore, kind_is

CALLERS = [("northwind", c) for c in ("ana", "ben", "carla", "dev", "fiona", "admin")] + [
    ("southwind", c) for c in ("zoe", "b-admin")
]
RECORDS = [
    None, {"email": "jane@acme.com"}, {"email": "jane.doe@acme.com"}, {"email": "raj@acme.com"},
    {"website": "https://www.acme.com"}, {"website": "globex.com"}, {"email": "george@vandelay.com"},
    {"website": "vandelay.com"}, {"id": "rec-george"}, {"id": "b-jane"}, {"id": "rec-jane"}, {"id": "b-acme"},
    {"phone": "+1 415 555 0100"}, {"email": "samir@initech.com"}, {"email": "nobody@example.org"},
]  # fmt: skip
MESSAGES = [
    "What pricing did we discuss, and what discount rules apply?", "What did George ask for?",
    "What is our commission rate on multi-year deals?", "How should we answer a liability cap redline?",
    "How do we beat Contoso?", "What does the CRM field health mean?", "Southwind pricing", "NW-EDU-40",
    "SW-EDU-25", "refund window", "account plan next steps", "who does Jane report to?", "",
]  # fmt: skip
FETCH_IDS = ["doc-pricing", "b-doc-pricing", "doc-redlines", "doc-commission", "doc-battlecard", "doc-sys-agent",
             "doc-note-george", "doc-note-acme", "doc-note-globex", "doc-refund", "missing-doc"]  # fmt: skip
FAULTS = {
    "semantic": ("search_vectors_many", kind_is("memory", parents=True)),  # the question's and the adapted vector
    "vector": ("search_vectors", kind_is("section", parents=False)),
    "text": ("search_text", kind_is("section")),
    "aliases": ("records_by_domain", lambda *a, **k: True),
    "graph": ("edges_around", lambda *a, **k: True),
}


@pytest.fixture(scope="module")
def world(sample_bundle: dict) -> dict[str, Any]:
    """Who owns what, from the bundle itself."""
    owner: dict[str, str] = {}
    roles: dict[str, tuple[str, ...] | None] = {}
    attached: dict[str, str | None] = {}
    system: set[str] = set()
    for r in sample_bundle["records"]:
        owner[r["id"]] = r["org"]
    for m in sample_bundle["memories"]:
        owner[m["id"]] = m["org"]
        attached[m["id"]] = m["record"]
    for e in sample_bundle["edges"]:
        owner[e["id"]] = e["org"]
    for d in sample_bundle["documents"]:
        for key in [d["id"], *(s["id"] for s in d["sections"])]:
            owner[key] = d["org"]
            roles[key] = tuple(d["visible_to_roles"]) if d.get("visible_to_roles") else None
            attached[key] = d.get("attached_record")
            if d.get("is_system"):
                system.add(key)
    callers = {(c["org"], c["id"]): set(c["roles"]) for c in sample_bundle["callers"]}
    deleted = {r["id"] for r in sample_bundle["records"] if r.get("pending_deletion")}
    edges = {e["id"]: (e["src"], e["dst"]) for e in sample_bundle["edges"]}
    return {"owner": owner, "roles": roles, "attached": attached, "system": system, "callers": callers,
            "deleted": deleted, "edges": edges}  # fmt: skip


requests = st.fixed_dictionaries(
    {
        "mode": st.sampled_from([None, "brief", "scout", "fetch", "filter"]),
        "record": st.sampled_from(RECORDS),
        "message": st.sampled_from(MESSAGES),
        "depth": st.sampled_from(["fast", "standard", "deep"]),
        "budget": st.builds(lambda n: {"totalTokens": n}, st.sampled_from([1, 200, 1500, 8000, 50_000])),
        "fetch": st.lists(st.sampled_from(FETCH_IDS), min_size=1, max_size=5),
        "filters": st.sampled_from([None, {"tags": ["pricing"]}, {"doc_types": ["policy"]}, {"tags": ["legal", "commission"]}]),
        "sources": st.fixed_dictionaries({"graph": st.sampled_from([None, True, False]),
                                          "properties": st.sampled_from([None, True])}),  # fmt: skip
        "infer_filters": st.booleans(),
    }
)


def _shape(raw: dict) -> dict:
    body = {k: v for k, v in raw.items() if v is not None}
    mode = body.get("mode")
    if mode != "fetch":
        body.pop("fetch")
    if mode == "filter" and "filters" not in body:
        body["filters"] = {"tags": ["pricing"]}
    if not body["message"]:
        body.pop("message")
    return body


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=requests, who=st.sampled_from(CALLERS), faults=st.sets(st.sampled_from(sorted(FAULTS)), max_size=2))
def test_no_request_sees_what_it_must_not(sample_engine: dossier.Engine, world: dict, raw: dict, who, faults) -> None:  # type: ignore[no-untyped-def]
    org, caller = who
    engine = sample_engine
    original = engine.store
    if faults:
        engine.store = FaultyStore(original, dict(FAULTS[f] for f in faults))  # type: ignore[assignment]
    try:
        response = engine.retrieve(_shape(raw), org=org, caller=caller)
    finally:
        engine.store = original
    caller_roles = world["callers"][(org, caller)]
    resolved = response.record
    allowed_attached = set()
    if resolved is not None and not resolved.tombstone:
        allowed_attached = {resolved.id, *resolved.aliases, *resolved.merged_from}
    for key in all_ids(response):
        assert world["owner"].get(key, org) == org, f"{key} belongs to another org"
    if resolved is not None and resolved.tombstone:
        assert all(r.items == [] for name, r in response.sources.items() if name in ("properties", "memories", "graph"))
    for item in response.sources["documents"].items:
        for key in (item.section_id, item.document_id):
            assert key not in world["system"], f"system document {key} returned"
            needed = world["roles"].get(key)
            assert needed is None or set(needed) & caller_roles, f"{key} outside {caller}'s roles"
            owner_record = world["attached"].get(key)
            assert owner_record is None or owner_record in allowed_attached, f"{key} is attached to {owner_record}"
    for item in response.sources["memories"].items:
        assert item.record_id not in world["deleted"]
    for item in response.sources["properties"].items:
        assert item.record_id not in world["deleted"]
    for item in response.sources["graph"].items:
        assert item.src not in world["deleted"] and item.dst not in world["deleted"]
    assert sum(response.budget.used.values()) <= response.budget.total_bytes


def test_one_orgs_calls_never_warm_the_query_cache_of_another(fresh_engine: dossier.Engine) -> None:
    """A call's query vectors (its question, and memory texts it embeds) are cached for its org and caller
    alone: a shared cache would answer another org's identical text faster, and that timing would tell it
    what was asked or held elsewhere."""
    message = "What is the cancellation notice period for annual plans? (isolation probe)"
    fresh_engine.retrieve({"mode": "brief", "message": message, "record": {"email": "jane@acme.com"}}, org="northwind", caller="ana")
    queries = fresh_engine._queries
    assert queries is not None
    before = queries.runs
    fresh_engine.retrieve({"mode": "brief", "message": message}, org="southwind", caller="zoe")
    assert queries.runs > before  # southwind's call embedded the text itself
    after_other_org = queries.runs
    fresh_engine.retrieve({"mode": "brief", "message": message}, org="northwind", caller="ben")
    assert queries.runs > after_other_org  # so did another caller of the same org
    settled = queries.runs
    fresh_engine.retrieve({"mode": "brief", "message": message}, org="southwind", caller="zoe")
    assert queries.runs == settled  # and a caller's own repeated question is still answered from the cache



def test_what_another_org_loads_never_changes_this_orgs_answers(fresh_engine: dossier.Engine) -> None:
    """The same calls of one org before and after another org loads documents full of the same words: the
    same items in the same order with the same scores, and the same trace (full-text statistics are each
    org's own)."""
    import json
    import random
    from pathlib import Path

    from dossier.schema import item_key

    path = Path(__file__).parents[2] / "examples" / "eval" / "sample-questions.json"
    questions = [q for q in json.loads(path.read_text())["questions"] if q["org"] == "northwind" and q.get("message")][:20]

    def answers() -> list[dict[str, list[tuple[Any, ...]]]]:
        out = []
        for q in questions:
            request = {k: v for k, v in q.items() if k in ("mode", "message", "record", "budget", "depth")}
            response = fresh_engine.retrieve({"mode": "brief", **request, "trace": True}, org="northwind", caller=q.get("caller", "ana"))
            out.append({s: [(item_key(i), getattr(i, "score", None)) for i in response.items(s)] for s in response.sources})
            out.append({"trace": [(t.source, t.id, t.layer, t.decision, t.reason, t.score) for t in response.trace or []]})
        return out

    before = answers()
    rng = random.Random(3)
    words = "discount pricing renewal contract refund enterprise annual plan seats approval finance policy support".split()
    documents = [{"id": f"sw-doc-{n}", "org": "southwind", "title": f"Southwind note {n}",
                  "sections": [{"id": f"sw-s-{n}-{k}", "heading": rng.choice(words),
                                "text": " ".join(rng.choice(words) for _ in range(40))} for k in range(3)]} for n in range(60)]  # fmt: skip
    fresh_engine.load_bundle({"documents": documents})
    assert answers() == before
