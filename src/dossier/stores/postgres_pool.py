"""The connections of a PostgreSQL store: a psycopg pool that fails fast while its server cannot be reached.

psycopg_pool alone makes a caller wait its whole timeout (30 s by default) for a connection it cannot
make, and once its own attempts have failed it tries again on a back-off that grows to minutes, so a
call could also wait long after the server came back. :class:`Pool` keeps the pool for the normal case
(a lease is one lock and a deque) and adds one state: after a connection broke, or a lease failed, the
next lease first makes one direct connection, bounded by a short connect timeout. While that fails,
every lease fails at once with :class:`~dossier.errors.StoreUnavailable`. The first that succeeds after a
failure replaces the pool with a fresh one, which connects at once instead of waiting out its back-off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from ..errors import StoreUnavailable

_FINE, _UNSURE, _DOWN = "fine", "unsure", "down"


class Pool:
    """``make()`` builds a new (unopened) psycopg pool; ``url`` is what it connects to, ``label`` names it in
    messages (no password); ``probe_timeout`` bounds the direct connection made while unsure (seconds)."""

    def __init__(self, make: Callable[[], ConnectionPool[Any]], *, url: str, label: str, probe_timeout: float) -> None:
        self._make = make
        self._url, self._label = url, label
        self._probe_timeout = max(2, int(probe_timeout))  # libpq's least connect_timeout
        self._lock = threading.Lock()
        self._state = _FINE
        self.pool = make()

    def open(self, timeout: float) -> None:
        """Open the pool and wait for its first connection (psycopg_pool's PoolTimeout if none comes)."""
        self.pool.open(wait=True, timeout=timeout)

    def close(self) -> None:
        self.pool.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; while the server was last seen unreachable, StoreUnavailable at once instead."""
        if self._state != _FINE:
            self._reach()
        with self.pool.connection() as conn:
            yield conn

    def check(self) -> None:
        """Test the idle connections, replacing the broken ones (a server restart leaves them all dead)."""
        self.pool.check()

    def unsure(self) -> None:
        """A connection broke or a lease failed: the next lease first checks that the server answers."""
        with self._lock:
            if self._state == _FINE:
                self._state = _UNSURE

    def _reach(self) -> None:
        with self._lock:  # one direct connection at a time; the others wait for its verdict
            if self._state == _FINE:
                return
            try:
                psycopg.connect(self._url, autocommit=True, connect_timeout=self._probe_timeout).close()
            except psycopg.OperationalError as exc:
                self._state = _DOWN
                raise StoreUnavailable(f"PostgreSQL at {self._label} is unreachable: {exc}".strip()) from exc
            if self._state == _DOWN:  # the pool's own attempts failed: it may be waiting out a long back-off
                stale, self.pool = self.pool, self._make()
                self.pool.open(wait=False)
                stale.close(timeout=0)  # a lease still waiting on it fails (PoolClosed) and is reported unavailable
            self._state = _FINE


def dropped(pool: Pool, conn: psycopg.Connection[Any] | None, attempt: int) -> bool:
    """Whether a first attempt failed on a pooled connection the server dropped (a restart, a failover, an
    outage). The pool's other idle connections are likely gone too: they are tested, and replaced, and the
    server is asked once directly before the caller tries once more (only what had not begun, or may run
    twice), so an outage fails now rather than after the pool's whole timeout."""
    if attempt == 1 and conn is not None and conn.broken:
        pool.unsure()
        pool.check()
        return True
    return False
