"""Documents: section candidates by vector and full-text search, fused by reciprocal rank fusion.

Candidates found only by full text (an exact code, say) are kept through fusion and given their
cosine score afterwards, so the section layer can see them. Each retriever can fail on its own; the
route says which backend served (``hybrid | vector | lexical``) and why it fell back.
"""

from __future__ import annotations

from typing import Any

from ..bundle import Document
from ..schema import Filters, SourceName
from ..providers import adapter as adapters
from ..stores.base import Hit
from ..stores.fulltext import codes
from ..pipeline.call import Call, SectionCandidate, public_error
from ..pipeline.visibility import document_verdict
from . import Skipped


def rrf(rankings: list[list[Hit]], k: int, weights: list[float] | None = None) -> dict[str, float]:
    """Reciprocal rank fusion (Cormack, Clarke and Büttcher, 2009): sum of weight / (k + rank)."""
    fused: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings)):
        for rank, hit in enumerate(ranking, start=1):
            fused[hit.id] = fused.get(hit.id, 0.0) + weight / (k + rank)
    return fused


def matches(document: Document, filters: Filters | None) -> bool:
    if filters is None or filters.empty:
        return True
    if filters.doc_types and document.doc_type not in filters.doc_types:
        return False
    return not filters.tags or bool(set(filters.tags) & set(document.tags))


class DocumentsSource:
    name: SourceName = "documents"

    def recall(self, call: Call) -> list[Any]:
        mode = call.planned.mode
        if mode == "fetch":
            return self._fetch(call)
        if mode == "filter" and not call.message:
            return self._filtered(call)
        if not call.message:
            raise Skipped("no question")
        return self._search(call)

    def prefetch(self, call: Call) -> None:
        """Start this call's section searches in the background (when the store reads concurrently), so
        that they run while the record's own sources recall; :meth:`_search` then takes their results."""
        if call.planned.mode == "fetch" or not call.message:
            return
        query, limit = self._query_and_limit(call)
        vector = call.steps.embed_query(query)
        started = call.steps.background(call.store.search_vectors, "section", vector, org=call.org, limit=limit)
        if started is None:
            return
        call.prefetched["documents.vector"] = started
        if call.planned.effective_depth != "fast":
            text = call.steps.background(self._text_search, call, query, limit)
            if text is not None:
                call.prefetched["documents.text"] = text

    @staticmethod
    def _query_and_limit(call: Call) -> tuple[str, int]:
        query = call.understanding.document_query or call.message
        return query, call.settings.document_candidates * (3 if call.understanding.filters else 1)

    # -- search ------------------------------------------------------------------------------------
    def _search(self, call: Call) -> list[SectionCandidate]:
        query, limit = self._query_and_limit(call)
        filters = call.understanding.filters
        vector = call.steps.embed_query(query)
        vector_hits = call.guarded(
            "documents",
            lambda: call.take("documents.vector", lambda: call.store.search_vectors("section", vector, org=call.org, limit=limit)),
            what="vector search",
        )
        text_hits: list[Hit] | None = []
        if call.planned.effective_depth != "fast":
            text_hits = call.guarded(
                "documents", lambda: call.take("documents.text", lambda: self._text_search(call, query, limit)),
                what="full-text search",
            )  # fmt: skip
        if vector_hits is None and text_hits is None:
            raise RuntimeError("vector and full-text search both failed")
        if vector_hits is None:
            call.decide("documents", backend="lexical", fallback_reason="vector_error")
        elif text_hits is None:
            call.decide("documents", backend="vector", fallback_reason="lexical_error")
        elif call.planned.effective_depth == "fast":
            call.decide("documents", backend="vector")
        else:
            call.decide("documents", backend="hybrid")
        vector_hits, text_hits = vector_hits or [], text_hits or []
        call.decide("documents", detail={"vector_candidates": len(vector_hits), "text_candidates": len(text_hits)})
        candidates = self._fuse(call, vector_hits, text_hits)
        self._score_lexical_only(call, candidates, vector)
        kept = self._apply_filters(call, candidates, filters)
        self._adapt(call, kept, vector, limit=500)
        return kept

    @staticmethod
    def _text_search(call: Call, query: str, limit: int) -> list[Hit]:
        """Full-text hits; sections holding an exact code from the question rank first."""
        hits = call.store.search_text("section", query, org=call.org, limit=limit)
        exact = codes(query)
        if not exact:
            return hits
        first = call.store.search_text("section", " ".join(exact), org=call.org, limit=limit)
        seen = {h.id for h in first}
        return first + [h for h in hits if h.id not in seen]

    def _fuse(self, call: Call, vector_hits: list[Hit], text_hits: list[Hit]) -> list[SectionCandidate]:
        parents = {h.id: h.parent for h in (*vector_hits, *text_hits)}
        cosine = {h.id: h.score for h in vector_hits}
        vector_rank = {h.id: r for r, h in enumerate(vector_hits, start=1)}
        text_rank = {h.id: r for r, h in enumerate(text_hits, start=1)}
        best_text = max((h.score for h in text_hits), default=0.0)
        text_score = {h.id: (h.score / best_text if best_text > 0 else 0.0) for h in text_hits}
        try:
            fused = call.steps.fuse([vector_hits, text_hits], call.settings.rrf_k)
        except Exception as exc:  # noqa: BLE001 - fusion failure falls back to vector ranking
            call.fail("documents", f"fusion failed: {public_error(exc)}", keep_items=True)
            call.decide("documents", backend="vector", fallback_reason="fusion_error")
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
            call.note("documents", c.section_id, "recall", "kept", "lexical_only" if c.lexical_only else None, c.score)
        return out

    def _score_lexical_only(self, call: Call, candidates: list[SectionCandidate], vector) -> None:
        """Give lexical-only candidates their cosine score, so thresholds can judge them too."""
        lexical = [c for c in candidates if c.lexical_only]
        if not lexical:
            return
        documents = sorted({c.document_id for c in lexical})
        hits = call.guarded(
            "documents",
            lambda: call.store.search_vectors("section", vector, org=call.org, limit=500, parents=documents),
            what="scoring lexical-only candidates",
        )
        scores = {h.id: h.score for h in hits or []}
        for c in lexical:
            c.score = scores.get(c.section_id, 0.0)

    def _apply_filters(self, call: Call, candidates: list[SectionCandidate], filters: Filters | None) -> list[SectionCandidate]:
        if filters is None or filters.empty:
            return candidates
        documents = {d.id: d for d in call.store.get_documents(sorted({c.document_id for c in candidates}), org=call.org)}
        kept = []
        for c in candidates:
            document = documents.get(c.document_id)
            if document is not None and matches(document, filters):
                kept.append(c)
            else:
                call.note("documents", c.section_id, "filter", "dropped", "filtered_out", c.score)
        return kept

    # -- fetch and filter modes ----------------------------------------------------------------------
    def _fetch(self, call: Call) -> list[SectionCandidate]:
        ids = list(dict.fromkeys(call.request.fetch or []))
        # one this caller may not see reads exactly like one that does not exist: not found, nothing ranked
        documents = [d for d in call.store.get_documents(ids, org=call.org) if document_verdict(call, d) is None]
        found = {d.id for d in documents}
        missing = [i for i in ids if i not in found]
        if missing:
            call.decide("documents", detail={"not_found": missing})
            for doc_id in missing:
                call.note("documents", doc_id, "recall", "dropped", "not_found")
        return self._whole(call, documents)

    def _filtered(self, call: Call) -> list[SectionCandidate]:
        filters = call.understanding.filters
        assert filters is not None  # filter mode without a question has the caller's filters (plan checks)
        documents = call.store.find_documents(
            org=call.org, doc_types=filters.doc_types, tags=filters.tags, limit=call.settings.max_fetch_ids
        )
        return self._whole(call, documents)

    def _whole(self, call: Call, documents: list[Document]) -> list[SectionCandidate]:
        """Every section of ``documents``: ranked by the question when there is one, else in order."""
        candidates = [
            SectionCandidate(section_id=s.id, document_id=d.id, score=0.0, vector_rank=position)
            for d in documents
            for position, s in enumerate(d.sections, start=1)
        ]
        call.decide("documents", backend="direct", detail={"ranked": False})
        if call.message and candidates:
            query = call.understanding.document_query or call.message
            parents = [d.id for d in documents]
            vector = call.steps.embed_query(query)
            hits = call.store.search_vectors("section", vector, org=call.org, limit=len(candidates), parents=parents)
            words = call.guarded(
                "documents",
                lambda: call.store.search_text("section", query, org=call.org, limit=len(candidates), parents=parents),
                what="full-text ranking",
            )
            fused = call.steps.fuse([hits, words or []], call.settings.rrf_k)
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
            call.decide("documents", backend="hybrid" if words else "vector", detail={"ranked": True})
            self._adapt(call, candidates, vector, limit=len(candidates))
        return candidates

    @staticmethod
    def _adapt(call: Call, candidates: list[SectionCandidate], vector, *, limit: int) -> None:
        """Each candidate's cosine to the adapted query (a ranker feature), searched within the candidates'
        documents; where no adapter fits the store's model the route says why and the feature is the plain cosine."""
        if not candidates:
            return
        embedder = call.steps.embedder()
        try:
            adapter = adapters.load("sections", embedder.model_id, embedder.dimensions)
        except adapters.AdapterUnavailable as exc:
            call.decide("documents", detail={"adapter": f"none: {exc}"})
            return
        documents = sorted({c.document_id for c in candidates})
        hits = call.guarded(
            "documents",
            lambda: call.store.search_vectors("section", adapter.apply(vector), org=call.org, limit=max(limit, len(candidates)),
                                              parents=documents),
            what="adapted vector scoring",
        )  # fmt: skip
        if hits is None:
            return
        scores = {h.id: h.score for h in hits}
        for c in candidates:
            c.adapted = scores.get(c.section_id)
        call.decide("documents", detail={"adapter": "sections"})

