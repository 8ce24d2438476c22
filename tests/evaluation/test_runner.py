"""The evaluation harness on the project's own labelled set: metrics, leakage, evidence losses, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dossier
from dossier.cli import app
from dossier.evaluation.dataset import Dataset, Question, load_dataset
from dossier.evaluation.metrics import losses, score
from dossier.evaluation.runner import run

DATASET = Path(__file__).resolve().parents[2] / "examples" / "eval" / "sample-questions.json"


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return load_dataset(DATASET)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory, embedder, dataset: Dataset):  # type: ignore[no-untyped-def]
    with dossier.open(f"sqlite:///{tmp_path_factory.mktemp('eval')}/e.db", embedder=embedder) as engine:
        engine.load_bundle(dataset.bundle)
        yield engine


def test_the_project_set_covers_every_category(dataset: Dataset) -> None:
    categories = {q.category for q in dataset.questions}
    assert len(dataset.questions) >= 80
    assert {"direct", "paraphrase", "discovery", "memory", "property", "graph", "exact_code", "sibling",
            "role_restricted", "tombstone", "merge", "cross_org", "unanswerable"} <= categories  # fmt: skip


def test_full_run_has_no_leakage_and_reports_every_metric(loaded: dossier.Engine, dataset: Dataset) -> None:
    report = run(loaded, dataset)
    assert report.leakage == 0, report.leaked
    assert report.questions == len(dataset.questions)
    for metric in ("document_accuracy", "section_accuracy", "section_recall@3", "memory_recall", "record_accuracy"):
        assert report.overall[metric] is not None and 0.0 <= report.overall[metric] <= 1.0
    assert report.overall["record_accuracy"] == 1.0
    assert report.latency_ms["p95"] >= report.latency_ms["p50"] > 0
    # every lost gold item is attributed to a layer
    assert all(": " in key for key in report.losses)
    assert sum(report.losses.values()) == sum(len(r.losses) for r in report.results)


def test_a_leak_is_counted_with_its_id(loaded: dossier.Engine, dataset: Dataset) -> None:
    question = next(q for q in dataset.questions if q.gold.sections)
    leaky = question.model_copy(update={"forbidden": list(question.gold.sections)})  # pretend the answer is forbidden
    report = run(loaded, Dataset("leaky", dataset.bundle, [leaky], dataset.raw_bundle))
    if report.results[0].metrics["section_recall@3"]:
        assert report.leakage >= 1 and question.gold.sections[0] in " ".join(report.leaked)


def test_losses_name_the_layer(loaded: dossier.Engine) -> None:
    question = Question(id="t", org="northwind", caller="ana", record={"email": "jane@acme.com"},
                        message="What pricing did we discuss?", gold={"memories": ["mem-0001"], "sections": ["doc-travel-s1"], "records": ["rec-jane"]})  # fmt: skip
    response = loaded.retrieve({"mode": "brief", "record": question.record, "message": question.message,
                                "trace": True, "budget": {"totalTokens": 300}}, org="northwind", caller="ana")  # fmt: skip
    found = {(l.kind, l.id): (l.layer, l.reason) for l in losses(question, response)}
    assert found[("sections", "doc-travel-s1")][0] in ("recall", "select")
    assert ("memories", "mem-0001") in found
    metrics = score(question, response, {})
    assert metrics["memory_recall"] in (0.0, 1.0) and metrics["record_accuracy"] == 1.0


def test_eval_cli_prints_tables_and_writes_json(tmp_path: Path) -> None:
    small = json.loads(DATASET.read_text())
    small["bundle"] = str(DATASET.parent / small["bundle"])
    small["questions"] = small["questions"][:12]
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["eval", str(path), "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "overall" in result.stdout and "leakage: 0" in result.stdout
    report = json.loads(out.read_text())
    assert report["questions"] == 12 and len(report["per_question"]) == 12 and report["leakage"] == 0


def test_eval_cli_prints_names_that_look_like_markup_as_they_are(tmp_path: Path) -> None:
    small = json.loads(DATASET.read_text())
    small["bundle"] = str(DATASET.parent / small["bundle"])
    small["name"] = "set [/] [bold]x[/bold]"
    small["questions"] = [{**q, "category": "odd[/]"} for q in small["questions"][:3]]
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    result = CliRunner().invoke(app, ["eval", str(path)])
    assert result.exit_code == 0, result.output
    assert "set [/] [bold]x[/bold]" in result.stdout and "odd[/]" in result.stdout


def test_eval_cli_rejects_a_broken_dataset(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text(json.dumps({"bundle": {}, "questions": [{"id": "q", "org": "o"}]}))
    result = CliRunner().invoke(app, ["eval", str(path)])
    assert result.exit_code == 2 and "questions.0" in result.stderr


def test_calibrate_refuses_a_question_asked_as_a_caller_its_bundle_does_not_hold(tmp_path: Path) -> None:
    small = json.loads(DATASET.read_text())
    small["bundle"] = str(DATASET.parent / small["bundle"])
    small["questions"] = [{**small["questions"][0], "caller": "nobody"}]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(small))
    result = CliRunner().invoke(app, ["calibrate", str(path)])
    assert result.exit_code == 2 and result.stdout == ""  # before the scan, which would have printed
    assert result.stderr.splitlines() == [f"error: dataset {path}: question {small['questions'][0]['id']!r} asks as "
                                          "'nobody' of org 'northwind', which its bundle does not hold"]  # fmt: skip


def test_calibrate_writes_thresholds_that_later_calls_use(tmp_path: Path) -> None:
    small = json.loads(DATASET.read_text())
    small["bundle"] = str(DATASET.parent / small["bundle"])
    small["questions"] = small["questions"][:20]
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    db = f"sqlite:///{tmp_path}/target.db"
    earlier = {"service": {"max_deadline_ms": 60_000}, "rankers": {"sections": {"features": ["cosine"], "coef": [1.0]}}}
    with dossier.open(db) as engine:  # the org's service limits, and a ranker fitted earlier, are kept
        engine.save_org_settings("northwind", earlier)
    result = CliRunner().invoke(app, ["calibrate", str(path), "--write", "--db", db, "--json", str(tmp_path / "c.json")])
    assert result.exit_code == 0, result.output
    assert "an org's own ranker needs at least 30: the org's ranker fitted earlier stays" in result.stdout  # 20 are too few
    recommended = json.loads((tmp_path / "c.json").read_text())["recommended"]
    with dossier.open(db) as engine:
        stored = engine.store.get_settings(org="northwind")
        assert stored == {**earlier, "thresholds": recommended}
        assert engine.settings_for("northwind").thresholds.memory_semantic == recommended["memory_semantic"]


def test_an_orgs_fit_is_held_against_the_ranker_it_would_otherwise_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With $DOSSIER_RANKER_FILE naming another shipped file, calls without an org ranker run that file's
    model: an org's fit must beat that one, not the packaged model nobody runs."""
    from dossier import cli
    from dossier.providers import ranker

    packaged = json.loads((Path(ranker.__file__).parent / "data" / "ranker.json").read_text())
    packaged["sections"]["intercept"] = packaged["sections"]["intercept"] + 1.0
    other = tmp_path / "ranker.json"
    other.write_text(json.dumps(packaged))
    monkeypatch.delenv(ranker.FILE_ENV, raising=False)
    assert cli._ranker_to_beat().intercept != packaged["sections"]["intercept"]
    monkeypatch.setenv(ranker.FILE_ENV, str(other))
    assert cli._ranker_to_beat().intercept == packaged["sections"]["intercept"]
