"""The one context object that flows through the layers of a retrieve call, and its typed parts.

:class:`Call` holds the request, who asks, the settings, the pluggable steps the call runs with
(:class:`~dossier.pipeline.steps.Steps`: the store, the models, the selector ...) and what each layer
wrote so far. It never holds the engine.
"""

from __future__ import annotations

import logging
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, cast

import numpy as np

from ..bundle import Caller, Document, Record
from ..errors import ProviderError, ProviderTimeout
from ..providers.llm import Meter
from ..providers.pii import Masker
from ..schema import (
    SOURCE_NAMES,
    Depth,
    Filters,
    Mode,
    RetrieveRequest,
    RetrieveResponse,
    Route,
    SourceName,
    SourceResult,
    Synthesis,
    TraceEntry,
)
from ..settings import Settings
from ..stores.base import Store
from ..stores.service_base import Session
from .events import Decision, Degraded, Event, Fallback
from .steps import Steps

_log = logging.getLogger("dossier")


def public_error(exc: BaseException) -> str:
    """What a caller may read about a failure: the error's class, and its message only where dossier wrote
    that message for callers (a model's or an external source's ProviderError). A store's or the standard
    library's messages can name hosts, file paths or SQL: they go to the server's log (``dossier`` logger),
    never into a response."""
    if isinstance(exc, ProviderError):
        return f"{type(exc).__name__}: {exc}"
    return type(exc).__name__


@dataclass(frozen=True)
class Plan:
    """What ``plan`` decided; frozen: a model step that later falls back records a
    :class:`~dossier.pipeline.events.Fallback` instead (``Call.effective_depth``)."""

    mode: Mode
    sources: dict[SourceName, bool]
    requested_depth: Depth
    effective_depth: Depth
    depth_fallback: str | None = None  # why the plan itself lowered the depth ("no_model")
    model_steps: bool = False  # deep with a model configured: the model-backed steps run


@dataclass
class Resolution:
    record: Record | None = None
    tombstone: bool = False
    aliases: list[Record] = field(default_factory=list)
    merged_from: list[str] = field(default_factory=list)
    not_found: bool = False

    @property
    def record_ids(self) -> list[str]:
        """The record, its merged-away records and its aliases: whose memories count."""
        if self.record is None or self.tombstone:
            return []
        return [self.record.id, *self.merged_from, *(a.id for a in self.aliases)]


@dataclass
class Understanding:
    intent: str = "general"
    filters: Filters | None = None
    filters_source: str = "none"  # caller | inferred | none
    inferred: dict[str, Any] = field(default_factory=dict)
    document_query: str = ""
    memory_query: str = ""  # the part of a multi-part question about the customer (else the question)
    parts: int = 1  # how many parts the question asks (layers/understand.py: question_parts)
    rephrasings: list[str] = field(default_factory=list)


@dataclass
class SectionCandidate:
    section_id: str
    document_id: str
    score: float  # cosine similarity to the question (0 when unknown)
    fused: float = 0.0
    vector_rank: int | None = None
    text_rank: int | None = None
    text_score: float = 0.0  # full-text score relative to the best full-text hit of this call (0..1)
    rerank: float | None = None  # reranker score, when one ran (higher is better; its own scale)
    adapted: float | None = None  # cosine of the adapted query (providers/adapter.py), when an adapter ran

    @property
    def id(self) -> str:
        """The id the candidate is known by in traces (``schema.item_key``): its section's."""
        return self.section_id

    @property
    def lexical_only(self) -> bool:
        return self.vector_rank is None and self.text_rank is not None


@dataclass(frozen=True)
class Restored:
    """An expand call's session, as ``restore_session`` found it (layers/session.py)."""

    session: Session
    state: dict[str, Any]  # remaining items per source, returned so far, page, who the call was about
    page: frozenset[SourceName]  # the sources whose items this page came from
    own: bool = True  # the caller paging is the one that opened the session


@dataclass
class Call:
    """Everything one retrieve call knows; each layer reads what earlier layers wrote."""

    steps: Steps
    request: RetrieveRequest
    org: str
    caller: Caller
    settings: Settings
    call_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    plan: Plan | None = None
    resolution: Resolution = field(default_factory=Resolution)
    understanding: Understanding = field(default_factory=Understanding)
    # per source: candidates before packing, and results. One slot per source: documents hold
    # SectionCandidates from recall until section selection turns them into SectionItems (an expand
    # page restores SectionItems), every other source its pydantic items
    candidates: dict[SourceName, list[Any]] = field(default_factory=lambda: {s: [] for s in SOURCE_NAMES})
    results: dict[SourceName, SourceResult] = field(default_factory=lambda: {s: SourceResult() for s in SOURCE_NAMES})
    route: dict[str, Route] = field(default_factory=dict)  # built by report from the events
    documents: dict[str, Document] = field(default_factory=dict)
    trace: list[TraceEntry] = field(default_factory=list)  # every decision; report shows the caller only its own
    full_trace: bool = False  # in-process only (dossier eval): the trace keeps what the caller may not see
    cleared: set[tuple[str, str]] = field(default_factory=set)  # (source, item id) governance let through
    shares: dict[str, int] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)  # decisions, fallbacks, failures (pipeline/events.py)
    synthesis: Synthesis | None = None
    meter: Meter = field(default_factory=Meter)
    session: Restored | None = None  # an expand call's session (restore_session)
    continuation: str | None = None  # the session a later expand call continues (keep_session)
    response: RetrieveResponse | None = None
    _query_vector: np.ndarray | None = None
    _masker: Masker | None = None
    # store reads the sources started in the background before recall needs them (layers/recall.py)
    prefetched: dict[str, Future] = field(default_factory=dict)

    @property
    def store(self) -> Store:
        return self.steps.store

    @property
    def sections(self) -> list[SectionCandidate]:
        """The documents slot while it holds section candidates: after recall, before selection."""
        return cast("list[SectionCandidate]", self.candidates["documents"])

    @property
    def planned(self) -> Plan:
        """The plan, for the layers and sources that run after ``plan`` (which always sets it)."""
        assert self.plan is not None
        return self.plan

    @property
    def message(self) -> str:
        return (self.request.message or "").strip()

    def query_vector(self) -> np.ndarray:
        if self._query_vector is None:
            self._query_vector = self.steps.embed_query(self.message)
        return self._query_vector

    def masker(self, *, fresh: bool = False) -> Masker:
        """Masks the personal data of the resolved record (and its aliases) in what a model is sent. The
        call keeps one; ``fresh`` gives a new one, whose placeholders depend only on what it masks."""
        if self._masker is None or fresh:
            res = self.resolution
            records = [] if res.record is None or res.tombstone else [res.record, *res.aliases]
            if fresh:
                return Masker.for_records(records)
            self._masker = Masker.for_records(records)
        return self._masker

    def step_failed(self, step: str, error: BaseException, *, fallback: str) -> Fallback:
        """A model step of a deep call failed and ``fallback`` ran instead: recorded as a
        :class:`Fallback` (the documents route says so at the end: ``deep_timeout`` or ``deep_error``),
        and the documents source's error names it."""
        reason = "deep_timeout" if isinstance(error, ProviderTimeout) else "deep_error"
        text = f"{step} step failed, {fallback} used: {public_error(error)}"
        event = Fallback(step=step, reason=reason, fallback=fallback, error=text)
        self.events.append(event)
        if self.enabled("documents"):
            self.fail("documents", text, keep_items=True)
        else:
            self.degrade(step, text)
        return event

    @property
    def fallbacks(self) -> list[Fallback]:
        return [e for e in self.events if isinstance(e, Fallback)]

    @property
    def effective_depth(self) -> Depth:
        """The plan's depth, or ``standard`` once a model step fell back."""
        return "standard" if self.fallbacks else self.planned.effective_depth

    @property
    def degraded(self) -> bool:
        """Whether anything failed that the call survived (``partial``)."""
        return any(isinstance(e, Degraded) for e in self.events)

    def decide(self, route: str, /, *, detail: dict[str, Any] | None = None, append: dict[str, Any] | None = None,
               **fields: Any) -> None:  # fmt: skip
        """Record what ``route[route]`` shows: Route fields (``ran=True``, ``backend="hybrid"``), ``detail``
        keys, or ``append`` entries to a detail list (``append={"siblings": [a, b]}``)."""
        self.events.append(Decision(route=route, fields=fields, detail=dict(detail or {}), append=dict(append or {})))

    def degrade(self, where: str, error: str) -> None:
        """Record a failure the call survives: the response is ``partial``."""
        self.events.append(Degraded(where=where, error=error))

    def enabled(self, source: SourceName) -> bool:
        return bool(self.plan and self.plan.sources.get(source))

    def note(self, source: SourceName, item_id: str, layer: str, decision: Literal["kept", "dropped"],
             reason: str | None = None, score: float | None = None) -> None:  # fmt: skip
        """Record one layer's decision about one item. Any layer may note any candidate, seen or not:
        the response shows the caller only decisions about items governance cleared for it, and merely
        counts the rest (``layers/report.py``). Nothing is recorded when no trace was asked for."""
        if not self.request.trace:
            return
        self.trace.append(
            TraceEntry(source=source, id=item_id, layer=layer, decision=decision, reason=reason, score=score)
        )

    def fail(self, source: SourceName, error: BaseException | str, *, keep_items: bool = False) -> None:
        """Record that ``source`` failed (or degraded, with ``keep_items``) and mark the call partial."""
        result = self.results[source]
        text = error if isinstance(error, str) else public_error(error)
        result.error = text if result.error is None else f"{result.error}; {text}"
        if not keep_items:
            result.status = "error"
        self.degrade(source, text)

    def guarded(self, source: SourceName, step: Callable[[], Any], *, what: str) -> Any:
        """Run ``step``; on failure record the error against ``source`` and return None."""
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - every source failure is reported, never raised
            _log.warning("%s of %s failed", what, source, exc_info=exc)
            self.fail(source, f"{what} failed: {public_error(exc)}", keep_items=True)
            return None
