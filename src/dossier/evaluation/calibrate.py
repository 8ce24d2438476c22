"""Calibrating thresholds on labelled questions: thresholds are claims about a corpus and a model.

For each similarity threshold in :class:`~dossier.settings.Thresholds`, the dataset is run through the
real pipeline at each value of a grid (the others held at their current values) and the value with the
best quality is recommended; ties go to the current value, then to the stricter one. Score
distributions of gold and non-gold candidates per source show why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine import Engine
from ..settings import Thresholds
from .dataset import Dataset
from .runner import EvalReport, run

#: threshold -> (grid, metrics whose mean is the objective)
SECTION_QUALITY = ("section_accuracy", "section_recall@3", "discovery", "abstention")
GRID: dict[str, tuple[tuple[float, ...], tuple[str, ...]]] = {
    "memory_semantic": ((0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55), ("memory_recall", "memory_precision")),
    "property_discovery": ((0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6), ("property_recall", "property_precision")),
    "selector_floor": ((0.35, 0.4, 0.45, 0.5, 0.55), SECTION_QUALITY),
    "clear_winner": ((0.45, 0.5, 0.55, 0.6, 0.65), SECTION_QUALITY + ("section_precision",)),
    "clear_winner_margin": ((0.06, 0.09, 0.12, 0.15, 0.2), SECTION_QUALITY + ("section_precision",)),
    "fallback_low": ((0.2, 0.25, 0.3, 0.35, 0.4), SECTION_QUALITY),
    "supplementary": ((0.55, 0.6, 0.65, 0.7, 0.75), SECTION_QUALITY + ("section_precision",)),
    "fallback_last": ((0.3, 0.35, 0.4, 0.45, 0.5), SECTION_QUALITY),
    "sibling_ratio": ((0.7, 0.8, 0.9, 1.0), SECTION_QUALITY),
}


@dataclass
class Scan:
    threshold: str
    current: float
    recommended: float
    objective: tuple[str, ...]
    quality: dict[float, float]  # value -> objective


@dataclass
class Calibration:
    model: str
    scans: list[Scan]
    distributions: dict[str, dict[str, dict[str, float]]]  # source -> gold|other -> stats
    before: EvalReport
    after: EvalReport
    thresholds: Thresholds = field(default_factory=Thresholds)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "recommended": dataclasses.asdict(self.thresholds),
            "scans": [dataclasses.asdict(s) | {"quality": {str(k): v for k, v in s.quality.items()}} for s in self.scans],
            "distributions": self.distributions,
            "before": self.before.overall, "after": self.after.overall,
        }  # fmt: skip


def _objective(report: EvalReport, metrics: tuple[str, ...]) -> float:
    extra = precision(report)
    values = [report.overall.get(m) if m in report.overall else extra.get(m) for m in metrics]
    present = [v for v in values if v is not None]
    return round(sum(present) / len(present), 4) if present else 0.0


def precision(report: EvalReport) -> dict[str, float | None]:
    """Share of returned items that are gold, for questions that have gold of that kind."""
    from .metrics import answer_sections  # noqa: F401 - kept for symmetry with score()

    out: dict[str, float | None] = {}
    for kind, source in (("memory", "memories"), ("property", "properties"), ("section", "documents")):
        ratios = []
        for r in report.results:
            gold = r.gold.get(kind, set())
            got = r.returned.get(source, [])
            if gold and got:
                ratios.append(len(set(got) & gold) / len(got))
        out[f"{kind}_precision"] = round(sum(ratios) / len(ratios), 4) if ratios else None
    return out


def distributions(report: EvalReport) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for source in ("documents", "memories", "properties"):
        gold = [s for r in report.results for _, s, g in r.candidate_scores.get(source, []) if g]
        other = [s for r in report.results for _, s, g in r.candidate_scores.get(source, []) if not g]
        out[source] = {name: _stats(values) for name, values in (("gold", gold), ("other", other)) if values}
    return out


def _stats(values: list[float]) -> dict[str, float]:
    """Count and percentiles of ``values``, each interpolated linearly between the two nearest ranks (numpy's
    default rule, which gives the median as ``statistics.median`` does), so they never go down as p goes up."""
    ordered = sorted(values)

    def q(p: float) -> float:
        at = p * (len(ordered) - 1)
        low = int(at)
        high = min(low + 1, len(ordered) - 1)
        return round(ordered[low] + (ordered[high] - ordered[low]) * (at - low), 3)

    return {"n": len(values), "p10": q(0.1), "p25": q(0.25), "median": q(0.5), "p75": q(0.75), "p90": q(0.9)}


def calibrate(engine: Engine, dataset: Dataset, *, orgs: list[str], progress: Callable[[str], None] | None = None) -> Calibration:
    """Scan every threshold on ``dataset`` (already loaded into ``engine``); returns recommendations."""
    base = engine.settings
    current = base.thresholds

    def run_with(thresholds: Thresholds) -> EvalReport:
        for org in orgs:
            engine.org_settings[org] = base.replace(thresholds=thresholds)
        return run(engine, dataset)

    saved = {org: engine.org_settings.get(org) for org in orgs}
    try:
        before = run_with(current)
        scans: list[Scan] = []
        chosen = current
        for name, (grid, metrics) in GRID.items():
            if progress:
                progress(name)
            now = getattr(current, name)
            values = sorted(set(grid) | {now})
            quality = {v: _objective(run_with(dataclasses.replace(chosen, **{name: v})), metrics) for v in values}
            best = max(quality.values())
            strict_first = sorted(values, key=lambda v: (v != now, -v))  # current, then stricter
            recommended = next(v for v in strict_first if quality[v] == best)
            scans.append(Scan(name, now, recommended, metrics, quality))
            chosen = dataclasses.replace(chosen, **{name: recommended})
        after = run_with(chosen)
    finally:
        for org, settings in saved.items():
            if settings is None:
                engine.org_settings.pop(org, None)
            else:
                engine.org_settings[org] = settings
    return Calibration(engine.embedder.model_id, scans, distributions(before), before, after, chosen)
