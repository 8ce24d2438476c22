"""Exact and HNSW nearest-neighbour search agree on clustered, real-looking vectors."""

from __future__ import annotations

import numpy as np
import pytest

from dossier.stores.vector_index import VectorIndex, exact_search


def _clustered(n: int, d: int = 32, clusters: int = 8, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, d))
    rows = centres[rng.integers(0, clusters, n)] + 0.3 * rng.normal(size=(n, d))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _index(matrix: np.ndarray, hnsw_min_rows: int) -> VectorIndex:
    keys = np.array([f"k{i:04d}" for i in range(len(matrix))], dtype=object)
    parents = np.array([f"p{i % 5}" for i in range(len(matrix))], dtype=object)
    return VectorIndex(keys, parents, matrix, generation=0, hnsw_min_rows=hnsw_min_rows)


def test_exact_search_orders_by_similarity_then_key() -> None:
    matrix = np.array([[1, 0], [0, 1], [1, 0], [0.6, 0.8]], dtype=np.float32)
    keys = np.array(["b", "c", "a", "d"], dtype=object)
    found = exact_search(keys, keys, matrix, np.array([1, 0], dtype=np.float32), 3)
    assert [(k, round(s, 3)) for k, _, s in found] == [("a", 1.0), ("b", 1.0), ("d", 0.6)]
    assert exact_search(keys, keys, matrix, np.array([1, 0], dtype=np.float32), 10)[-1][0] == "c"


@pytest.mark.parametrize("limit", [0, 1, 10, 500])
def test_hnsw_finds_what_exact_search_finds(limit: int) -> None:
    matrix = _clustered(400)
    exact, hnsw = _index(matrix, hnsw_min_rows=10_000), _index(matrix, hnsw_min_rows=1)
    assert not exact.uses_hnsw and hnsw.uses_hnsw
    for row in (0, 17, 399):
        want, got = exact.search(matrix[row], limit), hnsw.search(matrix[row], limit)
        assert len(want) == min(limit, 400)
        if not limit:
            assert got == []
            continue
        # HNSW is approximate (and built in parallel): demand high recall, not identity
        keys = [k for k, _, _ in got]
        assert len(keys) == len(set(keys)) <= len(want)
        assert len(set(keys) & {k for k, _, _ in want}) >= 0.9 * len(want)
        assert keys[0] == want[0][0] == f"k{row:04d}"  # a vector's nearest neighbour is itself
        assert got[0][2] == pytest.approx(1.0, abs=1e-4)
        assert [s for *_, s in got] == sorted((s for *_, s in got), reverse=True)


def test_an_empty_index_finds_nothing() -> None:
    empty = VectorIndex(np.array([], dtype=object), np.array([], dtype=object), np.zeros((0, 1), np.float32), 0, 1)
    assert empty.search(np.ones(4, dtype=np.float32), 5) == []
