"""One deadline per call: when each model step must end, the threads the steps run on, and their timings.

A retrieve call has one deadline (``deadline_ms`` of the request, else ``Settings.deadline_ms``),
counted from the moment the engine starts the call. The store reads, the embeddings and the packing
always run: they are what the context is made of, and they take milliseconds. The model steps are
what can hang, so each has an end time within the deadline (:meth:`Deadline.plan`):

* the last model step ends :data:`RESERVE` before the deadline (what is left builds the response);
* with synthesis in the call (``synthesize`` and not ``deferred``), the steps before it must be done
  by 60% of that, so that a slow rephrasing cannot eat the answer's time;
* filter inference and rephrasings (run at the same time) end by half of their window, rerank by
  three quarters, the section selector at its end.

A step also keeps its own timeout (``DEFAULT_TIMEOUTS`` of the chat model): it ends at whichever comes
first. A step runs on a thread of its own (:func:`start_step`) and is waited for until its end time at
most; one that has not finished is left behind and reported as timed out, and the layer that asked
falls back to its heuristic (``deep_timeout``). Only the model request runs on that thread: the store
and the embedder are used by the calling thread alone.

:meth:`Deadline.report` is ``route["deadline"].detail``: the deadline, how it was chosen, the time each
layer took and, per model step, when it started, how long it took, the time it was given and how it
ended (``ok | error | timeout | no_time | circuit_open``).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar, copy_context
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterator, TypeVar, cast

from .errors import ProviderTimeout

R = TypeVar("R")

#: Seconds kept at the end of the deadline, after the last model step, to build the response.
RESERVE = 0.2
#: A model step is not started with less time than this left (seconds): it could not answer.
MIN_STEP_SECONDS = 0.05
#: How long after its end time a step is still waited for (its own request timeout fires first, so
#: that its cost and error are recorded as usual).
GRACE_SECONDS = 0.1
#: With synthesis in the call, the share of the time that the steps before it may use.
BEFORE_SYNTHESIS = 0.6
#: When each step before synthesis ends, as a share of their window.
STEP_ENDS = {"filters": 0.5, "rephrase": 0.5, "rerank": 0.75, "select": 1.0}
#: Outcomes that mean the step ran out of time.
MISSED = ("timeout", "no_time")


@dataclass
class Deadline:
    """The deadline of one call: ``seconds`` from ``started``, and the end time of each model step."""

    seconds: float
    ends: dict[str, float] = field(default_factory=dict)  # step -> seconds after the start
    started: float = field(default_factory=time.monotonic)
    source: str = "default"  # "request" | "default"
    requested_ms: int | None = None  # what the request asked for, when a maximum lowered it
    _steps: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _layers: dict[str, float] = field(default_factory=dict, repr=False)
    _marked: dict[str, str] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def plan(cls, seconds: float, *, synthesis: bool, **kwargs: Any) -> "Deadline":
        """A deadline of ``seconds`` whose model steps end as the module docstring says."""
        last = max(seconds - min(RESERVE, 0.2 * seconds), 0.0)
        window = last * (BEFORE_SYNTHESIS if synthesis else 1.0)
        ends = {step: round(window * share, 4) for step, share in STEP_ENDS.items()}
        ends["synthesize"] = round(last, 4)
        return cls(seconds=seconds, ends=ends, **kwargs)

    @property
    def ms(self) -> int:
        return int(round(self.seconds * 1000))

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def end_of(self, step: str) -> float:
        """Seconds after the start by which ``step`` must end (the deadline itself for unknown steps)."""
        return self.ends.get(step, self.seconds)

    def remaining(self, step: str | None = None) -> float:
        """Seconds left for ``step`` (or for the whole call); negative once it is past."""
        return (self.seconds if step is None else self.end_of(step)) - self.elapsed()

    def mark(self, step: str, outcome: str) -> None:
        """How ``step`` ended, said by whoever knows better than its thread's result: an adapter that
        sent nothing (``no_time``, ``circuit_open``), or a step that reports its failure as a value."""
        with self._lock:
            self._marked[step] = outcome

    def note(self, step: str, *, started: float, budget: float, outcome: str) -> None:
        """Record how ``step`` went: when it started, how long it took, the time it was given."""
        with self._lock:
            outcome = self._marked.pop(step, outcome)
            self._steps[step] = {
                "start_ms": round((started - self.started) * 1000, 1),
                "ms": round((time.monotonic() - started) * 1000, 1),
                "budget_ms": round(max(budget, 0.0) * 1000, 1),
                "end_ms": round(self.end_of(step) * 1000, 1),
                "outcome": outcome,
            }

    @contextmanager
    def layer(self, name: str) -> Iterator[None]:
        """Time one layer of the pipeline."""
        began = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._layers[name] = round((time.monotonic() - began) * 1000, 1)

    def report(self) -> dict[str, Any]:
        """``route["deadline"].detail``; ``missed`` lists the steps that ran out of time (timed out, or not
        started for lack of it)."""
        with self._lock:
            steps = {step: dict(timing) for step, timing in self._steps.items()}
            layers = dict(self._layers)
        out: dict[str, Any] = {"deadline_ms": self.ms, "source": self.source}
        if self.requested_ms is not None:
            out["requested_ms"] = self.requested_ms
        out.update(elapsed_ms=round(self.elapsed() * 1000, 1), layers=layers, steps=steps,
                   missed=[s for s, t in steps.items() if t["outcome"] in MISSED])  # fmt: skip
        return out


_DEADLINE: ContextVar[Deadline | None] = ContextVar("dossier_deadline", default=None)
_IN_STEP: ContextVar[str | None] = ContextVar("dossier_in_step", default=None)


@contextmanager
def within(deadline: Deadline | None) -> Iterator[Deadline | None]:
    """Model steps started inside this block (in this thread or context) keep to ``deadline``;
    ``None`` lifts it (a background synthesis keeps only its own timeout)."""
    token = _DEADLINE.set(deadline)
    try:
        yield deadline
    finally:
        _DEADLINE.reset(token)


def current_deadline() -> Deadline | None:
    """The deadline of the call being run here, if any."""
    return _DEADLINE.get()


class Pending(Generic[R]):
    """A model step started by :func:`start_step`; :meth:`result` waits for it until its end time."""

    def __init__(self, step: str, work: Callable[[], R]) -> None:
        self.step = step
        self.started = time.monotonic()
        self.budget = 0.0  # seconds it was given (under a deadline)
        self.ran = True  # False when it was never started (no time was left, or no thread)
        self._deadline = current_deadline()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[R | None, BaseException | None], None]] = []
        self._value: R | None = None
        self._error: BaseException | None = None
        self._late: ProviderTimeout | None = None
        self._waited = False
        deadline = self._deadline
        if deadline is None or _IN_STEP.get() is not None:  # no deadline, or already on a step's thread
            self._deadline = None
            self._run(work)
            return
        self.budget = deadline.remaining(step)
        if self.budget < MIN_STEP_SECONDS:
            deadline.mark(step, "no_time")
            self.ran = False
            self._error = ProviderTimeout(f"no time was left for the {step} step before the call's deadline "
                                          f"({deadline.ms} ms)")  # fmt: skip
            self._done.set()
            return
        context = copy_context()
        context.run(_IN_STEP.set, step)
        try:
            threading.Thread(target=context.run, args=(self._run, work), name=f"dossier-{step}", daemon=True).start()
        except RuntimeError as exc:  # no thread to be had: the step fails and its layer falls back
            self.ran = False
            self._error = exc
            self._done.set()

    def _run(self, work: Callable[[], R]) -> None:
        try:
            self._value = work()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the step
            self._error = exc
        finally:
            with self._lock:
                self._done.set()
                callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks:
                callback(self._value, self._error)

    def done(self) -> bool:
        return self._done.is_set()

    def then(self, callback: Callable[[R | None, BaseException | None], None]) -> None:
        """Call ``callback(value, error)`` once the step has ended (at once if it has), whether or not
        anyone still waits for it: what a step left behind still produces is not lost."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self._value, self._error)

    def result(self) -> R:
        """The step's value, or its error; :class:`ProviderTimeout` when it did not end in time."""
        deadline = self._deadline
        if deadline is not None and not self._waited:
            self._waited = True
            finished = self._done.wait(max(deadline.remaining(self.step) + GRACE_SECONDS, 0.0))
            if not finished:
                self._late = ProviderTimeout(f"the {self.step} step did not finish by its end time "
                                             f"({deadline.end_of(self.step) * 1000:.0f} ms into the call's "
                                             f"{deadline.ms} ms deadline)")  # fmt: skip
            error = self._late or self._error
            outcome = "ok" if error is None else "timeout" if isinstance(error, ProviderTimeout) else "error"
            deadline.note(self.step, started=self.started, budget=self.budget, outcome=outcome)
        if self._late is not None:
            raise self._late
        if self._error is not None:
            raise self._error
        return cast(R, self._value)


def start_step(step: str, work: Callable[[], R]) -> Pending[R]:
    """Start model step ``step`` on a thread of its own under the current deadline (at once and in
    place when there is none, or when this already is a step's thread)."""
    return Pending(step, work)


def run_step(step: str, work: Callable[[], R]) -> R:
    """:func:`start_step` and wait for it."""
    return start_step(step, work).result()
