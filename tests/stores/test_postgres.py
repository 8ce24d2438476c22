"""What only the PostgreSQL store has: row-level security, migrations, its HNSW path, URL selection.

Everything the two stores share is in the contract (tests/stores/contract.py), run against both.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
import pytest
from typer.testing import CliRunner

import dossier
from dossier import cli
from dossier.bundle import Document, Memory, Org, Section
from dossier.stores import store_from_url
from dossier.stores.base import WriteBatch
from dossier.stores.postgres import PostgresStore
from dossier.stores.postgres_schema import ORG_TABLES, SCHEMA_VERSION
from tests.stores.contract import _beta, _contact, make_batch, write_world

pytestmark = pytest.mark.usefixtures("postgres_server")


@pytest.fixture
def pg_url(postgres_server: Any) -> Iterator[str]:
    url = postgres_server.create_database()
    yield url
    postgres_server.drop_database(url)


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(pg_url)
    yield store
    store.close()


def _two_orgs(store: PostgresStore, embedder: Any) -> None:
    write_world(store, embedder, "acme")
    store.write(make_batch(embedder, **_beta()))
    store.put_settings({"thresholds": {"memory_semantic": 0.4}}, org="beta")
    store.put_result("call-1", {"answer": "beta's"}, org="beta")


# -- row-level security ------------------------------------------------------------------------------
def test_a_query_that_forgets_the_org_filter_sees_nothing_of_another_org(pg_store: PostgresStore, pg_url: str, embedder: Any) -> None:
    _two_orgs(pg_store, embedder)
    assert pg_store.row_security_enforced  # the test role is an ordinary role, as an application's is
    tables = [*ORG_TABLES, "results", "text_partitions"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        unscoped = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in [*tables, "orgs"]}  # type: ignore[index]
        assert set(unscoped.values()) == {0}  # no org setting: nothing at all
        conn.execute("SELECT set_config('dossier.org', 'acme', false)")
        for table in tables:
            orgs = {row[0] for row in conn.execute(f"SELECT org FROM {table}")}  # no WHERE org = ... on purpose
            assert orgs <= {"acme"}, table
        assert [r[0] for r in conn.execute("SELECT id FROM orgs")] == ["acme"]
        assert conn.execute("SELECT count(*) FROM memories WHERE text ILIKE '%zebra%'").fetchone()[0] == 0  # type: ignore[index]
        # the same through each org's own vector partition, read directly
        for (name,) in conn.execute("SELECT name FROM vector_partitions").fetchall():
            assert {r[0] for r in conn.execute(f"SELECT DISTINCT org FROM {name}")} <= {"acme"}
        assert conn.execute("SELECT count(*) FROM vectors").fetchone()[0] == pg_store.counts(org="acme")["vectors"]  # type: ignore[index]
        # and writing a row of another org under acme's setting is refused
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO orgs (id, name, hash) VALUES ('gamma', 'g', 'h')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE records SET org = 'beta' WHERE id = 'r-jane'")
        conn.execute("SELECT set_config('dossier.org', 'beta', false)")
        assert conn.execute("SELECT count(*) FROM memories WHERE text ILIKE '%zebra%'").fetchone()[0] == 2  # type: ignore[index]


def test_the_store_reads_through_row_level_security_not_around_it(pg_store: PostgresStore, embedder: Any) -> None:
    """Drop the explicit org filter from a store query: row-level security alone still scopes it."""
    _two_orgs(pg_store, embedder)
    rows = pg_store._query("acme", "SELECT DISTINCT org FROM memories")  # no org filter in the SQL
    assert rows == [("acme",)]
    assert pg_store._query("beta", "SELECT count(*) FROM memories")[0][0] == 7


def test_a_superuser_is_reported_as_bypassing_row_level_security(postgres_server: Any, pg_url: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    admin = postgres_server.admin_url_of(conninfo_to_dict(pg_url)["dbname"])
    if not psycopg.connect(admin).execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]:  # type: ignore[index]
        pytest.skip("the admin role of DOSSIER_DATABASE_URL is not a superuser")
    store = PostgresStore(admin)
    try:
        assert store.row_security_enforced is False
    finally:
        store.close()


# -- migrations ------------------------------------------------------------------------------------
def test_migrations_are_recorded_and_applied_once(pg_url: str) -> None:
    PostgresStore(pg_url).close()
    PostgresStore(pg_url).close()
    with psycopg.connect(pg_url) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM dossier_schema ORDER BY version")]
    assert versions == list(range(1, SCHEMA_VERSION + 1))


_BACK_TO_V4 = """
CREATE TABLE memories_fts_plain AS SELECT org, id, record, tsv, length FROM memories_fts;
CREATE TABLE sections_fts_plain AS SELECT org, id, document, tsv, length FROM sections_fts;
DROP TABLE memories_fts, sections_fts, text_partitions CASCADE;
ALTER TABLE memories_fts_plain RENAME TO memories_fts;
ALTER TABLE sections_fts_plain RENAME TO sections_fts;
ALTER TABLE memories_fts ADD PRIMARY KEY (org, id);
ALTER TABLE sections_fts ADD PRIMARY KEY (org, id);
CREATE INDEX memories_fts_tsv ON memories_fts USING gin (tsv);
CREATE INDEX memories_fts_record ON memories_fts (org, record) INCLUDE (id, tsv, length);
CREATE INDEX sections_fts_tsv ON sections_fts USING gin (tsv);
CREATE INDEX sections_fts_document ON sections_fts (org, document);
DROP INDEX records_email;
DROP INDEX records_profile;
CREATE INDEX records_email ON records (org, email) WHERE email IS NOT NULL;
CREATE INDEX records_profile ON records (org, profile_url) WHERE profile_url IS NOT NULL;
DELETE FROM dossier_schema WHERE version IN (5, 6);
"""  # the full-text tables and record indexes as version 4 had them: one table each for every org


def test_an_older_database_is_migrated_in_place_and_ranks_as_a_new_one(pg_url: str, embedder: Any) -> None:
    """Migration 4 adds each full-text row's length (BM25 normalises by it) to rows already stored."""
    store = PostgresStore(pg_url)
    write_world(store, embedder)
    before = store.search_text("memory", "discount renewal pricing", org="acme", limit=10)
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to version 3, as a database made before it
        conn.execute(_BACK_TO_V4)
        conn.execute("DROP INDEX memories_fts_record")
        conn.execute("ALTER TABLE memories_fts DROP COLUMN length")
        conn.execute("ALTER TABLE sections_fts DROP COLUMN length")
        conn.execute("CREATE INDEX memories_fts_record ON memories_fts (org, record) INCLUDE (id, tsv)")
        conn.execute("DELETE FROM dossier_schema WHERE version = 4")
    store = PostgresStore(pg_url)
    try:
        after = store.search_text("memory", "discount renewal pricing", org="acme", limit=10)
        assert [(h.id, round(h.score, 9)) for h in after] == [(h.id, round(h.score, 9)) for h in before] and before
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT set_config('dossier.org', 'acme', false)")
            lengths = dict(conn.execute("SELECT id, length FROM memories_fts WHERE org = 'acme'").fetchall())
            texts = dict(conn.execute("SELECT id, text FROM memories WHERE org = 'acme'").fetchall())
        assert set(lengths) == set(texts) and all(lengths[i] >= len(texts[i].split()) for i in texts)  # stop words too
    finally:
        store.close()


def test_migration_5_gives_each_org_its_own_full_text_partitions_and_the_same_answers(pg_url: str, embedder: Any) -> None:
    store = PostgresStore(pg_url)
    _two_orgs(store, embedder)
    asked = [("memory", "discount renewal pricing"), ("section", "discount approval"), ("memory", "zebra")]
    before = {(kind, org, q): [(h.id, round(h.score, 9)) for h in store.search_text(kind, q, org=org, limit=10)]  # type: ignore[arg-type]
              for kind, q in asked for org in ("acme", "beta")}  # fmt: skip
    store.close()
    assert any(before.values())
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(_BACK_TO_V4)
    store = PostgresStore(pg_url)  # migration 5 runs
    try:
        after = {(kind, org, q): [(h.id, round(h.score, 9)) for h in store.search_text(kind, q, org=org, limit=10)]  # type: ignore[arg-type]
                 for kind, q in asked for org in ("acme", "beta")}  # fmt: skip
        assert after == before
        with psycopg.connect(pg_url, autocommit=True) as conn:
            parts = conn.execute(
                "SELECT p.relname, c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname IN ('memories_fts', 'sections_fts')"
            ).fetchall()
            assert sorted(p for p, _ in parts) == ["memories_fts"] * 2 + ["sections_fts"] * 2
            for _, child in parts:  # each partition holds one org's rows
                assert len({r[0] for r in conn.execute(f"SELECT DISTINCT org FROM {child}")}) == 1, child
        # a new org writing gets its own partitions too
        store.write(WriteBatch(orgs=[Org(id="gamma")], memories=[(Memory(
            id="g-m", org="gamma", record="g-r", text="zebra crossing", created_at=datetime(2025, 1, 1, tzinfo=timezone.utc)), "h")]))
        assert [h.id for h in store.search_text("memory", "zebra", org="gamma", limit=5)] == ["g-m"]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT set_config('dossier.org', 'gamma', false)")
            suffix = conn.execute("SELECT name FROM text_partitions WHERE org = 'gamma'").fetchone()[0]  # type: ignore[index]
            assert conn.execute(f"SELECT id FROM memories_fts_{suffix}").fetchall() == [("g-m",)]
    finally:
        store.close()


def test_long_memories_and_identifiers_of_many_bytes_are_stored_and_found(pg_url: str, embedder: Any) -> None:
    """A B-tree entry holds at most 2,704 bytes: a long memory's tsvector is kept out of the record index, and
    emails and profile URLs are found through hash indexes (schema version 6). Before, such a write failed."""
    store = PostgresStore(pg_url)
    try:
        write_world(store, embedder)
        words = " ".join(f"clause{n} covers the renewal pricing of contract line {n}" for n in range(700))  # ~40k characters
        long_url = "linkedin.com/in/" + "名" * 2000
        at = datetime(2025, 1, 1, tzinfo=timezone.utc)
        store.write(WriteBatch(
            memories=[(Memory(id="m-long", org="acme", record="r-jane", text=words, created_at=at), "h1"),
                      (Memory(id="m-mid", org="acme", record="r-jane", text=words[:3000] + " zebra", created_at=at), "h2")],
        ))  # fmt: skip
        found = store.search_text("memory", "clause699 renewal", org="acme", parents=["r-jane"], limit=5)
        assert [h.id for h in found][:1] == ["m-long"]
        assert "m-mid" in [h.id for h in store.search_text("memory", "zebra", org="acme", parents=["r-jane"], limit=5)]
        assert "m-long" in [h.id for h in store.search_text("memory", "clause699", org="acme", limit=5)]
        [jane] = store.get_records(["r-jane"], org="acme")
        ids = jane.identifiers.model_copy(update={"profile_url": long_url, "email": "ü" * 240 + "@acme.com"})
        store.write(WriteBatch(records=[(jane.model_copy(update={"identifiers": ids}), "h3")]))
        assert [r.id for r in store.find_records("profile_url", long_url, org="acme")] == ["r-jane"]
        assert [r.id for r in store.find_records("email", "ü" * 240 + "@acme.com", org="acme")] == ["r-jane"]
    finally:
        store.close()


def test_a_database_from_a_newer_dossier_is_refused(pg_url: str) -> None:
    PostgresStore(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO dossier_schema VALUES (%s, now())", [SCHEMA_VERSION + 1])
    with pytest.raises(dossier.SchemaMismatch, match="upgrade dossier"):
        PostgresStore(pg_url)


def test_an_unreachable_server_is_store_unavailable(tmp_path: Any) -> None:
    with pytest.raises(dossier.StoreUnavailable):
        PostgresStore(f"postgresql://nobody@/nowhere?host={tmp_path}", timeout=2)


def test_pooled_connections_the_server_dropped_are_replaced_not_reported(postgres_server: Any, pg_url: str, embedder: Any) -> None:
    """After a server restart every idle pooled connection is dead; the next read tests them and goes on."""
    store = PostgresStore(pg_url, pool_size=4)
    try:
        write_world(store, embedder, "acme")
        held = [store._pool.pool.getconn() for _ in range(3)]  # three connections open, then idle in the pool
        for conn in held:
            store._pool.pool.putconn(conn)
        name = psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
        with psycopg.connect(postgres_server.admin_url, autocommit=True) as admin:
            ended = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s",
                                  [name]).fetchone()[0]  # fmt: skip
        assert ended >= 3
        for _ in range(5):  # each read would have met a dead connection
            assert store.counts(org="acme")["memories"] > 0
        held = [store._pool.pool.getconn() for _ in range(3)]
        for conn in held:
            store._pool.pool.putconn(conn)
        with psycopg.connect(postgres_server.admin_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
        store.write(make_batch(embedder, **_beta()))  # a write's transaction, the same way
        assert store.counts(org="beta")["records"] > 0
    finally:
        store.close()


def test_an_outage_fails_each_call_at_once_and_the_store_answers_again_when_the_server_is_back(
    postgres_server: Any, pg_url: str, embedder: Any
) -> None:
    """While the server refuses connections every call fails with StoreUnavailable at once, not after the
    pool's 30 s wait for a connection it cannot make, and a write loses nothing; once the server is back the
    next call answers, without waiting out the back-off of the pool's own failed attempts."""
    store = PostgresStore(pg_url, pool_size=4)  # the default 30 s wait for a pooled connection
    try:
        write_world(store, embedder, "acme")
        before = store.counts(org="acme")
        with postgres_server.outage(pg_url):
            for call in (lambda: store.counts(org="acme"), lambda: store.search_text("memory", "discount", org="acme", limit=5),
                         lambda: store.write(make_batch(embedder, **_beta()))):  # fmt: skip
                started = time.monotonic()
                with pytest.raises(dossier.StoreUnavailable, match="unreachable"):
                    call()
                assert time.monotonic() - started < 10  # a refused connection, not the pool's 30 s
            time.sleep(8)  # the pool's own attempts back off (1, 2, 4, 8 s ...): its next is seconds away
        started = time.monotonic()
        assert store.counts(org="acme") == before  # the write during the outage left nothing
        assert time.monotonic() - started < 5
        store.write(make_batch(embedder, **_beta()))
        assert store.counts(org="beta")["records"] > 0
    finally:
        store.close()


@pytest.mark.parametrize("settings", ["session", "transaction"])
def test_a_read_blocked_on_the_server_fails_at_the_statement_timeout_and_a_write_waits(
    pg_url: str, embedder: Any, settings: str
) -> None:
    """A read that a lock (a migration, a stuck transaction) keeps waiting fails with StoreError once it has
    run ``dossier_statement_timeout_ms``, instead of holding the call's thread for ever; the store answers
    again once the lock is gone. Writes are not bounded: a write behind the same lock waits for it."""
    sep = "&" if "?" in pg_url else "?"
    store = PostgresStore(f"{pg_url}{sep}dossier_statement_timeout_ms=300&dossier_settings={settings}")
    try:
        write_world(store, embedder, "acme")
        assert store.statement_timeout_ms == 300
        before = store.counts(org="acme")
        with psycopg.connect(pg_url) as locker:
            locker.execute("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE")  # held until this transaction ends
            started = time.monotonic()
            with pytest.raises(dossier.StoreError, match="statement timeout .300 ms"):
                store.recent_memories(["r-jane"], org="acme", limit=5)
            assert time.monotonic() - started < 5
            writer = ThreadPoolExecutor(1).submit(lambda: store.write(make_batch(embedder, **_beta())))
            time.sleep(1.0)  # over three times the timeout: a bounded write would have failed by now
            assert not writer.done()
            locker.rollback()
        writer.result(timeout=30)
        assert store.counts(org="beta")["memories"] > 0
        assert store.counts(org="acme") == before
        assert store.recent_memories(["r-jane"], org="acme", limit=5)  # the same pooled connections read again
    finally:
        store.close()


def test_a_committed_write_stands_when_its_upkeep_fails(pg_store: PostgresStore, embedder: Any, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """After the commit a large write refreshes statistics (VACUUM ANALYZE) and may build an HNSW index. A
    failure there (the connection dropped by a restart, say) used to reach the caller as a raw driver error (an
    HTTP 500) for data that was stored; now it is a warning in the log and the write returns."""

    def dropped(*_: Any) -> None:
        raise psycopg.OperationalError("the connection is closed")

    monkeypatch.setattr(pg_store, "_analyze", dropped)
    write_world(pg_store, embedder, "acme")  # returns
    assert pg_store.counts(org="acme")["memories"] > 0
    assert "were not brought up to date after a write (OperationalError)" in caplog.text


def _at_once(pg_url: str, embedder: Any, rounds: int, batches: Callable[[int], tuple[WriteBatch, WriteBatch]]) -> list[str]:
    """``rounds`` times, two handles on the database write ``batches(round)`` at the same moment; the message
    of every write refused."""
    from threading import Barrier

    stores = [PostgresStore(pg_url), PostgresStore(pg_url)]
    try:
        write_world(stores[0], embedder, "acme")
        failures: list[str] = []
        for round_ in range(rounds):
            start = Barrier(2)

            def load(store: PostgresStore, batch: WriteBatch) -> None:
                start.wait(10)
                try:
                    store.write(batch)
                except dossier.StoreError as exc:
                    failures.append(str(exc))

            with ThreadPoolExecutor(2) as pool:
                list(pool.map(load, stores, batches(round_)))
        return failures
    finally:
        for store in stores:
            store.close()


def test_loads_writing_the_same_rows_in_other_orders_at_once_never_deadlock(pg_url: str, embedder: Any) -> None:
    """Rows are upserted in one order (by id) whatever order a bundle lists them in: two loads touching the
    same records in opposite orders used to fail one of them now and then with "deadlock detected"."""

    def load(ids: list[str], n: int) -> WriteBatch:
        return make_batch(embedder, records=[_contact("acme", i, properties={"round": n, "by": ids[0]}) for i in ids], vectors=False)

    assert _at_once(pg_url, embedder, 25, lambda n: (load(["r-x1", "r-x2", "r-x3"], n), load(["r-x3", "r-x2", "r-x1"], n))) == []


def test_two_guarded_writes_of_one_record_at_once_queue_instead_of_deadlocking(pg_url: str, embedder: Any) -> None:
    """A guarded write (a caller without the admin role) locks the records it checks; those it will write are
    locked as the upsert locks them, so two writers of one record queue. With a share lock each, each upsert
    waited for the other's share lock, and one failed with "deadlock detected"."""

    def load(by: str, n: int) -> WriteBatch:
        batch = make_batch(embedder, records=[_contact("acme", "r-bob", properties={"round": n, "by": by})], vectors=False)
        batch.guard = True
        return batch

    assert _at_once(pg_url, embedder, 20, lambda n: (load("one", n), load("two", n))) == []


def test_a_statement_timeout_that_is_not_a_number_is_refused(pg_url: str) -> None:
    sep = "&" if "?" in pg_url else "?"
    with pytest.raises(dossier.ConfigError, match="dossier_statement_timeout_ms must be a whole number"):
        PostgresStore(f"{pg_url}{sep}dossier_statement_timeout_ms=soon")
    assert PostgresStore(pg_url).statement_timeout_ms == 30_000  # the default


# -- the HNSW path -----------------------------------------------------------------------------------
def test_past_exact_below_searches_use_an_hnsw_index_and_find_the_same(pg_url: str, embedder: Any) -> None:
    store = PostgresStore(pg_url, exact_below=200)
    try:
        write_world(store, embedder)
        texts = [f"The customer asked about {topic} for the {site} site." for topic in
                 ("invoices", "discounts", "forklifts", "onboarding", "security reviews", "renewal dates", "data exports")
                 for site in ("Berlin", "Lyon", "Leeds", "Oslo", "Porto", "Turin")]  # fmt: skip
        memories = [Memory(id=f"m-{copy}-{i:02d}", org="acme", record=f"r-{copy}", text=t, created_at="2024-05-01T00:00:00Z")
                    for copy in ("bob", "joe", "dan", "eve", "fay") for i, t in enumerate(texts)]  # fmt: skip
        assert not store._is_indexed("acme", "memory", fresh=True)
        store.write(make_batch(embedder, memories=memories))
        assert store._is_indexed("acme", "memory", fresh=True)  # 216 memories >= 200: indexed by the write
        assert not store._is_indexed("acme", "section", fresh=True)  # 6 sections: still exact
        query = embedder.embed_query("which customer wanted a discount for Lyon")
        dims = len(query)
        plan = "\n".join(r[0] for r in store._query(
            "acme", f"EXPLAIN SELECT key FROM vectors WHERE org = %b AND kind = 'memory' "
            f"ORDER BY embedding::vector({dims}) <=> %b::vector({dims}) LIMIT 10", ["acme", np.asarray(query)]))  # fmt: skip
        assert "_memory_hnsw" in plan  # what search_vectors runs, planned on the index
        approx = store.search_vectors("memory", query, org="acme", limit=10)
        everyone = ["r-jane", "r-bob", "r-joe", "r-dan", "r-eve", "r-fay"]
        exact = store.search_vectors("memory", query, org="acme", limit=10, parents=everyone)  # the exact path
        # each text is there five times (identical vectors tie): compare what was found, not which copy
        assert [h.score for h in approx] == pytest.approx([h.score for h in exact], abs=1e-5)
        assert approx[0].score > 0.5 and "discounts for the Lyon" in store.get_memories([approx[0].id], org="acme")[0].text
        # more than one HNSW scan returns (ef_search is at most 1000) falls back to exact search
        assert len(store.search_vectors("memory", query, org="acme", limit=2000)) == 216
    finally:
        store.close()


def test_options_in_the_url_and_settings_per_transaction(pg_url: str, embedder: Any) -> None:
    """``dossier_*`` URL parameters configure the store (libpq never sees them); with
    ``settings=transaction`` (a transaction-pooling proxy) every statement carries its own org."""
    sep = "&" if "?" in pg_url else "?"
    store = PostgresStore(f"{pg_url}{sep}dossier_settings=transaction&dossier_exact_below=5&dossier_ef_search=64")
    try:
        assert (store.session_settings, store.exact_below, store.ef_search) == (False, 5, 64)
        _two_orgs(store, embedder)
        assert store._is_indexed("acme", "memory", fresh=True)  # 6 memories >= 5
        assert store._query("acme", "SELECT DISTINCT org FROM memories") == [("acme",)]  # no org filter: RLS
        assert store._query("beta", "SELECT count(*) FROM memories")[0][0] == 7
        hits = store.search_vectors("memory", embedder.embed_query("zebra crossing permit"), org="beta", limit=1)
        assert hits[0].id == "m-zebra"
        assert [h.id for h in store.search_text("section", "NW-EDU-40", org="acme", limit=5)] == ["s-edu-40"]
        with psycopg.connect(pg_url) as conn:  # nothing is left set on the server's sessions
            assert conn.execute("SELECT current_setting('dossier.org', true)").fetchone()[0] in (None, "")  # type: ignore[index]
    finally:
        store.close()


# -- full text at scale ------------------------------------------------------------------------------
def test_full_text_weighs_rare_words_and_prunes_common_ones(pg_store: PostgresStore, embedder: Any) -> None:
    """A word in most rows weighs nothing (IDF) and, past the pruning cap, no longer widens the match; the
    rows of the rare word come first, and the common word's rows only fill the remaining places."""
    write_world(pg_store, embedder)
    memories = [Memory(id=f"m-inv-{i:02d}", org="acme", record="r-bob", text=f"Invoice {i} was sent to the customer.",
                       created_at="2024-05-01T00:00:00Z") for i in range(14)]  # fmt: skip
    memories += [Memory(id=f"m-zep-{i}", org="acme", record="r-joe", text=f"The zeppelin invoice {i} is overdue.",
                        created_at="2024-05-02T00:00:00Z") for i in range(2)]  # fmt: skip
    pg_store.write(make_batch(embedder, memories=memories, vectors=False))
    complete = pg_store.search_text("memory", "zeppelin invoice", org="acme", limit=10)
    assert [h.id for h in complete[:2]] == ["m-zep-0", "m-zep-1"] and len(complete) == 10
    pg_store._text.cap = 5  # as if the org were large: "invoice" (16 rows) is now common
    pg_store._text.forget({"acme"})
    pruned = pg_store.search_text("memory", "zeppelin invoice", org="acme", limit=10)
    assert [h.id for h in pruned[:2]] == ["m-zep-0", "m-zep-1"]
    assert len(pruned) == 2 + 5  # the rare word's rows, then at most ``cap`` rows of the common one
    assert [h.score for h in pruned] == sorted((h.score for h in pruned), reverse=True)
    # among a few parents the ranking is always complete
    among = pg_store.search_text("memory", "zeppelin invoice", org="acme", limit=50, parents=["r-bob", "r-joe"])
    assert len(among) == 17 and [h.id for h in among[:2]] == ["m-zep-0", "m-zep-1"]  # 16 + "Bob wants ... invoices"


def test_every_orgs_full_text_search_reads_its_own_partition_alone(pg_store: PostgresStore, pg_url: str, embedder: Any) -> None:
    """The full-text tables are partitioned by org (migration 5), each partition with its own GIN index: a
    search of any org, small or large, is planned on that org's partitions and no other's, so what other
    orgs hold neither reaches its answer nor moves its cost."""
    write_world(pg_store, embedder)  # acme: small
    def text(n: int) -> str:
        return ("renewal discount approval " if n % 25 else "renewal zanzibar approval ") * 4 + str(n)

    for org in ("globex", "initech"):  # two large orgs holding the word
        documents = [Document(id=f"{org}-d{n}", org=org, title=f"{org} {n}", sections=tuple(
            Section(id=f"{org}-d{n}-s{k}", heading="Renewal", text=text(n)) for k in range(4))) for n in range(500)]
        memories = [Memory(id=f"{org}-m{n}", org=org, record=f"{org}-r", text=text(n), created_at="2024-05-01T00:00:00Z")
                    for n in range(2000)]  # fmt: skip
        pg_store.write(make_batch(embedder, orgs=[Org(id=org)], records=[_contact(org, f"{org}-r")], memories=memories,
                                  documents=documents, vectors=False))  # fmt: skip
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ANALYZE memories_fts; ANALYZE sections_fts")
        owned: dict[str, set[str]] = {}
        for org in ("acme", "globex", "initech"):
            conn.execute("SELECT set_config('dossier.org', %s, false)", [org])
            suffix = conn.execute("SELECT name FROM text_partitions WHERE org = %s", [org]).fetchone()[0]  # type: ignore[index]
            owned[org] = {f"memories_fts_{suffix}", f"sections_fts_{suffix}"}
    partitions = set().union(*owned.values())
    pg_store._text.sample = 200  # acme's rows fit a sample this size, the others' do not: they count as large
    statements: list[tuple[str, list[Any]]] = []
    query = pg_store._text._query
    pg_store._text._query = lambda org, sql, params: statements.append((sql, list(params))) or query(org, sql, params)  # type: ignore[method-assign]

    def relations(sql: str, params: list[Any]) -> set[str]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            register_vector(conn)
            plan = json.dumps(conn.execute(("EXPLAIN (FORMAT JSON) " + sql).replace("%b", "%s"), params).fetchone()[0])  # type: ignore[index]
        return {name for name in partitions if name in plan}

    for org in ("acme", "globex"):
        for kind, parents in (("memory", None), ("section", None), ("memory", [f"{org}-r" if org != "acme" else "r-bob"])):
            statements.clear()
            hits = pg_store.search_text(kind, "zanzibar renewal discount", org=org, limit=10, parents=parents)  # type: ignore[arg-type]
            assert hits and not [h.id for h in hits if h.id.split("-")[0] in owned.keys() - {org}], (org, kind, hits)
            read = [(sql, params) for sql, params in statements if "_fts" in sql]
            assert read, (org, kind)
            touched = set().union(*(relations(sql, params) for sql, params in read))
            assert touched and touched <= owned[org], (org, kind, touched)


# -- selection by URL ------------------------------------------------------------------------------
def test_open_selects_the_postgres_store_by_url(pg_url: str, embedder: Any) -> None:
    with dossier.open(pg_url, embedder=embedder) as engine:
        assert isinstance(engine.store, PostgresStore)
        write_world(engine.store, embedder)
    assert isinstance(store_from_url(pg_url.replace("postgresql://", "postgres://", 1)), PostgresStore)


def test_the_cli_reads_the_postgres_url_from_the_environment(pg_url: str, embedder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with dossier.open(pg_url, embedder=embedder) as engine:
        write_world(engine.store, embedder)
    monkeypatch.setattr(cli.console, "_width", 500)
    result = CliRunner().invoke(cli.app, ["stats"], env={"DOSSIER_DATABASE_URL": pg_url}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "acme" in result.output and "16" in result.output  # the org and its 16 records


def test_without_the_postgres_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now fails
    with pytest.raises(dossier.MissingExtra, match=r"postgres") as caught:
        store_from_url("postgresql://localhost/dossier")
    assert caught.value.extra == "postgres"


def test_full_text_statements_are_never_prepared_but_other_reads_are(pg_store: PostgresStore, embedder: Any) -> None:
    """A statement prepared on the server may run on a plan made once for every org (a generic plan), whose
    shape is chosen from all orgs' partitions together: full text runs unprepared, planned for its org."""
    write_world(pg_store, embedder)
    for _ in range(12):  # past psycopg's prepare threshold (5) on any pooled connection
        assert pg_store.search_text("memory", "discount renewal", org="acme", limit=5)
        assert pg_store.search_text("section", "discount approval", org="acme", limit=5)
        pg_store.recent_memories(["r-jane"], org="acme", limit=3)
    prepared: list[str] = []
    with ExitStack() as stack:  # every connection of the pool at once
        connections = [stack.enter_context(pg_store._pool.connection()) for _ in range(pg_store._pool.pool.max_size)]
        for conn in connections:
            prepared += [r[0] for r in conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()]
    assert any("memories" in s and "created_at" in s for s in prepared), prepared  # the recent tier is prepared
    assert not [s for s in prepared if "_fts" in s], [s for s in prepared if "_fts" in s]


def test_a_viewers_sampled_statistics_never_draw_a_section_it_may_not_see(pg_store: PostgresStore, embedder: Any) -> None:
    """Past its sample the store estimates the word statistics from the org's first rows: for a viewer they are
    drawn from the unrestricted sections alone (the restricted ones it may see added exactly), and a word rare in
    the sample is counted through the index among those alone. Here 120 sections only the legal role may see
    hold "zanzibar" and "tariff" many times; 40 sections everyone may see hold "tariff" alone."""
    from dossier.bundle import Document, Org, Section
    from dossier.stores.base import Viewer

    hidden = [Document(id=f"d-legal-{n:03d}", org="acme", title="Tariff rules", visible_to_roles=("legal",), sections=(
        Section(id=f"s-legal-{n:03d}", heading="Zanzibar", text="zanzibar tariff zanzibar tariff clause " * 4),))
        for n in range(120)]  # fmt: skip
    open_ = [Document(id=f"d-open-{n:03d}", org="acme", title="Price list", sections=(
        Section(id=f"s-open-{n:03d}", heading="Prices", text=f"The tariff for region {n} is listed here."),))
        for n in range(40)]  # fmt: skip
    sales = [Document(id="d-sales", org="acme", title="Sales desk", visible_to_roles=("sales",), sections=(
        Section(id="s-sales", heading="Desk", text="The sales desk quotes the tariff."),))]  # fmt: skip
    pg_store.write(make_batch(embedder, orgs=[Org(id="acme")], documents=hidden + open_ + sales, vectors=False))
    pg_store._text.sample = 30  # the org (161 sections) is past its sample: estimates, and the index for rare words
    found = ["zanzibar", "tariff"]
    lexeme = pg_store._text._lexemes("acme", found)
    viewer = Viewer(roles=frozenset({"sales"}), record_ids=frozenset())
    shown = pg_store._text.shown("acme", viewer)
    assert shown == {"d-sales"}
    rows, _, df = pg_store._text._statistics("acme", "section", found, lexeme, shown)
    assert rows == 41 and df["zanzibar"] == 0  # 40 open sections and the sales desk's; the legal ones never
    assert 30 <= df["tariff"] <= 41  # estimated from a sample of the open sections, the sales desk's added
    _, _, org_wide = pg_store._text._statistics("acme", "section", found, lexeme)
    assert org_wide["zanzibar"] > 0  # the premise: without a viewer, the org's statistics hold the legal sections
    hits = pg_store.search_text("section", "zanzibar tariff", org="acme", limit=5, viewer=viewer)
    assert hits and not any(h.parent.startswith("d-legal") for h in hits)  # what it may see alone comes back
    assert pg_store.search_text("section", "zanzibar", org="acme", limit=5, viewer=viewer) == []
    assert pg_store.search_text("section", "zanzibar", org="acme", limit=5)  # the premise: they match
