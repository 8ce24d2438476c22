"""Exact nearest-neighbour search: best first, ties broken by key (the same on every backend)."""

from __future__ import annotations

import numpy as np

from dossier.stores.vector_index import VectorIndex, exact_search, exact_search_blocks, similarities


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


def test_similarities_of_a_large_matrix_are_its_products_computed_in_slices() -> None:
    rng = np.random.default_rng(5)
    for rows, dims in ((5_003, 384), (700, 1536), (10, 384)):
        matrix = rng.normal(size=(rows, dims)).astype(np.float32)
        query = rng.normal(size=dims).astype(np.float32)
        got = similarities(matrix, query)
        assert got.dtype == np.float32 and got.shape == (rows,)
        np.testing.assert_allclose(got, matrix.astype(np.float64) @ query.astype(np.float64), rtol=1e-4, atol=1e-4)
        # a slice of rows alone is one product on this thread: its bits are those of the product itself
        assert np.array_equal(got[:64], matrix[:64] @ query)


def test_a_large_exact_search_leaves_no_thread_spinning() -> None:
    # OpenBLAS's threads, once woken by a product of thousands of rows, spin for about 100 ms after it;
    # the store's searches must not wake them (a core of the machine's few, after every search)
    import time

    rng = np.random.default_rng(6)
    matrix = rng.normal(size=(20_000, 384)).astype(np.float32)
    keys = np.array([f"k{i}" for i in range(20_000)], dtype=object)
    time.sleep(0.3)  # any earlier test's BLAS threads wind down first
    exact_search(keys, keys, matrix, rng.normal(size=384).astype(np.float32), 10)
    started = time.process_time()
    time.sleep(0.2)
    assert time.process_time() - started < 0.03  # CPU the process spent while idle (a spinning thread: ~0.1 s)
