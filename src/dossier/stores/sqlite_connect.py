"""How every SQLite handle of a dossier file is opened: the data store's and the service tables' alike."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def connect(path: str) -> sqlite3.Connection:
    """A connection on ``path`` (its folder made when missing; ``:memory:`` as is), shared between threads
    behind the caller's own lock, in autocommit mode (the caller opens its transactions), in WAL mode (readers
    never wait for the writer) with ``synchronous = NORMAL``, waiting up to 30 s for another writer's lock.

    Raises :class:`sqlite3.DatabaseError` (the caller says which store could not be opened)."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA busy_timeout = 30000")
    except BaseException:
        db.close()
        raise
    return db
