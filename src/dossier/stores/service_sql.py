"""The service tables' SQL, written once for every SQL backend.

:class:`SQLServiceStore` holds every statement of :class:`~dossier.stores.service_base.ServiceStore`. A
backend gives it a small :class:`ServiceDialect`: its placeholder, its upsert, its SQL for the two
expressions the engines spell differently, and how a list of statements runs as one transaction (and how
its driver's errors read). Each backend's schema and migrations stay in its own module
(``sqlite_service.py``, ``postgres_service.py``), run by its dialect when it opens.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, Sequence

from .service_base import ApiKey, AuditRow, Feedback, LedgerEntry, Session, UsageLine

#: what a list of statements does: only reads, writes, or the readiness check (a read and a write)
Access = Literal["read", "write", "check"]
Statement = tuple[str, Sequence[Any]]

KEY_COLUMNS = ("id", "org", "caller", "secret_hash", "created_at", "revoked_at", "name")
SESSION_COLUMNS = ("id", "org", "caller", "call_id", "state", "created_at", "last_used")
AUDIT_COLUMNS = ("call_id", "org", "caller", "key_id", "front_end", "at", "latency_ms", "mode", "depth", "outcome",
                 "error_type", "units", "shape")  # fmt: skip
FEEDBACK_COLUMNS = ("call_id", "org", "caller", "rating", "comment", "at")
LEDGER_COLUMNS = ("org", "call_id", "kind", "item", "units", "at")


class ServiceDialect(Protocol):
    """What one SQL backend says its own way. Statements reach it written with ``?`` placeholders."""

    #: the driver's placeholder for one parameter, put in place of each ``?``
    placeholder: str
    #: the column that keeps the order in which rows of the append-only tables (feedback) were added
    insertion_order: str
    #: an aggregate counting the rows of a group whose ``kind`` is ``'charge'``
    count_charges: str

    def upsert(self, table: str, columns: Sequence[str], key: str) -> str:
        """An insert of one whole row (``columns``, in table order) that replaces the row with the same ``key``."""
        ...

    def run(self, statements: Sequence[Statement], *, access: Access) -> tuple[list[tuple], int]:
        """Run ``statements`` in order as one transaction; the rows and the row count of the last one. A
        driver's error is raised as :class:`~dossier.errors.StoreError` (nothing written)."""
        ...

    def close(self) -> None:
        """Release the connection(s)."""
        ...


def _names(columns: Sequence[str]) -> str:
    return ", ".join(columns)


def _marks(columns: Sequence[str]) -> str:
    return ", ".join("?" for _ in columns)


class SQLServiceStore:
    """A :class:`~dossier.stores.service_base.ServiceStore` over any SQL backend's :class:`ServiceDialect`."""

    def __init__(self, dialect: ServiceDialect, *, url: str) -> None:
        self.url = url
        self._dialect = dialect

    def close(self) -> None:
        self._dialect.close()

    def _run(self, statements: Sequence[Statement], *, access: Access = "write") -> tuple[list[tuple], int]:
        mark = self._dialect.placeholder
        native = [(sql if mark == "?" else sql.replace("?", mark), params) for sql, params in statements]
        return self._dialect.run(native, access=access)

    def _write(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._run([(sql, params)])[1]

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return self._run([(sql, params)], access="read")[0]

    def check_ready(self, *, at: float) -> None:
        self._run([
            ("SELECT value FROM service_meta WHERE key = 'schema_version'", ()),
            (self._dialect.upsert("service_meta", ("key", "value"), "key"), ("ready_checked_at", repr(at))),
        ], access="check")  # fmt: skip

    # -- keys --------------------------------------------------------------------------------------
    def add_key(self, key: ApiKey) -> None:
        self._write(f"INSERT INTO api_keys VALUES ({_marks(KEY_COLUMNS)})",
                    (key.id, key.org, key.caller, key.secret_hash, key.created_at, key.revoked_at, key.name))  # fmt: skip

    def get_key(self, key_id: str) -> ApiKey | None:
        rows = self._query(f"SELECT {_names(KEY_COLUMNS)} FROM api_keys WHERE id = ?", (key_id,))
        return ApiKey(*rows[0]) if rows else None

    def list_keys(self, *, org: str | None = None) -> list[ApiKey]:
        if org is None:
            rows = self._query(f"SELECT {_names(KEY_COLUMNS)} FROM api_keys ORDER BY created_at, id")
        else:
            rows = self._query(f"SELECT {_names(KEY_COLUMNS)} FROM api_keys WHERE org = ? ORDER BY created_at, id", (org,))
        return [ApiKey(*row) for row in rows]

    def revoke_key(self, key_id: str, *, at: float) -> bool:
        return self._write("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (at, key_id)) > 0

    # -- sessions ----------------------------------------------------------------------------------
    def put_session(self, session: Session, *, idle_before: float) -> None:
        s = session
        self._run([
            ("DELETE FROM sessions WHERE last_used < ?", (idle_before,)),
            (self._dialect.upsert("sessions", SESSION_COLUMNS, "id"),
             (s.id, s.org, s.caller, s.call_id, s.state, s.created_at, s.last_used)),
        ])  # fmt: skip

    def get_session(self, session_id: str) -> Session | None:
        rows = self._query(f"SELECT {_names(SESSION_COLUMNS)} FROM sessions WHERE id = ?", (session_id,))
        return Session(*rows[0]) if rows else None

    def delete_session(self, session_id: str, *, org: str) -> None:
        self._write("DELETE FROM sessions WHERE id = ? AND org = ?", (session_id, org))

    # -- audit and feedback ------------------------------------------------------------------------
    def add_audit(self, row: AuditRow) -> None:
        r = row
        self._write(
            self._dialect.upsert("audit", AUDIT_COLUMNS, "call_id"),
            (r.call_id, r.org, r.caller, r.key_id, r.front_end, r.at, r.latency_ms, r.mode, r.depth, r.outcome,
             r.error_type, r.units, r.shape),
        )  # fmt: skip

    def get_audit(self, call_id: str) -> AuditRow | None:
        rows = self._query(f"SELECT {_names(AUDIT_COLUMNS)} FROM audit WHERE call_id = ?", (call_id,))
        return AuditRow(*rows[0]) if rows else None

    def audit_rows(self, *, org: str, limit: int) -> list[AuditRow]:
        rows = self._query(
            f"SELECT {_names(AUDIT_COLUMNS)} FROM audit WHERE org = ? ORDER BY at DESC, call_id LIMIT ?", (org, int(limit))
        )
        return [AuditRow(*row) for row in rows]

    def add_feedback(self, feedback: Feedback) -> None:
        f = feedback
        self._write(f"INSERT INTO feedback ({_names(FEEDBACK_COLUMNS)}) VALUES ({_marks(FEEDBACK_COLUMNS)})",
                    (f.call_id, f.org, f.caller, f.rating, f.comment, f.at))  # fmt: skip

    def get_feedback(self, call_id: str, *, org: str) -> list[Feedback]:
        rows = self._query(
            f"SELECT {_names(FEEDBACK_COLUMNS)} FROM feedback WHERE org = ? AND call_id = ? "
            f"ORDER BY {self._dialect.insertion_order}",
            (org, call_id),
        )
        return [Feedback(*row) for row in rows]

    # -- billing -----------------------------------------------------------------------------------
    def add_ledger(self, entry: LedgerEntry) -> None:
        e = entry
        self._write(f"INSERT INTO ledger ({_names(LEDGER_COLUMNS)}) VALUES ({_marks(LEDGER_COLUMNS)})",
                    (e.org, e.call_id, e.kind, e.item, e.units, e.at))  # fmt: skip

    def usage(self, *, org: str, since: float | None = None, until: float | None = None) -> list[UsageLine]:
        sql = (
            f"SELECT item, {self._dialect.count_charges}, sum(CASE WHEN units > 0 THEN units ELSE 0 END), "
            "sum(CASE WHEN units < 0 THEN -units ELSE 0 END) FROM ledger WHERE org = ?"
        )
        params: list[Any] = [org]
        if since is not None:
            sql += " AND at >= ?"
            params.append(float(since))
        if until is not None:
            sql += " AND at < ?"
            params.append(float(until))
        rows = self._query(sql + " GROUP BY item ORDER BY item", params)
        return [UsageLine(item=r[0], calls=int(r[1] or 0), charged=int(r[2] or 0), refunded=int(r[3] or 0)) for r in rows]
