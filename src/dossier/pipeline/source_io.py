"""What a source is given and what it gives back: the contract between the recall layer and the sources.

A source never sees the call. The recall layer (layers/recall.py) hands each one a frozen
:class:`SourceQuery` (what it may read about this call) and :class:`SourceTools` (the store, the query
embedding and the other steps it runs with), and the source returns a :class:`Found`: its items, and the
events it wants recorded, in the order they happened. Only the recall layer writes them into the call.

The events are the call's own types: a :class:`~dossier.pipeline.events.Decision` for what the source's
route shows, a :class:`~dossier.pipeline.events.Degraded` for a failure the source survived (its error
text joins the source's ``error``, the response is ``partial``) and a :class:`~dossier.schema.TraceEntry`
for a trace note about one candidate.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Literal, Mapping

import numpy as np

from ..bundle import Record
from ..providers.embeddings import Embedder
from ..schema import Depth, Filters, Mode, SourceName, TraceEntry
from ..settings import Settings
from ..stores.base import Store, Viewer
from .events import Decision, Degraded
from .steps import Failed, Fuse, Skipped
from .visibility import Guarded, verdict

SourceEvent = Decision | Degraded | TraceEntry


@dataclass(frozen=True)
class MemoryLead:
    """The memory the memories source rated best for this call: what a multi-part question's document
    search may read (the recall layer passes it on only when it belongs to one of the call's records)."""

    id: str
    record_id: str
    text: str


@dataclass(frozen=True, kw_only=True)
class SourceQuery:
    """What a source reads about one call: who asks, about which record, the question as understood, and
    the parts of the plan and settings the sources follow."""

    org: str
    roles: tuple[str, ...] = ()  # the caller's roles (who may see a fetched document)
    message: str = ""  # the question, stripped
    record_named: bool = False  # whether the request named a record (none named, or named and not found)
    record: Record | None = None  # the resolved record (or the tombstone's)
    tombstone: bool = False
    merged_from: tuple[str, ...] = ()  # records merged into ``record``
    record_ids: tuple[str, ...] = ()  # the record, its merged-away records and aliases: whose memories count
    mode: Mode = "brief"
    depth: Depth = "standard"  # the plan's effective depth
    document_query: str = ""  # the understood document query (empty: the question)
    memory_query: str = ""  # the part of the question about the customer (empty: the question)
    parts: int = 1  # how many parts the question asks (layers/understand.py: question_parts)
    memory_lead: MemoryLead | None = None  # the memory the memories source rated best (set by the recall layer)
    filters: Filters | None = None  # the caller's or the inferred filters
    fetch: tuple[str, ...] = ()  # the documents a fetch call names
    settings: Settings = field(default_factory=Settings)
    trace: bool = True  # whether the caller asked for a trace: without one, trace notes are not even made
    full_trace: bool = False  # the operator's full evidence (in-process only, dossier eval): notes what is hidden too

    def document_verdict(self, document: Guarded | None) -> str | None:
        """Why ``document`` must not be returned to this caller, or None when it may be (the one rule:
        :func:`dossier.pipeline.visibility.verdict`)."""
        return verdict(document, org=self.org, roles=self.roles, record_ids=self.record_ids)

    @property
    def viewer(self) -> Viewer:
        """This caller as the store's full-text statistics count what it may see (the rule's inputs)."""
        return Viewer(roles=frozenset(self.roles), record_ids=frozenset(self.record_ids))


@dataclass(frozen=True, kw_only=True)
class SourceTools:
    """What a source runs with. ``query_vector`` embeds the question once per call (the same vector the
    other layers use); ``background`` starts a store read on another thread (None when the store serves
    one read at a time); ``embed_ahead`` starts embedding a query text on another thread and one core
    (where the reads to run meanwhile are long: :func:`~dossier.sources.context_helpers.long_text_read`),
    and ``while_embedding`` runs a read that needs no vector meanwhile, at once on the call's thread (a
    store that reads there, SQLite); :meth:`ahead` picks between ``background`` and ``while_embedding``;
    ``prefetched`` holds the reads the sources' ``prefetch`` started."""

    store: Store
    embed_query: Callable[[str], np.ndarray]
    query_vector: Callable[[], np.ndarray]
    embedder: Callable[[], Embedder]
    fuse: Fuse
    background: Callable[..., Future[Any] | None] = lambda *args, **kwargs: None
    embed_ahead: Callable[[str], None] = lambda text: None
    while_embedding: Callable[..., Future[Any] | None] = lambda *args, **kwargs: None
    prefetched: Mapping[str, Future[Any]] = field(default_factory=lambda: MappingProxyType({}))

    def ahead(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any] | None:
        """Start a read that needs no vector ahead of recall: in the background where the store reads
        concurrently (``background``), else now on the call's thread (``while_embedding``)."""
        started = self.background(fn, *args, **kwargs)
        return started if started is not None else self.while_embedding(fn, *args, **kwargs)

    def take(self, key: str, compute: Callable[[], Any]) -> Any:
        """The result of the read prefetched under ``key`` (its exception, if it failed), else ``compute()``."""
        future = self.prefetched.get(key)
        return compute() if future is None else future.result()


@dataclass
class Found:
    """What a source found for one call: its items and the events to record, in order; or why it had
    nothing to do (``skipped``), that it failed and said why in its events (``failed``), or the exception
    it could not survive (``error``)."""

    items: list[Any] = field(default_factory=list)
    events: list[SourceEvent] = field(default_factory=list)
    skipped: str | None = None
    failed: bool = False
    error: Exception | None = None
    trace: bool = True  # False: :meth:`note` records nothing (no trace was asked for)
    lead: MemoryLead | None = None  # memories: the one the ranker rates best, for the documents source

    def decide(self, route: str, /, *, detail: dict[str, Any] | None = None, append: dict[str, Any] | None = None,
               **fields: Any) -> None:  # fmt: skip
        """What ``route[route]`` shows: Route fields, ``detail`` keys, or ``append`` entries to a detail list."""
        self.events.append(Decision(route=route, fields=fields, detail=dict(detail or {}), append=dict(append or {})))

    def note(self, source: SourceName, item_id: str, layer: str, decision: Literal["kept", "dropped"],
             reason: str | None = None, score: float | None = None) -> None:  # fmt: skip
        """One decision about one candidate, for the trace (nothing when no trace was asked for)."""
        if not self.trace:
            return
        self.events.append(TraceEntry(source=source, id=item_id, layer=layer, decision=decision, reason=reason, score=score))

    def fail(self, source: SourceName, error: str) -> None:
        """A failure ``source`` survives: its items stand, its error says what failed, the call is partial."""
        self.events.append(Degraded(where=source, error=error))

    def stopped(self, exc: Exception) -> Found:
        """Record why the source stopped: :class:`Skipped`, :class:`Failed` or any other exception."""
        if isinstance(exc, Skipped):
            self.skipped = str(exc)
        elif isinstance(exc, Failed):
            self.failed = True
        else:
            self.error = exc
        return self


def recalled(body: Callable[[Found], list[Any]], *, trace: bool = True) -> Found:
    """Run a source's ``body``, which records its events into the :class:`Found` it is given and returns
    its items; an exception keeps the events recorded before it (:meth:`Found.stopped`). ``trace``: the
    query's, whether trace notes are kept."""
    found = Found(trace=trace)
    try:
        found.items = body(found)
    except Exception as exc:  # noqa: BLE001 - the recall layer reports it
        found.stopped(exc)
    return found
