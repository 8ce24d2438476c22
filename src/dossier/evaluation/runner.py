"""Run a labelled dataset through the public ``retrieve`` and summarise quality per category and layer."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..engine import Engine, open_engine
from ..errors import redacted_url
from ..providers.embeddings import Embedder
from .dataset import Dataset, Question, load_dataset
from .intervals import Change, change, interval, per_question
from .leakage import World, leaks
from .metrics import COST_FIELDS, METRICS, QuestionResult, candidate_scores, deadline_steps, losses, model_cost, score

DEFAULT_REQUEST = {"mode": "brief", "budget": {"totalTokens": 8000}}


@dataclass
class EvalReport:
    dataset: str
    store: str
    questions: int
    overall: dict[str, float | None]
    by_category: dict[str, dict[str, float | None]]
    counts: dict[str, int]
    leakage: int
    leaked: list[str]
    latency_ms: dict[str, float]
    model_calls: int
    tokens: int  # prompt + completion tokens of every model call
    losses: dict[str, int]  # "layer: reason" -> count
    results: list[QuestionResult] = field(default_factory=list, repr=False)
    model_by_layer: dict[str, dict[str, int]] = field(default_factory=dict)  # layer -> calls, errors, tokens
    rankers: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> ranker that ran -> calls
    # model step -> questions it ran in, how many ran out of the deadline, found the circuit open, failed,
    # and its median and slowest time (ms); most often out of time first
    deadline: dict[str, dict[str, float]] = field(default_factory=dict)
    # each overall figure's 95% interval, the questions resampled (evaluation.intervals; None: no question)
    intervals: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    against: dict[str, Change] = field(default_factory=dict)  # metric -> change from an earlier report (--against)
    against_file: str = ""

    def as_dict(self) -> dict[str, Any]:
        against = {"file": self.against_file, "metrics": {m: c.as_dict() for m, c in self.against.items()}}
        return {
            "dataset": self.dataset, "store": self.store, "questions": self.questions, "overall": self.overall,
            "overall_interval": {m: None if v is None else list(v) for m, v in self.intervals.items()},
            **({"against": against} if self.against_file else {}),
            "by_category": self.by_category, "counts": self.counts, "leakage": self.leakage, "leaked": self.leaked,
            "latency_ms": self.latency_ms, "model_calls": self.model_calls, "tokens": self.tokens,
            "model_by_layer": self.model_by_layer, "losses": self.losses, "rankers": self.rankers,
            "deadline": self.deadline,
            "per_question": [
                {"id": r.id, "category": r.category, "metrics": r.metrics, "latency_ms": round(r.latency_ms, 2),
                 "leaks": r.leaks, "losses": [f"{l.kind} {l.id}: {l.layer} {l.reason}" for l in r.losses],
                 "returned": r.returned, "model": r.model, "deadline": r.deadline}
                for r in self.results
            ],
        }  # fmt: skip


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present) / len(present), 4) if present else None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else 0.0


def ask(engine: Engine, question: Question, defaults: dict[str, Any]) -> Any:
    request = {**defaults, **question.request, "message": question.message, "trace": True}
    if question.record is not None:
        request["record"] = question.record
    # the operator's full evidence: the trace also names what the caller may not see (govern: not_visible)
    return engine.retrieve(request, org=question.org, caller=question.caller, full_trace=True)


def run(engine: Engine, dataset: Dataset, *, request: dict[str, Any] | None = None,
        progress: Callable[[int, int], None] | None = None, store_label: str = "") -> EvalReport:  # fmt: skip
    """Every question through ``engine.retrieve``; the engine must already hold the dataset's bundle."""
    defaults = {**DEFAULT_REQUEST, **(request or {})}
    world = World.of(dataset.raw_bundle)
    titles = {d.id: d.title for d in dataset.bundle.documents}
    results: list[QuestionResult] = []
    for n, question in enumerate(dataset.questions, start=1):
        started = time.perf_counter()
        response = ask(engine, question, defaults)
        elapsed = (time.perf_counter() - started) * 1000
        results.append(
            QuestionResult(
                id=question.id, category=question.category, answerable=question.answerable, latency_ms=elapsed,
                metrics=score(question, response, titles),
                leaks=leaks(world, response, org=question.org, caller=question.caller, forbidden=set(question.forbidden)),
                losses=losses(question, response),
                returned={name: [getattr(i, "section_id", None) or getattr(i, "id", None) or f"{i.record_id}/{i.name}"
                                 for i in r.items] for name, r in response.sources.items()},
                candidate_scores=candidate_scores(question, response),
                gold={"memory": set(question.gold.memories), "property": set(question.gold.properties),
                      "section": set(question.gold.sections)},
                model=model_cost(response),
                rankers={source: str(response.route[source].detail["ranker"]) for source in ("documents", "memories")
                         if source in response.route and "ranker" in response.route[source].detail},
                deadline=deadline_steps(response),
            )
        )  # fmt: skip
        if progress:
            progress(n, len(dataset.questions))
    return summarise(dataset.name, redacted_url(store_label or engine.store.url), results)


def summarise(name: str, store: str, results: list[QuestionResult]) -> EvalReport:
    by_category: dict[str, list[QuestionResult]] = defaultdict(list)
    for r in results:
        by_category[r.category].append(r)
    loss_counts = Counter(f"{l.layer}: {l.reason}" for r in results for l in r.losses)
    leaked = sorted({f"{r.id}: {leak}" for r in results for leak in r.leaks})
    latencies = [r.latency_ms for r in results]
    rankers: dict[str, dict[str, int]] = {}
    for r in results:
        for source, ranker in r.rankers.items():
            rankers.setdefault(source, {})[ranker] = rankers.get(source, {}).get(ranker, 0) + 1
    by_layer: dict[str, dict[str, int]] = {}
    for r in results:
        for layer, used in r.model.items():
            into = by_layer.setdefault(layer, dict.fromkeys(COST_FIELDS, 0))
            for name in COST_FIELDS:
                into[name] += used[name]
    return EvalReport(
        dataset=name, store=store, questions=len(results), deadline=deadline_summary(results),
        overall={m: _mean([r.metrics[m] for r in results]) for m in METRICS},
        intervals={m: interval([v for r in results if (v := r.metrics[m]) is not None]) for m in METRICS},
        by_category={c: {m: _mean([r.metrics[m] for r in rs]) for m in METRICS} for c, rs in sorted(by_category.items())},
        counts={c: len(rs) for c, rs in sorted(by_category.items())},
        leakage=len(leaked), leaked=leaked,
        latency_ms={"p50": round(statistics.median(latencies), 2) if latencies else 0.0,
                    "p95": round(_percentile(latencies, 0.95), 2)},
        model_calls=sum(u["calls"] for u in by_layer.values()),
        tokens=sum(u["prompt_tokens"] + u["completion_tokens"] for u in by_layer.values()),
        losses=dict(loss_counts.most_common()), results=results, model_by_layer=by_layer, rankers=rankers,
    )  # fmt: skip


def compare(report: EvalReport, earlier: dict[str, Any], *, label: str) -> None:
    """Set ``report.against``: each metric's change from the ``--json`` report ``earlier``, question by question
    (the questions both hold, where the metric applies in both)."""
    for metric in METRICS:
        now = {r.id: r.metrics[metric] for r in report.results}
        found = change(per_question(earlier, metric), now)
        if found is not None:
            report.against[metric] = found
    report.against_file = label


def deadline_summary(results: list[QuestionResult]) -> dict[str, dict[str, float]]:
    """Per model step: questions it ran in, out of time (``timeout``/``no_time``), ``circuit_open``,
    ``error``, and its median and slowest ms; the steps that most often ran out of time first."""
    steps: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        for step, timing in r.deadline.items():
            steps[step].append(timing)
    out: dict[str, dict[str, float]] = {}
    for step, timings in steps.items():
        outcomes = Counter(str(t.get("outcome")) for t in timings)
        ms = [float(t.get("ms", 0.0)) for t in timings]
        out[step] = {"questions": len(timings), "out_of_time": outcomes["timeout"] + outcomes["no_time"],
                     "circuit_open": outcomes["circuit_open"], "error": outcomes["error"],
                     "median_ms": round(statistics.median(ms), 1), "max_ms": round(max(ms), 1)}  # fmt: skip
    return dict(sorted(out.items(), key=lambda kv: (-kv[1]["out_of_time"], -kv[1]["circuit_open"], kv[0])))


def evaluate(path: str | Path, *, store_url: str | None = None, embedder: Embedder | str | None = None,
             request: dict[str, Any] | None = None, progress: Callable[[int, int], None] | None = None,
             llm: Any = None, reranker: Any = None) -> EvalReport:  # fmt: skip
    """Load the dataset into a fresh store (a temporary SQLite file unless ``store_url``) and run it.
    ``llm`` / ``reranker`` as for :func:`dossier.open` (left out: ``DOSSIER_LLM`` / ``DOSSIER_RERANK``)."""
    dataset = load_dataset(path)
    with tempfile.TemporaryDirectory(prefix="dossier-eval-") as tmp:
        url = store_url or f"sqlite:///{tmp}/eval.db"
        with open_engine(url, embedder=embedder, llm=llm, reranker=reranker) as engine:
            engine.load_bundle(dataset.bundle)
            return run(engine, dataset, request=request, progress=progress, store_label=store_url or "sqlite (temporary)")
