"""The service tables (:class:`~dossier.stores.service_base.ServiceStore`) in the data's SQLite file.

A connection of its own on the same file (WAL, so readers never wait for writers), with its own schema
version under ``service_meta`` and its own migrations: the data schema (``meta``, ``MIGRATIONS``) is
neither read nor written here. The statements are :class:`~dossier.stores.service_sql.SQLServiceStore`'s;
this module says them SQLite's way (:class:`SQLiteServiceDialect`).
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import SchemaMismatch, StoreError, StoreUnavailable
from .service_sql import Access, SQLServiceStore, Statement
from .sqlite_connect import connect

#: ``SERVICE_MIGRATIONS[i]`` moves the service tables from version i to i + 1.
SERVICE_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE service_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE api_keys (
        id TEXT PRIMARY KEY, org TEXT NOT NULL, caller TEXT NOT NULL, secret_hash TEXT NOT NULL,
        created_at REAL NOT NULL, revoked_at REAL, name TEXT
    );
    CREATE INDEX api_keys_org ON api_keys (org, created_at);
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY, org TEXT NOT NULL, caller TEXT NOT NULL, call_id TEXT NOT NULL,
        state TEXT NOT NULL, created_at REAL NOT NULL, last_used REAL NOT NULL
    );
    CREATE INDEX sessions_last_used ON sessions (last_used);
    CREATE TABLE audit (
        call_id TEXT PRIMARY KEY, org TEXT NOT NULL, caller TEXT NOT NULL, key_id TEXT, front_end TEXT NOT NULL,
        at REAL NOT NULL, latency_ms REAL NOT NULL, mode TEXT, depth TEXT, outcome TEXT NOT NULL,
        error_type TEXT, units INTEGER NOT NULL, shape TEXT NOT NULL
    );
    CREATE INDEX audit_org_at ON audit (org, at);
    CREATE TABLE feedback (
        rowid INTEGER PRIMARY KEY, call_id TEXT NOT NULL, org TEXT NOT NULL, caller TEXT NOT NULL,
        rating INTEGER NOT NULL, comment TEXT, at REAL NOT NULL
    );
    CREATE INDEX feedback_call ON feedback (org, call_id);
    CREATE TABLE ledger (
        rowid INTEGER PRIMARY KEY, org TEXT NOT NULL, call_id TEXT NOT NULL, kind TEXT NOT NULL,
        item TEXT NOT NULL, units INTEGER NOT NULL, at REAL NOT NULL
    );
    CREATE INDEX ledger_org_at ON ledger (org, at);
    """,
)
SERVICE_SCHEMA_VERSION = len(SERVICE_MIGRATIONS)


class SQLiteServiceDialect:
    """The service statements on one SQLite connection, one transaction at a time (behind a lock)."""

    placeholder = "?"
    insertion_order = "rowid"
    count_charges = "SUM(kind = 'charge')"

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.RLock()
        try:
            self._db = connect(self.path)
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailable(f"cannot open the service tables in {self.path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def upsert(self, table: str, columns: Sequence[str], key: str) -> str:
        return f"INSERT OR REPLACE INTO {table} VALUES ({', '.join('?' for _ in columns)})"

    def _migrate(self) -> None:
        with self._transaction() as db:
            version = 0
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'service_meta'").fetchone():
                row = db.execute("SELECT value FROM service_meta WHERE key = 'schema_version'").fetchone()
                version = int(row[0]) if row else 0
            if version > SERVICE_SCHEMA_VERSION:
                raise SchemaMismatch(
                    f"{self.path} has service schema version {version}; this dossier knows up to "
                    f"{SERVICE_SCHEMA_VERSION}: upgrade dossier"
                )
            for script in SERVICE_MIGRATIONS[version:]:
                for statement in script.split(";"):
                    if statement.strip():
                        db.execute(statement)
            db.execute(
                "INSERT OR REPLACE INTO service_meta VALUES ('schema_version', ?)", (str(SERVICE_SCHEMA_VERSION),)
            )

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            try:
                self._db.execute("COMMIT")
            except BaseException:
                # a COMMIT that failed (a full disk: SQLITE_FULL, SQLITE_IOERR) may leave the transaction
                # open; roll it back, or every later BEGIN on this connection would fail too
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def run(self, statements: Sequence[Statement], *, access: Access) -> tuple[list[tuple], int]:
        if access == "read":  # reads take no transaction: WAL gives each statement a consistent snapshot
            with self._lock:
                try:
                    return _execute(self._db, statements)
                except sqlite3.DatabaseError as exc:
                    raise StoreError(f"SQLite query failed: {exc}") from exc
        try:
            with self._transaction() as db:
                return _execute(db, statements)
        except sqlite3.DatabaseError as exc:
            what = "read and write check" if access == "check" else "write"
            raise StoreError(f"SQLite {what} failed (nothing was written): {exc}") from exc


def _execute(db: sqlite3.Connection, statements: Sequence[Statement]) -> tuple[list[tuple], int]:
    rows: list[tuple] = []
    count = -1
    for sql, params in statements:
        cursor = db.execute(sql, params)
        rows = cursor.fetchall() if cursor.description else []
        count = cursor.rowcount
    return rows, count


class SQLiteServiceStore(SQLServiceStore):
    """Service tables in one SQLite file (usually the data's own)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        super().__init__(SQLiteServiceDialect(self.path), url=f"sqlite:///{self.path}")
