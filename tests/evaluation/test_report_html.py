"""``dossier eval --html``: one self-contained page with the quality per category and the evidence-loss funnel."""

from __future__ import annotations

import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dossier import MissingExtra
from dossier.cli import app
from dossier.evaluation.dataset import load_dataset
from dossier.evaluation.report_html import funnel, gold_items, render_html
from dossier.evaluation.runner import EvalReport

DATASET = Path(__file__).resolve().parents[2] / "examples" / "eval" / "sample-questions.json"


class Page(HTMLParser):
    """Every tag and attribute of a page, and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _report(losses: dict[str, int]) -> EvalReport:
    metrics = {"document_accuracy": 0.5, "section_accuracy": None}
    return EvalReport(dataset="t", store="s", questions=2, overall=metrics, by_category={"direct": metrics},
                      counts={"direct": 2}, leakage=0, leaked=[], latency_ms={"p50": 1.0, "p95": 2.0}, model_calls=0,
                      tokens=0, losses=losses)  # fmt: skip


def test_the_funnel_counts_down_from_every_gold_item_layer_by_layer() -> None:
    report = _report({"recall: never_recalled": 3, "select: not_selected": 2, "budget: over_budget": 1,
                      "rerank: cut": 1, "govern: not_visible": 1})  # fmt: skip
    stages = funnel(report, 20)
    assert [s for s, _, _ in stages] == ["plan", "recall", "filter", "govern", "select", "rerank", "budget"]
    assert stages == [("plan", 20, 0), ("recall", 17, 3), ("filter", 17, 0), ("govern", 16, 1), ("select", 14, 2),
                      ("rerank", 13, 1), ("budget", 12, 1)]  # fmt: skip


def test_without_pygal_the_report_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pygal", None)  # as if it were not installed
    with pytest.raises(MissingExtra, match=r"dossier-engine\[report\]"):
        render_html(_report({}), gold_total=0)


def test_eval_writes_one_self_contained_page_with_categories_and_funnel(tmp_path: Path) -> None:
    small = json.loads(DATASET.read_text())
    small["bundle"] = str(DATASET.parent / small["bundle"])
    by_category: dict[str, list[dict]] = {}
    for question in small["questions"]:
        by_category.setdefault(question["category"], []).append(question)
    small["questions"] = [q for qs in by_category.values() for q in qs[:2]]  # two questions of every category
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    out = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["eval", str(path), "--html", str(out)])
    assert result.exit_code == 0, result.output
    assert f"HTML report written to {out}" in result.stdout
    page = out.read_text(encoding="utf-8")

    # self-contained: nothing to fetch, from anywhere
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", page, re.I), "an address in the page"
    assert "@import" not in page and "<script" not in page.lower() and "<link" not in page.lower()
    assert all(ref.startswith("#") for ref in re.findall(r"url\(\s*['\"]?([^)'\"]*)", page)), "url() outside the page"
    parsed = Page()
    parsed.feed(page)
    for tag, attrs in parsed.tags:
        for name in ("src", "href", "xlink:href", "srcset", "data", "action"):
            value = attrs.get(name)
            assert value is None or value.startswith("#"), f"<{tag} {name}={value!r}>"
    assert {tag for tag, _ in parsed.tags} >= {"html", "svg", "table"}
    assert sum(1 for tag, _ in parsed.tags if tag == "svg") == 2  # quality bars, funnel

    # what it shows: every category (in the bars and the table), and the funnel from every gold item down
    text = " ".join(" ".join(parsed.text).split())
    for category in by_category:
        assert page.count(f">{category}<") >= 2, category  # an axis label of the chart and a table cell
    total = gold_items(load_dataset(path))
    assert total > 0 and "Evidence-loss funnel" in text and f"{total} gold items named by the questions" in text
    for stage in ("after plan", "after recall", "after govern", "after select", "after budget"):
        assert page.count(f">{stage}<") >= 2, stage  # chart label and table row
    assert "leakage: 0" in text


def test_eval_html_into_a_folder_that_is_not_there_fails_before_the_run(tmp_path: Path) -> None:
    small = json.loads(DATASET.read_text())
    small["bundle"] = str(DATASET.parent / small["bundle"])
    small["questions"] = small["questions"][:2]
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    result = CliRunner().invoke(app, ["eval", str(path), "--html", str(tmp_path / "no" / "such" / "r.html")])
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()  # one line, and no question ran
    assert line.startswith("error: cannot write") and "r.html" in line and str(tmp_path / "no" / "such") in line
