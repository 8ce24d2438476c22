"""A circuit breaker per model URL: a model that keeps timing out is not asked again for a while.

After :data:`THRESHOLD` timeouts in a row (3) of requests that were given at least :data:`MIN_WAIT`
seconds (1 s: a request cut short by a caller's tight deadline says nothing about the model), the
breaker of that URL opens. For :data:`COOL_DOWN` seconds (30) no request is sent there: every step
that would ask that model falls back at once, as if it had timed out, and the route says so
(``route.model.detail.circuit``). Then one request goes through (half-open); if it times out, the
breaker opens again for another cool-down, and any answer, even an HTTP error or malformed output,
closes it (the model is there; it is not hanging).

Breakers are shared by every client of the same URL in the process (:func:`breaker_for`), so one
caller's experience of a hanging model spares the next caller the wait.
"""

from __future__ import annotations

import time
from threading import Lock
from typing import Any, Callable

THRESHOLD = 3  # timeouts in a row that open the breaker
COOL_DOWN = 30.0  # seconds the breaker stays open
MIN_WAIT = 1.0  # a timeout counts only when the request was given at least this many seconds


class CircuitBreaker:
    """The breaker of one model URL (thread-safe)."""

    def __init__(self, url: str, *, threshold: int = THRESHOLD, cool_down: float = COOL_DOWN, min_wait: float = MIN_WAIT,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.url = url
        self.threshold, self.cool_down, self.min_wait = threshold, cool_down, min_wait
        self._clock = clock
        self._lock = Lock()
        self._timeouts = 0  # in a row
        self._opened_at: float | None = None
        self._trial_at: float | None = None  # when the half-open request was let through

    def allow(self) -> bool:
        """Whether a request may be sent now (closed, or the one trial request after the cool-down)."""
        with self._lock:
            if self._opened_at is None:
                return True
            now = self._clock()
            if now - self._opened_at < self.cool_down:
                return False
            if self._trial_at is not None and now - self._trial_at < self.cool_down:
                return False  # a trial request is still out
            self._trial_at = now
            return True

    def timed_out(self, given: float) -> None:
        """A request that was given ``given`` seconds did not answer in time."""
        with self._lock:
            if given < self.min_wait and self._trial_at is None:
                return
            self._timeouts += 1
            if self._trial_at is not None or self._timeouts >= self.threshold:
                self._opened_at, self._trial_at = self._clock(), None

    def answered(self) -> None:
        """The model answered (whatever it said): the breaker closes."""
        with self._lock:
            self._timeouts, self._opened_at, self._trial_at = 0, None, None

    def status(self) -> dict[str, Any]:
        """``state`` (``closed | open | half_open``), timeouts in a row, and seconds until a request may go."""
        with self._lock:
            out: dict[str, Any] = {"state": "closed", "timeouts_in_a_row": self._timeouts, "threshold": self.threshold,
                                   "cool_down_s": self.cool_down}  # fmt: skip
            if self._opened_at is not None:
                wait = self.cool_down - (self._clock() - self._opened_at)
                out["state"] = "open" if wait > 0 else "half_open"
                out["retry_in_s"] = round(max(wait, 0.0), 1)
            return out

    def describe(self) -> str:
        """Why a request was not sent, for the error a step falls back with."""
        status = self.status()
        return (f"not asked: {status['timeouts_in_a_row']} timeouts in a row, the circuit of {self.url} is open "
                f"for another {status.get('retry_in_s', 0.0):g} s (cool-down {self.cool_down:g} s)")  # fmt: skip


_BREAKERS: dict[str, CircuitBreaker] = {}
_REGISTRY_LOCK = Lock()


def breaker_for(url: str) -> CircuitBreaker:
    """The process's breaker of ``url`` (one per URL, shared by every client of it)."""
    with _REGISTRY_LOCK:
        breaker = _BREAKERS.get(url)
        if breaker is None:
            breaker = _BREAKERS[url] = CircuitBreaker(url)
        return breaker


def reset_breakers() -> None:
    """Forget every breaker's state (a new process starts like this)."""
    with _REGISTRY_LOCK:
        _BREAKERS.clear()
