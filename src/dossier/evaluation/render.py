"""Terminal tables for evaluation and calibration reports."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .calibrate import Calibration
from .metrics import METRICS
from .runner import EvalReport


SHORT = {"document_accuracy": "doc acc", "section_accuracy": "sec acc", "section_recall@3": "sec R@3",
         "discovery": "discovery", "memory_recall": "mem R", "property_recall": "prop R", "edge_recall": "edge R",
         "record_accuracy": "record", "abstention": "abstain"}  # fmt: skip


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render_eval(console: Console, report: EvalReport) -> None:
    table = Table(title=escape(f"{report.dataset}: {report.questions} questions on {report.store}"), title_justify="left")
    table.add_column("category")
    table.add_column("n", justify="right")
    for metric in METRICS:
        table.add_column(SHORT[metric], justify="right")
    for category, values in report.by_category.items():
        table.add_row(escape(category), str(report.counts[category]), *(_fmt(values[m]) for m in METRICS))
    table.add_row("[bold]overall[/]", str(report.questions), *(f"[bold]{_fmt(report.overall[m])}[/]" for m in METRICS))
    console.width = max(console.width, 140)
    console.print(table)
    shown = [(m, v) for m in METRICS if (v := report.intervals.get(m)) is not None]
    if shown:
        console.print("95% intervals (questions resampled): " + ", ".join(
            f"{SHORT[m]} {low:.3f}-{high:.3f}" for m, (low, high) in shown), highlight=False)  # fmt: skip
    if report.against:
        against = Table(title=escape(f"against {report.against_file}, question by question (the questions both hold)"),
                        title_justify="left")  # fmt: skip
        for column in ("metric", "questions", "before", "after", "difference", "95% interval", "better", "worse"):
            against.add_column(column, justify="left" if column == "metric" else "right")
        for metric, c in report.against.items():
            mark = "[bold]" if c.clear else ""
            against.add_row(SHORT[metric], str(c.questions), _fmt(c.before), _fmt(c.after),
                            f"{mark}{c.difference:+.3f}", f"{c.low:+.3f} .. {c.high:+.3f}", str(c.better), str(c.worse))
        console.print(against)
        console.print("a bold difference is one whose interval leaves out 0; the others these questions cannot "
                      "tell from noise", highlight=False)
    elif report.against_file:  # said, not left out: a report of another set shares no question with this one
        console.print(f"against {report.against_file}: no question in common with this run (a report of another "
                      f"set?): nothing to compare", markup=False, highlight=False)  # fmt: skip
    leak_style = "green" if report.leakage == 0 else "bold red"
    console.print(
        f"leakage: [{leak_style}]{report.leakage}[/]   latency p50 {report.latency_ms['p50']:.1f} ms, "
        f"p95 {report.latency_ms['p95']:.1f} ms   model calls {report.model_calls}, tokens {report.tokens}"
    )
    for leak in report.leaked:
        console.print(f"  [red]leaked[/] {escape(str(leak))}", highlight=False)
    for source, used in report.rankers.items():
        ran = ", ".join(f"{name} ({n} calls)" for name, n in sorted(used.items()))
        console.print(f"{source} ranker: {ran}", markup=False, highlight=False)
    if report.model_by_layer:
        cost = Table(title="model cost per layer (all questions)", title_justify="left")
        for column in ("layer", "calls", "errors", "prompt tokens", "cached", "completion tokens", "per question"):
            cost.add_column(column, justify="left" if column == "layer" else "right")
        for layer, used in report.model_by_layer.items():
            per_question = (used["prompt_tokens"] + used["completion_tokens"]) / max(report.questions, 1)
            cost.add_row(layer, str(used["calls"]), str(used["errors"]), str(used["prompt_tokens"]),
                         str(used["cached_tokens"]), str(used["completion_tokens"]), f"{per_question:.0f}")  # fmt: skip
        console.print(cost)
    if report.deadline:
        timing = Table(title="model steps against the deadline (most often out of time first)", title_justify="left")
        for column in ("step", "questions", "out of time", "circuit open", "failed", "median ms", "max ms"):
            timing.add_column(column, justify="left" if column == "step" else "right")
        for step, t in report.deadline.items():
            timing.add_row(step, *(f"{t[k]:g}" for k in ("questions", "out_of_time", "circuit_open", "error", "median_ms", "max_ms")))
        console.print(timing)
    if report.losses:
        losses = Table(title="where gold evidence was lost (last layer that had it: reason)", title_justify="left")
        losses.add_column("layer: reason")
        losses.add_column("gold items", justify="right")
        for key, count in report.losses.items():
            losses.add_row(escape(key), str(count))
        console.print(losses)


def render_calibration(console: Console, calibration: Calibration) -> None:
    table = Table(title=escape(f"thresholds for {calibration.model}"), title_justify="left")
    for column in ("threshold", "current", "recommended", "objective", "quality by value"):
        table.add_column(column, justify="left" if column in ("threshold", "objective", "quality by value") else "right")
    for scan in calibration.scans:
        marks = "  ".join(f"{v:g}:{q:.3f}" for v, q in sorted(scan.quality.items()))
        table.add_row(scan.threshold, f"{scan.current:g}", f"{scan.recommended:g}", "+".join(scan.objective), marks)
    console.width = max(console.width, 160)
    console.print(table)
    dist = Table(title="candidate scores at recall: gold vs other", title_justify="left")
    for column in ("source", "kind", "n", "p10", "p25", "median", "p75", "p90"):
        dist.add_column(column, justify="left" if column in ("source", "kind") else "right")
    for source, kinds in calibration.distributions.items():
        for kind, stats in kinds.items():
            dist.add_row(source, kind, *(f"{stats[k]:g}" for k in ("n", "p10", "p25", "median", "p75", "p90")))
    console.print(dist)
    before, after = calibration.before.overall, calibration.after.overall
    console.print("quality before -> after: " + ", ".join(
        f"{m} {_fmt(before[m])} -> {_fmt(after[m])}" for m in METRICS if before[m] is not None
    ))  # fmt: skip
