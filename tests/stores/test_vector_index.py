"""Exact nearest-neighbour search: best first, ties broken by key (the same on every backend)."""

from __future__ import annotations

import numpy as np

from dossier.stores.vector_index import VectorIndex, exact_search, exact_search_blocks


def test_exact_search_orders_by_similarity_then_key() -> None:
    matrix = np.array([[1, 0], [0, 1], [1, 0], [0.6, 0.8]], dtype=np.float32)
    keys = np.array(["b", "c", "a", "d"], dtype=object)
    found = exact_search(keys, keys, matrix, np.array([1, 0], dtype=np.float32), 3)
    assert [(k, round(s, 3)) for k, _, s in found] == [("a", 1.0), ("b", 1.0), ("d", 0.6)]
    assert exact_search(keys, keys, matrix, np.array([1, 0], dtype=np.float32), 10)[-1][0] == "c"


def test_blocks_search_as_one_matrix() -> None:
    rng = np.random.default_rng(3)
    matrix = rng.normal(size=(50, 8)).astype(np.float32)
    keys = np.array([f"k{i:02d}" for i in range(50)], dtype=object)
    query = rng.normal(size=8).astype(np.float32)
    whole = exact_search(keys, keys, matrix, query, 7)
    assert exact_search_blocks(keys, keys, [matrix[:20], matrix[20:35], matrix[35:]], query, 7) == whole


def test_an_empty_index_finds_nothing() -> None:
    empty = VectorIndex(np.array([], dtype=object), np.array([], dtype=object), np.zeros((0, 1), np.float32), 0)
    assert empty.search(np.ones(4, dtype=np.float32), 5) == []
    assert len(empty) == 0
