"""In-memory nearest-neighbour search over one org's vectors of one kind.

Exact search (one matrix-vector product over normalised float32 rows) is the default: it is exact and,
measured on this project's bench, fast enough below ``Settings.hnsw_min_rows`` rows. Above that an
HNSW index (usearch, cosine) is built once per generation of the data and answers approximately.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


#: HNSW search breadth: at 1M memories (bench/scale.py) 64 gave recall@10 0.963 against exact search (a
#: text repeated a dozen times makes a cluster of identical vectors the search can miss); PostgreSQL's
#: store uses 200 for the same reason (docs/scaling.md)
EF_SEARCH = 200


@dataclass
class VectorIndex:
    keys: np.ndarray  # object array of str
    parents: np.ndarray  # object array of str
    matrix: np.ndarray  # (n, d) float32, rows L2-normalised
    generation: int
    hnsw_min_rows: int
    _hnsw: object | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def uses_hnsw(self) -> bool:
        return len(self.keys) >= self.hnsw_min_rows

    def search(self, query: np.ndarray, limit: int) -> list[tuple[str, str, float]]:
        n = len(self.keys)
        if n == 0 or limit <= 0:
            return []
        if self.uses_hnsw and limit * 4 < n:  # asked for a quarter of the rows or more: a scan is exact and as cheap
            return self._search_hnsw(query, limit)
        return exact_search(self.keys, self.parents, self.matrix, query, limit)

    def _search_hnsw(self, query: np.ndarray, limit: int) -> list[tuple[str, str, float]]:
        if self._hnsw is None:
            from usearch.index import Index

            index = Index(
                ndim=self.matrix.shape[1], metric="cos", dtype="f32", connectivity=16, expansion_add=128,
                expansion_search=max(EF_SEARCH, limit * 4),
            )  # fmt: skip
            index.add(np.arange(len(self.keys), dtype=np.uint64), self.matrix)
            self._hnsw = index
        matches = self._hnsw.search(query.astype(np.float32), limit)  # type: ignore[attr-defined]
        rows = np.asarray(matches.keys, dtype=np.int64)
        sims = 1.0 - np.asarray(matches.distances, dtype=np.float32)
        return [(self.keys[r], self.parents[r], float(s)) for r, s in zip(rows, sims)]


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
