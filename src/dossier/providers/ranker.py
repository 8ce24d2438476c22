"""The learned rankers: a logistic model over a candidate's evidence, as numpy and a small JSON file.

One model ranks section candidates, one ranks memory candidates (tier 2). Each is a standardised
logistic model: ``p = sigmoid(((x - mean) / scale) . coef + intercept)`` (fitted row by row, or question
by question and then calibrated: :func:`dossier.evaluation.fit.fit`), so its score is a probability that
the candidate answers, and the decisions that follow (clear winner, picks,
supplementary, abstention, the memory floor) are thresholds on that probability, stored with the
model and measured on the data it was fitted on (``bench/train_ranker.py``; docs/evaluation.md).

The shipped models live in ``providers/data/ranker.json`` (``$DOSSIER_RANKER_FILE`` names another file). An org may carry its own, fitted by
``dossier calibrate --write`` on its labelled questions; it reaches a call only through that org's
settings. A model file that is missing, unreadable or does not match the features this code computes
is :class:`RankerUnavailable`; the layers then rank by the heuristic and the route says so.
Inference needs numpy only (fitting needs scikit-learn: the ``train`` extra).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import DossierError

SHIPPED = "ranker.json"
FORMAT = 1
FILE_ENV = "DOSSIER_RANKER_FILE"  # another shipped-model file instead of the packaged one


class RankerUnavailable(DossierError):
    """No usable ranker model: missing, corrupt, or fitted on other features."""


@dataclass(frozen=True)
class LinearRanker:
    """A fitted logistic model over named features, with its decision thresholds."""

    kind: str  # "sections" | "memories"
    name: str  # "shipped:<digest>" or "org:<digest>"
    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    thresholds: Mapping[str, float] = field(default_factory=dict)

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """One probability per row of ``x`` (rows are candidates, columns :attr:`features`)."""
        if x.size == 0:
            return np.zeros(0)
        z = ((x - self.mean) / self.scale) @ self.coef + self.intercept
        return 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))

    def threshold(self, name: str, default: float) -> float:
        return float(self.thresholds.get(name, default))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "features": list(self.features), "mean": self.mean.tolist(),
                "scale": self.scale.tolist(), "coef": self.coef.tolist(), "intercept": self.intercept,
                "thresholds": dict(self.thresholds)}  # fmt: skip


def parse(spec: Mapping[str, Any], *, kind: str, expected: Sequence[str], origin: str) -> LinearRanker:
    """A :class:`LinearRanker` from its JSON form; ``expected`` are the features this code computes."""
    try:
        features = tuple(str(f) for f in spec["features"])
        mean, scale, coef = (np.asarray(spec[k], dtype=np.float64) for k in ("mean", "scale", "coef"))
        intercept = float(spec["intercept"])
        thresholds = {str(k): float(v) for k, v in dict(spec.get("thresholds") or {}).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise RankerUnavailable(f"{kind} ranker ({origin}) is malformed: {type(exc).__name__}: {exc}") from None
    if spec.get("kind", kind) != kind:
        raise RankerUnavailable(f"{kind} ranker ({origin}) is a {spec.get('kind')!r} model")
    if features != tuple(expected):
        raise RankerUnavailable(f"{kind} ranker ({origin}) was fitted on other features")
    n = len(features)
    if not (mean.shape == scale.shape == coef.shape == (n,)) or not np.all(np.isfinite([*mean, *scale, *coef, intercept])):
        raise RankerUnavailable(f"{kind} ranker ({origin}) has arrays of the wrong shape or non-finite values")
    if np.any(scale <= 0):
        raise RankerUnavailable(f"{kind} ranker ({origin}) has a non-positive scale")
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    return LinearRanker(kind=kind, name=f"{origin}:{digest}", features=features, mean=mean, scale=scale, coef=coef,
                        intercept=intercept, thresholds=thresholds)  # fmt: skip


@lru_cache(maxsize=4)
def _shipped_specs(path: str | None) -> dict[str, Any]:
    try:
        if path is None:
            text = resources.files("dossier.providers").joinpath("data", SHIPPED).read_text(encoding="utf-8")
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise RankerUnavailable(f"ranker file unreadable ({type(exc).__name__})") from None  # no path: routes reach callers
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RankerUnavailable(f"shipped ranker file is not format {FORMAT}")
    return data


def shipped(kind: str, expected: Sequence[str], *, path: str | None = None) -> LinearRanker:
    """The shipped model of ``kind`` (``path`` overrides the packaged file, for tests and training)."""
    spec = _shipped_specs(path).get(kind)
    if not isinstance(spec, dict):
        raise RankerUnavailable(f"shipped ranker file has no {kind} model")
    return _parsed(json.dumps(spec, sort_keys=True), kind, tuple(expected), "shipped")


@lru_cache(maxsize=64)
def _parsed(spec_json: str, kind: str, expected: tuple[str, ...], origin: str) -> LinearRanker:
    return parse(json.loads(spec_json), kind=kind, expected=expected, origin=origin)


def for_settings(org_models: Mapping[str, Any] | None, kind: str, expected: Sequence[str],
                 *, path: str | None = None) -> LinearRanker:  # fmt: skip
    """The org's own model of ``kind`` when its settings carry one, else the shipped model."""
    spec = (org_models or {}).get(kind)
    if spec is not None:
        return _parsed(json.dumps(spec, sort_keys=True), kind, tuple(expected), "org")
    return shipped(kind, expected, path=path or os.environ.get(FILE_ENV) or None)


def relevance(probability: float) -> int:
    """A probability on the selector's 1-5 relevance scale (0.2 per step)."""
    return max(1, min(5, math.ceil(probability * 5 - 1e-9)))
