"""Memories in two tiers: the most recent of the record (with its merged-away records and aliases),
and, for a question, the semantically closest others. Tier 1 survives any failure of tier 2."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..bundle import Memory

from ..pipeline.call import Call
from ..pipeline.features import MEMORY_FEATURES, MemoryEvidence, memory_features
from ..providers import adapter as adapters
from ..providers import ranker as rankers
from ..providers.ranker import RankerUnavailable
from ..schema import MemoryItem, SourceName
from ..providers.embeddings import Embedder
from ..stores.base import Hit, Store
from . import Skipped


class MemoriesSource:
    name: SourceName = "memories"

    def prefetch(self, call: Call) -> None:
        """Nothing to start ahead: this source's reads are quick, or depend on each other."""

    def recall(self, call: Call) -> list[Any]:
        res, settings = call.resolution, call.settings
        if res.tombstone:
            raise Skipped("record is pending deletion")
        record_ids = res.record_ids
        if not record_ids:
            raise Skipped("no record" if call.request.record is None else "record not found")
        recent = call.store.recent_memories(record_ids, org=call.org, limit=settings.recent_memories)
        tier1 = [MemoryItem(id=m.id, record_id=m.record, text=m.text, created_at=m.created_at, tier="recent") for m in recent]
        call.decide("memories", detail={"recent": len(tier1)})
        if not call.message:
            return tier1
        if not self._semantic_enabled(call):
            call.decide("memories", detail={"semantic": "off for this org"})
            return tier1
        tier2 = call.guarded("memories", lambda: self._semantic(call, record_ids, tier1), what="semantic memory tier")
        if tier2 is None:
            call.decide("memories", fallback_reason="semantic_error")
            return tier1
        call.decide("memories", detail={"semantic": len(tier2)})
        return tier2 + tier1

    @staticmethod
    def _semantic_enabled(call: Call) -> bool:
        settings = call.settings
        allow = settings.semantic_memory_orgs
        return settings.semantic_memories_enabled and (allow is None or call.org in allow)

    def _semantic(self, call: Call, record_ids: list[str], tier1: list[MemoryItem]) -> list[MemoryItem]:
        """Tier 2: memories close to the question by meaning or by words, the recent tier's own items
        left out, ranked by the learned memory ranker (its probability floor decides what comes back);
        without a usable ranker model, by the heuristic: a cosine floor and reciprocal rank fusion."""
        settings = call.settings
        query = call.understanding.memory_query or call.message
        vector = call.query_vector() if query == call.message else call.steps.embed_query(query)
        try:
            ranker = rankers.for_settings(settings.rankers, "memories", MEMORY_FEATURES)
        except RankerUnavailable as exc:
            ranker = None
            call.decide("memories", detail={"ranker": "heuristic", "ranker_fallback": str(exc)})
        wanted = settings.semantic_memories + len(tier1)
        pool = max(wanted, settings.memory_candidates) if ranker is not None else wanted
        hits = call.store.search_vectors("memory", vector, org=call.org, parents=record_ids, limit=pool)
        recent = {m.id: m for m in tier1}
        cosine = {h.id: h.score for h in hits}
        for memory_id, score in cosine.items():
            if memory_id in recent:
                recent[memory_id].score = score
        words = call.guarded(
            "memories",
            lambda: call.store.search_text("memory", query, org=call.org, parents=record_ids, limit=pool),
            what="full-text memory search",
        )
        lexical = [h for h in words or [] if h.id not in recent]
        if ranker is None:
            chosen = self._fused(call, [h for h in hits if h.id not in recent], lexical, cosine)
            found = {m.id: m for m in call.store.get_memories(chosen, org=call.org)}
        else:
            call.decide("memories", detail={"ranker": ranker.name})
            adapted = adapted_search(call.store, call.steps.embedder(), vector, org=call.org, record_ids=record_ids, pool=pool,
                                     semantic=hits)  # fmt: skip
            call.decide("memories", detail={"adapter": "memories" if adapted is not hits else "none"})
            chosen, found = self._ranked(call, ranker, query, [h for h in hits if h.id not in recent], lexical,
                                         [h for h in adapted if h.id not in recent])  # fmt: skip
        out = []
        for memory_id in chosen:
            m = found.get(memory_id)
            if m is not None:
                out.append(MemoryItem(id=m.id, record_id=m.record, text=m.text, created_at=m.created_at,
                                      tier="semantic", score=cosine.get(m.id)))  # fmt: skip
        return out

    @staticmethod
    def _fused(call: Call, semantic: list, lexical: list, cosine: dict[str, float]) -> list[str]:
        settings = call.settings
        floor = settings.thresholds.memory_semantic
        above = [h for h in semantic if h.score >= floor]
        fused = (
            call.steps.fuse([above, lexical], settings.memory_rrf_k, [1.0, settings.memory_text_weight])
            if lexical
            else {h.id: 1.0 / (i + 60) for i, h in enumerate(above)}
        )
        chosen = sorted(fused, key=lambda i: (-fused[i], i))[: settings.semantic_memories]
        for hit in semantic:
            if hit.score < floor and hit.id not in chosen:
                call.note("memories", hit.id, "recall", "dropped", "below_threshold", hit.score)
        return chosen

    @staticmethod
    def _ranked(call: Call, ranker, query: str, semantic: list, lexical: list, adapted: list) -> tuple[list[str], dict]:
        """The memory ranker's choice among the vector, full-text and adapted-vector candidates: best first,
        at most ``semantic_memories``, each at or above the model's probability floor."""
        settings = call.settings
        ids = list(dict.fromkeys([h.id for h in semantic] + [h.id for h in lexical] + [h.id for h in adapted]))
        found = {m.id: m for m in call.store.get_memories(ids, org=call.org)}
        evidence = memory_evidence(query, semantic, lexical, found, adapted)
        probabilities = ranker.probabilities(memory_features(query, evidence))
        floor = ranker.threshold("floor", 0.05)
        order = sorted(range(len(evidence)), key=lambda i: (-probabilities[i], evidence[i].id))
        chosen = [evidence[i].id for i in order if probabilities[i] >= floor][: settings.semantic_memories]
        kept = set(chosen)
        for i in order:
            if evidence[i].id not in kept:
                call.note("memories", evidence[i].id, "recall", "dropped", "below_threshold", float(probabilities[i]))
        return chosen, found


def adapted_search(store: Store, embedder: Embedder, vector: np.ndarray, *, org: str, record_ids: list[str], pool: int,
                   semantic: list[Hit]) -> list[Hit]:  # fmt: skip
    """The record's memories closest to the adapted query (:mod:`dossier.providers.adapter`); where no
    adapter fits the embedding model, the plain vector hits themselves (what the identity adapter gives)."""
    try:
        adapter = adapters.load("memories", embedder.model_id, embedder.dimensions)
    except adapters.AdapterUnavailable:
        return semantic
    return store.search_vectors("memory", adapter.apply(vector), org=org, parents=record_ids, limit=pool)


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
