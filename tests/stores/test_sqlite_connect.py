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
