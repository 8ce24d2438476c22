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

    def search(self, query: np.ndarray, limit: int, exclude: np.ndarray | None = None) -> list[tuple[str, str, float]]:
        """The best ``limit`` rows; ``exclude`` (a boolean per row) leaves rows out: they take no place."""
        if len(self.keys) == 0 or limit <= 0:
            return []
        if exclude is None:
            return exact_search(self.keys, self.parents, self.matrix, query, limit)
        left = len(self.keys) - int(exclude.sum())
        if left <= 0:
            return []
        sims = np.where(exclude, np.float32(-np.inf), similarities(self.matrix, query))
        return _top(self.keys, self.parents, sims, min(limit, left))


#: Elements of a matrix multiplied by a vector in one BLAS call. Past a few hundred thousand (2,000 rows of
#: 384) OpenBLAS splits the product over its threads, which then spin for about 100 ms waiting for more
#: work: a core taken from the rest of the call and from the store's server after every search. Products
#: of slices this size (in whole multiples of 64 rows) run on the calling thread alone.
_ELEMENTS_PER_PRODUCT = 262_144


def similarities(matrix: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``matrix @ query`` (float32), computed on the calling thread in slices of rows: the same products up
    to float32 rounding (a row's dot product may be summed in another order than a threaded split would)."""
    q = query.astype(np.float32, copy=False)
    rows = max(64, _ELEMENTS_PER_PRODUCT // max(1, matrix.shape[-1]) // 64 * 64)
    if len(matrix) <= rows:
        return matrix @ q
    return np.concatenate([matrix[i : i + rows] @ q for i in range(0, len(matrix), rows)])


def exact_search(
    keys: np.ndarray, parents: np.ndarray, matrix: np.ndarray, query: np.ndarray, limit: int
) -> list[tuple[str, str, float]]:
    """Top ``limit`` rows of ``matrix`` by dot product with ``query`` (cosine for normalised rows)."""
    if len(keys) == 0:
        return []
    return _top(keys, parents, similarities(matrix, query), limit)


def exact_search_blocks(
    keys: np.ndarray, parents: np.ndarray, blocks: list[np.ndarray], query: np.ndarray, limit: int
) -> list[tuple[str, str, float]]:
    """:func:`exact_search` over the rows of ``blocks`` stacked in order, without copying them into one matrix."""
    if len(keys) == 0:
        return []
    sims = np.concatenate([similarities(block, query) for block in blocks]) if len(blocks) > 1 else similarities(blocks[0], query)
    return _top(keys, parents, sims, limit)


def _top(keys: np.ndarray, parents: np.ndarray, sims: np.ndarray, limit: int) -> list[tuple[str, str, float]]:
    k = min(limit, len(sims))
    top = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
    # Stable order: score descending, then key, so ties break the same on every backend.
    order = sorted(top.tolist(), key=lambda r: (-float(sims[r]), keys[r]))
    return [(keys[r], parents[r], float(sims[r])) for r in order]
