"""The layers end to end on the deterministic stand-in model: fast enough for the development subset
(``pytest -m "not slow and not postgres"``), so governance, budgets and resolution are checked on every
save. The same properties are checked with the real model, on both stores, in tests/retrieve/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

import dossier
from dossier.evaluation.leakage import World, leaks
from tests.fake_embedder import HashEmbedder

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "sample-org.json"
QUESTIONS = json.loads((REPO / "examples" / "eval" / "sample-questions.json").read_text(encoding="utf-8"))["questions"]


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dossier.Engine]:
    path = tmp_path_factory.mktemp("fake") / "sample.db"
    with dossier.open(f"sqlite:///{path}", embedder=HashEmbedder()) as engine:
        engine.load_bundle(SAMPLE)
        yield engine


def _request(q: dict) -> dict:
    request = {"mode": "brief", "budget": {"totalTokens": 8000}, **q.get("request", {}), "message": q["message"]}
    if q.get("record") is not None:
        request["record"] = q["record"]
    return request


def test_the_stand_in_model_is_deterministic_and_ranks_shared_words_closer() -> None:
    model = HashEmbedder()
    a, b, c = model.embed_batch(["discount rules for annual plans", "annual plan discount", "kubernetes upgrade"])
    assert (model.embed_batch(["discount rules for annual plans"])[0] == a).all()
    assert float(a @ b) > float(a @ c)


def test_no_question_of_the_project_set_returns_what_its_caller_may_not_see(fake: dossier.Engine) -> None:
    world = World.of(json.loads(SAMPLE.read_text(encoding="utf-8")))
    found = []
    for q in QUESTIONS:
        response = fake.retrieve(_request(q), org=q["org"], caller=q["caller"])
        found += [f"{q['id']}: {leak}" for leak in leaks(world, response, org=q["org"], caller=q["caller"],
                                                          forbidden=set(q.get("forbidden", [])))]  # fmt: skip
        assert sum(response.budget.used.values()) <= response.budget.total_bytes, q["id"]
    assert not found


def test_every_labelled_record_resolves_and_a_pending_deletion_record_gives_no_memories(fake: dossier.Engine) -> None:
    for q in [q for q in QUESTIONS if q.get("record") is not None and q["gold"]["records"]]:
        response = fake.retrieve(_request(q), org=q["org"], caller=q["caller"])
        assert response.record is not None and response.record.id == q["gold"]["records"][0], q["id"]
        if q["category"] == "tombstone":
            assert response.record.tombstone and not response.sources["memories"].items, q["id"]


def test_a_smaller_budget_drops_and_never_overflows(fake: dossier.Engine) -> None:
    request = {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "What pricing did we discuss, and what discount rules apply?"}
    wide = fake.retrieve({**request, "budget": {"totalTokens": 8000}}, org="northwind", caller="ana")
    narrow = fake.retrieve({**request, "budget": {"totalTokens": 1500}}, org="northwind", caller="ana")
    assert sum(narrow.budget.used.values()) <= 1500 < sum(wide.budget.used.values())
    assert sum(narrow.budget.dropped.values()) > sum(wide.budget.dropped.values())


def test_without_an_adapter_for_the_model_the_route_says_so(fake: dossier.Engine) -> None:
    response = fake.retrieve({"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "discount rules",
                              "trace": True}, org="northwind", caller="ana")  # fmt: skip
    assert response.route["documents"].detail["adapter"].startswith("none: adapters were fitted on")


def test_asking_for_the_trace_changes_nothing_but_the_trace(fake: dossier.Engine) -> None:
    """Without ``trace`` the layers keep no trace (governance and the budget note nothing); the answer is the
    one a call with ``trace: true`` gets, item for item, with its statuses, routes and budget."""
    for q in QUESTIONS:
        plain, traced = (fake.retrieve({**_request(q), "trace": t}, org=q["org"], caller=q["caller"]).model_dump(mode="json")
                         for t in (False, True))  # fmt: skip
        assert plain["trace"] is None and plain["withheld"] is None and traced["trace"] is not None, q["id"]
        for response in (plain, traced):
            for key in ("call_id", "trace", "withheld"):
                response.pop(key)
            response["route"].pop("deadline", None)  # its timings differ from call to call
        assert plain == traced, q["id"]
