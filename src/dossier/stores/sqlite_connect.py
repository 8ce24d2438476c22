"""How every SQLite handle of a dossier file is opened: the data store's and the service tables' alike."""

from __future__ import annotations

import sqlite3
from pathlib import Path

#: Reads map the file (SQLite's own ceiling, 2 GiB) instead of copying each page through a system call, and
#: keep up to 64 MiB of pages per connection (SQLite's default is 2 MB): a call on a large record reads
#: a few thousand pages at random (its memories' full-text candidates, rows and keys). On the 100,000-memory
#: record of ``bench/retrieve.py --one-record`` they cut the record's full-text search from about 9.5 to 7.5
#: ms and the reads of its candidates by a fifth (docs/scaling.md).
MMAP_BYTES = 2_147_418_112
CACHE_KIB = 65_536


def connect(path: str) -> sqlite3.Connection:
    """A connection on ``path`` (its folder made when missing; ``:memory:`` as is), shared between threads
    behind the caller's own lock, in autocommit mode (the caller opens its transactions), in WAL mode (readers
    never wait for the writer) with ``synchronous = NORMAL``, waiting up to 30 s for another writer's lock,
    reading through a memory map with a page cache of ``CACHE_KIB`` (above).

    Raises :class:`sqlite3.DatabaseError` (the caller says which store could not be opened)."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA busy_timeout = 30000")
        db.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
        db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    except BaseException:
        db.close()
        raise
    return db
