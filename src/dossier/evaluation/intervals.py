"""How far a labelled set's figures can be trusted: bootstrap intervals over its questions.

A set of a hundred questions measures a share to within several points: one question is 0.01 of it,
and which questions were written decides more than that. ``dossier eval`` gives each overall figure a
95% interval (the questions resampled with replacement, the figure computed again each time), and with
``--against`` the change from an earlier report, question by question: the mean difference over the
questions both reports hold, its interval (the same questions resampled in pairs), and how many
questions went up or down. An interval that holds 0 is a change these questions cannot tell from noise.

The resampling is seeded: the same report gives the same intervals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

LEVEL = 0.95
RESAMPLES = 2000
_SEED = 20261206
_CHUNK = 250  # resamples drawn at once (bounds the index matrix: _CHUNK x questions)


def interval(values: Sequence[float] | np.ndarray) -> tuple[float, float] | None:
    """The 95% percentile bootstrap interval of the mean of ``values`` (None: no values)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return None
    rng = np.random.default_rng(_SEED)
    means = np.concatenate([
        x[rng.integers(0, x.size, size=(min(_CHUNK, RESAMPLES - start), x.size))].mean(axis=1)
        for start in range(0, RESAMPLES, _CHUNK)
    ])  # fmt: skip
    low, high = np.quantile(means, [(1 - LEVEL) / 2, 1 - (1 - LEVEL) / 2])
    return round(float(low), 4), round(float(high), 4)


@dataclass(frozen=True)
class Change:
    """One metric of two reports over the questions both hold (and where it applies in both)."""

    questions: int
    before: float
    after: float
    difference: float  # after - before, the mean over those questions
    low: float  # the 95% interval of ``difference``
    high: float
    better: int  # questions whose value rose
    worse: int  # ... fell

    @property
    def clear(self) -> bool:
        """Whether the interval leaves out 0: a change these questions tell from noise."""
        return self.low > 0 or self.high < 0

    def as_dict(self) -> dict[str, Any]:
        return {"questions": self.questions, "before": self.before, "after": self.after,
                "difference": self.difference, "interval": [self.low, self.high], "better": self.better,
                "worse": self.worse, "clear": self.clear}  # fmt: skip


def change(before: Mapping[str, float | None], after: Mapping[str, float | None]) -> Change | None:
    """``after`` against ``before``, each a question id -> value map (None where the metric does not apply);
    None when no question has a value in both."""
    ids = sorted(q for q in set(before) & set(after) if before[q] is not None and after[q] is not None)
    if not ids:
        return None
    a = np.array([before[q] for q in ids], dtype=np.float64)
    b = np.array([after[q] for q in ids], dtype=np.float64)
    found = interval(b - a)
    assert found is not None
    return Change(questions=len(ids), before=round(float(a.mean()), 4), after=round(float(b.mean()), 4),
                  difference=round(float((b - a).mean()), 4), low=found[0], high=found[1],
                  better=int((b > a).sum()), worse=int((b < a).sum()))  # fmt: skip


def per_question(report: Mapping[str, Any], metric: str) -> dict[str, float | None]:
    """A metric of every question of an ``--json`` report (``per_question``), by question id."""
    return {str(q["id"]): q["metrics"].get(metric) for q in report.get("per_question", [])}
