"""The Engine: one store, one embedder, one settings object, the pluggable steps; load and retrieve."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from .bundle import Bundle, Document
from .errors import ConfigError, DossierError, UsageError
from .layers.model_steps import ModelAugmenter, ModelFilterInferrer, ModelSelector
from .layers.sections import HeuristicSelector, Selector
from .layers.synthesize import DeferredResults
from .layers.understand import Augmenter, FilterInferrer, NoAugmenter, RuleFilterInferrer
from .pipeline.steps import Steps
from .loading import LoadReport, Progress, document_from_markdown, load_bundle
from .providers.embeddings import CachedQueries, Embedder, embedder_from_spec
from .providers.llm import ChatModel, llm_from_env, llm_from_spec
from .providers.rerank import Reranker, reranker_from_env, reranker_from_spec
from .retrieve import retrieve
from .schema import RetrieveRequest, RetrieveResponse, Synthesis
from .settings import Settings
from .sources.documents import DocumentsSource, rrf
from .sources.external import ExternalAdapter, ExternalSource
from .sources.graph import GraphSource
from .sources.memories import MemoriesSource
from .sources.properties import PropertiesSource
from .stores import store_from_url
from .stores.base import Store
from .stores.service_base import ServiceStore, service_store_from_url

#: Seconds an engine uses what it read of an org's stored settings before reading them again (Engine.settings_ttl).
SETTINGS_TTL = 5.0


class Engine:
    """Entry point of the library. Open one with :func:`dossier.open`; close it (or use ``with``)."""

    def __init__(
        self,
        store: Store,
        *,
        embedder: Embedder | str | None = None,
        settings: Settings | None = None,
        llm: ChatModel | str | None = None,
        reranker: Reranker | str | None = None,
    ) -> None:
        self.store = store
        self._embedder_spec = embedder
        self._embedder: Embedder | None = embedder if isinstance(embedder, Embedder) else None
        self._settings = settings
        self._queries: CachedQueries | None = None
        # The pluggable steps; model-backed variants replace these without changing the pipeline.
        self.selector: Selector = HeuristicSelector()
        self.filter_inferrer: FilterInferrer = RuleFilterInferrer()
        self.augmenter: Augmenter = NoAugmenter()
        self.fuse = rrf
        self.llm: ChatModel | None = None  # set with use_llm(); None: every step is a heuristic
        self.reranker: Reranker | None = reranker_from_spec(reranker) if isinstance(reranker, str) else reranker
        self.use_llm(llm)
        self._deferred = DeferredResults(lambda: self.store)
        self.external: dict[str, ExternalAdapter] = {}
        self.sources = (PropertiesSource(), MemoriesSource(), DocumentsSource(), GraphSource(), ExternalSource(self.external))
        self.org_settings: dict[str, Settings] = {}
        #: org -> (when read, the settings stored for it, those merged over the engine's): settings_for
        self._stored_settings: dict[str, tuple[float, dict[str, Any] | None, Settings]] = {}
        #: seconds a read of an org's stored settings is used before it is read again
        self.settings_ttl = SETTINGS_TTL
        self._service_store: ServiceStore | None = None
        self._service_lock = threading.Lock()
        self._background: ThreadPoolExecutor | None = None
        self._background_lock = threading.Lock()

    @property
    def embedder(self) -> Embedder:
        """The embedding model, loaded on first use and bound to the store (same model as its vectors)."""
        if self._embedder is None:
            self._embedder = embedder_from_spec(self._embedder_spec if isinstance(self._embedder_spec, str) else None)
        if self._queries is None:
            self.store.bind_embedder(self._embedder.model_id, self._embedder.dimensions)
            self._queries = CachedQueries(self._embedder)
        return self._embedder

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = Settings.for_model(self.embedder.model_id)
        return self._settings

    @property
    def service_store(self) -> ServiceStore:
        """Expand sessions, API keys, audit, feedback and the ledger: tables in the same database as the
        data (opened on first use; see dossier.stores.service_base)."""
        with self._service_lock:
            if self._service_store is None:
                self._service_store = service_store_from_url(self.store.url)
            return self._service_store

    def use_llm(self, llm: ChatModel | str | None) -> None:
        """Use ``llm`` (a chat model or ``openai:<model>``) for the model-backed steps of ``deep`` calls
        (filter inference, rephrasings, section selection) and for synthesis; None turns them off."""
        self.llm = llm_from_spec(llm) if isinstance(llm, str) else llm
        if self.llm is None:
            self.filter_inferrer, self.augmenter, self.selector = RuleFilterInferrer(), NoAugmenter(), HeuristicSelector()
        else:
            self.filter_inferrer = ModelFilterInferrer(self.llm)
            self.augmenter = ModelAugmenter(self.llm)
            self.selector = ModelSelector(self.llm)

    def settings_for(self, org: str) -> Settings:
        """The settings of ``org``: set on this engine (``org_settings``), else stored for the org (``dossier
        calibrate --write``, :meth:`save_org_settings`) merged over the engine's, else the engine's. What is
        stored is read again once ``settings_ttl`` seconds have passed since it was last read, so settings
        stored by another process (a calibration, another worker) apply to this one's calls within that."""
        if org in self.org_settings:
            return self.org_settings[org]
        now = time.monotonic()
        kept = self._stored_settings.get(org)
        if kept is None or now - kept[0] >= self.settings_ttl:
            try:
                stored = self.store.get_settings(org=org)
                if kept is not None and stored == kept[1]:
                    merged = kept[2]
                else:
                    merged = self.settings.merged(stored) if stored else self.settings
            except (DossierError, ValueError, TypeError, AttributeError) as exc:  # a row written by hand, or by an older dossier
                if isinstance(exc, DossierError) and not isinstance(exc, ConfigError):
                    raise  # the store's failure, or no org named: not the row's
                raise ConfigError(f"the stored settings of org {org!r} are not valid ({exc}); store valid ones with "
                                  "save_org_settings or dossier calibrate --write") from None  # fmt: skip
            kept = self._stored_settings[org] = (now, stored, merged)
        return kept[2]

    def save_org_settings(self, org: str, settings: dict[str, Any], *, replace: bool = False) -> Settings:
        """Store ``org``'s own settings (merged over the engine's on every later call, unless this engine holds
        an override for the org in ``org_settings``). They are merged into what is stored for the org already:
        a group (``thresholds``, ``shares``, ``service``, and ``rankers`` by ranker) setting by setting, any
        other setting whole, so that storing service limits keeps a calibration and the reverse. ``replace``
        stores ``settings`` alone instead, and so does a stored row that cannot be read or is not valid."""
        checked: list[Settings] = []
        base = self.settings  # read first: the first read of it binds the store's embedder, a write of its own

        def change(row: dict | None) -> dict:
            stored: dict[str, Any] = {}
            if row and not replace:
                try:
                    base.merged(row)  # a row that is not valid is replaced, not merged into
                    stored = dict(row)
                except (ConfigError, ValueError, TypeError, AttributeError):
                    stored = {}
            for name, value in settings.items():
                groups = ("thresholds", "shares", "service", "rankers")
                if name in groups and isinstance(value, Mapping) and isinstance(stored.get(name), Mapping):
                    stored[name] = {**stored[name], **value}
                else:
                    stored[name] = value
            checked.append(base.merged(stored))  # validates (names and types): raising stores nothing
            return stored

        # read, merged and written in one transaction, so that two processes saving at once both count
        stored = self.store.update_settings(change, org=org)
        merged = checked[-1]
        self._stored_settings[org] = (time.monotonic(), stored, merged)
        return merged

    def register_external(self, adapter: ExternalAdapter) -> None:
        """Make an external source available to calls that ask for ``sources.external``."""
        self.external[adapter.name] = adapter

    # -- retrieving --------------------------------------------------------------------------------
    def retrieve(
        self, request: RetrieveRequest | Mapping[str, Any], *, org: str, caller: str, call_id: str | None = None,
        full_trace: bool = False, max_deadline_ms: int | None = None,
    ) -> RetrieveResponse:
        """One call about one record: the layers of DESIGN.md section 2 in order (see dossier.retrieve).
        ``call_id`` names the call in advance (the service charges and audits it under that id).
        ``full_trace`` (in-process only, for evaluation) keeps in the trace what the caller may not see.
        ``max_deadline_ms`` lowers a longer ``deadline_ms`` (the service passes its maximum)."""
        return retrieve(self, request, org=org, caller=caller, call_id=call_id, full_trace=full_trace,
                        max_deadline_ms=max_deadline_ms)  # fmt: skip

    def result(self, call_id: str, *, org: str, caller: str, wait: float = 0.0) -> Synthesis:
        """The synthesis of an earlier ``deferred`` call (``pending`` while it runs; waits up to ``wait``
        seconds for it). Only the org and caller that made the call can fetch it; NotFound otherwise."""
        return self._deferred.get(call_id, org=org, caller=caller, wait=wait)

    def defer(self, call_id: str, work: Any, *, org: str, caller: str, drawn: dict[str, list[str]] | None = None) -> None:
        """Run ``work`` (returning a Synthesis) in the background as the result of ``call_id``; ``drawn``:
        what its answer may repeat, checked again whenever it is served (``pipeline.visibility.drawn_on``)."""
        self._deferred.submit(call_id, work, org=org, caller=caller, drawn=drawn)

    def keep_late(self, call_id: str, pending: Any, *, org: str, caller: str, drawn: dict[str, list[str]] | None = None) -> None:
        """Keep the synthesis still running after its call's deadline (a ``dossier.deadline.Pending``)
        as the result of ``call_id``, fetched with :meth:`result` like a deferred one."""
        self._deferred.adopt(call_id, pending, org=org, caller=caller, drawn=drawn)

    def embed_query(self, text: str, *, scope: tuple[str, str] | None = None) -> np.ndarray:
        """The query vector of ``text``, cached per ``scope`` (a call's org and caller): what one caller's
        calls embedded never answers another's from the cache, so timing reveals nothing across them."""
        self.embedder  # noqa: B018 - binds the store on first use
        assert self._queries is not None
        return self._queries(text, scope)

    def steps(self, *, org: str | None = None, caller: str | None = None) -> Steps:
        """What a call runs with, as this engine stands now: its store, models and pluggable steps (a
        call never sees the engine itself). The embedding model and the service tables still open on
        first use. Query vectors are cached for ``org`` and ``caller`` alone (:meth:`embed_query`)."""
        scope = (org or "", caller or "")
        return Steps(
            store=self.store, embed_query=lambda text: self.embed_query(text, scope=scope),
            embedder=lambda: self.embedder, fuse=self.fuse,
            sources=self.sources, selector=self.selector, filter_inferrer=self.filter_inferrer,
            augmenter=self.augmenter, llm=self.llm, reranker=self.reranker, background=self.background,
            embed_ahead=lambda text: self.embed_ahead(text, scope=scope),
            while_embedding=self.while_embedding,
            service_store=lambda: self.service_store, defer=self.defer, keep_late=self.keep_late,
        )  # fmt: skip

    # -- loading -----------------------------------------------------------------------------------
    def load_bundle(self, source: str | Path | Mapping[str, Any] | Bundle, *, progress: Progress | None = None,
                    before_write: Callable[[], None] | None = None) -> LoadReport:  # fmt: skip
        """Load a bundle (path, parsed dict or :class:`Bundle`). All of it is stored, or nothing.
        ``before_write`` runs once it passed every check, before anything is embedded or written."""
        return load_bundle(self.store, self.embedder, source, progress=progress, before_write=before_write)

    def add_document(self, document: Document, *, progress: Progress | None = None) -> LoadReport:
        """Load one document (its org must exist)."""
        return load_bundle(self.store, self.embedder, Bundle(documents=[document]), progress=progress)

    def add_markdown(
        self,
        path: str | Path,
        *,
        org: str,
        title: str | None = None,
        doc_id: str | None = None,
        doc_type: str = "guideline",
        tags: Iterable[str] = (),
        visible_to_roles: Iterable[str] | None = None,
        progress: Progress | None = None,
    ) -> LoadReport:
        """Load a markdown file as a document, one section per heading."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise UsageError(f"{path} is not UTF-8 text (byte {exc.start})") from exc
        document = document_from_markdown(
            text, org=org, title=title, doc_id=doc_id, doc_type=doc_type, tags=tags, visible_to_roles=visible_to_roles
        )
        return self.add_document(document, progress=progress)

    def background(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future | None:
        """Start a store read on a background thread, or None when the store serves one read at a time.

        A call starts the reads of a later step this way (the section searches, while the record's own
        sources recall), so that a store with concurrent reads (PostgreSQL: a pool of connections, the
        server working on the other core) overlaps them with the engine's own work.
        """
        if not getattr(self.store, "concurrent_reads", False):
            return None
        return self._pool().submit(fn, *args, **kwargs)

    def while_embedding(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """Run a store read that needs no vector now, on the call's thread, its result (or its exception)
        in the returned future: a source runs its full-text search this way on a store that reads on the
        call's thread (SQLite: one connection under a lock), while the question's embedding, started by
        :meth:`embed_ahead`, runs on another thread and core (the model holds neither that lock nor
        Python's)."""
        done: Future = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - the source reads it back and reports it where it takes it
            done.set_exception(exc)
        return done

    def embed_ahead(self, text: str, *, scope: tuple[str, str]) -> None:
        """Start the query embedding of ``text`` (cached per ``scope``, as :meth:`embed_query`) on a
        background thread and one core (:meth:`Embedder.embed_query_beside`), so that the call's long reads
        that need no vector run meanwhile on the other; a later :meth:`embed_query` of the same text in the
        same scope waits for that run instead of making its own (the cache's queue). A failure here is not
        reported: that later call embeds again and reports it."""
        if text:
            self.embedder  # noqa: B018 - binds the store on first use (on this thread: a failure is the call's)
            assert self._queries is not None
            self._pool().submit(self._queries, text, scope, beside=True)

    def _pool(self) -> ThreadPoolExecutor:
        with self._background_lock:
            if self._background is None:
                self._background = ThreadPoolExecutor(3, thread_name_prefix="dossier-prefetch")
            return self._background

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        if self._background is not None:
            self._background.shutdown(wait=True)
        self._deferred.close()  # deferred syntheses still running finish and are stored first
        if self._service_store is not None:
            self._service_store.close()
        self.store.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_engine(
    url: str | None = None,
    *,
    embedder: Embedder | str | None = None,
    settings: Settings | None = None,
    llm: ChatModel | str | None = None,
    reranker: Reranker | str | None = None,
) -> Engine:
    """Open an engine on the store at ``url``. ``llm`` is a chat model or ``openai:<model>``; left out,
    it is read from ``DOSSIER_LLM`` (``"none"`` turns it off); ``reranker`` likewise from ``DOSSIER_RERANK``."""
    hnsw = settings.hnsw_min_rows if settings else Settings().hnsw_min_rows
    chat = llm_from_env() if llm is None else llm
    rerank = reranker_from_env() if reranker is None else reranker
    return Engine(store_from_url(url, hnsw_min_rows=hnsw), embedder=embedder, settings=settings, llm=chat, reranker=rerank)
