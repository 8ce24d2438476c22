"""The pluggable steps of a call: the interfaces the layers call through, and :class:`Steps`, the frozen
set of them one call runs with (the engine builds it for each call: :meth:`dossier.Engine.steps`).

A layer reaches the store, the embedding model, a chat model or a reranker only through ``call.steps``;
it never sees the engine. A test can build a :class:`Steps` of its own.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

from ..bundle import Document
from ..providers.embeddings import Embedder
from ..providers.llm import ChatModel
from ..providers.rerank import Reranker
from ..schema import Filters, SourceName
from ..stores.base import Hit, Store
from ..stores.service_base import ServiceStore

if TYPE_CHECKING:
    from .call import SectionCandidate
    from .source_io import Found, SourceQuery, SourceTools


# -- sources ---------------------------------------------------------------------------------------------
class Skipped(Exception):
    """Raised by a source that has nothing to do for this call (e.g. no record); the reason is reported."""


class Failed(Exception):
    """Raised by a source whose failure its recorded events already tell; marks it ``error``."""


class Source(Protocol):
    """One source of candidates (dossier.sources). ``recall`` returns what it found for one call (its
    candidates and the events to record: :mod:`dossier.pipeline.source_io`); ``prefetch`` may start its
    store reads in the background before recall asks for them, and returns them by key
    (``SourceTools.take`` reads them back). Neither is given the call."""

    name: SourceName

    def prefetch(self, query: SourceQuery, tools: SourceTools) -> dict[str, Future[Any]]: ...

    def recall(self, query: SourceQuery, tools: SourceTools) -> Found: ...


# -- understanding ---------------------------------------------------------------------------------------
@dataclass
class InferredFilters:
    filters: Filters
    confidence: float
    reason: str = ""
    backend: str = "rules"


class FilterInferrer(Protocol):
    """Guess doc types / tags from a question, with a confidence in [0, 1]. ``vocabulary`` holds the
    doc types and tags of the documents this caller may see (only model-backed inferrers ask for it)."""

    name: str

    def infer(self, message: str, *, vocabulary: Filters | None = None) -> InferredFilters | None: ...


class Augmenter(Protocol):
    """Rephrase a question from other angles to widen the document query."""

    name: str

    def rephrase(self, message: str) -> list[str]: ...


# -- section selection -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pick:
    section_id: str
    relevance: int  # 1-5


class Selector(Protocol):
    """Picks the sections that answer ``question`` among governed candidates (best first)."""

    name: str

    def select(self, question: str, candidates: list[SectionCandidate], documents: dict[str, Document]) -> list[Pick]: ...


# -- fusion ------------------------------------------------------------------------------------------------
class Fuse(Protocol):
    """Fuses rankings into one score per id (reciprocal rank fusion: dossier.sources.documents.rrf)."""

    def __call__(self, rankings: list[list[Hit]], k: int, weights: list[float] | None = None) -> dict[str, float]: ...


def uses_model(step: object) -> bool:
    """Whether a pluggable step asks a chat model (its ``uses_model`` attribute)."""
    return bool(getattr(step, "uses_model", False))


@dataclass(frozen=True)
class Steps:
    """What one call runs with: the store, the models and the pluggable steps, frozen for the call.

    ``embedder`` and ``service_store`` are opened on first use (a call that embeds nothing loads no model;
    one that opens no session opens no service tables). ``background`` starts a store read on another
    thread (None when the store serves one read at a time); ``embed_ahead`` starts a query embedding on
    one (and one core), and ``while_embedding`` runs a read that needs no vector meanwhile
    (``Engine.while_embedding``); ``defer`` and ``keep_late`` hand a synthesis over to the engine's
    background results.
    """

    store: Store
    embed_query: Callable[[str], np.ndarray]
    embedder: Callable[[], Embedder]
    fuse: Fuse
    sources: Sequence[Source]
    selector: Selector
    filter_inferrer: FilterInferrer
    augmenter: Augmenter
    llm: ChatModel | None
    reranker: Reranker | None
    background: Callable[..., Future[Any] | None]
    embed_ahead: Callable[[str], None]
    while_embedding: Callable[..., Future[Any]]
    service_store: Callable[[], ServiceStore]
    defer: Callable[..., None]
    keep_late: Callable[..., None]

