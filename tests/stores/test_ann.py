"""The SQLite store's persisted ANN index (stores/ann.py): saved beside the database, reopened without a
rebuild, kept current across connections and processes through the change log, rebuilt when its file is
missing, corrupt, of another database or too old, and answering what exact search answers."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path

import numpy as np
import pytest

from dossier.bundle import Org
from dossier.stores.base import VectorWrite, WriteBatch
from dossier.stores.sqlite import SQLiteStore
from dossier.stores.vector_index import exact_search

DIMS = 32


def clustered(n: int, seed: int) -> np.ndarray:
    """Unit vectors around 8 centres (real embeddings cluster; uniform random ones make HNSW look bad)."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(size=(8, DIMS))
    rows = centres[rng.integers(0, 8, n)] + 0.3 * rng.normal(size=(n, DIMS))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def vectors(org: str, keys: list[str], matrix: np.ndarray, parent: str | None = None) -> list[VectorWrite]:
    return [VectorWrite(org, "memory", k, parent or f"p{i % 4}", "h", v) for i, (k, v) in enumerate(zip(keys, matrix))]


def open_store(path: Path, *, hnsw_min_rows: int = 400, ann_min_rows: int = 300) -> SQLiteStore:
    """Small thresholds, so that a few hundred rows exercise what 200,000 and 5,000 rows do by default."""
    return SQLiteStore(path, hnsw_min_rows=hnsw_min_rows, ann_min_rows=ann_min_rows, ann_compact_after=100)


@pytest.fixture
def loaded(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A store file with 1,000 memory vectors of org acme (an index was built and saved by the write)."""
    path = tmp_path / "s.db"
    matrix = clustered(1000, seed=1)
    store = open_store(path)
    store.write(WriteBatch(orgs=[Org(id="acme")], vectors=vectors("acme", [f"m{i:04d}" for i in range(1000)], matrix)))
    assert store.ann.builds == 1
    store.close()
    return path, matrix


def files(path: Path) -> list[str]:
    return sorted(p.name for p in Path(f"{path}-ann").iterdir())


def ids(store: SQLiteStore, query: np.ndarray, limit: int = 10, parents: list[str] | None = None) -> list[str]:
    return [h.id for h in store.search_vectors("memory", query, org="acme", limit=limit, parents=parents)]


def test_the_index_is_saved_beside_the_database_and_reopened_without_a_rebuild(loaded: tuple[Path, np.ndarray]) -> None:
    path, matrix = loaded
    names = files(path)
    assert len(names) == 2 and names[0].endswith(".usearch") and names[1].endswith(".json")
    store = open_store(path)
    try:
        for row in (0, 17, 999):
            found = store.search_vectors("memory", matrix[row], org="acme", limit=10)
            assert found[0].id == f"m{row:04d}" and found[0].score == pytest.approx(1.0, abs=1e-5)
        assert store.ann.builds == 0  # the saved file answered
    finally:
        store.close()


def test_answers_are_what_exact_search_answers(loaded: tuple[Path, np.ndarray]) -> None:
    path, matrix = loaded
    keys = np.array([f"m{i:04d}" for i in range(1000)], dtype=object)
    store = open_store(path)
    try:
        recall = []
        for row in range(0, 1000, 50):
            query = matrix[row] + 0.05 * clustered(1, seed=row)[0]
            want = exact_search(keys, keys, matrix, query, 10)
            got = store.search_vectors("memory", query, org="acme", limit=10)
            recall.append(len({h.id for h in got} & {k for k, _, _ in want}) / 10)
            # rescored exactly: each hit carries its exact similarity, and hits come best first, then by id
            for hit in got:
                assert hit.score == pytest.approx(float(matrix[int(hit.id[1:])] @ query), abs=1e-5)
            assert [(-h.score, h.id) for h in got] == sorted((-h.score, h.id) for h in got)
        assert np.mean(recall) >= 0.95
    finally:
        store.close()


def test_a_parent_holding_many_rows_searches_the_index_and_finds_its_own_rows(loaded: tuple[Path, np.ndarray]) -> None:
    path, matrix = loaded
    store = open_store(path, ann_min_rows=200)  # each of p0..p3 holds 250 rows: the index is asked
    try:
        keys = np.array([f"m{i:04d}" for i in range(0, 1000, 4)], dtype=object)
        for row in (0, 400, 996):
            got = store.search_vectors("memory", matrix[row], org="acme", limit=10, parents=["p0"])
            assert {h.parent for h in got} == {"p0"}
            want = exact_search(keys, keys, matrix[::4], matrix[row], 10)
            assert got[0].id == f"m{row:04d}"
            assert len({h.id for h in got} & {k for k, _, _ in want}) >= 9
    finally:
        store.close()


def test_queries_searched_together_answer_what_each_alone_answers(loaded: tuple[Path, np.ndarray]) -> None:
    """search_vectors_many asks the index for all its queries at once (several threads): the same hits,
    org-wide and among parents, before and after rows changed since the file was written."""
    path, matrix = loaded
    store = open_store(path, ann_min_rows=200)
    try:
        def check() -> None:
            for row in range(0, 1000, 97):
                queries = [matrix[row] + 0.05 * clustered(1, seed=row)[0], matrix[(row * 7) % 1000], matrix[999 - row]]
                for parents in (None, ["p1"], ["p0", "p2"]):
                    many = store.search_vectors_many("memory", queries, org="acme", limit=10, parents=parents)
                    alone = [store.search_vectors("memory", q, org="acme", limit=10, parents=parents) for q in queries]
                    assert many == alone and all(len(hits) == 10 for hits in many)

        check()
        assert store.ann.builds == 0  # the saved index answered
        fresh = clustered(40, seed=99)
        store.write(WriteBatch(vectors=vectors("acme", [f"m{i:04d}" for i in range(0, 400, 10)], fresh)))  # changed rows
        check()
    finally:
        store.close()


def test_only_hits_that_can_rescore_into_the_best_are_fetched_and_the_answers_are_the_same(
    loaded: tuple[Path, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parents' search asks the index for more rows than it returns; the stored vectors of those past the
    limit by more than float32 rounding are not fetched, and no answer changes: the same hits in the same
    order, their scores equal up to float32 rounding (a product over fewer rows may sum in another order)."""
    from dossier.stores import sqlite_vectors

    path, matrix = loaded
    store = open_store(path, ann_min_rows=200)
    fetched: list[int] = []
    try:
        index = store.ann.get("acme", "memory")
        vectors_of = index.vectors
        monkeypatch.setattr(index, "vectors", lambda labels: fetched.append(len(labels)) or vectors_of(labels))
        queries = [matrix[row] + 0.05 * clustered(1, seed=row)[0] for row in range(0, 1000, 41)]

        def answers() -> list:
            return [store.search_vectors_many("memory", [q, matrix[999 - i]], org="acme", limit=10, parents=["p1"])
                    for i, q in enumerate(queries)]  # fmt: skip

        trimmed, fewer = answers(), list(fetched)
        monkeypatch.setattr(sqlite_vectors, "_RESCORE_SLACK", float("inf"))
        fetched.clear()
        every = answers()
        assert [[[h.id for h in hits] for hits in pair] for pair in every] == \
            [[[h.id for h in hits] for hits in pair] for pair in trimmed]
        scores = [h.score for pair in every for hits in pair for h in hits]
        assert np.allclose(scores, [h.score for pair in trimmed for hits in pair for h in hits], rtol=0, atol=1e-6)
        assert sum(fewer) < sum(fetched)
    finally:
        store.close()


def test_a_hit_is_rescored_within_the_slack_of_the_last_wanted_and_every_hit_when_one_distance_is_unknown() -> None:
    from dossier.stores.sqlite_vectors import _RESCORE_SLACK, _rescored

    found = [(label, f"k{label}", "p") for label in range(6)]
    distance = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.3, 4: 0.3 + _RESCORE_SLACK / 2, 5: 0.3 + 2 * _RESCORE_SLACK}
    assert _rescored(found, distance, 3) == found[:5]  # the tie and the one within rounding are kept
    assert _rescored(found, distance, 6) == found
    assert _rescored(found, {k: v for k, v in distance.items() if k != 5}, 3) == found  # found by a wider search
    assert _rescored(None, distance, 3) is None and _rescored([], distance, 3) == []


def test_a_write_through_another_connection_is_seen_without_a_rebuild(loaded: tuple[Path, np.ndarray]) -> None:
    path, matrix = loaded
    reader, writer = open_store(path), open_store(path)
    try:
        assert ids(reader, matrix[3])[0] == "m0003"  # the reader has the index open
        fresh = clustered(5, seed=99)
        writer.write(WriteBatch(vectors=vectors("acme", [f"new{i}" for i in range(5)], fresh)))
        with writer._transaction() as db:  # a delete, as a document losing a section would make
            db.execute("DELETE FROM vectors WHERE org = 'acme' AND kind = 'memory' AND key = 'm0003'")
        assert ids(reader, fresh[2])[0] == "new2"
        assert "m0003" not in ids(reader, matrix[3], limit=50)
        assert reader.ann.builds == 0 and writer.ann.builds == 0
    finally:
        reader.close()
        writer.close()


def _write_in_another_process(path: str, seed: int) -> None:
    store = open_store(Path(path))
    store.write(WriteBatch(vectors=vectors("acme", ["elsewhere"], clustered(1, seed=seed))))
    store.close()


def test_a_rowid_freed_and_taken_again_never_answers_with_the_old_rows_key(loaded: tuple[Path, np.ndarray]) -> None:
    """Hits' keys and parents are kept per label (a rowid) between searches; a row deleted and another
    inserted in its rowid (raw SQL through another connection: the org's generation does not move, the
    index's log does) is answered with the new row's key and parent."""
    path, matrix = loaded
    reader, writer = open_store(path, ann_min_rows=200), open_store(path)
    try:
        last = 999  # m0999 holds the largest rowid, so the next insert takes it again
        assert ids(reader, matrix[last], parents=["p3"])[0] == "m0999"  # its key and parent are now kept
        with writer._transaction() as db:
            rowid = db.execute("SELECT rowid FROM vectors WHERE key = 'm0999'").fetchone()[0]
            db.execute("DELETE FROM vectors WHERE key = 'm0999'")
            db.execute("INSERT INTO vectors VALUES ('acme', 'memory', 'taken', 'p0', 'h', ?)", (matrix[last].tobytes(),))
            assert db.execute("SELECT rowid FROM vectors WHERE key = 'taken'").fetchone()[0] == rowid
        assert "m0999" not in ids(reader, matrix[last], limit=50)
        assert ids(reader, matrix[last], parents=["p0"])[0] == "taken"
        assert "taken" not in ids(reader, matrix[last], parents=["p3"], limit=50)
    finally:
        reader.close()
        writer.close()


def test_a_write_by_another_process_makes_the_index_stale_and_that_is_detected(loaded: tuple[Path, np.ndarray]) -> None:
    path, matrix = loaded
    store = open_store(path)
    try:
        assert ids(store, matrix[0])[0] == "m0000"
        process = multiprocessing.get_context("spawn").Process(target=_write_in_another_process, args=(str(path), 1234))
        process.start()
        process.join(120)
        assert process.exitcode == 0
        assert ids(store, clustered(1, seed=1234)[0])[0] == "elsewhere"
        assert store.ann.builds == 0
    finally:
        store.close()


def test_changes_are_folded_into_a_new_file_and_the_log_is_dropped(loaded: tuple[Path, np.ndarray]) -> None:
    path, _ = loaded
    before = files(path)
    store = open_store(path)
    try:
        moved = clustered(150, seed=7)  # 150 changed rows: past ann_compact_after (100)
        store.write(WriteBatch(vectors=vectors("acme", [f"m{i:04d}" for i in range(150)], moved)))
        after = files(path)
        assert after != before and len(after) == 2  # a new file, the old one removed
        assert store._db.execute("SELECT count(*) FROM vector_log").fetchone()[0] == 0
        assert json.loads(Path(f"{path}-ann", after[1]).read_text())["rows"] == 1000
    finally:
        store.close()
    reopened = open_store(path)
    try:
        assert ids(reopened, moved[10])[0] == "m0010"
        assert reopened.ann.builds == 0
    finally:
        reopened.close()


def test_a_compaction_whose_file_another_process_replaced_builds_afresh(loaded: tuple[Path, np.ndarray]) -> None:
    """Another process compacted and removed the file this handle's index was opened from, and this one
    has not noticed yet (the other had not recorded its new file): this handle's own compaction cannot load
    the file it knew. It builds from the database instead of failing a write that is already committed."""
    path, _ = loaded
    store = open_store(path)
    try:
        store.search_vectors("memory", clustered(1, seed=3)[0], org="acme", limit=5)  # the index, opened from its file
        for name in files(path):
            if name.endswith(".usearch"):
                Path(f"{path}-ann", name).unlink()  # as the other process's compaction does
        moved = clustered(150, seed=7)  # past ann_compact_after: this write compacts
        store.write(WriteBatch(vectors=vectors("acme", [f"m{i:04d}" for i in range(150)], moved)))
        assert ids(store, moved[10])[0] == "m0010"
        assert store.ann.builds == 1
        assert [n for n in files(path) if n.endswith(".usearch")]  # a file again, for the next process
    finally:
        store.close()
    reopened = open_store(path)
    try:
        assert ids(reopened, moved[20])[0] == "m0020" and reopened.ann.builds == 0
    finally:
        reopened.close()


def test_files_killed_saves_left_behind_are_removed_by_the_next_save(loaded: tuple[Path, np.ndarray]) -> None:
    """A process killed between writing its file and removing the one before leaves an older file; one killed
    while writing leaves a partial file. The next save removes both once they are an hour old (before that,
    another process may be writing the one, or about to open the other)."""
    import os
    import time

    path, _ = loaded
    folder = Path(f"{path}-ann")
    [current] = [n for n in files(path) if n.endswith(".usearch")]
    stem = current.rsplit("-", 1)[0]
    older, killed, writing = folder / f"{stem}-1.usearch", folder / f"{stem}-7.usearch.999.partial", folder / f"{stem}.json.998.partial"
    fresh_older = folder / f"{stem}-2.usearch"  # just written by another process, which may be about to open it
    shutil.copy(folder / current, older)
    shutil.copy(folder / current, fresh_older)
    for leftover in (killed, writing):
        leftover.write_bytes(b"half written")
    hour_ago = time.time() - 3700
    os.utime(killed, (hour_ago, hour_ago))
    os.utime(older, (hour_ago, hour_ago))
    store = open_store(path)
    try:
        store.write(WriteBatch(vectors=vectors("acme", [f"m{i:04d}" for i in range(150)], clustered(150, seed=7))))
    finally:
        store.close()
    left = files(path)
    assert older.name not in left and killed.name not in left and writing.name in left and fresh_older.name in left
    assert len([n for n in left if n.endswith(".usearch")]) == 2


def test_an_index_rebuilt_after_a_compaction_emptied_the_log_is_built_once(loaded: tuple[Path, np.ndarray]) -> None:
    """A compaction drops every log entry; the file is then lost (deleted, or the database copied without it).
    The rebuilt index must stand at the log's position, not at the empty log's 0, or every search takes it for
    stale and builds it again."""
    path, _ = loaded
    store = open_store(path)
    try:
        moved = clustered(150, seed=7)  # past ann_compact_after: compacted, the log emptied
        store.write(WriteBatch(vectors=vectors("acme", [f"m{i:04d}" for i in range(150)], moved)))
        assert store._db.execute("SELECT count(*) FROM vector_log").fetchone()[0] == 0
    finally:
        store.close()
    shutil.rmtree(Path(f"{path}-ann"))
    store = open_store(path)
    try:
        for n in range(5):
            assert ids(store, moved[n])[0] == f"m{n:04d}"
        assert store.ann.builds == 1
    finally:
        store.close()
    again = open_store(path)
    try:
        assert ids(again, moved[20])[0] == "m0020" and again.ann.builds == 0
    finally:
        again.close()


def test_an_index_that_cannot_be_saved_serves_from_memory(loaded: tuple[Path, np.ndarray], caplog: pytest.LogCaptureFixture) -> None:
    """The folder beside the database cannot take the file (here a file stands in its place; a read-only
    folder or a full disk alike): the search still answers, from the index built in memory, and says why."""
    path, matrix = loaded
    directory = Path(f"{path}-ann")
    shutil.rmtree(directory)
    directory.write_text("not a folder")
    store = open_store(path)
    try:
        with caplog.at_level("WARNING"):
            assert ids(store, matrix[42])[0] == "m0042"
            assert ids(store, matrix[43])[0] == "m0043"
        assert store.ann.builds == 1  # built once, kept in memory
        assert any("cannot be saved" in r.getMessage() for r in caplog.records)
        tries: list[str] = []
        real = store.ann._write_file
        store.ann._write_file = lambda *a, **k: (tries.append("save"), real(*a, **k))  # type: ignore[method-assign]
        for n in range(3):  # each past ann_compact_after: no file is tried again for a while
            moved = clustered(120, seed=20 + n)
            store.write(WriteBatch(vectors=vectors("acme", [f"m{i:04d}" for i in range(120)], moved)))
            assert ids(store, moved[7])[0] == "m0007"  # the index in memory follows the writes
        assert tries == []
    finally:
        store.close()


def test_a_file_damaged_where_its_checks_do_not_read_never_scores_a_hit_with_no_number(
    loaded: tuple[Path, np.ndarray], caplog: pytest.LogCaptureFixture
) -> None:
    """Opening a file checks its size, its two ends and a sample of rows; a row in the middle can be damaged
    unseen. A hit scored with no number (its stored vector turned to NaN) makes the search exact and the
    index built again."""
    path, matrix = loaded
    index_file = next(Path(f"{path}-ann").glob("*.usearch"))
    data = bytearray(index_file.read_bytes())
    placed = {n: data.find(matrix[n].astype(np.float32).tobytes()) for n in range(len(matrix))}
    # the premise: a row lies where the checks on opening do not read (not in the first or last 64 KiB)
    n = next(n for n, at in placed.items()  # and not one of the rows sampled at both ends of the keys
             if 64 * 1024 < at < len(data) - 64 * 1024 - 4 * matrix.shape[1] and 10 <= n < len(matrix) - 10)
    row = matrix[n].astype(np.float32)
    data[placed[n] : placed[n] + row.nbytes] = np.full(row.shape, np.nan, dtype=np.float32).tobytes()
    index_file.write_bytes(bytes(data))
    store = open_store(path)
    try:
        with caplog.at_level("WARNING"):
            hits = store.search_vectors("memory", matrix[n], org="acme", limit=5)
        assert hits[0].id == f"m{n:04d}" and all(np.isfinite(h.score) for h in hits)
        assert any("no number" in r.getMessage() for r in caplog.records)
        assert ids(store, matrix[n + 1])[0] == f"m{n + 1:04d}" and store.ann.builds == 1  # built again, from the database
        assert len(list(Path(f"{path}-ann").glob("*.usearch"))) == 1  # the damaged file is gone
        store.search_vectors("memory", np.full(matrix.shape[1], np.nan, dtype=np.float32), org="acme", limit=5)
        assert store.ann.builds == 1  # a question with no number is not the file's fault: nothing built again
    finally:
        store.close()


def test_a_compaction_between_the_look_at_the_log_and_the_catch_up_reopens_the_index(loaded: tuple[Path, np.ndarray]) -> None:
    """A reader looks at the log, then another process writes and compacts (dropping the log the reader would
    read), then the reader catches up: it must reopen the new file, not step over the dropped changes."""
    path, matrix = loaded
    reader, writer = open_store(path), open_store(path)
    try:
        assert ids(reader, matrix[1])[0] == "m0001"
        stale = reader.ann._open[("acme", "memory")]
        looked = reader.ann._state("acme", "memory")
        assert looked is not None
        moved = clustered(150, seed=9)  # past ann_compact_after: the writer compacts and drops the log
        writer.write(WriteBatch(vectors=vectors("acme", [f"m{i:04d}" for i in range(150)], moved)))
        assert writer._db.execute("SELECT count(*) FROM vector_log").fetchone()[0] == 0
        real = reader.ann._state
        reader.ann._state = lambda org, kind: (looked[0], looked[1] + 1)  # type: ignore[method-assign]  # what it saw
        try:
            index = reader.ann.get("acme", "memory")
        finally:
            reader.ann._state = real  # type: ignore[method-assign]
        assert index is not stale
        assert [ids(reader, moved[n])[0] for n in (5, 50, 120)] == ["m0005", "m0050", "m0120"]
    finally:
        reader.close()
        writer.close()


@pytest.mark.parametrize("damage", ["deleted", "truncated", "garbage", "sidecar"])
def test_a_missing_or_corrupt_file_is_rebuilt(loaded: tuple[Path, np.ndarray], damage: str) -> None:
    path, matrix = loaded
    directory = Path(f"{path}-ann")
    index_file = next(directory.glob("*.usearch"))
    if damage == "deleted":
        shutil.rmtree(directory)
    elif damage == "truncated":
        index_file.write_bytes(index_file.read_bytes()[: index_file.stat().st_size // 2])
    elif damage == "garbage":
        index_file.write_bytes(b"\0not an index" * 1000)
    else:
        next(directory.glob("*.json")).write_text("{")
    store = open_store(path)
    try:
        assert ids(store, matrix[42])[0] == "m0042"
        assert store.ann.builds == 1
    finally:
        store.close()
    again = open_store(path)  # the rebuilt file is good for the next process
    try:
        assert ids(again, matrix[43])[0] == "m0043"
        assert again.ann.builds == 0
    finally:
        again.close()


def test_the_file_of_another_database_or_an_older_file_is_not_used(loaded: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    path, matrix = loaded
    # another database with the same org and kind but other vectors, given this one's index files
    other = tmp_path / "other.db"
    store = open_store(other)
    store.write(WriteBatch(orgs=[Org(id="acme")], vectors=vectors("acme", [f"x{i}" for i in range(1000)], clustered(1000, seed=5))))
    store.close()
    shutil.rmtree(f"{other}-ann")
    shutil.copytree(f"{path}-ann", f"{other}-ann")
    store = open_store(other)
    try:
        assert ids(store, clustered(1000, seed=5)[9])[0] == "x9"
        assert store.ann.builds == 1
    finally:
        store.close()
    # a file older than the log kept: saved, then compacted past by a writer, then put back
    old = tmp_path / "old-ann"
    shutil.copytree(f"{path}-ann", old)
    store = open_store(path)
    store.write(WriteBatch(vectors=vectors("acme", [f"m{i:04d}" for i in range(150)], clustered(150, seed=8))))
    store.close()
    shutil.rmtree(f"{path}-ann")
    shutil.copytree(old, f"{path}-ann")
    store = open_store(path)
    try:
        assert ids(store, clustered(150, seed=8)[3])[0] == "m0003"
        assert store.ann.builds == 1
    finally:
        store.close()


def test_each_org_searches_its_own_index_only(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.db")
    try:
        shared = clustered(600, seed=3)
        store.write(WriteBatch(orgs=[Org(id="acme"), Org(id="globex")],
                               vectors=vectors("acme", [f"a{i}" for i in range(600)], shared)
                               + vectors("globex", [f"g{i}" for i in range(600)], shared)))  # fmt: skip
        assert store.ann.builds == 2
        for org, prefix in (("acme", "a"), ("globex", "g")):
            found = store.search_vectors("memory", shared[11], org=org, limit=20)
            assert found[0].id == f"{prefix}11" and all(h.id.startswith(prefix) for h in found)
            found = store.search_vectors("memory", shared[11], org=org, limit=20, parents=["p3"])
            assert all(h.id.startswith(prefix) and h.parent == "p3" for h in found)
    finally:
        store.close()


def test_a_memory_moving_to_another_record_is_found_under_its_new_record(tmp_path: Path) -> None:
    from datetime import datetime, timezone

    from dossier.bundle import Memory, Record

    store = open_store(tmp_path / "s.db", ann_min_rows=100, hnsw_min_rows=100)
    try:
        matrix = clustered(400, seed=4)
        records = [(Record(id=f"p{i}", org="acme", kind="contact"), "h") for i in range(4)] + [
            (Record(id="elsewhere", org="acme", kind="contact"), "h")]  # fmt: skip
        memories = [(Memory(id=f"m{i:04d}", org="acme", record=f"p{i % 4}", text=f"note {i}",
                            created_at=datetime(2024, 1, 1, tzinfo=timezone.utc)), "h") for i in range(400)]  # fmt: skip
        store.write(WriteBatch(orgs=[Org(id="acme")], records=records, memories=memories,
                               vectors=vectors("acme", [f"m{i:04d}" for i in range(400)], matrix)))  # fmt: skip
        assert ids(store, matrix[8], parents=["p0"])[0] == "m0008"
        moved = Memory(id="m0008", org="acme", record="elsewhere", text="note 8", created_at=datetime(2024, 1, 1, tzinfo=timezone.utc))
        store.write(WriteBatch(memories=[(moved, "h2")]))  # same text, same vector: only its record changes
        assert "m0008" not in ids(store, matrix[8], parents=["p0"])
        assert ids(store, matrix[8], parents=["elsewhere"]) == ["m0008"]
        assert store.search_vectors("memory", matrix[8], org="acme", limit=1)[0].parent == "elsewhere"
    finally:
        store.close()


def test_the_embedding_model_loads_after_an_index_was_opened(loaded: tuple[Path, np.ndarray]) -> None:
    """usearch loaded before onnxruntime crashed the process; the index module loads them in a safe order."""
    import subprocess
    import sys

    path, _ = loaded
    script = (
        "import numpy as np, sys\n"
        "from dossier.stores.sqlite import SQLiteStore\n"
        "store = SQLiteStore(sys.argv[1], hnsw_min_rows=400, ann_min_rows=300)\n"
        "store.search_vectors('memory', np.ones(32, np.float32) / 32 ** 0.5, org='acme', limit=5)\n"
        "from dossier.providers.embeddings import OnnxMiniLM\n"
        "print(len(OnnxMiniLM().embed_query('still alive')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "384"


def test_a_viewers_search_of_the_ann_index_passes_over_what_it_may_not_see(tmp_path: Path) -> None:
    """Past the ANN line a viewer's section search asks the index for more while sections of documents it may
    not see fill its nearest: none comes back, and the best it may see does (as exact search ranks them)."""
    from dossier.bundle import Document, Section
    from dossier.stores.base import Viewer

    rng = np.random.default_rng(5)
    query = clustered(1, seed=9)[0]
    near = query + 0.05 * rng.normal(size=(300, DIMS))  # 300 legal-only sections around the question
    far = clustered(60, seed=3)  # 60 sections every caller may see
    matrix = np.vstack([near / np.linalg.norm(near, axis=1, keepdims=True), far]).astype(np.float32)
    documents = [(Document(id=f"d{i:03d}", org="acme", title=f"Doc {i}", visible_to_roles=("legal",) if i < 300 else None,
                           sections=(Section(id=f"s{i:03d}", heading="H", text=f"text {i}"),)), "h")
                 for i in range(360)]  # fmt: skip
    writes = [VectorWrite("acme", "section", f"s{i:03d}", f"d{i:03d}", "h", v) for i, v in enumerate(matrix)]
    store = open_store(tmp_path / "s.db", hnsw_min_rows=100, ann_min_rows=100)
    try:
        store.write(WriteBatch(orgs=[Org(id="acme")], documents=documents, vectors=writes))
        assert store.ann.builds == 1  # 360 rows: the org-wide search asks the ANN index
        viewer = Viewer(roles=frozenset({"sales"}), record_ids=frozenset())
        blind = store.search_vectors("section", query, org="acme", limit=5)
        assert all(int(h.parent[1:]) < 300 for h in blind)  # the premise: the hidden sections are the nearest
        seen = store.search_vectors("section", query, org="acme", limit=5, viewer=viewer)
        exact = exact_search(np.array([f"s{i:03d}" for i in range(300, 360)], dtype=object),
                             np.array([f"d{i:03d}" for i in range(300, 360)], dtype=object), matrix[300:], query, 5)  # fmt: skip
        assert len(seen) == 5 and all(int(h.parent[1:]) >= 300 for h in seen)
        assert seen[0].id == exact[0][0] and len({h.id for h in seen} & {k for k, _, _ in exact}) >= 4
        legal = Viewer(roles=frozenset({"legal"}), record_ids=frozenset())
        assert [h.id for h in store.search_vectors("section", query, org="acme", limit=5, viewer=legal)] == [h.id for h in blind]
    finally:
        store.close()
