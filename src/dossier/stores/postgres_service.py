"""The service tables (:class:`~dossier.stores.service_base.ServiceStore`) in the data's PostgreSQL database.

A small connection pool of its own on the same database, with its own schema version under
``service_meta`` and its own migrations: the data schema (``dossier_schema``) is neither read nor
written here. The tables map the SQLite ones column for column.
"""

from __future__ import annotations

from typing import Any, Sequence

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import SchemaMismatch, StoreError, StoreUnavailable
from .postgres import _dossier_options
from .service_base import ApiKey, AuditRow, Feedback, LedgerEntry, Session, UsageLine

#: ``SERVICE_MIGRATIONS[i]`` moves the service tables from version i to i + 1.
SERVICE_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE api_keys (
        id text PRIMARY KEY, org text NOT NULL, caller text NOT NULL, secret_hash text NOT NULL,
        created_at double precision NOT NULL, revoked_at double precision, name text
    );
    CREATE INDEX api_keys_org ON api_keys (org, created_at);
    CREATE TABLE sessions (
        id text PRIMARY KEY, org text NOT NULL, caller text NOT NULL, call_id text NOT NULL,
        state text NOT NULL, created_at double precision NOT NULL, last_used double precision NOT NULL
    );
    CREATE INDEX sessions_last_used ON sessions (last_used);
    CREATE TABLE audit (
        call_id text PRIMARY KEY, org text NOT NULL, caller text NOT NULL, key_id text, front_end text NOT NULL,
        at double precision NOT NULL, latency_ms double precision NOT NULL, mode text, depth text,
        outcome text NOT NULL, error_type text, units integer NOT NULL, shape text NOT NULL
    );
    CREATE INDEX audit_org_at ON audit (org, at);
    CREATE TABLE feedback (
        seq bigserial PRIMARY KEY, call_id text NOT NULL, org text NOT NULL, caller text NOT NULL,
        rating integer NOT NULL, comment text, at double precision NOT NULL
    );
    CREATE INDEX feedback_call ON feedback (org, call_id);
    CREATE TABLE ledger (
        seq bigserial PRIMARY KEY, org text NOT NULL, call_id text NOT NULL, kind text NOT NULL,
        item text NOT NULL, units integer NOT NULL, at double precision NOT NULL
    );
    CREATE INDEX ledger_org_at ON ledger (org, at);
    """,
)
SERVICE_SCHEMA_VERSION = len(SERVICE_MIGRATIONS)
_MIGRATION_LOCK = 7_345_010
_KEY_COLUMNS = "id, org, caller, secret_hash, created_at, revoked_at, name"
_AUDIT_COLUMNS = "call_id, org, caller, key_id, front_end, at, latency_ms, mode, depth, outcome, error_type, units, shape"


class PostgresServiceStore:
    """Service tables in one PostgreSQL database (usually the data's own)."""

    def __init__(self, url: str, *, pool_size: int = 4, timeout: float = 30.0) -> None:
        self.url = url
        url, _ = _dossier_options(url)  # the data store's own options are not libpq's
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=int(timeout)) as conn:
                self._migrate(conn)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"cannot open the service tables at {url}: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"cannot prepare the service tables at {url}: {exc}") from exc
        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, timeout=timeout, kwargs={"autocommit": True},
                                    open=False, name="dossier-service")  # fmt: skip
        try:
            self._pool.open(wait=True, timeout=timeout)
        except PoolTimeout as exc:
            self._pool.close()
            raise StoreUnavailable(f"cannot connect to the service tables at {url}: {exc}") from exc

    def close(self) -> None:
        self._pool.close()

    def _migrate(self, conn: psycopg.Connection) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [_MIGRATION_LOCK])
            conn.execute("CREATE TABLE IF NOT EXISTS service_meta (key text PRIMARY KEY, value text NOT NULL)")
            row = conn.execute("SELECT value FROM service_meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SERVICE_SCHEMA_VERSION:
                raise SchemaMismatch(
                    f"{self.url} has service schema version {version}; this dossier knows up to "
                    f"{SERVICE_SCHEMA_VERSION}: upgrade dossier"
                )
            for script in SERVICE_MIGRATIONS[version:]:
                conn.execute(script)  # type: ignore[arg-type]
            conn.execute(
                "INSERT INTO service_meta VALUES ('schema_version', %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [str(SERVICE_SCHEMA_VERSION)],
            )

    def _run(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> tuple[list[tuple], int]:
        """Run statements in one transaction; the rows and row count of the last one."""
        try:
            with self._pool.connection() as conn, conn.transaction():
                for sql, params in statements:
                    cur = conn.execute(sql, params, binary=True)  # type: ignore[arg-type]
                rows = cur.fetchall() if cur.description else []
                return rows, cur.rowcount
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise StoreUnavailable(f"the service tables at {self.url} are unreachable: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL service query failed (nothing was written): {exc}") from exc

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return self._run([(sql, params)])[0]

    def check_ready(self, *, at: float) -> None:
        self._run([
            ("SELECT value FROM service_meta WHERE key = 'schema_version'", ()),
            ("INSERT INTO service_meta VALUES ('ready_checked_at', %b) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
             (repr(at),)),
        ])  # fmt: skip

    # -- keys --------------------------------------------------------------------------------------
    def add_key(self, key: ApiKey) -> None:
        self._run([("INSERT INTO api_keys VALUES (%b, %b, %b, %b, %b, %b, %b)",
                    (key.id, key.org, key.caller, key.secret_hash, key.created_at, key.revoked_at, key.name))])  # fmt: skip

    def get_key(self, key_id: str) -> ApiKey | None:
        rows = self._query(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = %b", (key_id,))
        return ApiKey(*rows[0]) if rows else None

    def list_keys(self, *, org: str | None = None) -> list[ApiKey]:
        if org is None:
            rows = self._query(f"SELECT {_KEY_COLUMNS} FROM api_keys ORDER BY created_at, id")
        else:
            rows = self._query(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE org = %b ORDER BY created_at, id", (org,))
        return [ApiKey(*row) for row in rows]

    def revoke_key(self, key_id: str, *, at: float) -> bool:
        _, count = self._run([("UPDATE api_keys SET revoked_at = %b WHERE id = %b AND revoked_at IS NULL", (at, key_id))])
        return count > 0

    # -- sessions ----------------------------------------------------------------------------------
    def put_session(self, session: Session, *, idle_before: float) -> None:
        s = session
        self._run([
            ("DELETE FROM sessions WHERE last_used < %b", (idle_before,)),
            ("INSERT INTO sessions VALUES (%b, %b, %b, %b, %b, %b, %b) ON CONFLICT (id) DO UPDATE SET org = excluded.org, "
             "caller = excluded.caller, call_id = excluded.call_id, state = excluded.state, "
             "created_at = excluded.created_at, last_used = excluded.last_used",
             (s.id, s.org, s.caller, s.call_id, s.state, s.created_at, s.last_used)),
        ])  # fmt: skip

    def get_session(self, session_id: str) -> Session | None:
        rows = self._query(
            "SELECT id, org, caller, call_id, state, created_at, last_used FROM sessions WHERE id = %b", (session_id,)
        )
        return Session(*rows[0]) if rows else None

    def delete_session(self, session_id: str, *, org: str) -> None:
        self._run([("DELETE FROM sessions WHERE id = %b AND org = %b", (session_id, org))])

    # -- audit and feedback ------------------------------------------------------------------------
    def add_audit(self, row: AuditRow) -> None:
        r = row
        self._run([(
            "INSERT INTO audit VALUES (%b, %b, %b, %b, %b, %b, %b, %b, %b, %b, %b, %b, %b) ON CONFLICT (call_id) DO UPDATE SET "
            "org = excluded.org, caller = excluded.caller, key_id = excluded.key_id, front_end = excluded.front_end, "
            "at = excluded.at, latency_ms = excluded.latency_ms, mode = excluded.mode, depth = excluded.depth, "
            "outcome = excluded.outcome, error_type = excluded.error_type, units = excluded.units, shape = excluded.shape",
            (r.call_id, r.org, r.caller, r.key_id, r.front_end, r.at, r.latency_ms, r.mode, r.depth, r.outcome,
             r.error_type, r.units, r.shape),
        )])  # fmt: skip

    def get_audit(self, call_id: str) -> AuditRow | None:
        rows = self._query(f"SELECT {_AUDIT_COLUMNS} FROM audit WHERE call_id = %b", (call_id,))
        return AuditRow(*rows[0]) if rows else None

    def audit_rows(self, *, org: str, limit: int) -> list[AuditRow]:
        rows = self._query(
            f"SELECT {_AUDIT_COLUMNS} FROM audit WHERE org = %b ORDER BY at DESC, call_id LIMIT %b", (org, int(limit))
        )
        return [AuditRow(*row) for row in rows]

    def add_feedback(self, feedback: Feedback) -> None:
        f = feedback
        self._run([("INSERT INTO feedback (call_id, org, caller, rating, comment, at) VALUES (%b, %b, %b, %b, %b, %b)",
                    (f.call_id, f.org, f.caller, f.rating, f.comment, f.at))])  # fmt: skip

    def get_feedback(self, call_id: str, *, org: str) -> list[Feedback]:
        rows = self._query(
            "SELECT call_id, org, caller, rating, comment, at FROM feedback WHERE org = %b AND call_id = %b ORDER BY seq",
            (org, call_id),
        )
        return [Feedback(*row) for row in rows]

    # -- billing -----------------------------------------------------------------------------------
    def add_ledger(self, entry: LedgerEntry) -> None:
        e = entry
        self._run([("INSERT INTO ledger (org, call_id, kind, item, units, at) VALUES (%b, %b, %b, %b, %b, %b)",
                    (e.org, e.call_id, e.kind, e.item, e.units, e.at))])  # fmt: skip

    def usage(self, *, org: str, since: float | None = None, until: float | None = None) -> list[UsageLine]:
        sql = (
            "SELECT item, count(*) FILTER (WHERE kind = 'charge'), sum(CASE WHEN units > 0 THEN units ELSE 0 END), "
            "sum(CASE WHEN units < 0 THEN -units ELSE 0 END) FROM ledger WHERE org = %b"
        )
        params: list[Any] = [org]
        if since is not None:
            sql += " AND at >= %b"
            params.append(float(since))
        if until is not None:
            sql += " AND at < %b"
            params.append(float(until))
        rows = self._query(sql + " GROUP BY item ORDER BY item", params)
        return [UsageLine(item=r[0], calls=int(r[1] or 0), charged=int(r[2] or 0), refunded=int(r[3] or 0)) for r in rows]
