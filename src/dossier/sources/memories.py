"""Memories in two tiers: the most recent of the record (with its merged-away records and aliases),
and, for a question, the semantically closest others. Tier 1 survives any failure of tier 2."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Mapping

import numpy as np

from ..bundle import Memory

from ..pipeline import features
from ..pipeline.features import MEMORY_FEATURES, MemoryEvidence, memory_features
from ..pipeline.source_io import Found, MemoryLead, SourceQuery, SourceTools, recalled
from ..providers import adapter as adapters
from ..providers import ranker as rankers
from ..providers.ranker import RankerUnavailable
from ..schema import MemoryItem, SourceName
from ..providers.embeddings import Embedder
from ..stores.base import Hit, Store
from . import Skipped
from .context_helpers import guarded, long_text_read


class MemoriesSource:
    name: SourceName = "memories"

    def prefetch(self, query: SourceQuery, tools: SourceTools) -> dict[str, Future[Any]]:
        """On a store that reads on the call's thread (SQLite), search the record's memories by words now
        (it needs no vector), with the memory query embedded beside it where that search is long (on a
        record of many memories it is the longest read of the call), and then, while it still embeds, read
        the recent tier and the rows of the search's hits; elsewhere nothing (PostgreSQL searches in recall,
        on the server). The search is asked with the pool the ranker takes; :meth:`_semantic` takes it
        (and the rows) only when it asks the same (the heuristic's pool depends on the recent tier: it then
        searches again)."""
        if tools.store.concurrent_reads or query.tombstone or not query.record_ids or not query.message:
            return {}
        if not self._semantic_enabled(query):
            return {}
        settings, store, org, record_ids = query.settings, tools.store, query.org, list(query.record_ids)
        text = query.memory_query or query.message
        ahead = long_text_read(query, tools, "memory", record_ids)
        if ahead:
            tools.embed_ahead(text)
        pool = max(settings.semantic_memories + settings.recent_memories, settings.memory_candidates)
        hits = tools.while_embedding(store.search_text, "memory", text, org=org, parents=record_ids, limit=pool)
        if hits is None:
            return {}
        out = {_words_key(text, pool): hits}
        if not ahead:
            return out
        # the reads that come next and need no vector, while the question still embeds: the recent tier, and
        # the rows of the search's hits (the ranker reads them), their words worked out for its features
        recent = tools.while_embedding(store.recent_memories, record_ids, org=org, limit=settings.recent_memories)
        if recent is not None:
            out[_RECENT] = recent
        if hits.done() and hits.exception() is None:
            rows = tools.while_embedding(_read_memories, store, [h.id for h in hits.result()], org=org)
            if rows is not None:
                out[_rows_key(text, pool)] = rows
        return out

    def recall(self, query: SourceQuery, tools: SourceTools) -> Found:
        return recalled(lambda found: self._recall(query, tools, found), trace=query.trace)

    def _recall(self, query: SourceQuery, tools: SourceTools, found: Found) -> list[Any]:
        settings = query.settings
        if query.tombstone:
            raise Skipped("record is pending deletion")
        record_ids = list(query.record_ids)
        if not record_ids:
            raise Skipped("record not found" if query.record_named else "no record")
        recent = tools.take(_RECENT, lambda: tools.store.recent_memories(record_ids, org=query.org,
                                                                         limit=settings.recent_memories))  # fmt: skip
        tier1 = [MemoryItem(id=m.id, record_id=m.record, text=m.text, created_at=m.created_at, tier="recent") for m in recent]
        found.decide("memories", detail={"recent": len(tier1)})
        if not query.message:
            return tier1
        if not self._semantic_enabled(query):
            found.decide("memories", detail={"semantic": "off for this org"})
            return tier1
        semantic = guarded(found, "memories", lambda: self._semantic(query, tools, found, record_ids, tier1),
                           what="semantic memory tier")  # fmt: skip
        if semantic is None:
            found.decide("memories", fallback_reason="semantic_error")
            return tier1
        tier2, lead = semantic
        found.decide("memories", detail={"semantic": len(tier2)})
        if not lead:
            return tier2 + tier1
        # the ranker's order over both tiers: tier 2 and the recent memories it ranks among its best, then the
        # rest of tier 1 in recency order (each item keeps its tier)
        newest = {m.id: m for m in tier1}
        found.decide("memories", detail={"recent_ranked": sum(1 for i in lead if i in newest)})
        items = {m.id: m for m in tier2} | newest
        first = [items[i] for i in lead if i in items]
        if first:  # what the documents source may read: the memory the ranker rates best (recall layer)
            found.lead = MemoryLead(id=first[0].id, record_id=first[0].record_id, text=first[0].text)
        placed = {m.id for m in first}
        return first + [m for m in tier1 if m.id not in placed]

    @staticmethod
    def _semantic_enabled(query: SourceQuery) -> bool:
        settings = query.settings
        allow = settings.semantic_memory_orgs
        return settings.semantic_memories_enabled and (allow is None or query.org in allow)

    def _semantic(self, query: SourceQuery, tools: SourceTools, found: Found, record_ids: list[str],
                  tier1: list[MemoryItem]) -> tuple[list[MemoryItem], list[str]]:  # fmt: skip
        """Tier 2: memories close to the question by meaning or by words, the recent tier's own items
        left out, ranked by the learned memory ranker (its probability floor decides what comes back);
        without a usable ranker model, by the heuristic: a cosine floor and reciprocal rank fusion.
        With the ranker, also the order to list them in: the ranker ranks every candidate, recent ones
        included (as it was trained), and a recent memory it ranks among its first ``semantic_memories``
        is listed at that rank instead of at its recency position (empty without the ranker)."""
        settings, store, org = query.settings, tools.store, query.org
        text = query.memory_query or query.message
        vector = tools.query_vector() if text == query.message else tools.embed_query(text)
        try:
            ranker = rankers.for_settings(settings.rankers, "memories", MEMORY_FEATURES)
        except RankerUnavailable as exc:
            ranker = None
            found.decide("memories", detail={"ranker": "heuristic", "ranker_fallback": str(exc)})
        wanted = settings.semantic_memories + len(tier1)
        pool = max(wanted, settings.memory_candidates) if ranker is not None else wanted
        if ranker is None:
            hits, adapted = store.search_vectors("memory", vector, org=org, parents=record_ids, limit=pool), None
        else:
            hits, adapted = memory_searches(store, tools.embedder(), vector, org=org, record_ids=record_ids, pool=pool)
        recent = {m.id: m for m in tier1}
        cosine = {h.id: h.score for h in hits}
        for memory_id, score in cosine.items():
            if memory_id in recent:
                recent[memory_id].score = score
        words = guarded(
            found, "memories",
            lambda: tools.take(_words_key(text, pool),
                               lambda: store.search_text("memory", text, org=org, parents=record_ids, limit=pool)),
            what="full-text memory search",
        )  # fmt: skip
        lead: list[str] = []
        if ranker is None:
            lexical = [h for h in words or [] if h.id not in recent]
            chosen = self._fused(query, tools, found, [h for h in hits if h.id not in recent], lexical)
            kept = {m.id: m for m in store.get_memories(chosen, org=org)}
        else:
            found.decide("memories", detail={"ranker": ranker.name, "adapter": "none" if adapted is None else "memories"})
            read = tools.take(_rows_key(text, pool), list)  # the words' hits, read while the question embedded
            chosen, lead, kept = self._ranked(query, tools, found, ranker, text, hits, list(words or []),
                                              hits if adapted is None else adapted, set(recent), read)  # fmt: skip
        out = []
        for memory_id in chosen:
            m = kept.get(memory_id)
            if m is not None:
                out.append(MemoryItem(id=m.id, record_id=m.record, text=m.text, created_at=m.created_at,
                                      tier="semantic", score=cosine.get(m.id)))  # fmt: skip
        return out, lead

    @staticmethod
    def _fused(query: SourceQuery, tools: SourceTools, found: Found, semantic: list, lexical: list) -> list[str]:
        settings = query.settings
        floor = settings.thresholds.memory_semantic
        above = [h for h in semantic if h.score >= floor]
        fused = (
            tools.fuse([above, lexical], settings.memory_rrf_k, [1.0, settings.memory_text_weight])
            if lexical
            else {h.id: 1.0 / (i + 60) for i, h in enumerate(above)}
        )
        chosen = sorted(fused, key=lambda i: (-fused[i], i))[: settings.semantic_memories]
        for hit in semantic:
            if hit.score < floor and hit.id not in chosen:
                found.note("memories", hit.id, "recall", "dropped", "below_threshold", hit.score)
        return chosen

    @staticmethod
    def _ranked(query: SourceQuery, tools: SourceTools, found: Found, ranker, text: str, semantic: list, lexical: list,
                adapted: list, recent: set[str], read: list[Memory]) -> tuple[list[str], list[str], dict]:  # fmt: skip
        """The memory ranker over every vector, full-text and adapted-vector candidate, recent ones included:
        tier 2 is the best of the others, at most ``semantic_memories``, each at or above the model's
        probability floor; the lead is tier 2 together with the recent memories ranked among the first
        ``semantic_memories`` above the floor, best first. ``read``: candidates already read (the rest are)."""
        settings = query.settings
        ids = list(dict.fromkeys([h.id for h in semantic] + [h.id for h in lexical] + [h.id for h in adapted]))
        memories = {m.id: m for m in read}
        memories.update((m.id, m) for m in tools.store.get_memories([i for i in ids if i not in memories], org=query.org))
        evidence = memory_evidence(text, semantic, lexical, memories, adapted)
        probabilities = ranker.probabilities(memory_features(text, evidence))
        floor = ranker.threshold("floor", 0.05)
        order = sorted(range(len(evidence)), key=lambda i: (-probabilities[i], evidence[i].id))
        above = [evidence[i].id for i in order if probabilities[i] >= floor]
        chosen = [i for i in above if i not in recent][: settings.semantic_memories]
        kept = set(chosen)
        top = set(above[: settings.semantic_memories])
        lead = [i for i in above if i in kept or i in top]
        for i in order:
            if evidence[i].id not in kept and evidence[i].id not in recent:
                found.note("memories", evidence[i].id, "recall", "dropped", "below_threshold", float(probabilities[i]))
        return chosen, lead, memories


_RECENT = "memories.recent"  # the key of the record's recent memories read while the question embeds


def _rows_key(text: str, pool: int) -> str:
    """The key of the rows of a prefetched full-text search's hits (see :func:`_words_key`)."""
    return f"memories.rows:{pool}:{text}"


def _read_memories(store: Store, ids: list[str], *, org: str) -> list[Memory]:
    """The memories ``ids`` of ``org``, with their words worked out for the ranker's features (kept by
    :func:`dossier.pipeline.features.words`)."""
    memories = store.get_memories(ids, org=org)
    for m in memories:
        features.words(m.text)
    return memories


def _words_key(text: str, pool: int) -> str:
    """The key of a prefetched full-text search of the record's memories (its text and pool, so that a
    search asked differently never takes it)."""
    return f"memories.text:{pool}:{text}"


def memory_searches(store: Store, embedder: Embedder, vector: np.ndarray, *, org: str, record_ids: list[str],
                    pool: int) -> tuple[list[Hit], list[Hit] | None]:  # fmt: skip
    """The record's memories closest to the question's vector and, where an adapter fits the embedding
    model (:mod:`dossier.providers.adapter`), to the adapted vector, searched together (None: no adapter;
    the identity adapter would give the plain hits)."""
    try:
        adapter = adapters.load("memories", embedder.model_id, embedder.dimensions)
    except adapters.AdapterUnavailable:
        return store.search_vectors("memory", vector, org=org, parents=record_ids, limit=pool), None
    plain, adapted = store.search_vectors_many("memory", [vector, adapter.apply(vector)], org=org, parents=record_ids,
                                               limit=pool)  # fmt: skip
    return plain, adapted


def memory_evidence(query: str, semantic: list[Hit], lexical: list[Hit], found: Mapping[str, Memory],
                    adapted: list[Hit] | None = None) -> list[MemoryEvidence]:  # fmt: skip
    """What the vector, full-text and adapted-vector searches said about each candidate that still exists
    (``adapted`` None: no adapted search, its evidence is the plain vector search's)."""
    adapted = semantic if adapted is None else adapted
    vector = {h.id: (rank, h.score) for rank, h in enumerate(semantic, start=1)}
    close = {h.id: (rank, h.score) for rank, h in enumerate(adapted, start=1)}
    best_text = max((h.score for h in lexical), default=0.0)
    text = {h.id: (rank, h.score / best_text if best_text > 0 else 0.0) for rank, h in enumerate(lexical, start=1)}
    out = []
    for memory_id in dict.fromkeys([*vector, *text, *close]):
        m = found.get(memory_id)
        if m is None:
            continue
        v, t, a = vector.get(memory_id), text.get(memory_id), close.get(memory_id)
        out.append(MemoryEvidence(id=m.id, text=m.text, created_at=m.created_at, cosine=v[1] if v else None,
                                  vector_rank=v[0] if v else None, text_score=t[1] if t else 0.0,
                                  text_rank=t[0] if t else None, adapted=a[1] if a else None,
                                  adapted_rank=a[0] if a else None))  # fmt: skip
    return out
