"""The evaluation's evidence trace names the layer where an injected loss happened: a threshold is
raised (or the budget shrunk) until a known gold item drops, and the report must say where."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import dossier
from dossier.providers.ranker import FILE_ENV
from dossier.evaluation.dataset import Dataset, Gold, Question
from dossier.evaluation.runner import run
from dossier.loading import read_bundle

from .conftest import SAMPLE
from .faults import FaultyStore, kind_is


def q(**fields) -> Question:  # type: ignore[no-untyped-def]
    return Question.model_validate(fields)


JANE_OLD_DISCOUNT = q(id="old", org="northwind", caller="ana", record={"email": "jane@acme.com"},
                      message="How much of a price cut did she get on her initial purchase, and who signed off on it?",
                      gold={"memories": ["mem-0005"], "records": ["rec-jane"]})  # fmt: skip


def _losses(question: Question, engine: dossier.Engine) -> dict[tuple[str, str], tuple[str, str]]:
    raw = json.loads(SAMPLE.read_text())
    report = run(engine, Dataset("one", read_bundle(raw), [question], raw))
    return {(l.kind, l.id): (l.layer, l.reason) for l in report.results[0].losses}


def _only(question: Question, engine: dossier.Engine) -> tuple[str, str]:
    raw = json.loads(SAMPLE.read_text())
    report = run(engine, Dataset("one", read_bundle(raw), [question], raw))
    found = {(l.kind, l.id): (l.layer, l.reason) for l in report.results[0].losses}
    return found.get(("memories", "mem-0005")) or found.get(("sections", "doc-refund-s3")) or ("", "")


def _shipped(kind: str, **thresholds: float) -> dict:
    spec = json.loads((Path(dossier.__file__).parent / "providers" / "data" / "ranker.json").read_text())[kind]
    return {**spec, "thresholds": {**spec.get("thresholds", {}), **thresholds}}


def test_raising_the_memory_rankers_floor_loses_the_memory_at_recall(fresh_engine: dossier.Engine) -> None:
    # words alone (full text) would still find it; take them away so the floor decides
    fresh_engine.store = FaultyStore(fresh_engine.store, {"search_text": kind_is("memory")})  # type: ignore[assignment]
    assert _only(JANE_OLD_DISCOUNT, fresh_engine) == ("", ""), "found at the shipped floor"
    fresh_engine.org_settings["northwind"] = fresh_engine.settings.replace(rankers={"memories": _shipped("memories", floor=0.999)})
    assert _only(JANE_OLD_DISCOUNT, fresh_engine) == ("recall", "below_threshold")


def test_raising_the_semantic_floor_loses_the_memory_at_recall_without_a_ranker(
    fresh_engine: dossier.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FILE_ENV, str(tmp_path / "missing.json"))  # the heuristic ranks
    fresh_engine.store = FaultyStore(fresh_engine.store, {"search_text": kind_is("memory")})  # type: ignore[assignment]
    assert _only(JANE_OLD_DISCOUNT, fresh_engine) == ("", ""), "found at the shipped floor"
    t = fresh_engine.settings.thresholds
    fresh_engine.org_settings["northwind"] = fresh_engine.settings.replace(thresholds=dataclasses.replace(t, memory_semantic=0.99))
    assert _only(JANE_OLD_DISCOUNT, fresh_engine) == ("recall", "below_threshold")


REFUND = q(id="refund", org="northwind", caller="ana", message="How many days after purchase can a customer get a full refund?",
           gold={"documents": ["doc-refund"], "sections": ["doc-refund-s3"]})  # fmt: skip


def test_raising_the_section_rankers_thresholds_loses_the_section_at_select(fresh_engine: dossier.Engine) -> None:
    assert _only(REFUND, fresh_engine) == ("", "")
    strict = _shipped("sections", first_pick=1.01, other_pick=1.01, clear_winner=1.01, fallback_low=1.01, supplementary=1.01)
    fresh_engine.org_settings["northwind"] = fresh_engine.settings.replace(rankers={"sections": strict})
    assert _only(REFUND, fresh_engine) == ("select", "not_selected")


def test_raising_the_selector_floors_loses_the_section_at_select_without_a_ranker(
    fresh_engine: dossier.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FILE_ENV, str(tmp_path / "missing.json"))
    assert _only(REFUND, fresh_engine) == ("", "")
    t = fresh_engine.settings.thresholds
    strict = dataclasses.replace(t, selector_floor=0.99, clear_winner=0.99, fallback_low=0.99, supplementary=0.99, fallback_last=0.99)
    fresh_engine.org_settings["northwind"] = fresh_engine.settings.replace(thresholds=strict)
    assert _only(REFUND, fresh_engine) == ("select", "not_selected")


def test_a_tiny_budget_loses_the_memory_at_budget(fresh_engine: dossier.Engine) -> None:
    newest = JANE_OLD_DISCOUNT.model_copy(update={"gold": Gold(memories=["mem-0005", "mem-0042"], records=["rec-jane"])})
    report_losses = _losses(newest, fresh_engine)
    assert ("memories", "mem-0042") not in report_losses  # Jane's newest memory: always in the recent tier
    tiny = newest.model_copy(update={"request": {"budget": {"totalTokens": 40}}})
    assert _losses(tiny, fresh_engine)[("memories", "mem-0042")] == ("budget", "over_budget")
