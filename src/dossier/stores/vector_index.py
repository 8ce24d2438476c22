"""Exact nearest-neighbour search over one org's vectors of one kind, in memory.

One matrix-vector product over normalised float32 rows: exact and, measured on this project's bench, fast
enough below ``Settings.hnsw_min_rows`` rows; above that the SQLite store asks its persisted ANN index
(``stores/ann.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class VectorIndex:
    keys: np.ndarray  # object array of str
    parents: np.ndarray  # object array of str
    matrix: np.ndarray  # (n, d) float32, rows L2-normalised
    generation: int

    def __len__(self) -> int:
        return len(self.keys)

    def search(self, query: np.ndarray, limit: int) -> list[tuple[str, str, float]]:
        if len(self.keys) == 0 or limit <= 0:
            return []
        return exact_search(self.keys, self.parents, self.matrix, query, limit)


def exact_search(
    keys: np.ndarray, parents: np.ndarray, matrix: np.ndarray, query: np.ndarray, limit: int
) -> list[tuple[str, str, float]]:
    """Top ``limit`` rows of ``matrix`` by dot product with ``query`` (cosine for normalised rows)."""
    if len(keys) == 0:
        return []
    return _top(keys, parents, matrix @ query.astype(np.float32), limit)


def exact_search_blocks(
    keys: np.ndarray, parents: np.ndarray, blocks: list[np.ndarray], query: np.ndarray, limit: int
) -> list[tuple[str, str, float]]:
    """:func:`exact_search` over the rows of ``blocks`` stacked in order, without copying them into one matrix."""
    if len(keys) == 0:
        return []
    q = query.astype(np.float32)
    sims = np.concatenate([block @ q for block in blocks]) if len(blocks) > 1 else blocks[0] @ q
    return _top(keys, parents, sims, limit)


def _top(keys: np.ndarray, parents: np.ndarray, sims: np.ndarray, limit: int) -> list[tuple[str, str, float]]:
    k = min(limit, len(sims))
    top = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
    # Stable order: score descending, then key, so ties break the same on every backend.
    order = sorted(top.tolist(), key=lambda r: (-float(sims[r]), keys[r]))
    return [(keys[r], parents[r], float(sims[r])) for r in order]
