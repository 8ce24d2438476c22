"""Documents: section candidates by vector and full-text search, fused by reciprocal rank fusion.

Candidates found only by full text (an exact code, say) are kept through fusion and given their
cosine score afterwards, so the section layer can see them. Each retriever can fail on its own; the
route says which backend served (``hybrid | vector | lexical``) and why it fell back.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..bundle import Document
from ..schema import Filters, SourceName
from ..providers import adapter as adapters
from ..stores.base import Hit, Store, Viewer
from ..stores.fulltext import codes
from ..pipeline.call import SectionCandidate, public_error
from ..pipeline.source_io import Found, SourceQuery, SourceTools, recalled
from . import Skipped
from .context_helpers import guarded, long_text_read


def rrf(rankings: list[list[Hit]], k: int, weights: list[float] | None = None) -> dict[str, float]:
    """Reciprocal rank fusion (Cormack, Clarke and Büttcher, 2009): sum of weight / (k + rank)."""
    fused: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings)):
        for rank, hit in enumerate(ranking, start=1):
            fused[hit.id] = fused.get(hit.id, 0.0) + weight / (k + rank)
    return fused


class Hidden:
    """What of the org this call's caller may not see, judged document by document as the searches meet
    them (each verdict read once per call, whatever the org hides), and a filtered question's scope.

    Every search of this source takes its best hits among the sections the caller may see: governance
    would drop the others later, but by then they would have taken places visible sections should have
    had and shifted the ranks the ranker reads, so that what the caller is given would depend on what it
    may not see."""

    def __init__(self, query: SourceQuery, store: Store) -> None:
        self._query, self._store = query, store
        self._verdicts: dict[str, str | None] = {}  # document id -> why the caller may not see it (None: it may)
        self._lock = threading.Lock()  # the vector and full-text searches may run on two threads
        #: a filtered question's scope: the documents its filters match that the caller may see, where they
        #: are few enough to search among (None: the org's, the filters applied to the hits)
        self.within: tuple[str, ...] | None = None
        self._visible: list[str] | None = None  # every visible document, once a crowded search needed them
        self.viewer = query.viewer  # whose view the searches take their places in (and the full-text statistics count)

    def why(self, document_id: str) -> str | None:
        """The verdict on a document this scope has judged."""
        return self._verdicts.get(document_id)

    def hidden(self, documents: Iterable[str]) -> set[str]:
        """Which of ``documents`` the caller may not see (their access rows read once per call)."""
        wanted = set(documents)
        with self._lock:
            unknown = sorted(wanted - self._verdicts.keys())
            if unknown:
                rows = {d.id: d for d in self._store.restricted_documents(org=self._query.org, ids=unknown)}
                for i in unknown:
                    self._verdicts[i] = self._query.document_verdict(rows[i]) if i in rows else None
            return {i for i in wanted if self._verdicts[i] is not None}

    def top(self, search: Callable[[int, list[str] | None, Viewer | None], list[Hit]], limit: int,
            withheld: list[Hit] | None = None) -> list[Hit]:  # fmt: skip
        """The best ``limit`` hits of ``search(n, parents, viewer)`` (its best ``n``, best first, among the
        sections of ``parents``, None: of every document; the store's search for ``viewer``, which passes over
        what it may not see where it can) in documents this caller may see: twice the places read and the
        hidden hits removed; where they push visible ones out (a store's approximate index), eight times the
        places read, and past that a search among the visible documents alone, at what they hold.
        ``withheld`` (the operator's full evidence only) gets the hidden sections among the first ``limit`` of
        the same search over everything, one more search made for it alone. A filtered question's search is
        held to its scope (``within``)."""
        viewer = self.viewer
        if self.within is not None:
            return search(limit, list(self.within), viewer) if self.within and limit > 0 else []
        if limit <= 0:
            return search(limit, None, viewer)
        if withheld is not None:
            everything = search(limit, None, None)
            unseen = self.hidden(h.parent for h in everything)
            withheld.extend(h for h in everything if h.parent in unseen)
        asked = 2 * limit
        while True:
            hits = search(asked, None, viewer)
            hidden = self.hidden(h.parent for h in hits)
            visible = [h for h in hits if h.parent not in hidden]
            if len(visible) >= limit or len(hits) < asked:
                return visible[:limit]
            if asked >= _MOST_READ * limit:
                break
            asked = _MOST_READ * limit  # one read further (a search's cost grows little with its length)
        shown = self._visible
        if shown is None:  # read once per call (two searches racing here both read it: the same list)
            shown = self._visible = self.visible_documents()
        return search(limit, shown, viewer)[:limit] if shown else []

    def visible_documents(self, doc_types: Sequence[str] = (), tags: Sequence[str] = (),
                          limit: int | None = None) -> list[str]:  # fmt: skip
        """The ids (sorted) of the documents matching ``doc_types`` and ``tags`` that the caller may see,
        the first ``limit`` of them (None: all): listed by the store with the rule as a query (what the org
        hides is not read), each then judged by the rule itself."""
        q = self._query
        ids = self._store.document_ids(org=q.org, doc_types=doc_types, tags=tags, limit=limit, roles=q.roles,
                                       record_ids=q.record_ids)  # fmt: skip
        hidden = self.hidden(ids)
        return [i for i in ids if i not in hidden]


#: how far a search crowded by hidden sections reads past them, as a multiple of its places, before it
#: searches among the visible documents instead
_MOST_READ = 8
#: documents a filtered question's searches are held to at most (more: the org's searched, the filters applied
#: to three times the hits)
FILTERED_DOCUMENTS = 500


def hidden_documents(query: SourceQuery, store: Store) -> Hidden:
    """What of ``query.org`` its caller may not see (the one rule, on the store's access rows, read as the
    searches meet the documents), and a filtered question's scope: the visible documents its filters match,
    where they are few enough."""
    scope = Hidden(query, store)
    filters = query.filters
    if filters is not None and not filters.empty:
        visible = scope.visible_documents(filters.doc_types, filters.tags, limit=FILTERED_DOCUMENTS + 1)
        if len(visible) <= FILTERED_DOCUMENTS:
            scope.within = tuple(visible)
    return scope


def matches(document: Document, filters: Filters | None) -> bool:
    if filters is None or filters.empty:
        return True
    if filters.doc_types and document.doc_type not in filters.doc_types:
        return False
    return not filters.tags or bool(set(filters.tags) & set(document.tags))


class DocumentsSource:
    name: SourceName = "documents"

    def recall(self, query: SourceQuery, tools: SourceTools) -> Found:
        return recalled(lambda found: self._recall(query, tools, found), trace=query.trace)

    def _recall(self, query: SourceQuery, tools: SourceTools, found: Found) -> list[Any]:
        if query.mode == "fetch":
            return self._fetch(query, tools, found)
        if query.mode == "filter" and not query.message:
            return self._filtered(query, tools, found)
        if not query.message:
            raise Skipped("no question")
        return self._search(query, tools, found)

    def prefetch(self, query: SourceQuery, tools: SourceTools) -> dict[str, Future[Any]]:
        """Start this call's section searches ahead of recall. Where the store reads concurrently
        (PostgreSQL), the vector and full-text searches start in the background, so that they run on the
        server while the record's own sources recall. Where it reads on the call's thread (SQLite), the
        full-text search runs now, with the document query embedded beside it where that search is long
        (``long_text_read``), and the vector search waits for recall. :meth:`_search` takes them."""
        if query.mode == "fetch" or not query.message:
            return {}
        hidden, withheld = self._hidden(query, tools.store)
        text, limit = self._query_and_limit(query, hidden)
        out: dict[str, Future[Any]] = {"documents.hidden": _done((hidden, withheld))}
        concurrent = tools.store.concurrent_reads
        # the vector search in the background where the store reads concurrently (on SQLite it would wait
        # for the question's vector here, before the reads of later sources that need none), unless it
        # waits for the memories source's lead
        if concurrent and not self._may_inform(query):
            vector = tools.embed_query(text)
            started = tools.background(self._vector_search, tools.store, query.org, vector, limit, hidden, withheld)
            if started is not None:
                out["documents.vector"] = started
        if query.depth != "fast":
            if not concurrent and long_text_read(query, tools, "section", None):
                tools.embed_ahead(text)
            words = tools.ahead(self._text_search, tools.store, query.org, text, limit, hidden, withheld)
            if words is not None:
                out["documents.text"] = words
        return out

    @staticmethod
    def _hidden(query: SourceQuery, store: Store) -> tuple[Hidden, list[Hit] | None]:
        """What this caller may not see, and where the searches put the hidden hits they remove (the
        operator's full evidence only: None otherwise)."""
        return hidden_documents(query, store), [] if query.full_trace else None

    @staticmethod
    def _query_and_limit(query: SourceQuery, hidden: Hidden) -> tuple[str, int]:
        """The text searched, and how many hits each search takes: three times the places where filters
        apply to the org's hits, the places themselves where the search is held to what they match."""
        text = query.document_query or query.message
        applied = query.filters is not None and not query.filters.empty and hidden.within is None
        return text, query.settings.document_candidates * (3 if applied else 1)

    # -- search ------------------------------------------------------------------------------------
    def _search(self, query: SourceQuery, tools: SourceTools, found: Found) -> list[SectionCandidate]:
        filters, store, org = query.filters, tools.store, query.org
        hidden, withheld = tools.take("documents.hidden", lambda: self._hidden(query, store))
        text, limit = self._query_and_limit(query, hidden)
        vector = tools.embed_query(text)
        informed = self._informed(query, tools, vector)
        if informed is not None:
            vector = informed
            assert query.memory_lead is not None
            found.decide("documents", detail={"memory_informed": query.memory_lead.id})
        vector_hits = guarded(
            found, "documents",
            lambda: (self._vector_search(store, org, vector, limit, hidden, withheld) if informed is not None else
                     tools.take("documents.vector", lambda: self._vector_search(store, org, vector, limit, hidden, withheld))),
            what="vector search",
        )  # fmt: skip
        text_hits: list[Hit] | None = []
        if query.depth != "fast":
            text_hits = guarded(
                found, "documents", lambda: tools.take("documents.text", lambda: self._text_search(store, org, text, limit, hidden, withheld)),
                what="full-text search",
            )  # fmt: skip
        if vector_hits is None and text_hits is None:
            raise RuntimeError("vector and full-text search both failed")
        if vector_hits is None:
            found.decide("documents", backend="lexical", fallback_reason="vector_error")
        elif text_hits is None:
            found.decide("documents", backend="vector", fallback_reason="lexical_error")
        elif query.depth == "fast":
            found.decide("documents", backend="vector")
        else:
            found.decide("documents", backend="hybrid")
        failed_vectors = vector_hits is None
        vector_hits, text_hits = vector_hits or [], text_hits or []
        # the operator's full evidence: what the searches found that the caller may not see, noted where
        # governance would have dropped it (a caller's own trace never notes it, not even as a count)
        for hit in {h.id: h for h in withheld or []}.values():
            found.note("documents", hit.id, "govern", "dropped", hidden.why(hit.parent))
        # no count of the hits in the route: they are counted before governance, so a count would tell a caller
        # how many sections it may not see hold the question's words (a count needs no id to answer that)
        candidates = self._fuse(query, tools, found, vector_hits, text_hits)
        self._score_lexical_only(query, tools, found, candidates, vector)
        if failed_vectors:
            self._rank_by_meaning(candidates)
        kept = candidates if hidden.within is not None else self._apply_filters(query, tools, found, candidates, filters)
        self._adapt(query, tools, found, kept, vector, limit=500)
        return kept

    @staticmethod
    def _informed(query: SourceQuery, tools: SourceTools, vector: np.ndarray) -> np.ndarray | None:
        """The document query for a multi-part question about a record: the question's vector plus
        ``memory_informed_weight`` times that of the memory the memories source rated best, so that "what
        was the fine for, and who pays it?" searches for the rule on what the memory says the fine was
        for. None (search with the question alone) for a one-part question, without such a memory, at
        ``fast`` depth, or with the weight 0. With a model that embeds queries and documents alike
        (``Embedder.symmetric``: the default one) the memory's vector is the one the store holds for it,
        read rather than made again; otherwise, or where the store holds none, its text is embedded."""
        lead = query.memory_lead
        if lead is None or not DocumentsSource._may_inform(query):
            return None
        stored = None
        if tools.embedder().symmetric:  # else the memory's query vector differs from its stored one
            stored = tools.store.stored_vectors("memory", [lead.id], org=query.org).get(lead.id)
        memory = stored if stored is not None else tools.embed_query(lead.text)
        mixed = vector + query.settings.memory_informed_weight * memory
        norm = float(np.linalg.norm(mixed))
        return mixed / norm if norm > 0 else None

    @staticmethod
    def _may_inform(query: SourceQuery) -> bool:
        """Whether a memory may inform this call's document search (when the memories source finds one)."""
        return (query.settings.memory_informed_weight > 0 and query.parts >= 2 and bool(query.record_ids)
                and query.depth != "fast")  # fmt: skip

    @staticmethod
    def _vector_search(store: Store, org: str, vector: np.ndarray, limit: int, hidden: Hidden,
                       withheld: list[Hit] | None = None) -> list[Hit]:  # fmt: skip
        """The nearest sections the caller may see (the store passes over the others where it can)."""
        return hidden.top(lambda n, among, who: store.search_vectors("section", vector, org=org, limit=n, parents=among,
                                                                     viewer=who),
                          limit, withheld)  # fmt: skip

    @staticmethod
    def _text_search(store: Store, org: str, text: str, limit: int, hidden: Hidden,
                     withheld: list[Hit] | None = None) -> list[Hit]:  # fmt: skip
        """Full-text hits among the sections the caller may see; those holding an exact code from the
        question rank first."""
        hits = hidden.top(lambda n, among, who: store.search_text("section", text, org=org, limit=n, parents=among,
                                                                  viewer=who),
                          limit, withheld)  # fmt: skip
        exact = codes(text)
        if not exact:
            return hits
        first = hidden.top(lambda n, among, who: store.search_text("section", " ".join(exact), org=org, limit=n,
                                                                     parents=among, viewer=who),
                           limit, withheld)  # fmt: skip
        seen = {h.id for h in first}
        return first + [h for h in hits if h.id not in seen]

    def _fuse(self, query: SourceQuery, tools: SourceTools, found: Found, vector_hits: list[Hit],
              text_hits: list[Hit]) -> list[SectionCandidate]:  # fmt: skip
        parents = {h.id: h.parent for h in (*vector_hits, *text_hits)}
        cosine = {h.id: h.score for h in vector_hits}
        vector_rank = {h.id: r for r, h in enumerate(vector_hits, start=1)}
        text_rank = {h.id: r for r, h in enumerate(text_hits, start=1)}
        best_text = max((h.score for h in text_hits), default=0.0)
        text_score = {h.id: (h.score / best_text if best_text > 0 else 0.0) for h in text_hits}
        try:
            fused = tools.fuse([vector_hits, text_hits], query.settings.rrf_k)
        except Exception as exc:  # noqa: BLE001 - fusion failure falls back to vector ranking
            found.fail("documents", f"fusion failed: {public_error(exc)}")
            found.decide("documents", backend="vector", fallback_reason="fusion_error")
            fused = {h.id: 1.0 / r for h, r in zip(vector_hits, range(1, len(vector_hits) + 1))}
            fused.update({h.id: 0.0 for h in text_hits if h.id not in fused})  # lexical-only hits stay
        out = [
            SectionCandidate(section_id=sid, document_id=parents[sid], score=cosine.get(sid, 0.0), fused=score,
                             vector_rank=vector_rank.get(sid), text_rank=text_rank.get(sid),
                             text_score=text_score.get(sid, 0.0))  # fmt: skip
            for sid, score in fused.items()
        ]
        out.sort(key=lambda c: (-c.fused, -c.score, c.section_id))
        for c in out:
            found.note("documents", c.section_id, "recall", "kept", "lexical_only" if c.lexical_only else None, c.score)
        return out

    def _score_lexical_only(self, query: SourceQuery, tools: SourceTools, found: Found,
                            candidates: list[SectionCandidate], vector) -> None:  # fmt: skip
        """Give lexical-only candidates their cosine score, so thresholds can judge them too."""
        lexical = [c for c in candidates if c.lexical_only]
        if not lexical:
            return
        documents = sorted({c.document_id for c in lexical})
        hits = guarded(
            found, "documents",
            lambda: tools.store.search_vectors("section", vector, org=query.org, limit=500, parents=documents),
            what="scoring lexical-only candidates",
        )  # fmt: skip
        scores = {h.id: h.score for h in hits or []}
        for c in lexical:
            c.score = scores.get(c.section_id, 0.0)

    @staticmethod
    def _rank_by_meaning(candidates: list[SectionCandidate]) -> None:
        """The org-wide vector search failed: the full-text candidates, scored by meaning within their
        documents, get the vector ranks that search would have given them among themselves, so that the
        ranker reads them as it was trained to (found by both searches), not as found by words alone."""
        scored = sorted((c for c in candidates if c.score > 0), key=lambda c: (-c.score, c.section_id))
        for rank, c in enumerate(scored, start=1):
            c.vector_rank = rank

    def _apply_filters(self, query: SourceQuery, tools: SourceTools, found: Found, candidates: list[SectionCandidate],
                       filters: Filters | None) -> list[SectionCandidate]:  # fmt: skip
        if filters is None or filters.empty:
            return candidates
        documents = {d.id: d for d in tools.store.get_documents(sorted({c.document_id for c in candidates}), org=query.org)}
        kept = []
        for c in candidates:
            document = documents.get(c.document_id)
            if document is not None and matches(document, filters):
                kept.append(c)
            else:
                found.note("documents", c.section_id, "filter", "dropped", "filtered_out", c.score)
        return kept

    # -- fetch and filter modes ----------------------------------------------------------------------
    def _fetch(self, query: SourceQuery, tools: SourceTools, found: Found) -> list[SectionCandidate]:
        ids = list(dict.fromkeys(query.fetch))
        # one this caller may not see reads exactly like one that does not exist: not found, nothing ranked
        documents = [d for d in tools.store.get_documents(ids, org=query.org) if query.document_verdict(d) is None]
        present = {d.id for d in documents}
        missing = [i for i in ids if i not in present]
        if missing:
            found.decide("documents", detail={"not_found": missing})
            for doc_id in missing:
                found.note("documents", doc_id, "recall", "dropped", "not_found")
        return self._whole(query, tools, found, documents)

    def _filtered(self, query: SourceQuery, tools: SourceTools, found: Found) -> list[SectionCandidate]:
        filters = query.filters
        assert filters is not None  # filter mode without a question has the caller's filters (plan checks)
        # the first documents that match among those the caller may see: hidden ones take no places (and are
        # not read)
        limit = query.settings.max_fetch_ids
        hidden = hidden_documents(query, tools.store)
        if hidden.within is not None:  # all the visible documents the filters match (read for the scope)
            shown = list(hidden.within[:limit])
        else:
            shown = hidden.visible_documents(filters.doc_types, filters.tags, limit=limit)
        documents = [d for d in tools.store.get_documents(shown, org=query.org) if query.document_verdict(d) is None]
        return self._whole(query, tools, found, documents)

    def _whole(self, query: SourceQuery, tools: SourceTools, found: Found, documents: list[Document]) -> list[SectionCandidate]:
        """Every section of ``documents``: ranked by the question when there is one, else in order."""
        candidates = [
            SectionCandidate(section_id=s.id, document_id=d.id, score=0.0, vector_rank=position)
            for d in documents
            for position, s in enumerate(d.sections, start=1)
        ]
        found.decide("documents", backend="direct", detail={"ranked": False})
        if query.message and not candidates:
            # ranked as if something had matched: the route (and the query's embedding) must not tell that
            # nothing did, where what matched may be sections this caller may not see (governance is later)
            tools.embed_query(query.document_query or query.message)
            found.decide("documents", backend="hybrid", detail={"ranked": True})
            self._adapt(query, tools, found, candidates, None, limit=0)
        elif query.message:
            text = query.document_query or query.message
            parents = [d.id for d in documents]
            vector = tools.embed_query(text)
            hits = tools.store.search_vectors("section", vector, org=query.org, limit=len(candidates), parents=parents)
            words = guarded(
                found, "documents",
                lambda: tools.store.search_text("section", text, org=query.org, limit=len(candidates), parents=parents,
                                                viewer=query.viewer),
                what="full-text ranking",
            )  # fmt: skip
            fused = tools.fuse([hits, words or []], query.settings.rrf_k)
            scores = {h.id: h.score for h in hits}
            vector_rank = {h.id: r for r, h in enumerate(hits, start=1)}
            text_rank = {h.id: r for r, h in enumerate(words or [], start=1)}
            best_text = max((h.score for h in words or []), default=0.0)
            text_score = {h.id: (h.score / best_text if best_text > 0 else 0.0) for h in words or []}
            for c in candidates:
                c.score, c.fused = scores.get(c.section_id, 0.0), fused.get(c.section_id, 0.0)
                c.vector_rank, c.text_rank = vector_rank.get(c.section_id), text_rank.get(c.section_id)
                c.text_score = text_score.get(c.section_id, 0.0)
            candidates.sort(key=lambda c: (-c.fused, -c.score, c.section_id))
            found.decide("documents", backend="hybrid" if words else "vector", detail={"ranked": True})
            self._adapt(query, tools, found, candidates, vector, limit=len(candidates))
        return candidates

    @staticmethod
    def _adapt(query: SourceQuery, tools: SourceTools, found: Found, candidates: list[SectionCandidate], vector, *,
               limit: int) -> None:  # fmt: skip
        """Each candidate's cosine to the adapted query (a ranker feature), searched within the candidates'
        documents; where no adapter fits the store's model the route says why and the feature is the plain cosine."""
        embedder = tools.embedder()
        try:
            adapter = adapters.load("sections", embedder.model_id, embedder.dimensions)
        except adapters.AdapterUnavailable as exc:
            found.decide("documents", detail={"adapter": f"none: {exc}"})
            return
        # which adapter applies is said whether or not anything matched: its presence must not tell that a
        # section the caller may not see matched (governance, later, removes what it may not see)
        found.decide("documents", detail={"adapter": "sections"})
        if not candidates:
            return
        documents = sorted({c.document_id for c in candidates})
        hits = guarded(
            found, "documents",
            lambda: tools.store.search_vectors("section", adapter.apply(vector), org=query.org,
                                               limit=max(limit, len(candidates)), parents=documents),
            what="adapted vector scoring",
        )  # fmt: skip
        if hits is None:
            return
        scores = {h.id: h.score for h in hits}
        for c in candidates:
            c.adapted = scores.get(c.section_id)


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future
