"""The evaluation report as one self-contained HTML file (``dossier eval --html report.html``).

Charts are SVG drawn by pygal and written inline: the page loads nothing (no script, stylesheet, font or
image from anywhere), so it opens offline and can be mailed or archived as it is. pygal was chosen for
its size: about 2 MB installed with its dependencies, against about 100 MB for matplotlib (its fonts,
Pillow and the rest, beyond numpy) and 76 MB for plotly, whose pages also embed 4.8 MB of JavaScript.
"""

from __future__ import annotations

import html
import re
from typing import Any, Sequence

from ..errors import MissingExtra
from .dataset import Dataset
from .metrics import GOLD_SOURCES, METRICS
from .runner import EvalReport

#: the layers in the order evidence passes them; a gold item lost at a layer is missing from every later stage
STAGES = ("plan", "recall", "filter", "govern", "select", "budget")
SHORT = {"document_accuracy": "doc acc", "section_accuracy": "sec acc", "section_recall@3": "sec R@3",
         "discovery": "discovery", "memory_recall": "mem R", "property_recall": "prop R", "edge_recall": "edge R",
         "record_accuracy": "record", "abstention": "abstain"}  # fmt: skip
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1100px;
       color: #1f2328; padding: 0 1rem; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #d0d7de; }
table { border-collapse: collapse; font-size: .85rem; margin: .5rem 0 1rem; }
th, td { border: 1px solid #d0d7de; padding: .25rem .5rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr.overall td { font-weight: 600; }
.facts span { display: inline-block; margin-right: 1.5rem; }
.bad { color: #cf222e; font-weight: 600; } .good { color: #1a7f37; font-weight: 600; }
figure { margin: 0; } figcaption { font-size: .85rem; color: #57606a; }
svg { max-width: 100%; height: auto; }
"""


def gold_items(dataset: Dataset) -> int:
    """How many gold items the questions name, over the sources whose losses the trace reports."""
    return sum(len(getattr(q.gold, kind)) for q in dataset.questions for kind in GOLD_SOURCES)


def funnel(report: EvalReport, total: int) -> list[tuple[str, int, int]]:
    """(stage, gold items still present after it, gold items lost at it), from every gold item to those
    returned. Losses at a layer this list does not know are placed before ``budget``, the last layer."""
    lost: dict[str, int] = {}
    for key, count in report.losses.items():
        layer = key.split(":", 1)[0].strip()
        lost[layer] = lost.get(layer, 0) + count
    stages = [s for s in STAGES if s != "budget"] + sorted(set(lost) - set(STAGES)) + ["budget"]
    rows, present = [], total
    for stage in stages:
        present -= lost.get(stage, 0)
        rows.append((stage, present, lost.get(stage, 0)))
    return rows


def render_html(report: EvalReport, *, gold_total: int) -> str:
    """The whole page: summary, quality per category (bars and table), the evidence-loss funnel, losses
    by reason, model cost per layer and any leak."""
    try:
        import pygal
        from pygal.style import Style
    except ImportError as exc:
        raise MissingExtra("the HTML evaluation report", "report") from exc
    look = {"background": "white", "plot_background": "white", "font_family": "system-ui, sans-serif"}
    palette = ("#0969da", "#1a7f37", "#bf8700", "#8250df", "#cf222e", "#1b7c83", "#953800", "#6e7781", "#4d2d00")
    config: dict[str, Any] = {"js": [], "disable_xml_declaration": True, "print_zeroes": False}
    e = html.escape
    metrics = [m for m in METRICS if any(v[m] is not None for v in report.by_category.values())]
    categories = list(report.by_category)

    bars = pygal.HorizontalBar(width=1000, height=max(320, 34 * len(categories) * max(len(metrics), 1) // 3 + 120),
                               range=(0, 1), legend_at_bottom=True, title="quality per category",
                               style=Style(**look, colors=palette), **config)  # fmt: skip
    down = categories[::-1]  # pygal draws the first label at the bottom: reversed, the chart reads as the table
    bars.x_labels = down
    for metric in metrics:
        bars.add(SHORT.get(metric, metric), [report.by_category[c][metric] for c in down])

    stages = funnel(report, gold_total)
    chart = pygal.HorizontalStackedBar(width=1000, height=120 + 40 * (len(stages) + 1), legend_at_bottom=True,
                                       title="evidence-loss funnel: gold items per layer", print_values=True,
                                       style=Style(**look, colors=("#0969da", "#cf222e")), **config)  # fmt: skip
    chart.x_labels = ["gold items", *(f"after {stage}" for stage, _, _ in stages)][::-1]
    chart.add("still present", [gold_total, *(present for _, present, _ in stages)][::-1])
    chart.add("lost at this layer", [None, *((lost or None) for _, _, lost in stages)][::-1])

    leak_class = "good" if report.leakage == 0 else "bad"
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>dossier eval: {e(report.dataset)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>dossier eval: {e(report.dataset)}</h1>",
        '<p class="facts">'
        f"<span>{report.questions} questions</span><span>store: {e(report.store)}</span>"
        f'<span>leakage: <b class="{leak_class}">{report.leakage}</b></span>'
        f"<span>latency p50 {report.latency_ms['p50']:.1f} ms, p95 {report.latency_ms['p95']:.1f} ms</span>"
        f"<span>model calls {report.model_calls}, tokens {report.tokens}</span></p>",
        "<h2>Quality per category</h2>",
        _figure(bars.render(is_unicode=True), "Each bar is a metric's mean over the category's questions "
                "(metrics that do not apply to a category have no bar)."),  # fmt: skip
        _table(["category", "n", *(SHORT.get(m, m) for m in METRICS)],
               [[c, report.counts[c], *(_fmt(report.by_category[c][m]) for m in METRICS)] for c in categories]
               + [["95% interval", "", *(_span(report.intervals.get(m)) for m in METRICS)]]
               + [["overall", report.questions, *(_fmt(report.overall[m]) for m in METRICS)]],
               last_row_class="overall"),  # fmt: skip
        "<p>The interval row: where each overall figure lies with 95% confidence, the questions resampled "
        "with replacement (a set of a hundred questions measures a share to within several points).</p>",
        "<h2>Evidence-loss funnel</h2>",
        _figure(chart.render(is_unicode=True), f"{gold_total} gold items named by the questions; each gold item "
                "missing from a response is counted at the last layer that still had it."),  # fmt: skip
        _table(["stage", "still present", "lost at this layer"],
               [["gold items", gold_total, ""], *([f"after {s}", p, lost] for s, p, lost in stages)]),
    ]  # fmt: skip
    if report.losses:
        parts += ["<h3>Losses by layer and reason</h3>", _table(["layer: reason", "gold items"], list(report.losses.items()))]
    if report.model_by_layer:
        parts += ["<h2>Model cost per layer</h2>", _table(
            ["layer", "calls", "errors", "prompt tokens", "cached", "completion tokens"],
            [[layer, u["calls"], u["errors"], u["prompt_tokens"], u["cached_tokens"], u["completion_tokens"]]
             for layer, u in report.model_by_layer.items()])]  # fmt: skip
    if report.rankers:
        parts += ["<h2>Rankers</h2>", _table(["source", "ranker", "calls"],
                  [[source, name, n] for source, used in report.rankers.items() for name, n in sorted(used.items())])]  # fmt: skip
    if report.leaked:
        parts += ["<h2>Leaked items</h2>", "<ul>", *(f'<li class="bad">{e(leak)}</li>' for leak in report.leaked), "</ul>"]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _span(found: tuple[float, float] | None) -> str:
    return "-" if found is None else f"{found[0]:.3f}-{found[1]:.3f}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{_inline(svg)}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _inline(svg: str) -> str:
    """pygal's SVG made fit to sit inside HTML: no comments (they carry pygal's web address), no script (the
    settings of pygal's tooltip script, which the page does not load) and no namespace declarations (an HTML
    parser places <svg> in its namespace by itself)."""
    svg = re.sub(r"<!--.*?-->", "", svg, flags=re.S)
    svg = re.sub(r"<script\b.*?</script>", "", svg, flags=re.S | re.I)
    return re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], *, last_row_class: str = "") -> str:
    e = html.escape
    out = ["<table><thead><tr>", *(f"<th>{e(str(h))}</th>" for h in head), "</tr></thead><tbody>"]
    for n, row in enumerate(rows):
        attr = f' class="{last_row_class}"' if last_row_class and n == len(rows) - 1 else ""
        out.append(f"<tr{attr}>" + "".join(f"<td>{e(str(cell))}</td>" for cell in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)
