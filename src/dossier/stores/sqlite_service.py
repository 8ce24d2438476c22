"""The service tables (:class:`~dossier.stores.service_base.ServiceStore`) in the data's SQLite file.

A connection of its own on the same file (WAL, so readers never wait for writers), with its own schema
version under ``service_meta`` and its own migrations: the data schema (``meta``, ``MIGRATIONS``) is
neither read nor written here.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import SchemaMismatch, StoreError, StoreUnavailable
from .service_base import ApiKey, AuditRow, Feedback, LedgerEntry, Session, UsageLine

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


class SQLiteServiceStore:
    """Service tables in one SQLite file (usually the data's own file)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.url = f"sqlite:///{self.path}"
        self._lock = threading.RLock()
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._db.execute("PRAGMA busy_timeout = 30000")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailable(f"cannot open the service tables in {self.path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()

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

    def _write(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            with self._transaction() as db:
                return db.execute(sql, params).rowcount
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"SQLite write failed (nothing was written): {exc}") from exc

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"SQLite query failed: {exc}") from exc

    def check_ready(self, *, at: float) -> None:
        try:
            with self._transaction() as db:
                db.execute("SELECT value FROM service_meta WHERE key = 'schema_version'").fetchone()
                db.execute("INSERT OR REPLACE INTO service_meta VALUES ('ready_checked_at', ?)", (repr(at),))
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"SQLite read and write check failed (nothing was written): {exc}") from exc

    # -- keys --------------------------------------------------------------------------------------
    def add_key(self, key: ApiKey) -> None:
        self._write(
            "INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, ?, ?)",
            (key.id, key.org, key.caller, key.secret_hash, key.created_at, key.revoked_at, key.name),
        )

    def get_key(self, key_id: str) -> ApiKey | None:
        rows = self._query(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?", (key_id,))
        return ApiKey(*rows[0]) if rows else None

    def list_keys(self, *, org: str | None = None) -> list[ApiKey]:
        if org is None:
            rows = self._query(f"SELECT {_KEY_COLUMNS} FROM api_keys ORDER BY created_at, id")
        else:
            rows = self._query(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE org = ? ORDER BY created_at, id", (org,))
        return [ApiKey(*row) for row in rows]

    def revoke_key(self, key_id: str, *, at: float) -> bool:
        return self._write("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (at, key_id)) > 0

    # -- sessions ----------------------------------------------------------------------------------
    def put_session(self, session: Session, *, idle_before: float) -> None:
        s = session
        try:
            with self._transaction() as db:
                db.execute("DELETE FROM sessions WHERE last_used < ?", (idle_before,))
                db.execute(
                    "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (s.id, s.org, s.caller, s.call_id, s.state, s.created_at, s.last_used),
                )
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"SQLite write failed (nothing was written): {exc}") from exc

    def get_session(self, session_id: str) -> Session | None:
        rows = self._query(
            "SELECT id, org, caller, call_id, state, created_at, last_used FROM sessions WHERE id = ?", (session_id,)
        )
        return Session(*rows[0]) if rows else None

    def delete_session(self, session_id: str, *, org: str) -> None:
        self._write("DELETE FROM sessions WHERE id = ? AND org = ?", (session_id, org))

    # -- audit and feedback ------------------------------------------------------------------------
    def add_audit(self, row: AuditRow) -> None:
        r = row
        self._write(
            "INSERT OR REPLACE INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r.call_id, r.org, r.caller, r.key_id, r.front_end, r.at, r.latency_ms, r.mode, r.depth, r.outcome,
             r.error_type, r.units, r.shape),
        )  # fmt: skip

    def get_audit(self, call_id: str) -> AuditRow | None:
        rows = self._query(f"SELECT {_AUDIT_COLUMNS} FROM audit WHERE call_id = ?", (call_id,))
        return AuditRow(*rows[0]) if rows else None

    def audit_rows(self, *, org: str, limit: int) -> list[AuditRow]:
        rows = self._query(
            f"SELECT {_AUDIT_COLUMNS} FROM audit WHERE org = ? ORDER BY at DESC, call_id LIMIT ?", (org, int(limit))
        )
        return [AuditRow(*row) for row in rows]

    def add_feedback(self, feedback: Feedback) -> None:
        f = feedback
        self._write(
            "INSERT INTO feedback (call_id, org, caller, rating, comment, at) VALUES (?, ?, ?, ?, ?, ?)",
            (f.call_id, f.org, f.caller, f.rating, f.comment, f.at),
        )

    def get_feedback(self, call_id: str, *, org: str) -> list[Feedback]:
        rows = self._query(
            "SELECT call_id, org, caller, rating, comment, at FROM feedback WHERE org = ? AND call_id = ? ORDER BY rowid",
            (org, call_id),
        )
        return [Feedback(*row) for row in rows]

    # -- billing -----------------------------------------------------------------------------------
    def add_ledger(self, entry: LedgerEntry) -> None:
        e = entry
        self._write(
            "INSERT INTO ledger (org, call_id, kind, item, units, at) VALUES (?, ?, ?, ?, ?, ?)",
            (e.org, e.call_id, e.kind, e.item, e.units, e.at),
        )

    def usage(self, *, org: str, since: float | None = None, until: float | None = None) -> list[UsageLine]:
        sql = (
            "SELECT item, SUM(kind = 'charge'), SUM(CASE WHEN units > 0 THEN units ELSE 0 END), "
            "SUM(CASE WHEN units < 0 THEN -units ELSE 0 END) FROM ledger WHERE org = ?"
        )
        params: list[Any] = [org]
        if since is not None:
            sql += " AND at >= ?"
            params.append(since)
        if until is not None:
            sql += " AND at < ?"
            params.append(until)
        rows = self._query(sql + " GROUP BY item ORDER BY item", params)
        return [UsageLine(item=r[0], calls=int(r[1] or 0), charged=int(r[2] or 0), refunded=int(r[3] or 0)) for r in rows]


_KEY_COLUMNS = "id, org, caller, secret_hash, created_at, revoked_at, name"
_AUDIT_COLUMNS = (
    "call_id, org, caller, key_id, front_end, at, latency_ms, mode, depth, outcome, error_type, units, shape"
)
