"""Metrics against hand-computed values on a tiny dataset, and the evidence trace naming the layer
where an injected loss happened."""

from __future__ import annotations

import dataclasses

import pytest

import dossier
from tests.retrieve.conftest import SAMPLE, fresh_engine, sample_engine  # noqa: F401 - shared fixtures
from dossier.evaluation.dataset import Dataset, Question
from dossier.evaluation.runner import run
from dossier.loading import read_bundle

TINY = {
    "orgs": [{"id": "t"}, {"id": "other"}],
    "callers": [{"id": "sam", "org": "t", "roles": ["sales"]}],
    "records": [
        {"id": "r-ann", "org": "t", "kind": "contact", "identifiers": {"email": "ann@tiny.io"}, "properties": {"plan": "Pro"}},
        {"id": "x-ann", "org": "other", "kind": "contact", "identifiers": {"email": "ann@tiny.io"}},
    ],
    "memories": [
        {"id": "m1", "org": "t", "record": "r-ann", "text": "Ann asked for a 10% discount on annual billing.", "created_at": "2026-01-01T00:00:00Z"},
        {"id": "m2", "org": "t", "record": "r-ann", "text": "Ann prefers calls on Tuesdays.", "created_at": "2026-01-02T00:00:00Z"},
    ],
    "documents": [
        {"id": "d-refund", "org": "t", "title": "Refund Policy", "sections": [
            {"id": "d-refund-1", "heading": "Refund window", "text": "Customers may cancel within 30 days for a full refund."},
            {"id": "d-refund-2", "heading": "Credits", "text": "Service credits are never paid out in cash."}]},
        {"id": "d-travel", "org": "t", "title": "Travel Policy", "sections": [
            {"id": "d-travel-1", "heading": "Flights", "text": "Book economy class for flights under six hours."}]},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, embedder):  # type: ignore[no-untyped-def]
    with dossier.open(f"sqlite:///{tmp_path_factory.mktemp('tiny')}/t.db", embedder=embedder) as engine:
        engine.load_bundle(TINY)
        yield engine


def q(**fields) -> Question:  # type: ignore[no-untyped-def]
    return Question.model_validate({"org": "t", "caller": "sam", **fields})


def test_metrics_match_hand_computed_values(tiny: dossier.Engine) -> None:
    questions = [
        # 1: record resolved; both memories come back (tier 1); m2 is marked forbidden -> exactly one leak;
        #    gold memories m1 + a memory that does not exist -> recall 1/2
        q(id="leak", record={"email": "ann@tiny.io"}, message="What discount did Ann ask for?",
          gold={"memories": ["m1", "m-missing"], "records": ["r-ann"], "properties": ["r-ann/plan"]}, forbidden=["m2"]),
        # 2: the refund window question; gold section is the travel section -> a miss (accuracy 0, recall@3 0)
        q(id="miss", message="How long is the refund window after cancelling?",
          gold={"documents": ["d-travel"], "sections": ["d-travel-1"]}),
        # 3: answered correctly
        q(id="hit", message="How long is the refund window after cancelling?",
          gold={"documents": ["d-refund"], "sections": ["d-refund-1"]}),
    ]  # fmt: skip
    report = run(tiny, Dataset("tiny", read_bundle(TINY), questions, TINY), request={"mode": "brief"})
    by_id = {r.id: r for r in report.results}
    assert report.leakage == 1 and report.leaked == ["leak: m2 (forbidden)"]
    assert by_id["leak"].metrics["memory_recall"] == 0.5
    assert by_id["leak"].metrics["property_recall"] == 1.0
    assert by_id["leak"].metrics["record_accuracy"] == 1.0
    assert by_id["miss"].metrics["section_accuracy"] == 0.0 and by_id["miss"].metrics["section_recall@3"] == 0.0
    assert by_id["miss"].metrics["document_accuracy"] == 0.0
    assert by_id["hit"].metrics["section_accuracy"] == 1.0 and by_id["hit"].metrics["document_accuracy"] == 1.0
    assert report.overall["section_accuracy"] == 0.5  # (0 + 1) / 2 questions with gold sections
    assert report.overall["memory_recall"] == 0.5
    losses = {(l.kind, l.id): (l.layer, l.reason) for l in by_id["leak"].losses}
    assert losses[("memories", "m-missing")] == ("recall", "never_recalled")
    assert [l.id for l in by_id["miss"].losses] == ["d-travel-1"]


JANE_OLD_DISCOUNT = q(id="old", org="northwind", caller="ana", record={"email": "jane@acme.com"},
                      message="How much of a price cut did she get on her initial purchase, and who signed off on it?",
                      gold={"memories": ["mem-0005"], "records": ["rec-jane"]})  # fmt: skip


def _only(question: Question, engine: dossier.Engine) -> tuple[str, str]:
    import json

    raw = json.loads(SAMPLE.read_text())
    report = run(engine, Dataset("one", read_bundle(raw), [question], raw))
    found = {(l.kind, l.id): (l.layer, l.reason) for l in report.results[0].losses}
    return found.get(("memories", "mem-0005")) or found.get(("sections", "doc-refund-s3")) or ("", "")


def test_raising_the_semantic_floor_loses_the_memory_at_recall(fresh_engine: dossier.Engine) -> None:
    assert _only(JANE_OLD_DISCOUNT, fresh_engine) == ("", ""), "found at the shipped floor"
    t = fresh_engine.settings.thresholds
    fresh_engine.org_settings["northwind"] = fresh_engine.settings.replace(thresholds=dataclasses.replace(t, memory_semantic=0.99))
    assert _only(JANE_OLD_DISCOUNT, fresh_engine) == ("recall", "below_threshold")


def test_raising_the_selector_floors_loses_the_section_at_select(fresh_engine: dossier.Engine) -> None:
    question = q(id="refund", org="northwind", caller="ana", message="How many days after purchase can a customer get a full refund?",
                 gold={"documents": ["doc-refund"], "sections": ["doc-refund-s3"]})  # fmt: skip
    assert _only(question, fresh_engine) == ("", "")
    t = fresh_engine.settings.thresholds
    strict = dataclasses.replace(t, selector_floor=0.99, clear_winner=0.99, fallback_low=0.99, supplementary=0.99, fallback_last=0.99)
    fresh_engine.org_settings["northwind"] = fresh_engine.settings.replace(thresholds=strict)
    assert _only(question, fresh_engine) == ("select", "not_selected")


def test_a_tiny_budget_loses_the_memory_at_budget(fresh_engine: dossier.Engine) -> None:
    question = JANE_OLD_DISCOUNT.model_copy(update={"request": {"budget": {"totalTokens": 40}}})
    assert _only(question, fresh_engine) == ("budget", "over_budget")
