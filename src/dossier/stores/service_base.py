"""The service's storage seam: API keys, expand sessions, the audit log, feedback and the billing ledger.

These rows live in the same database as the data (the same SQLite file, the same PostgreSQL database),
so that any number of HTTP workers can serve any request: a worker holds no state of its own. They are
kept apart from :class:`~dossier.stores.base.Store` (their own protocol, their own schema version, their
own migrations) so that the data schema and the service schema evolve independently.

What a backend must guarantee:

* Every method is one transaction; a write is all of it or nothing. Methods may be called from many
  threads and many processes at once.
* Times are UNIX seconds (``float``), always passed in by the caller: a backend never reads the clock,
  so expiry is decided in one place (:mod:`dossier.service`) and is testable.
* Rows are plain values (the dataclasses below); JSON columns (``Session.state``, ``AuditRow.shape``)
  are opaque text to the backend, stored and returned byte for byte.
* Reads by an unguessable id (``get_key``, ``get_session``, ``get_audit``) are not scoped to an org:
  the caller needs the row's org to tell "another org's" (refused, 403) from "unknown" (404), and
  compares it before returning anything. Every other read takes ``org`` and is scoped to it.
* The audit table holds the shape of a call, never its bodies (see :class:`AuditRow`); a backend must
  not add columns that would hold request or response content.

A PostgreSQL backend maps these one to one: ``TEXT``/``DOUBLE PRECISION``/``INTEGER``/``BOOLEAN``
columns, ``INSERT ... ON CONFLICT`` for ``put_session``, a ``service_meta`` table with its own
``schema_version`` key, and ``SUM(units) ... GROUP BY`` for :meth:`ServiceStore.usage`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key as stored: its public id and the SHA-256 of its secret, never the secret itself."""

    id: str  # public part of the key, shown by ``dossier keys list``
    org: str
    caller: str
    secret_hash: str  # hex SHA-256 of the secret part
    created_at: float
    revoked_at: float | None = None
    name: str | None = None  # a label for people (``--name``), optional


@dataclass(frozen=True, slots=True)
class Session:
    """An expand session: what one call did not return yet. ``state`` is JSON written by
    :mod:`dossier.layers.session` (remaining items, ids already returned, the resolved record)."""

    id: str
    org: str
    caller: str
    call_id: str  # the call that opened it
    state: str
    created_at: float
    last_used: float


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One call's shape. ``shape`` is JSON of sizes, statuses and flags (per-source status, item count,
    bytes used, dropped; budget; record identifier *kind*; message length): never message text, item
    text, record identifiers or ids."""

    call_id: str
    org: str
    caller: str
    key_id: str | None  # None for calls through the Python API or the CLI
    front_end: str  # http | mcp | python
    at: float
    latency_ms: float
    mode: str | None
    depth: str | None
    outcome: str  # ok | error
    error_type: str | None  # the error's class name, never its message
    units: int  # net units charged
    shape: str


@dataclass(frozen=True, slots=True)
class Feedback:
    call_id: str
    org: str
    caller: str
    rating: int
    comment: str | None
    at: float


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One movement on an org's account: a charge (positive units) or a refund (negative units)."""

    org: str
    call_id: str
    kind: str  # charge | refund | adjust
    item: str  # what was charged: "standard", "deep+synthesis", "expand", ...
    units: int
    at: float


@dataclass(frozen=True, slots=True)
class UsageLine:
    """Usage of one org for one billed item (e.g. ``standard``) in a period."""

    item: str
    calls: int  # charges
    charged: int  # units charged up front
    refunded: int  # units given back (calls that threw, downgraded depth, synthesis that did not run)

    @property
    def net(self) -> int:
        return self.charged - self.refunded


@runtime_checkable
class ServiceStore(Protocol):
    """What every service backend provides (see the module docstring for the guarantees)."""

    url: str

    def close(self) -> None:
        """Release connections."""

    def check_ready(self, *, at: float) -> None:
        """Read the service tables and commit one small write (the time of this check, ``at``), so that a
        store that can be read but not written (a full disk, a read-only file or database) is found;
        :class:`~dossier.errors.StoreError` when either fails (nothing else changes)."""

    # -- keys --------------------------------------------------------------------------------------
    def add_key(self, key: ApiKey) -> None:
        """Store a new key; its id must be new."""

    def get_key(self, key_id: str) -> ApiKey | None:
        """The key with this public id, revoked or not (authentication happens before an org is known)."""

    def list_keys(self, *, org: str | None = None) -> list[ApiKey]:
        """Keys of ``org`` (every org's when None: an administrative read), oldest first."""

    def revoke_key(self, key_id: str, *, at: float) -> bool:
        """Mark a key revoked; False when no live key has this id."""

    # -- sessions ----------------------------------------------------------------------------------
    def put_session(self, session: Session, *, idle_before: float) -> None:
        """Insert or replace ``session``; also delete every session last used before ``idle_before``."""

    def get_session(self, session_id: str) -> Session | None:
        """The session with this id, of any org (the caller compares orgs), or None."""

    def delete_session(self, session_id: str, *, org: str) -> None:
        """Forget a session of ``org`` (when it has nothing left to return)."""

    # -- audit and feedback ------------------------------------------------------------------------
    def add_audit(self, row: AuditRow) -> None:
        """Append one call's audit row (one per call id)."""

    def get_audit(self, call_id: str) -> AuditRow | None:
        """The audit row of a call, of any org (the caller compares orgs), or None."""

    def audit_rows(self, *, org: str, limit: int) -> list[AuditRow]:
        """The ``limit`` newest audit rows of ``org``, newest first."""

    def add_feedback(self, feedback: Feedback) -> None:
        """Append a rating of a call (the caller checked that the call is of the same org)."""

    def get_feedback(self, call_id: str, *, org: str) -> list[Feedback]:
        """Ratings of ``call_id`` in ``org``, oldest first."""

    # -- billing -----------------------------------------------------------------------------------
    def add_ledger(self, entry: LedgerEntry) -> None:
        """Append one movement to the org's ledger."""

    def usage(self, *, org: str, since: float | None = None, until: float | None = None) -> list[UsageLine]:
        """``org``'s ledger summed per billed item over ``[since, until)``, by item."""


def service_store_from_url(url: str) -> ServiceStore:
    """The service tables of the data store at ``url`` (the same file or database)."""
    from ..errors import ConfigError, redacted_url

    if url.startswith("sqlite:///"):
        from .sqlite_service import SQLiteServiceStore

        return SQLiteServiceStore(url[len("sqlite:///") :])
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from .postgres_service import PostgresServiceStore
        except ImportError as exc:
            raise ConfigError("the service tables are not implemented for PostgreSQL in this release yet") from exc
        return PostgresServiceStore(url)
    raise ConfigError(f"no service tables for store URL {redacted_url(url)!r}")
