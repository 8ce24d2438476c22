"""Learned query adapters: a linear map of the query embedding, fitted on labelled questions.

A small embedding model places "what scope does the user choice apply to?" far from the section that
says "you can opt out of ...": the words differ, and the model never saw which answers which. An
adapter is a matrix ``W`` fitted on labelled (question, answer) pairs of a training split so that the
adapted query ``W q`` lies closer to the texts that answered such questions (``bench/train_ranker.py``
fits it; ``dossier.evaluation.adapter`` holds the fitting). The rankers read the adapted cosine as one
more feature beside the plain one, so a question the adapter knows nothing about still ranks on the rest.

An adapter belongs to one embedding model: the shipped file names the model it was fitted on, and a
store embedded with another model gets no adapter (the feature then equals the plain cosine, which is
what the identity adapter gives). ``$DOSSIER_ADAPTER_FILE`` points at another file; ``none`` turns
adapters off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

FILE_ENV = "DOSSIER_ADAPTER_FILE"
SHIPPED = "adapters.npz"
FORMAT = 1
KINDS = ("sections", "memories")


class AdapterUnavailable(Exception):
    """No usable adapter: missing, unreadable, or fitted on another embedding model."""


@dataclass(frozen=True)
class QueryAdapter:
    """``apply(q)`` = ``W q`` scaled back to unit length."""

    kind: str
    model_id: str
    matrix: np.ndarray  # (dimensions, dimensions) float32

    def apply(self, vector: np.ndarray) -> np.ndarray:
        adapted = self.matrix @ np.asarray(vector, dtype=np.float32)
        norm = float(np.linalg.norm(adapted))
        return (adapted / norm).astype(np.float32) if norm > 0 else np.asarray(vector, dtype=np.float32)


def save(path: str | os.PathLike[str], matrices: dict[str, np.ndarray], *, model_id: str, **about: Any) -> None:
    """Write adapters as ``W - I`` in float16 (the fitted maps stay near the identity, so this keeps them
    precise at half the size); ``about`` is kept as text for provenance."""
    arrays: dict[str, Any] = {f"{kind}_delta": (m - np.eye(m.shape[0])).astype(np.float16) for kind, m in matrices.items()}
    arrays["meta"] = np.array([f"format={FORMAT}", f"model={model_id}", *(f"{k}={v}" for k, v in sorted(about.items()))])
    with open(path, "wb") as handle:
        np.savez_compressed(handle, **arrays)


@lru_cache(maxsize=8)
def _read(path: str | None) -> dict[str, Any]:
    try:
        if path is None:
            handle = resources.files("dossier.providers").joinpath("data", SHIPPED).open("rb")
        else:
            handle = open(path, "rb")
        with handle, np.load(handle, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise AdapterUnavailable(f"adapter file unreadable ({type(exc).__name__})") from None  # no path: routes reach callers
    meta = dict(str(line).split("=", 1) for line in arrays.pop("meta", np.array([])) if "=" in str(line))
    if meta.get("format") != str(FORMAT):
        raise AdapterUnavailable(f"adapter file is not format {FORMAT}")
    return {"model": meta.get("model", ""), "deltas": arrays}


def load(kind: str, model_id: str, dimensions: int) -> QueryAdapter:
    """The adapter of ``kind`` for an embedding model, from ``$DOSSIER_ADAPTER_FILE`` or the packaged file."""
    path = os.environ.get(FILE_ENV) or None
    if path == "none":
        raise AdapterUnavailable(f"adapters turned off (${FILE_ENV}=none)")
    return _load(kind, model_id, dimensions, path)


@lru_cache(maxsize=16)
def _load(kind: str, model_id: str, dimensions: int, path: str | None) -> QueryAdapter:
    data = _read(path)
    if data["model"] != model_id:
        raise AdapterUnavailable(f"adapters were fitted on {data['model'] or 'an unnamed model'}, not {model_id}")
    delta = data["deltas"].get(f"{kind}_delta")
    if delta is None:
        raise AdapterUnavailable(f"adapter file has no {kind} adapter")
    if delta.shape != (dimensions, dimensions) or not np.all(np.isfinite(delta)):
        raise AdapterUnavailable(f"{kind} adapter has shape {delta.shape}, expected {(dimensions, dimensions)}")
    return QueryAdapter(kind=kind, model_id=model_id, matrix=(delta.astype(np.float32) + np.eye(dimensions, dtype=np.float32)))


def clear_cache() -> None:
    """Forget loaded adapters (after ``$DOSSIER_ADAPTER_FILE`` or the file changed)."""
    _read.cache_clear()
    _load.cache_clear()
