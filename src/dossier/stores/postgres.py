"""The scale store: PostgreSQL with pgvector (HNSW, cosine) and ``tsvector`` / GIN full text, via psycopg 3.

Layout (``postgres_schema.py``): one table per kind of item, every row keyed by ``(org, id)``; full
text in ``tsvector`` side tables with GIN indexes (``postgres_fulltext.py`` ranks them), list-partitioned
by org, so that no org's search reads another org's postings (its statements are planned at each run, for
their org's partition: never a plan shared by every org); vectors in ``vectors``, list-partitioned by org,
so each org's nearest-neighbour search runs over its own rows and its own index (an HNSW graph filtered by
org afterwards would return too few hits for a small org). A write creates the partitions of an org it
is the first to write.

Vector search is exact (a scan of the org's rows of one kind) until that org holds ``exact_below``
vectors of the kind; the write that crosses the line builds a partial HNSW index (cosine) for that org
and kind, and searches then use it with ``hnsw.ef_search = max(ef_search, limit)``. Searches among the
children of ``parents`` are always exact (the rows come from the ``(org, kind, parent)`` index).

Org scoping: every statement filters by org, and row-level security holds each connection to the org
in its ``dossier.org`` setting, set before every statement that reads or writes org data (once per
session while it stays on one org; per transaction with ``settings=transaction``, for a pooler such as
PgBouncer in transaction mode). Connections run in autocommit; a write is one transaction. No rows are
cached between calls, so a write by any process is seen by the next read of every process (full-text
statistics are kept a few minutes, see ``postgres_fulltext.py``).

Options come from the constructor or from ``dossier_*`` parameters of the URL (so that
``DOSSIER_DATABASE_URL`` can carry them), e.g. ``postgresql://app@db/dossier?dossier_ef_search=200``:
``exact_below``, ``ef_search``, ``hnsw_m``, ``hnsw_ef_construction``, ``index_build_memory`` and
``settings`` (``session`` or ``transaction``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import defaultdict
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator, LiteralString, Sequence, cast
from urllib.parse import parse_qsl, urlencode

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types import TypeInfo
from psycopg_pool import ConnectionPool, PoolTimeout
from pgvector.psycopg.vector import register_vector_info

from ..bundle import Caller, Document, Edge, Identifiers, Memory, Org, Record, Section
from ..errors import ConfigError, DossierError, SchemaMismatch, StoreError, StoreUnavailable, redacted_url
from ..identifiers import IdentifierKind, normalize
from .base import (RESTRICTED_SQL, VECTOR_KINDS, DocumentAccess, EdgeHop, GuardReads, Hit, ItemKind, TextKind, VectorKind, Viewer, WriteBatch,
                   merge_cycle, merge_cycle_error, require_org, shown_records, text_scope_asked, walk_edges, write_guard)
from .fulltext import terms
from .postgres_fulltext import TextSearch
from .postgres_pool import Pool, dropped
from .postgres_schema import MIGRATIONS, SCHEMA_VERSION, partition_ddl, text_partition_ddl
from .postgres_write import group_by_org, write_org

_TABLES: dict[str, str] = {
    "org": "orgs", "caller": "callers", "record": "records",
    "memory": "memories", "document": "documents", "edge": "edges",
}  # fmt: skip
_MIGRATION_LOCK = 7_345_001  # pg_advisory_xact_lock keys
_PARTITION_LOCK = 7_345_002
_TEXT_PARTITION_LOCK = 7_345_004
_INDEX_LOCK = 7_345_003
_MAX_EF_SEARCH = 1000  # pgvector's ceiling; an HNSW scan returns at most ef_search rows
_CHUNK = 20_000
_ANALYZE_AFTER = 10_000  # rows of one table in one write


def trusted(text: str | sql.Composed) -> LiteralString | sql.Composed:
    """SQL this module wrote itself (migrations, partition DDL, queries assembled from its own constants,
    values always passed as parameters), for psycopg's literal-string check."""
    return text if isinstance(text, sql.Composed) else cast(LiteralString, text)


def _suffix(org: str) -> str:
    """The part of ``org``'s partition names that is its own (a digest: any org id makes a valid name)."""
    return hashlib.sha256(org.encode()).hexdigest()[:20]


def _attach(conn: psycopg.Connection, org: str, registry: LiteralString, lock: int, name: str,
            ddl: Callable[[str, str], list[str]]) -> None:  # fmt: skip
    """Create and attach ``org``'s partitions (``ddl(name, org literal)``) on ``conn``'s transaction unless
    ``registry`` already lists them, under an advisory lock so that two writers do not both create them."""
    conn.execute("SELECT set_config('dossier.org', %b, true)", [org])
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%b))", [lock, org])
    if conn.execute(trusted(f"SELECT 1 FROM {registry} WHERE org = %b"), [org]).fetchone() is None:
        literal = sql.Literal(org).as_string(conn)
        for statement in ddl(name, literal):
            conn.execute(trusted(statement))
        conn.execute(trusted(f"INSERT INTO {registry} VALUES (%b, %b)"), [org, name])


_log = logging.getLogger(__name__)

class _Connection(psycopg.Connection):
    """A pooled connection that remembers its session settings, so they are sent only when they change."""

    dossier_org: str | None = None
    ef_search: int | None = None


class PostgresStore:
    """A :class:`~dossier.stores.base.Store` in one PostgreSQL database (pgvector >= 0.5 installed)."""

    #: reads from several threads run at once (one pooled connection each): the engine prefetches
    concurrent_reads = True

    def __init__(
        self,
        url: str,
        *,
        exact_below: int = 2_000,
        ef_search: int = 200,
        hnsw_m: int = 16,
        hnsw_ef_construction: int = 64,
        index_build_memory: str = "1GB",
        session_settings: bool = True,
        pool_size: int = 8,
        timeout: float = 30.0,
        statement_timeout_ms: int = 30_000,
    ) -> None:
        self.url = url
        self._label = _redacted(url)  # for messages: no password
        url, options = _dossier_options(url)
        self.exact_below = int(options.get("exact_below", exact_below))
        self.ef_search = int(options.get("ef_search", ef_search))
        self.hnsw_m = int(options.get("hnsw_m", hnsw_m))
        self.hnsw_ef_construction = int(options.get("hnsw_ef_construction", hnsw_ef_construction))
        self.index_build_memory = options.get("index_build_memory", index_build_memory)
        self.session_settings = options.get("settings", "session" if session_settings else "transaction") == "session"
        #: a read's longest run on the server (0: no limit): a read blocked by a lock or a hung server fails
        #: with StoreError instead of holding a call's thread for ever. Writes, index builds and VACUUM are
        #: not bounded (a large load's statements run long).
        self.statement_timeout_ms = statement_timeout(options, statement_timeout_ms)
        self._indexed: dict[tuple[str, str], float | bool] = {}  # (org, kind) -> True, or when last seen unindexed
        self._partitions: dict[str, str] = {}  # org -> partition table, once known to exist
        self._text_partitions: set[str] = set()  # orgs whose full-text partitions are known to exist
        # full text is never prepared: a plan made once for every org (a generic plan) is chosen from the
        # statistics of all orgs' partitions together, and its shape, so its cost, would follow what other orgs hold
        self._text = TextSearch(lambda org, query, params: self._query(org, query, params, prepare=False))
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=int(timeout)) as conn:
                self.row_security_enforced = self._migrate(conn)
                info = TypeInfo.fetch(conn, "vector")
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"cannot open PostgreSQL store at {self._label}: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"cannot prepare PostgreSQL store at {self._label}: {exc}") from exc
        assert info is not None

        def configure(conn: psycopg.Connection) -> None:
            register_vector_info(conn, info)
            conn.execute("SET timezone = 'UTC'; SET client_min_messages = warning")
            if self.session_settings:  # behind a transaction-pooling proxy it is set per transaction (_query)
                conn.execute(f"SET statement_timeout = {self.statement_timeout_ms}")

        def make() -> ConnectionPool:
            return ConnectionPool(
                url, min_size=1, max_size=pool_size, timeout=timeout, connection_class=_Connection,
                kwargs={"autocommit": True}, configure=configure, open=False, name="dossier",
            )  # fmt: skip

        self._pool = Pool(make, url=url, label=self._label, probe_timeout=min(timeout, 5.0))
        try:
            self._pool.open(timeout)
        except PoolTimeout as exc:
            self._pool.close()
            raise StoreUnavailable(f"cannot connect to PostgreSQL store at {self._label}: {exc}") from exc

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        self._pool.close()

    def _migrate(self, conn: psycopg.Connection) -> bool:
        """Bring the schema to :data:`SCHEMA_VERSION` (one process at a time); True if RLS binds this role."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [_MIGRATION_LOCK])
            if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
                try:
                    conn.execute("CREATE EXTENSION vector")
                except psycopg.errors.InsufficientPrivilege as exc:
                    raise StoreUnavailable(
                        "the pgvector extension is not installed in this database and this role may not install "
                        'it: run "CREATE EXTENSION vector" as a superuser once'
                    ) from exc
            conn.execute(
                "CREATE TABLE IF NOT EXISTS dossier_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL)"
            )
            found_version = conn.execute("SELECT coalesce(max(version), 0) FROM dossier_schema").fetchone()
            version = found_version[0] if found_version else 0
            if version > SCHEMA_VERSION:
                raise SchemaMismatch(
                    f"{self._label} has schema version {version}; this dossier knows up to {SCHEMA_VERSION}: upgrade dossier"
                )
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                conn.execute(trusted(script))
                conn.execute("INSERT INTO dossier_schema VALUES (%s, now())", [number])
            row = conn.execute(
                "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
            ).fetchone()
        return not (row and row[0])

    def bind_embedder(self, model_id: str, dimensions: int) -> None:
        wanted = f"{model_id}:{dimensions}"
        with self._transaction(None) as conn:
            conn.execute("INSERT INTO dossier_meta VALUES ('embedder', %b) ON CONFLICT (key) DO NOTHING", [wanted])
            bound = conn.execute("SELECT value FROM dossier_meta WHERE key = 'embedder'").fetchone()
            found = bound[0] if bound else None
        if found != wanted:
            raise SchemaMismatch(f"{self._label} holds vectors of {found}, not {wanted}: open it with the same embedder")

    # -- connections -------------------------------------------------------------------------------
    def _scope(self, conn: _Connection, org: str, ef_search: int | None = None) -> None:
        """Point the connection's session at ``org`` (row-level security) and, if given, an ef_search."""
        if conn.dossier_org != org or (ef_search is not None and conn.ef_search != ef_search):
            conn.execute(
                "SELECT set_config('dossier.org', %b, false), set_config('hnsw.ef_search', %b, false)",
                [org, str(ef_search or conn.ef_search or 40)],
            )
            conn.dossier_org, conn.ef_search = org, ef_search or conn.ef_search

    def _query(self, org: str, query: str | sql.Composed, params: Sequence[Any] = (), *, ef_search: int | None = None,
               prepare: bool | None = None) -> list[tuple]:  # fmt: skip
        """Rows of ``query`` run for ``org``. ``prepare=False`` keeps it from being prepared on the server: it is
        planned at each run for its own parameters (its org's partition and that partition's statistics), never
        by a plan made once for any org from the whole table's."""
        for attempt in (1, 2):
            conn: psycopg.Connection | None = None
            try:
                with self._pool.connection() as conn:
                    if self.session_settings:
                        self._scope(cast(_Connection, conn), org, ef_search)
                        return conn.execute(trusted(query), params, binary=True, prepare=prepare).fetchall()
                    with conn.transaction():  # behind a transaction-pooling proxy: settings last one transaction
                        conn.execute(
                            "SELECT set_config('dossier.org', %b, true), set_config('hnsw.ef_search', %b, true), "
                            "set_config('statement_timeout', %b, true)",
                            [org, str(ef_search or 40), str(self.statement_timeout_ms)],
                        )
                        return conn.execute(trusted(query), params, binary=True, prepare=prepare).fetchall()
            except psycopg.errors.QueryCanceled as exc:
                raise StoreError(
                    f"PostgreSQL read ran past the store's statement timeout ({self.statement_timeout_ms} ms; "
                    f"dossier_statement_timeout_ms on the URL): {exc}"
                ) from exc
            except (psycopg.OperationalError, PoolTimeout) as exc:
                if dropped(self._pool, conn, attempt):  # the statement never completed: a read, or an idempotent upsert
                    continue
                self._pool.unsure()
                raise StoreUnavailable(f"PostgreSQL store at {self._label} is unreachable: {exc}") from exc
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL query failed: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover - the second attempt returns or raises

    def _transaction(self, org: str | None) -> "_Transaction":
        return _Transaction(self, org)

    # -- writes ------------------------------------------------------------------------------------
    def write(self, batch: WriteBatch) -> None:
        self.write_many([batch])

    def write_many(self, batches: Iterable[WriteBatch]) -> None:
        sizes: dict[str, int] = defaultdict(int)  # rows written per table, for the statistics that follow
        orgs: set[str] = set()
        kinds: set[tuple[str, str]] = set()
        created: dict[str, str] = {}  # vector partitions this transaction attaches (known to all once it commits)
        texts: set[str] = set()  # ... and full-text partitions
        merged: set[tuple[str, str]] = set()  # (org, record) merged by this write
        locked: set[str] = set()  # orgs whose merges this transaction holds
        try:
            with self._transaction(None) as conn:
                for batch in batches:
                    groups = group_by_org(batch)  # refuses an item without an org before anything is written
                    for org in sorted({r.org for r, _ in batch.records if r.merged_into} - locked):
                        # held to the end of the transaction: two loads merging in one org write one after the
                        # other, so the check below sees the other's merges (committed before this one got the lock)
                        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%b, 0))", ["dossier.merges:" + org])
                        locked.add(org)
                    merged |= {(r.org, r.id) for r, _ in batch.records if r.merged_into}
                    for org in sorted({v.org for v in batch.vectors} - self._partitions.keys() - created.keys()):
                        # on this transaction: one attached by another session after this one first touched
                        # ``vectors`` (deleting a record's old property vectors, say) would stay unseen here
                        created[org] = self._create_partition(conn, org)
                    for org in sorted(set(groups) - self._text_partitions - texts):  # every org writing may hold text
                        self._create_text_partitions(conn, org)
                        texts.add(org)
                    # what a search reads from here on is not kept past the write (forgotten again when it ends)
                    self._text.forget(set(groups) - orgs)
                    for org in sorted(groups):
                        conn.execute("SELECT set_config('dossier.org', %b, true)", [org])
                        if batch.guard:  # the records read FOR SHARE: a deletion waits for this write, or it for one
                            if any(not r.merged_into and r.identifiers.model_dump(exclude_none=True) for r, _ in batch.records):
                                # two writers giving out one new identifier at once: the second waits, then sees it
                                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%b, 0))", ["dossier.identifiers:" + org])
                            write_guard(batch, _guard_reads(conn, org, {r.id for r, _ in batch.records}))
                        write_org(conn.cursor(binary=True), org, groups[org])
                    orgs |= set(groups)
                    kinds |= {(v.org, v.kind) for v in batch.vectors}
                    sections = sum(len(d.sections) for d, _ in batch.documents)
                    for table, n in (("records", len(batch.records)), ("memories", len(batch.memories)),
                                     ("memories_fts", len(batch.memories)), ("edges", len(batch.edges)),
                                     ("documents", len(batch.documents)), ("sections", sections),
                                     ("sections_fts", sections), ("vectors", len(batch.vectors))):  # fmt: skip
                        sizes[table] += n
                for org, record_id in sorted(merged):
                    conn.execute("SELECT set_config('dossier.org', %b, true)", [org])

                    def target(rid: str, org: str = org) -> str | None:
                        row = conn.execute("SELECT merged_into FROM records WHERE org = %b AND id = %b", [org, rid]).fetchone()
                        return row[0] if row else None

                    cycle = merge_cycle(target, record_id)
                    if cycle is not None:
                        raise StoreError(merge_cycle_error(org, cycle))
        except StoreError:
            raise
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL write failed (nothing was written): {exc}") from exc
        self._partitions.update(created)
        self._text_partitions |= texts
        self._text.forget(orgs)
        try:  # upkeep of a write that is committed: it stands whatever happens here
            self._analyze(sizes)
            for org, kind in sorted(kinds):
                self._maybe_index(org, kind)
        except (DossierError, psycopg.Error) as exc:
            _log.warning("statistics or an HNSW index were not brought up to date after a write (%s): the next "
                         "write tries again, and searches stay exact meanwhile", type(exc).__name__)  # fmt: skip

    def _analyze(self, sizes: dict[str, int]) -> None:
        """Refresh the planner's statistics after a large write (choosing between the GIN index and the
        (org, record) index, say, depends on them), rather than waiting for autovacuum to notice."""
        large = [table for table, n in sizes.items() if n >= _ANALYZE_AFTER]
        if large:  # VACUUM too: on all-visible pages, counting GIN matches skips the table (full-text IDF)
            with self._pool.connection() as conn, _unbounded(conn, self.session_settings):  # a table another session locks is left to autovacuum
                conn.execute("VACUUM (ANALYZE, SKIP_LOCKED) " + ", ".join(large))

    def _ensure_partition(self, org: str) -> None:
        """Create ``org``'s vector partition if it does not exist yet (its own short transaction)."""
        if org in self._partitions:
            return
        try:
            with self._transaction(org) as conn:
                name = self._create_partition(conn, org)
        except psycopg.Error as exc:
            raise StoreError(f"cannot create the vector partition of org {org!r}: {exc}") from exc
        self._partitions[org] = name

    @staticmethod
    def _create_partition(conn: psycopg.Connection, org: str) -> str:
        """Create and attach ``org``'s vector partition on ``conn``'s transaction unless it exists; its name
        (to remember once that transaction commits)."""
        name = "vectors_" + _suffix(org)
        _attach(conn, org, "vector_partitions", _PARTITION_LOCK, name, partition_ddl)
        return name

    @staticmethod
    def _create_text_partitions(conn: psycopg.Connection, org: str) -> None:
        """Create and attach ``org``'s partitions of the full-text tables on ``conn``'s transaction unless they
        exist (each org's GIN index holds its rows alone: a search reads no other org's postings)."""
        _attach(conn, org, "text_partitions", _TEXT_PARTITION_LOCK, _suffix(org), text_partition_ddl)

    def _index_name(self, org: str, kind: str) -> str:
        return f"{self._partitions[org]}_{kind}_hnsw"

    def _maybe_index(self, org: str, kind: str) -> None:
        """Build the HNSW index of ``org``'s ``kind`` vectors once they reach ``exact_below`` rows."""
        if self._is_indexed(org, kind, fresh=True):
            return
        count = self._query(
            org,
            "SELECT count(*) FROM (SELECT 1 FROM vectors WHERE org = %b AND kind = %b LIMIT %b) s",
            [org, kind, self.exact_below],
        )[0][0]
        if count < self.exact_below:
            return
        dims = self._query(org, "SELECT vector_dims(embedding) FROM vectors WHERE org = %b AND kind = %b LIMIT 1", [org, kind])[0][0]
        self._ensure_partition(org)
        name, table = self._index_name(org, kind), self._partitions[org]
        statement = sql.SQL(
            "CREATE INDEX IF NOT EXISTS {name} ON {table} USING hnsw ((embedding::vector({dims})) vector_cosine_ops) "
            "WITH (m = {m}, ef_construction = {efc}) WHERE kind = {kind}"
        ).format(name=sql.Identifier(name), table=sql.Identifier(table), dims=sql.Literal(int(dims)),
                 m=sql.Literal(self.hnsw_m), efc=sql.Literal(self.hnsw_ef_construction), kind=sql.Literal(kind))  # fmt: skip
        try:
            with self._transaction(org) as conn:
                conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%b))", [_INDEX_LOCK, name])
                conn.execute("SELECT set_config('maintenance_work_mem', %b, true)", [self.index_build_memory])
                conn.execute(statement)
            with self._pool.connection() as conn, _unbounded(conn, self.session_settings):  # so the planner weighs the index against the org's real size
                conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
        except psycopg.Error as exc:
            raise StoreError(f"cannot build the HNSW index {name}: {exc}") from exc
        self._indexed[(org, kind)] = True

    def _is_indexed(self, org: str, kind: str, *, fresh: bool = False) -> bool:
        """Whether ``org``'s ``kind`` vectors have their HNSW index (re-checked at most every 5 s)."""
        state = self._indexed.get((org, kind))
        if state is True:
            return True
        if not fresh and state is not None and time.monotonic() - state < 5.0:
            return False
        rows = self._query(
            org,
            "SELECT p.name FROM vector_partitions p JOIN pg_indexes i ON i.tablename = p.name "
            "WHERE p.org = %b AND i.schemaname = current_schema() AND i.indexname = p.name || '_' || %b || '_hnsw'",
            [org, kind],
        )
        if rows:
            self._partitions[org] = rows[0][0]
        self._indexed[(org, kind)] = True if rows else time.monotonic()
        return bool(rows)

    def content_hashes(self, kind: ItemKind, ids: Sequence[str], *, org: str) -> dict[str, str]:
        require_org(org, "content_hashes")
        table = _TABLES[kind]
        scope = "id = %b" if kind == "org" else "org = %b"  # an org row is its own scope
        out: dict[str, str] = {}
        for chunk in _chunks(list(ids)):
            out.update(self._query(org, f"SELECT id, hash FROM {table} WHERE {scope} AND id = ANY(%b::text[])", [org, chunk]))
        return out

    def vector_hashes(self, kind: VectorKind, keys: Sequence[str], *, org: str) -> dict[str, str]:
        require_org(org, "vector_hashes")
        out: dict[str, str] = {}
        for chunk in _chunks(list(keys)):
            out.update(
                self._query(
                    org,
                    "SELECT key, text_hash FROM vectors WHERE org = %b AND kind = %b AND key = ANY(%b::text[])",
                    [org, kind, chunk],
                )
            )
        return out

    def stored_vectors(self, kind: VectorKind, keys: Sequence[str], *, org: str) -> dict[str, np.ndarray]:
        require_org(org, "stored_vectors")
        out: dict[str, np.ndarray] = {}
        for chunk in _chunks(list(dict.fromkeys(keys))):
            rows = self._query(
                org, "SELECT key, embedding FROM vectors WHERE org = %b AND kind = %b AND key = ANY(%b::text[])", [org, kind, chunk]
            )
            out.update((key, np.asarray(vector.to_numpy(), dtype=np.float32)) for key, vector in rows)  # pgvector's Vector
        return out

    def put_settings(self, settings: dict, *, org: str) -> None:
        require_org(org, "put_settings")
        self._query(
            org,
            "INSERT INTO org_settings VALUES (%b, %b::json, now()) "
            "ON CONFLICT (org) DO UPDATE SET settings = excluded.settings, updated_at = excluded.updated_at RETURNING org",
            [org, json.dumps(settings, sort_keys=True)],
        )

    def update_settings(self, change: Callable[[dict | None], dict], *, org: str) -> dict:
        require_org(org, "update_settings")
        try:
            with self._transaction(org) as conn:
                # the org's settings held for this transaction, whether or not a row exists yet (FOR UPDATE
                # locks only a row that does): every other update of them waits here
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%b, 0))", ["dossier.settings:" + org])
                row = conn.execute("SELECT settings FROM org_settings WHERE org = %b", [org]).fetchone()
                settings = change(row[0] if row else None)
                conn.execute(
                    "INSERT INTO org_settings VALUES (%b, %b::json, now()) "
                    "ON CONFLICT (org) DO UPDATE SET settings = excluded.settings, updated_at = excluded.updated_at",
                    [org, json.dumps(settings, sort_keys=True)],
                )
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL query failed: {exc}") from exc
        return settings

    def get_settings(self, *, org: str) -> dict | None:
        require_org(org, "get_settings")
        rows = self._query(org, "SELECT settings FROM org_settings WHERE org = %b", [org])
        return rows[0][0] if rows else None

    def put_result(self, call_id: str, result: dict, *, org: str) -> None:
        require_org(org, "put_result")
        self._query(
            org,
            "INSERT INTO results VALUES (%b, %b, %b::json, now()) ON CONFLICT (org, call_id) DO UPDATE "
            "SET result = excluded.result, updated_at = excluded.updated_at RETURNING call_id",
            [org, call_id, json.dumps(result, sort_keys=True, default=str)],
        )

    def get_result(self, call_id: str, *, org: str) -> dict | None:
        require_org(org, "get_result")
        rows = self._query(org, "SELECT result FROM results WHERE org = %b AND call_id = %b", [org, call_id])
        return rows[0][0] if rows else None

    # -- reads by id -------------------------------------------------------------------------------
    def get_org(self, *, org: str) -> Org | None:
        require_org(org, "get_org")
        rows = self._query(org, "SELECT id, name FROM orgs WHERE id = %b", [org])
        return Org(id=rows[0][0], name=rows[0][1]) if rows else None

    def get_caller(self, caller_id: str, *, org: str) -> Caller | None:
        require_org(org, "get_caller")
        rows = self._query(org, "SELECT id, org, roles FROM callers WHERE org = %b AND id = %b", [org, caller_id])
        return Caller(id=rows[0][0], org=rows[0][1], roles=tuple(rows[0][2])) if rows else None

    def get_records(self, ids: Sequence[str], *, org: str) -> list[Record]:
        require_org(org, "get_records")
        found: list[Record] = []
        for chunk in _chunks(list(dict.fromkeys(ids))):
            found.extend(self._select_records(org, "id = ANY(%b::text[])", [chunk]))
        return _in_order(ids, found)

    def _select_records(self, org: str, where: str, params: list[Any], tail: str = "") -> list[Record]:
        rows = self._query(
            org,
            "SELECT org, id, kind, email, phone, website, profile_url, properties, merged_into, pending_deletion "
            f"FROM records WHERE org = %b AND {where} {tail}",
            [org, *params],
        )
        return [_record(row) for row in rows]

    def get_memories(self, ids: Sequence[str], *, org: str) -> list[Memory]:
        require_org(org, "get_memories")
        found: list[Memory] = []
        for chunk in _chunks(list(dict.fromkeys(ids))):
            rows = self._query(
                org, "SELECT org, id, record, text, created_at FROM memories WHERE org = %b AND id = ANY(%b::text[])", [org, chunk]
            )
            found.extend(_memory(row) for row in rows)
        return _in_order(ids, found)

    def get_documents(self, ids: Sequence[str], *, org: str) -> list[Document]:
        require_org(org, "get_documents")
        found: list[Document] = []
        for chunk in _chunks(list(dict.fromkeys(ids))):
            rows = self._query(
                org,
                "SELECT d.org, d.id, d.title, d.doc_type, d.tags, d.visible_to_roles, d.attached_record, d.is_system, "
                "s.ids, s.headings, s.texts FROM documents d LEFT JOIN LATERAL ("
                "  SELECT array_agg(id ORDER BY position) AS ids, array_agg(heading ORDER BY position) AS headings,"
                "         array_agg(text ORDER BY position) AS texts"
                "  FROM sections WHERE org = d.org AND document = d.id) s ON true "
                "WHERE d.org = %b AND d.id = ANY(%b::text[])",
                [org, chunk],
            )
            found.extend(_document(row) for row in rows)
        return _in_order(ids, found)

    def find_documents(
        self, *, org: str, doc_types: Sequence[str] = (), tags: Sequence[str] = (), limit: int
    ) -> list[Document]:
        require_org(org, "find_documents")
        return self.get_documents(self.document_ids(org=org, doc_types=doc_types, tags=tags, limit=limit), org=org)

    def document_ids(
        self, *, org: str, doc_types: Sequence[str] = (), tags: Sequence[str] = (), limit: int | None = None,
        roles: Sequence[str] | None = None, record_ids: Sequence[str] = (),
    ) -> list[str]:
        require_org(org, "document_ids")
        where = "org = %b"
        params: list[Any] = [org]
        if doc_types:
            where += " AND doc_type = ANY(%b::text[])"
            params.append(list(doc_types))
        if tags:
            where += " AND tags && %b::text[]"
            params.append(list(tags))
        if roles is not None:  # the visibility rule (pipeline/visibility.py) as a query
            where += (" AND NOT is_system AND (visible_to_roles IS NULL OR visible_to_roles && %b::text[])"
                      " AND (attached_record IS NULL OR attached_record = ANY(%b::text[]))")  # fmt: skip
            params.extend([list(roles), list(record_ids)])
        if limit is None:
            return [r[0] for r in self._query(org, f"SELECT id FROM documents WHERE {where} ORDER BY id", params)]
        rows = self._query(org, f"SELECT id FROM documents WHERE {where} ORDER BY id LIMIT %b", [*params, int(limit)])
        return [r[0] for r in rows]

    def restricted_documents(self, *, org: str, ids: Sequence[str] | None = None) -> list[DocumentAccess]:
        require_org(org, "restricted_documents")
        sql = (
            "SELECT d.id, d.is_system, d.visible_to_roles, d.attached_record FROM documents d "
            f"WHERE d.org = %b AND {RESTRICTED_SQL}"
        )
        if ids is None:
            rows = self._query(org, sql + " ORDER BY d.id", [org])
        else:
            rows = [r for chunk in _chunks(sorted(set(ids)))
                    for r in self._query(org, sql + " AND d.id = ANY(%b::text[]) ORDER BY d.id", [org, chunk])]  # fmt: skip
        return [
            DocumentAccess(id=r[0], org=org, is_system=bool(r[1]),
                           visible_to_roles=None if r[2] is None else tuple(r[2]), attached_record=r[3])  # fmt: skip
            for r in rows
        ]

    # -- records -----------------------------------------------------------------------------------
    def find_records(self, kind: IdentifierKind, value: str, *, org: str) -> list[Record]:
        require_org(org, "find_records")
        if kind not in ("email", "phone", "website", "profile_url"):
            raise ValueError(f"unknown identifier kind {kind!r}")
        try:
            value = normalize(kind, value)
        except ValueError:
            return []  # not an identifier of this kind, so no record has it
        return self._select_records(org, f"{kind} = %b", [value], "ORDER BY id")

    def records_by_domain(self, domain: str, *, org: str, limit: int) -> list[Record]:
        require_org(org, "records_by_domain")
        return self._select_records(org, "domain = %b", [domain], f"ORDER BY id LIMIT {int(limit)}")

    def merged_from(self, record_id: str, *, org: str) -> list[str]:
        require_org(org, "merged_from")
        rows = self._query(
            org,
            "WITH RECURSIVE merged(id) AS ("
            "  SELECT id FROM records WHERE org = %b AND merged_into = %b"
            "  UNION SELECT r.id FROM records r JOIN merged m ON r.merged_into = m.id WHERE r.org = %b"
            ") SELECT id FROM merged WHERE id <> %b ORDER BY id",
            [org, record_id, org, record_id],
        )
        return [r[0] for r in rows]

    # -- recall ------------------------------------------------------------------------------------
    def search_text(
        self, kind: TextKind, query: str, *, org: str, limit: int, parents: Sequence[str] | None = None,
        viewer: Viewer | None = None,
    ) -> list[Hit]:
        require_org(org, "search_text")
        if kind not in ("section", "memory"):
            raise ValueError(f"no full-text search over {kind!r}")
        found = terms(query)
        if not found or limit <= 0 or (parents is not None and not parents):
            return []
        rows = self._text.search(kind, found, org=org, limit=int(limit), parents=parents, viewer=viewer)
        return [Hit(id=r[0], parent=r[1], score=float(r[2])) for r in rows]

    def text_scope_rows(self, kind: TextKind, *, org: str, most: int, parents: Sequence[str] | None = None) -> int:
        if not text_scope_asked(kind, org, most, parents):
            return 0
        table, column = ("memories", "record") if kind == "memory" else ("sections", "document")
        within = "" if parents is None else f" AND {column} = ANY(%b)"
        params: list[Any] = [org, *([] if parents is None else [list(parents)]), int(most)]
        sql = f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE org = %b{within} LIMIT %b) s"
        return int(self._query(org, sql, params)[0][0])

    def search_vectors(
        self, kind: VectorKind, vector: np.ndarray, *, org: str, limit: int, parents: Sequence[str] | None = None,
        viewer: Viewer | None = None,
    ) -> list[Hit]:
        require_org(org, "search_vectors")
        if kind not in VECTOR_KINDS:
            raise ValueError(f"unknown vector kind {kind!r}")
        if limit <= 0 or (parents is not None and not parents):
            return []
        q = np.asarray(vector, dtype=np.float32)
        # exact searches for a viewer pass over what it may not see (the restriction as the database holds it);
        # an HNSW scan is not filtered: without iterative scans (pgvector 0.6) a filter would leave too few rows
        seen, seen_params = self._unseen(org, kind, viewer, "v.parent")
        if parents is None and limit <= _MAX_EF_SEARCH and self._is_indexed(org, kind):
            dims = int(q.shape[0])
            rows = self._query(
                org,
                f"SELECT key, parent, d FROM (SELECT key, parent, embedding::vector({dims}) <=> %b::vector({dims}) AS d "
                f"FROM vectors WHERE org = %b AND kind = '{kind}' ORDER BY d LIMIT %b) s ORDER BY d, key",
                [q, org, int(limit)],
                ef_search=min(_MAX_EF_SEARCH, max(self.ef_search, int(limit))),
            )
        elif parents is None:
            rows = self._query(
                org,
                "SELECT key, parent, d FROM (SELECT v.key, v.parent, v.embedding <=> %b AS d FROM vectors v "
                f"WHERE v.org = %b AND v.kind = %b{seen}) s ORDER BY d, key LIMIT %b",
                [q, org, kind, *seen_params, int(limit)],
            )
        else:  # each parent's rows through the (org, kind, parent) index, whatever the statistics say
            rows = self._query(
                org,
                "SELECT key, parent, d FROM (SELECT v.key, v.parent, v.embedding <=> %b AS d "
                "FROM unnest(%b::text[]) p(id) JOIN vectors v ON v.org = %b AND v.kind = %b AND v.parent = p.id COLLATE \"C\""
                f"{seen}) s ORDER BY d, key LIMIT %b",
                [q, list(dict.fromkeys(parents)), org, kind, *seen_params, int(limit)],
            )
        return [Hit(id=r[0], parent=r[1], score=1.0 - float(r[2])) for r in rows]

    def _unseen(self, org: str, kind: str, viewer: Viewer | None, parent: str) -> tuple[str, list[Any]]:
        """SQL (`` AND ...``) keeping the rows of ``parent`` (a document id) that ``viewer`` may see, and its
        parameters; nothing for another kind, no viewer, or an org that restricts no document."""
        shown = self._text.shown(org, viewer) if kind == "section" and viewer is not None else None
        if shown is None:
            return "", []
        return (f" AND ({parent} = ANY(%b::text[]) OR NOT EXISTS (SELECT 1 FROM documents d WHERE d.org = %b "
                f"AND d.id = {parent} AND {RESTRICTED_SQL}))", [sorted(shown), org])  # fmt: skip

    def search_vectors_many(
        self, kind: VectorKind, vectors: Sequence[np.ndarray], *, org: str, limit: int, parents: Sequence[str] | None = None,
        viewer: Viewer | None = None,
    ) -> list[list[Hit]]:
        require_org(org, "search_vectors_many")
        if parents is None or not parents or len(vectors) < 2 or limit <= 0 or kind not in VECTOR_KINDS:
            return [self.search_vectors(kind, v, org=org, limit=limit, parents=parents, viewer=viewer) for v in vectors]
        seen, seen_params = self._unseen(org, kind, viewer, "v.parent")
        # among parents: their rows are read once and each query's distances computed in the same scan
        # (search_vectors reads them once per query), then each query's best, ordered as search_vectors orders
        queries = [np.asarray(v, dtype=np.float32) for v in vectors]
        distances = ", ".join(f"v.embedding <=> %b AS d{i}" for i in range(len(queries)))
        best = " UNION ALL ".join(
            f"(SELECT {i} AS q, key, parent, d{i} AS d, row_number() OVER (ORDER BY d{i}, key) AS r FROM c ORDER BY d{i}, key LIMIT %b)"
            for i in range(len(queries))
        )
        rows = self._query(
            org,
            f"WITH c AS MATERIALIZED (SELECT v.key, v.parent, {distances} FROM unnest(%b::text[]) p(id) JOIN vectors v "
            f"ON v.org = %b AND v.kind = %b AND v.parent = p.id COLLATE \"C\"{seen}) SELECT q, key, parent, d FROM ({best}) s ORDER BY q, r",
            [*queries, list(dict.fromkeys(parents)), org, kind, *seen_params, *[int(limit)] * len(queries)],
        )
        out: list[list[Hit]] = [[] for _ in queries]
        for i, key, parent, d in rows:
            out[i].append(Hit(id=key, parent=parent, score=1.0 - float(d)))
        return out

    def recent_memories(self, record_ids: Sequence[str], *, org: str, limit: int) -> list[Memory]:
        require_org(org, "recent_memories")
        if not record_ids or limit <= 0:
            return []
        # the newest ``limit`` of each record from the (org, record, created_at DESC, id) index, then merged
        rows = self._query(
            org,
            "SELECT m.org, m.id, m.record, m.text, m.created_at FROM unnest(%b::text[]) r(id) CROSS JOIN LATERAL ("
            "  SELECT org, id, record, text, created_at FROM memories WHERE org = %b AND record = r.id "
            "  ORDER BY created_at DESC, id LIMIT %b) m ORDER BY m.created_at DESC, m.id LIMIT %b",
            [sorted(set(record_ids)), org, int(limit), int(limit)],
        )
        return [_memory(row) for row in rows]

    def edges_around(
        self,
        record_ids: Sequence[str],
        *,
        org: str,
        max_hops: int,
        limit: int,
        include_inactive: bool = False,
        include_stubs: bool = False,
    ) -> list[EdgeHop]:
        require_org(org, "edges_around")
        # A hop is one statement: two index-only searches of the covering (org, src) and (org, dst) indexes,
        # the second without the edges the first found (so UNION ALL: nothing to sort away), the best
        # ``read`` edges cut before their ends' records are looked up (a hub's thousands of edges are not
        # joined). An edge with an end pending deletion comes back marked and is dropped here; when that
        # leaves too few of a cut read, the hop reads more.
        columns = "org, id, src, dst, type, active, confidence, weight, dst_is_stub"
        flags = ("" if include_inactive else " AND active") + ("" if include_stubs else " AND NOT dst_is_stub")
        hop = (
            "SELECT e.org, e.id, e.src, e.dst, e.type, e.active, e.confidence, e.weight, e.dst_is_stub, "
            "s.id IS NOT NULL AND d.id IS NOT NULL FROM ("
            f"SELECT * FROM (SELECT {columns} FROM edges WHERE org = %b AND src = ANY(%b::text[]){flags} UNION ALL "
            f"SELECT {columns} FROM edges WHERE org = %b AND dst = ANY(%b::text[]) AND NOT src = ANY(%b::text[]){flags}) u "
            "ORDER BY confidence DESC, weight DESC, id LIMIT %b) e "
            "LEFT JOIN records s ON s.org = e.org AND s.id = e.src AND NOT s.pending_deletion "
            "LEFT JOIN records d ON d.org = e.org AND d.id = e.dst AND NOT d.pending_deletion "
            "ORDER BY e.confidence DESC, e.weight DESC, e.id"
        )

        def read_hop(frontier: list[str], fetch: int) -> tuple[list[Edge], bool]:
            read = fetch
            while True:
                rows = self._query(org, hop, [org, frontier, org, frontier, frontier, read])
                walkable = [_edge(row[:9]) for row in rows if row[9]]
                complete = len(rows) < read  # every edge of this hop was read
                if complete or len(walkable) >= fetch:
                    return (walkable if complete else walkable[:fetch]), complete
                read *= 4

        return walk_edges(record_ids, max_hops=max_hops, limit=limit, read_hop=read_hop,
                          shown=lambda ids: shown_records(self, ids, org=org))

    def counts(self, *, org: str) -> dict[str, int]:
        require_org(org, "counts")
        tables = ("callers", "records", "memories", "documents", "sections", "edges", "vectors")
        query = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t} WHERE org = %b" for t in tables)
        return {name: int(n) for name, n in self._query(org, query, [org] * len(tables))}

    def org_ids(self) -> list[str]:
        """Every org in the store (an administrative read, used by the CLI's summary)."""
        try:
            with self._transaction(None) as conn:
                conn.execute("SELECT set_config('dossier.admin', 'on', true)")
                return [r[0] for r in conn.execute("SELECT id FROM orgs ORDER BY id").fetchall()]
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL query failed: {exc}") from exc


class _Transaction:
    """``with store._transaction(org) as conn``: one pooled connection in one transaction, scoped to ``org``
    (None: scoped per statement by the caller). Driver errors inside surface as they are (callers translate)."""

    def __init__(self, store: PostgresStore, org: str | None) -> None:
        self.store, self.org = store, org

    def __enter__(self) -> psycopg.Connection:
        for attempt in (1, 2):
            try:
                self._lease = self.store._pool.connection()
                conn = self._lease.__enter__()
            except (psycopg.OperationalError, PoolTimeout) as exc:
                self.store._pool.unsure()
                raise StoreUnavailable(f"PostgreSQL store at {self.store._label} is unreachable: {exc}") from exc
            try:
                self._tx = conn.transaction()
                self._tx.__enter__()  # BEGIN: the first the server hears of this lease
                break
            except psycopg.OperationalError as exc:
                self._lease.__exit__(type(exc), exc, exc.__traceback__)
                if dropped(self.store._pool, conn, attempt):  # nothing was done on it yet
                    continue
                self.store._pool.unsure()
                raise StoreUnavailable(f"PostgreSQL store at {self.store._label} is unreachable: {exc}") from exc
        try:
            conn.execute("SET LOCAL statement_timeout = 0")  # writes and index builds are not bounded
            if self.org is not None:
                conn.execute("SELECT set_config('dossier.org', %b, true)", [self.org])
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)  # the transaction and the lease go back
            raise
        return conn

    def __exit__(self, *exc: Any) -> None:
        try:
            self._tx.__exit__(*exc)
        finally:
            self._lease.__exit__(*exc)


def _guard_reads(conn: psycopg.Connection, org: str, written: set[str]) -> GuardReads:
    """The reads :func:`~dossier.stores.base.write_guard` makes, on the write's own transaction: the records it
    reads locked, so a concurrent change of them (the admin marking one pending deletion) waits for this write
    to end, and a change already under way is waited for and then read as committed. Those the batch writes
    (``written``) are locked as its upsert will lock them (FOR NO KEY UPDATE): two writers of one record then
    queue instead of each holding a share lock the other's upsert waits for; the others FOR SHARE."""

    def rows(query: LiteralString, ids: list[str]) -> list[tuple]:
        return conn.execute(query, [org, ids]).fetchall() if ids else []

    def records(ids: list[str]) -> dict[str, tuple[bool, str | None]]:
        mine, others = sorted(set(ids) & written), sorted(set(ids) - written)
        found = rows("SELECT id, pending_deletion, merged_into FROM records WHERE org = %s AND id = ANY(%s) "
                     "ORDER BY id FOR NO KEY UPDATE", mine)  # fmt: skip
        found += rows("SELECT id, pending_deletion, merged_into FROM records WHERE org = %s AND id = ANY(%s) "
                      "ORDER BY id FOR SHARE", others)  # fmt: skip
        return {i: (bool(p), m) for i, p, m in found}

    def holders(kind: str, value: str) -> list[str]:
        column = {"email": "email", "phone": "phone", "website": "website", "profile_url": "profile_url"}[kind]
        query = sql.SQL("SELECT id FROM records WHERE org = %s AND {} = %s").format(sql.Identifier(column))
        return [r[0] for r in conn.execute(query, [org, value])]

    return GuardReads(
        records=records,
        memory_owners=lambda ids: {i: r for i, r in rows("SELECT id, record FROM memories WHERE org = %s AND id = ANY(%s)", ids)},
        attached=lambda ids: {i: a for i, a in rows("SELECT id, attached_record FROM documents WHERE org = %s AND id = ANY(%s)", ids)},
        holders=holders,
    )  # fmt: skip


@contextmanager
def _unbounded(conn: psycopg.Connection, session: bool) -> Iterator[None]:
    """No statement timeout on this pooled connection (VACUUM and ANALYZE of a large table) until the block
    ends, then the session's again. Behind a transaction-pooling proxy (``session`` false) the store sets no
    session timeout (each of its transactions sets its own), so there is nothing to lift, and a session
    setting would land on whichever server connection the proxy picked."""
    if not session:
        yield
        return
    kept = conn.execute("SHOW statement_timeout").fetchone()
    conn.execute("SET statement_timeout = 0")
    try:
        yield
    finally:
        conn.execute("SELECT set_config('statement_timeout', %s, false)", [kept[0] if kept else "0"])


def statement_timeout(options: dict[str, str], default: int = 30_000) -> int:
    """The ``dossier_statement_timeout_ms`` of a URL's options (``default`` when absent): milliseconds, 0 for none."""
    value = options.get("statement_timeout_ms", default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = -1
    if number < 0:
        raise ConfigError(f"dossier_statement_timeout_ms must be a whole number of milliseconds, 0 or more (got {value!r})")
    return number


def _redacted(url: str) -> str:
    return redacted_url(url)


def _dossier_options(url: str) -> tuple[str, dict[str, str]]:
    """Split ``dossier_*`` query parameters (the store's own options) off a ``postgresql://`` URL."""
    if "?" not in url or "://" not in url:
        return url, {}
    base, query = url.split("?", 1)
    pairs = parse_qsl(query, keep_blank_values=True)
    options = {k[len("dossier_") :]: v for k, v in pairs if k.startswith("dossier_")}
    rest = [(k, v) for k, v in pairs if not k.startswith("dossier_")]
    return (f"{base}?{urlencode(rest)}" if rest else base), options


def _chunks(values: list, size: int = _CHUNK) -> Iterator[list]:
    for i in range(0, len(values), size):
        yield values[i : i + size]


def _in_order(ids: Sequence[str], items: Iterable[Any]) -> list:
    by_id = {item.id: item for item in items}
    return [by_id[i] for i in dict.fromkeys(ids) if i in by_id]


def _record(row: tuple) -> Record:
    identifiers = Identifiers.model_construct(email=row[3], phone=row[4], website=row[5], profile_url=row[6])
    return Record.model_construct(
        org=row[0], id=row[1], kind=row[2], identifiers=identifiers, properties=row[7],
        merged_into=row[8], pending_deletion=row[9],
    )  # fmt: skip


def _memory(row: tuple) -> Memory:
    created: datetime = row[4]
    return Memory.model_construct(org=row[0], id=row[1], record=row[2], text=row[3], created_at=created.astimezone(timezone.utc))


def _document(row: tuple) -> Document:
    ids, headings, texts = row[8] or [], row[9] or [], row[10] or []
    # built without validation, as records and memories are: the rows were validated when they were written
    sections = tuple(Section.model_construct(id=i, heading=h, text=t) for i, h, t in zip(ids, headings, texts))
    return Document.model_construct(
        org=row[0], id=row[1], title=row[2], doc_type=row[3], tags=tuple(row[4]),
        visible_to_roles=None if row[5] is None else tuple(row[5]), attached_record=row[6], is_system=bool(row[7]),
        sections=sections or (Section.model_construct(id=f"{row[1]}-empty", heading="", text=""),),
    )  # fmt: skip


def _edge(row: tuple) -> Edge:
    return Edge.model_construct(
        org=row[0], id=row[1], src=row[2], dst=row[3], type=row[4], active=row[5], confidence=row[6],
        weight=row[7], dst_is_stub=row[8],
    )  # fmt: skip
