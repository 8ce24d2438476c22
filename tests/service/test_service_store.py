"""The ServiceStore contract: every backend (SQLite, PostgreSQL) keeps keys, sessions, audit, feedback and
the ledger the same way, next to the data and without touching the data's schema."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import pytest

from dossier.errors import StoreUnavailable
from dossier.stores import store_from_url
from dossier.stores.service_base import (
    ApiKey,
    AuditRow,
    Feedback,
    LedgerEntry,
    ServiceStore,
    Session,
    service_store_from_url,
)


@pytest.fixture
def open_service(store_url: str) -> Iterator[Callable[[], ServiceStore]]:
    handles: list[ServiceStore] = []

    def open_() -> ServiceStore:
        handles.append(service_store_from_url(store_url))
        return handles[-1]

    yield open_
    for handle in handles:
        handle.close()


@pytest.fixture
def service_store(open_service: Callable[[], ServiceStore]) -> ServiceStore:
    return open_service()


def _audit(call_id: str, org: str, at: float) -> AuditRow:
    return AuditRow(call_id=call_id, org=org, caller="ana", key_id="k1", front_end="http", at=at, latency_ms=3.5,
                    mode="brief", depth="standard", outcome="ok", error_type=None, units=2, shape='{"a":1}')  # fmt: skip


def test_it_is_a_service_store(service_store: ServiceStore) -> None:
    assert isinstance(service_store, ServiceStore)


def test_keys_are_kept_listed_and_revoked(service_store: ServiceStore) -> None:
    a = ApiKey(id="k1", org="north", caller="ana", secret_hash="h" * 64, created_at=1.0, name="laptop")
    b = ApiKey(id="k2", org="south", caller="zoe", secret_hash="g" * 64, created_at=2.0)
    service_store.add_key(a)
    service_store.add_key(b)
    assert service_store.get_key("k1") == a
    assert service_store.get_key("nope") is None
    assert service_store.list_keys() == [a, b]
    assert service_store.list_keys(org="south") == [b]
    assert service_store.revoke_key("k1", at=5.0) is True
    assert service_store.revoke_key("k1", at=6.0) is False  # already revoked
    assert service_store.revoke_key("nope", at=6.0) is False
    assert service_store.get_key("k1").revoked_at == 5.0  # type: ignore[union-attr]


def test_sessions_are_replaced_swept_and_deleted_by_org(service_store: ServiceStore) -> None:
    old = Session(id="s-old", org="north", caller="ana", call_id="c0", state="{}", created_at=1.0, last_used=1.0)
    service_store.put_session(old, idle_before=0.0)
    fresh = Session(id="s1", org="north", caller="ana", call_id="c1", state='{"page":1}', created_at=10.0, last_used=10.0)
    service_store.put_session(fresh, idle_before=5.0)  # sweeps every session unused since before 5.0
    assert service_store.get_session("s-old") is None
    assert service_store.get_session("s1") == fresh
    advanced = dataclasses.replace(fresh, state='{"page":2}', last_used=20.0)
    service_store.put_session(advanced, idle_before=0.0)
    assert service_store.get_session("s1") == advanced
    service_store.delete_session("s1", org="south")  # another org's delete does nothing
    assert service_store.get_session("s1") is not None
    service_store.delete_session("s1", org="north")
    assert service_store.get_session("s1") is None


def test_audit_rows_by_id_and_newest_first_per_org(service_store: ServiceStore) -> None:
    for i, org in enumerate(["north", "north", "south"]):
        service_store.add_audit(_audit(f"c{i}", org, float(i)))
    assert service_store.get_audit("c2") == _audit("c2", "south", 2.0)
    assert service_store.get_audit("nope") is None
    assert [r.call_id for r in service_store.audit_rows(org="north", limit=10)] == ["c1", "c0"]
    assert [r.call_id for r in service_store.audit_rows(org="north", limit=1)] == ["c1"]


def test_feedback_is_per_call_and_org(service_store: ServiceStore) -> None:
    one = Feedback(call_id="c1", org="north", caller="ana", rating=4, comment="good", at=1.0)
    two = Feedback(call_id="c1", org="north", caller="ben", rating=2, comment=None, at=2.0)
    for row in (one, two, Feedback(call_id="c1", org="south", caller="zoe", rating=1, comment="x", at=3.0)):
        service_store.add_feedback(row)
    assert service_store.get_feedback("c1", org="north") == [one, two]
    assert service_store.get_feedback("c9", org="north") == []


def test_usage_sums_the_ledger_per_item_and_period(service_store: ServiceStore) -> None:
    entries = [
        ("north", "c1", "charge", "standard", 2, 10.0), ("north", "c2", "charge", "standard", 2, 11.0),
        ("north", "c2", "refund", "standard", -2, 11.5), ("north", "c3", "charge", "deep", 5, 12.0),
        ("north", "c3", "adjust", "deep", -3, 12.5), ("south", "c4", "charge", "fast", 1, 10.0),
    ]  # fmt: skip
    for org, call, kind, item, units, at in entries:
        service_store.add_ledger(LedgerEntry(org=org, call_id=call, kind=kind, item=item, units=units, at=at))
    lines = {u.item: (u.calls, u.charged, u.refunded, u.net) for u in service_store.usage(org="north")}
    assert lines == {"deep": (1, 5, 3, 2), "standard": (2, 4, 2, 2)}
    assert [u.item for u in service_store.usage(org="north", since=11.9)] == ["deep"]
    assert [u.item for u in service_store.usage(org="north", until=11.0)] == ["standard"]
    assert service_store.usage(org="nobody") == []


def test_two_handles_see_each_others_writes_and_the_data_store_is_untouched(
    open_service: Callable[[], ServiceStore], store_url: str
) -> None:
    first, second = open_service(), open_service()  # a second handle = another worker process
    first.add_key(ApiKey(id="k1", org="north", caller="ana", secret_hash="h" * 64, created_at=1.0))
    assert second.get_key("k1") is not None
    data = store_from_url(store_url)  # the data store opens on the same database, schema intact
    try:
        assert data.get_org(org="north") is None
    finally:
        data.close()


def test_keys_sessions_audit_and_billing_work_on_every_backend(store_url: str, embedder) -> None:  # type: ignore[no-untyped-def]
    import dossier
    import dossier.errors
    from dossier.service import Service

    from .conftest import BRIEF, SAMPLE

    with dossier.open(store_url, embedder=embedder) as engine:
        engine.load_bundle(SAMPLE)
        service = Service(engine)
        _, key = service.create_key("northwind", "ana")
        who = service.authenticate(key)
        first = service.retrieve(who, {**BRIEF, "budget": {"totalTokens": 1500}})
        assert first.continuation
        zoe = service.authenticate(service.create_key("southwind", "zoe")[1])
        with pytest.raises(dossier.errors.InvalidRequest):  # another org's continuation reads like an unknown one
            service.retrieve(zoe, {"continuation": first.continuation})
        page = service.retrieve(who, {"continuation": first.continuation})
        assert page.mode == "expand" and page.record == first.record
        assert {u.item: u.net for u in service.usage("northwind")} == {"standard": 2, "expand": 1}
        assert service.call(who, first.call_id)["summary"]["shape"]["continuation"] is True


def test_check_ready_reads_and_commits_a_write(open_service: Callable[[], ServiceStore]) -> None:
    first, second = open_service(), open_service()
    first.check_ready(at=1.0)
    first.check_ready(at=2.0)  # again: the one row is replaced, not added
    second.check_ready(at=3.0)  # another handle (another worker) at the same time


def test_check_ready_fails_when_postgres_refuses_writes_while_reads_go_on(postgres_server) -> None:  # type: ignore[no-untyped-def]
    """Write privileges revoked from the application's role: the database can be read, not written."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from dossier.errors import StoreError

    url = postgres_server.create_database()
    store = service_store_from_url(url)
    try:
        store.add_key(ApiKey(id="k1", org="north", caller="ana", secret_hash="h" * 64, created_at=1.0))
        store.check_ready(at=1.0)
        admin = postgres_server.admin_url_of(conninfo_to_dict(url)["dbname"])
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public FROM dossier_test")
            with pytest.raises(StoreError, match="permission denied"):
                store.check_ready(at=2.0)
            assert store.get_key("k1") is not None  # reads go on
            conn.execute("GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO dossier_test")
        store.check_ready(at=3.0)
    finally:
        store.close()
        postgres_server.drop_database(url)


def test_service_tables_fail_at_once_while_the_server_is_down_and_answer_when_it_is_back(postgres_server) -> None:  # type: ignore[no-untyped-def]
    """A key check during an outage is StoreUnavailable at once (the service answers 503), not after the
    pool's 30 s wait; once the server is back the next one answers."""
    import time

    url = postgres_server.create_database()
    store = service_store_from_url(url)
    try:
        store.add_key(ApiKey(id="k1", org="north", caller="ana", secret_hash="h" * 64, created_at=1.0))
        with postgres_server.outage(url):
            for _ in range(2):
                started = time.monotonic()
                with pytest.raises(StoreUnavailable, match="unreachable"):
                    store.get_key("k1")
                assert time.monotonic() - started < 10
            time.sleep(8)  # the pool's own attempts back off meanwhile
        started = time.monotonic()
        assert store.get_key("k1") is not None
        assert time.monotonic() - started < 5
    finally:
        store.close()
        postgres_server.drop_database(url)


def test_service_tables_replace_connections_the_server_dropped(postgres_server) -> None:  # type: ignore[no-untyped-def]
    """After a PostgreSQL restart every idle pooled connection is dead: the next transaction tests them."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    url = postgres_server.create_database()
    store = service_store_from_url(url)
    try:
        store.add_key(ApiKey(id="k1", org="north", caller="ana", secret_hash="h" * 64, created_at=1.0))
        pool = store._dialect._pool.pool  # type: ignore[attr-defined]
        held = [pool.getconn() for _ in range(3)]
        for conn in held:
            pool.putconn(conn)
        with psycopg.connect(postgres_server.admin_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                          [conninfo_to_dict(url)["dbname"]])  # fmt: skip
        for at in (2.0, 3.0, 4.0):  # each would have met a dead connection
            store.check_ready(at=at)
        assert store.get_key("k1") is not None
    finally:
        store.close()
        postgres_server.drop_database(url)


def test_readiness_and_refusals_are_audited_on_every_backend(store_url: str, embedder) -> None:  # type: ignore[no-untyped-def]
    import json

    import dossier
    from dossier.errors import InvalidRequest
    from dossier.service import Principal, Service

    from .conftest import BRIEF, SAMPLE

    with dossier.open(store_url, embedder=embedder) as engine:
        engine.load_bundle(SAMPLE)
        service = Service(engine)
        service.ready()
        who = Principal(org="northwind", caller="ana", key_id="k1")
        assert service.refused(who, "InvalidRequest", front_end="http", route="POST /v1/records", status=422,
                               field="0.properties.jane@acme.com")  # fmt: skip
        [row] = service.store.audit_rows(org="northwind", limit=1)
        assert (row.outcome, row.error_type, row.units) == ("error", "InvalidRequest", 0)
        assert json.loads(row.shape) == {"route": "POST /v1/records", "status": 422, "invalid_field": "0.properties.?"}
        with pytest.raises(InvalidRequest):
            service.retrieve(who, {**BRIEF, "trace": "true"})
        [row] = service.store.audit_rows(org="northwind", limit=1)
        assert row.error_type == "InvalidRequest" and json.loads(row.shape)["invalid_field"] == "trace"
        assert "jane" not in repr(service.store.audit_rows(org="northwind", limit=10))


@pytest.mark.parametrize("settings", ["session", "transaction"])
def test_a_key_check_a_lock_keeps_waiting_fails_at_the_statement_timeout(postgres_server, settings: str) -> None:  # type: ignore[no-untyped-def]
    """The data store's dossier_statement_timeout_ms bounds the service tables' statements too: a key check
    behind a lock held elsewhere fails with StoreError (a 503) instead of holding a worker's thread."""
    import psycopg

    from dossier.errors import StoreError

    url = postgres_server.create_database()
    sep = "&" if "?" in url else "?"
    store = service_store_from_url(f"{url}{sep}dossier_statement_timeout_ms=300&dossier_settings={settings}")
    try:
        store.add_key(ApiKey(id="k1", org="north", caller="ana", secret_hash="h" * 64, created_at=1.0))
        with psycopg.connect(url) as locker:
            locker.execute("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(StoreError, match="statement timeout .300 ms"):
                store.get_key("k1")
            locker.rollback()
        assert store.get_key("k1") is not None
    finally:
        store.close()
        postgres_server.drop_database(url)
