"""Metrics against hand-computed values on a tiny dataset (the evidence trace naming the layer of an
injected loss is tested in tests/retrieve/test_evidence_trace.py, beside the sample-org fixtures)."""

from __future__ import annotations

import dataclasses

import pytest

import dossier
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
