"""How far a set's figures can be trusted: bootstrap intervals of its metrics, and of the change from an
earlier report question by question (``dossier eval --against``)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dossier.cli import app
from dossier.evaluation.intervals import change, interval, per_question

DATASET = Path(__file__).resolve().parents[2] / "examples" / "eval" / "sample-questions.json"


def test_an_interval_holds_the_mean_narrows_with_more_questions_and_repeats() -> None:
    few = [1.0, 0.0] * 10  # 20 questions, half right
    many = [1.0, 0.0] * 200  # 400 questions, half right
    low, high = interval(few)  # type: ignore[misc]
    assert 0.2 < low < 0.5 < high < 0.8
    wide, narrow = high - low, (lambda r: r[1] - r[0])(interval(many))  # type: ignore[arg-type]
    assert narrow < wide / 3  # about sqrt(20) times narrower
    assert interval(few) == interval(few)  # seeded: the same report gives the same intervals
    assert interval([1.0] * 30) == (1.0, 1.0)
    assert interval([]) is None


def test_a_change_is_paired_by_question_and_counts_what_went_up_and_down() -> None:
    before = {f"q{i}": 1.0 if i % 2 else 0.0 for i in range(60)} | {"gone": 1.0, "not-applicable": None}
    after = dict(before) | {"q0": 1.0, "q2": 1.0, "q1": 0.0, "new": 0.0, "not-applicable": None}
    del after["gone"]
    found = change(before, after)
    assert found is not None
    assert found.questions == 60  # the questions both hold, where the metric applies in both
    assert (found.better, found.worse) == (2, 1)
    assert abs(found.difference - 1 / 60) < 1e-4 and found.low <= found.difference <= found.high
    assert not found.clear  # one question net of sixty: noise
    everything = change({q: 0.0 for q in before}, {q: 1.0 for q in before})
    assert everything is not None and everything.clear and everything.low == everything.high == 1.0
    assert change({"a": None}, {"a": 1.0}) is None


def test_eval_against_an_earlier_report_shows_each_metrics_change(tmp_path: Path) -> None:
    small = json.loads(DATASET.read_text())
    small["bundle"] = str(DATASET.parent / small["bundle"])
    small["questions"] = [q for q in small["questions"] if q["gold"].get("sections")][:10]
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    first = tmp_path / "first.json"
    assert CliRunner().invoke(app, ["eval", str(path), "--json", str(first)]).exit_code == 0
    report = json.loads(first.read_text())
    assert report["overall_interval"]["section_accuracy"][0] <= report["overall"]["section_accuracy"]
    # an earlier report in which every question found its section: now lower or the same, question by question
    earlier = json.loads(first.read_text())
    for q in earlier["per_question"]:
        q["metrics"]["section_accuracy"] = 1.0
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    second = tmp_path / "second.json"
    result = CliRunner().invoke(app, ["eval", str(path), "--against", str(tmp_path / "earlier.json"), "--json", str(second)])
    assert result.exit_code == 0, result.output
    assert "against" in result.stdout and "95% interval" in result.stdout
    compared = json.loads(second.read_text())["against"]["metrics"]["section_accuracy"]
    missed = sum(1 for v in per_question(report, "section_accuracy").values() if v == 0.0)
    assert compared["questions"] == 10 and compared["worse"] == missed and compared["better"] == 0
    assert compared["before"] == 1.0 and abs(compared["difference"] + missed / 10) < 1e-4
    # a report of other questions: said so, not a table left out without a word
    for q in earlier["per_question"]:
        q["id"] = "other-" + q["id"]
    (tmp_path / "other.json").write_text(json.dumps(earlier))
    result = CliRunner().invoke(app, ["eval", str(path), "--against", str(tmp_path / "other.json")])
    assert result.exit_code == 0 and "no question in common" in result.stdout, result.output


def test_eval_against_a_file_that_is_no_report_is_refused_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "other.json").write_text(json.dumps({"questions": 3}))
    (tmp_path / "broken.json").write_text("{not json")
    for name, says in (("other.json", "no per-question metrics"), ("broken.json", "is not JSON"),
                       ("missing.json", "cannot read")):  # fmt: skip
        result = CliRunner().invoke(app, ["eval", str(DATASET), "--against", str(tmp_path / name)])
        assert result.exit_code == 2 and says in result.stderr, (name, result.output)


def test_eval_of_a_dataset_without_questions_is_refused_in_one_line(tmp_path: Path) -> None:
    empty = json.loads(DATASET.read_text())
    empty["bundle"] = str(DATASET.parent / empty["bundle"])
    empty["questions"] = []
    path = tmp_path / "empty.json"
    path.write_text(json.dumps(empty))
    result = CliRunner().invoke(app, ["eval", str(path)])
    assert result.exit_code == 2 and "has no questions" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1
