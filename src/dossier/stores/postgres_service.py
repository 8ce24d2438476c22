"""The service tables (:class:`~dossier.stores.service_base.ServiceStore`) in the data's PostgreSQL database.

A small connection pool of its own on the same database, with its own schema version under
``service_meta`` and its own migrations: the data schema (``dossier_schema``) is neither read nor
written here. The tables map the SQLite ones column for column, and the statements are
:class:`~dossier.stores.service_sql.SQLServiceStore`'s, said PostgreSQL's way (:class:`PostgresServiceDialect`).
"""

from __future__ import annotations

from typing import Sequence

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import SchemaMismatch, StoreError, StoreUnavailable, redacted_url
from .postgres import _dossier_options, statement_timeout, trusted
from .postgres_pool import Pool, dropped
from .service_sql import Access, SQLServiceStore, Statement

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


class PostgresServiceDialect:
    """The service statements over a small pool of autocommit connections, each list in one transaction."""

    placeholder = "%b"  # binary parameters
    insertion_order = "seq"
    count_charges = "count(*) FILTER (WHERE kind = 'charge')"

    def __init__(self, url: str, *, pool_size: int, timeout: float) -> None:
        self.url = url
        url, options = _dossier_options(url)  # the data store's own options are not libpq's
        #: the data store's bound on a statement (``dossier_statement_timeout_ms``) holds here too: a key check
        #: that a lock keeps waiting fails (503) instead of holding a worker's thread
        self.statement_timeout_ms = statement_timeout(options)
        self._per_transaction = options.get("settings", "session") != "session"
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=int(timeout)) as conn:
                self._migrate(conn)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"cannot open the service tables at {redacted_url(url)}: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"cannot prepare the service tables at {redacted_url(url)}: {exc}") from exc
        def configure(conn: psycopg.Connection) -> None:
            if not self._per_transaction:  # behind a transaction-pooling proxy it is set in each transaction (run)
                conn.execute(f"SET statement_timeout = {self.statement_timeout_ms}")

        def make() -> ConnectionPool:
            return ConnectionPool(url, min_size=1, max_size=pool_size, timeout=timeout, kwargs={"autocommit": True},
                                  configure=configure, open=False, name="dossier-service")  # fmt: skip

        self._pool = Pool(make, url=url, label=redacted_url(url), probe_timeout=min(timeout, 5.0))
        try:
            self._pool.open(timeout)
        except PoolTimeout as exc:
            self._pool.close()
            raise StoreUnavailable(f"cannot connect to the service tables at {redacted_url(url)}: {exc}") from exc

    def close(self) -> None:
        self._pool.close()

    def upsert(self, table: str, columns: Sequence[str], key: str) -> str:
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c != key)
        return f"INSERT INTO {table} VALUES ({', '.join('?' for _ in columns)}) ON CONFLICT ({key}) DO UPDATE SET {updates}"

    def _migrate(self, conn: psycopg.Connection) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [_MIGRATION_LOCK])
            conn.execute("CREATE TABLE IF NOT EXISTS service_meta (key text PRIMARY KEY, value text NOT NULL)")
            row = conn.execute("SELECT value FROM service_meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SERVICE_SCHEMA_VERSION:
                raise SchemaMismatch(
                    f"{redacted_url(self.url)} has service schema version {version}; this dossier knows up to "
                    f"{SERVICE_SCHEMA_VERSION}: upgrade dossier"
                )
            for script in SERVICE_MIGRATIONS[version:]:
                conn.execute(trusted(script))
            conn.execute(
                "INSERT INTO service_meta VALUES ('schema_version', %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [str(SERVICE_SCHEMA_VERSION)],
            )

    def run(self, statements: Sequence[Statement], *, access: Access) -> tuple[list[tuple], int]:
        for attempt in (1, 2):
            conn: psycopg.Connection | None = None
            began = False
            try:
                with self._pool.connection() as conn, conn.transaction():
                    began = True
                    rows: list[tuple] = []
                    count = -1
                    if self._per_transaction:
                        conn.execute("SELECT set_config('statement_timeout', %b, true)", [str(self.statement_timeout_ms)])
                    for sql, params in statements:
                        cur = conn.execute(trusted(sql), params, binary=True)
                        rows = cur.fetchall() if cur.description else []
                        count = cur.rowcount
                    return rows, count
            except psycopg.errors.QueryCanceled as exc:
                raise StoreError(f"a service statement ran past the store's statement timeout ({self.statement_timeout_ms} ms; "
                                 f"dossier_statement_timeout_ms on the URL): {exc}") from exc  # fmt: skip
            except (psycopg.OperationalError, PoolTimeout) as exc:
                if not began and dropped(self._pool, conn, attempt):  # BEGIN failed: nothing ran on it
                    continue
                self._pool.unsure()
                raise StoreUnavailable(f"the service tables at {redacted_url(self.url)} are unreachable: {exc}") from exc
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL service query failed (nothing was written): {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover - the second attempt returns or raises


class PostgresServiceStore(SQLServiceStore):
    """Service tables in one PostgreSQL database (usually the data's own)."""

    def __init__(self, url: str, *, pool_size: int = 4, timeout: float = 30.0) -> None:
        super().__init__(PostgresServiceDialect(url, pool_size=pool_size, timeout=timeout), url=url)
