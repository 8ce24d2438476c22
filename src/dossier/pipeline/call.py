"""The one context object that flows through the layers of a retrieve call."""

from __future__ import annotations

import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..bundle import Caller, Document, Record
from ..errors import ProviderTimeout
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

if TYPE_CHECKING:
    from ..engine import Engine


@dataclass
class Plan:
    mode: Mode
    sources: dict[SourceName, bool]
    requested_depth: Depth
    effective_depth: Depth
    depth_fallback: str | None = None
    model_steps: bool = False  # deep with a model configured: the model-backed steps run
    deep_fallbacks: dict[str, str] = field(default_factory=dict)  # step -> "deep_timeout: rules", ...


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
    def lexical_only(self) -> bool:
        return self.vector_rank is None and self.text_rank is not None


@dataclass
class Call:
    """Everything one retrieve call knows; each layer reads what earlier layers wrote."""

    engine: "Engine"
    request: RetrieveRequest
    org: str
    caller: Caller
    settings: Settings
    call_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    plan: Plan | None = None
    resolution: Resolution = field(default_factory=Resolution)
    understanding: Understanding = field(default_factory=Understanding)
    # per source: candidate items before packing (pydantic item models), results, routes
    candidates: dict[SourceName, list[Any]] = field(default_factory=lambda: {s: [] for s in SOURCE_NAMES})
    results: dict[SourceName, SourceResult] = field(default_factory=lambda: {s: SourceResult() for s in SOURCE_NAMES})
    route: dict[str, Route] = field(default_factory=dict)
    sections: list[SectionCandidate] = field(default_factory=list)
    documents: dict[str, Document] = field(default_factory=dict)
    trace: list[TraceEntry] = field(default_factory=list)  # every decision; report shows the caller only its own
    full_trace: bool = False  # in-process only (dossier eval): the trace keeps what the caller may not see
    cleared: set[tuple[str, str]] = field(default_factory=set)  # (source, item id) governance let through
    shares: dict[str, int] = field(default_factory=dict)
    degraded: bool = False
    synthesis: Synthesis | None = None
    meter: Meter = field(default_factory=Meter)
    response: RetrieveResponse | None = None
    _query_vector: np.ndarray | None = None
    _masker: Masker | None = None
    # store reads started in the background before their layer needs them (see Engine.background)
    prefetched: dict[str, Future] = field(default_factory=dict)

    @property
    def store(self) -> Store:
        return self.engine.store

    @property
    def message(self) -> str:
        return (self.request.message or "").strip()

    def query_vector(self) -> np.ndarray:
        if self._query_vector is None:
            self._query_vector = self.engine.embed_query(self.message)
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

    def step_failed(self, step: str, error: BaseException, *, fallback: str) -> str:
        """A model step of a deep call failed and ``fallback`` ran instead: the call goes on at standard
        depth for that step, and the documents route says so (``deep_timeout`` or ``deep_error``)."""
        reason = "deep_timeout" if isinstance(error, ProviderTimeout) else "deep_error"
        assert self.plan is not None
        self.plan.effective_depth = "standard"
        self.plan.depth_fallback = self.plan.depth_fallback or reason
        self.plan.deep_fallbacks[step] = f"{reason}: {fallback}"
        if step in ("filters", "rephrase") and "understand" in self.route:
            self.route["understand"].detail.setdefault("deep_fallbacks", {})[step] = f"{reason}: {fallback}"
        documents = self.route.get("documents")
        if documents is not None and documents.requested_depth is not None:
            documents.effective_depth = "standard"
            documents.fallback_reason = documents.fallback_reason or self.plan.depth_fallback
            documents.detail["deep_fallbacks"] = dict(self.plan.deep_fallbacks)
        text = f"{step} step failed, {fallback} used: {type(error).__name__}: {error}"
        if self.enabled("documents"):
            self.fail("documents", text, keep_items=True)
        else:
            self.degraded = True
        return reason

    def enabled(self, source: SourceName) -> bool:
        return bool(self.plan and self.plan.sources.get(source))

    def note(self, source: SourceName, item_id: str, layer: str, decision: str, reason: str | None = None,
             score: float | None = None) -> None:  # fmt: skip
        """Record one layer's decision about one item. Any layer may note any candidate, seen or not:
        the response shows the caller only decisions about items governance cleared for it, and merely
        counts the rest (``layers/report.py``)."""
        self.trace.append(
            TraceEntry(source=source, id=item_id, layer=layer, decision=decision, reason=reason, score=score)  # type: ignore[arg-type]
        )

    def fail(self, source: SourceName, error: BaseException | str, *, keep_items: bool = False) -> None:
        """Record that ``source`` failed (or degraded, with ``keep_items``) and mark the call partial."""
        result = self.results[source]
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        result.error = text if result.error is None else f"{result.error}; {text}"
        if not keep_items:
            result.status = "error"
        self.degraded = True

    def take(self, key: str, compute: Callable[[], Any]) -> Any:
        """The result of the read prefetched under ``key`` (its exception, if it failed), else ``compute()``."""
        future = self.prefetched.pop(key, None)
        return compute() if future is None else future.result()

    def guarded(self, source: SourceName, step: Callable[[], Any], *, what: str) -> Any:
        """Run ``step``; on failure record the error against ``source`` and return None."""
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - every source failure is reported, never raised
            self.fail(source, f"{what} failed: {type(exc).__name__}: {exc}", keep_items=True)
            return None
