"""How every SQLite handle of a dossier file is opened (stores/sqlite_connect.py)."""

from __future__ import annotations

from pathlib import Path

from dossier.stores.sqlite import SQLiteStore
from dossier.stores.sqlite_connect import CACHE_KIB, MMAP_BYTES, connect


def test_a_file_is_read_through_a_memory_map_with_a_larger_page_cache_in_wal_mode(tmp_path: Path) -> None:
    db = connect(str(tmp_path / "sub" / "s.db"))  # the folder is made
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA mmap_size").fetchone()[0] == MMAP_BYTES
        assert db.execute("PRAGMA cache_size").fetchone()[0] == -CACHE_KIB
    finally:
        db.close()


def test_the_store_s_own_connection_is_opened_that_way(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    try:
        assert store._query("PRAGMA mmap_size", ())[0][0] == MMAP_BYTES
        assert store._query("PRAGMA cache_size", ())[0][0] == -CACHE_KIB
    finally:
        store.close()


def test_opening_a_current_store_writes_nothing_so_a_read_only_file_can_be_read(tmp_path: Path) -> None:
    """Every open used to rewrite the schema version in a write transaction: a store whose file cannot be
    written (read-only, immutable) could not even be read."""
    path = tmp_path / "s.db"
    SQLiteStore(path).close()  # made and migrated
    again = SQLiteStore(path)
    try:
        assert again._db.total_changes == 0
        again._db.execute("PRAGMA query_only = ON")  # reading works as on a file that cannot be written
        assert again.get_org(org="nowhere") is None
    finally:
        again.close()


def test_a_file_of_a_newer_dossier_is_refused_before_any_write_is_tried(tmp_path: Path) -> None:
    """Said on the read that finds it, so a file that cannot be written gets the same answer."""
    import pytest

    import dossier

    path = tmp_path / "s.db"
    SQLiteStore(path).close()
    db = connect(str(path))
    db.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    db.close()
    with pytest.raises(dossier.SchemaMismatch, match="schema version 999.*upgrade dossier"):
        SQLiteStore(path)


def test_a_reader_never_waits_for_a_writer_and_a_write_it_blocks_is_a_store_error(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    """Another process holds the file's write lock (a long load). Opening an engine and asking it reads
    only: the embedder is already recorded, so binding it takes no write lock. A write that cannot get the
    lock fails with StoreError, naming the cause, not a driver error."""
    import sqlite3

    import pytest

    import dossier

    url = f"sqlite:///{tmp_path / 's.db'}"
    with dossier.open(url, embedder=embedder) as engine:
        engine.load_bundle({"orgs": [{"id": "acme"}], "callers": [{"id": "ana", "org": "acme", "roles": ["sales"]}],
                            "records": [{"id": "r-jane", "org": "acme", "kind": "contact", "identifiers": {"email": "jane@acme.com"}}],
                            "memories": [{"id": "m-1", "org": "acme", "record": "r-jane", "text": "Jane asked about pricing.",
                                          "created_at": "2026-01-05T10:00:00Z"}]})  # fmt: skip
    loader = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    loader.execute("BEGIN IMMEDIATE")  # held, as a load's one write transaction is
    try:
        with dossier.open(url, embedder=embedder) as engine:
            engine.store._db.execute("PRAGMA busy_timeout = 200")  # a write gives up at once (30 s by default)
            answer = engine.retrieve({"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "pricing?"},
                                     org="acme", caller="ana")  # fmt: skip
            assert [m.id for m in answer.sources["memories"].items] == ["m-1"]
            with pytest.raises(dossier.StoreError, match="cannot be written now .*another process holds its write lock"):
                engine.store.put_settings({"max_picks": 2}, org="acme")
    finally:
        loader.execute("ROLLBACK")
        loader.close()
