"""Memories in two tiers: the most recent of the record (with its merged-away records and aliases),
and, for a question, the semantically closest others. Tier 1 survives any failure of tier 2."""

from __future__ import annotations

from typing import Any

from ..schema import MemoryItem
from . import Skipped


class MemoriesSource:
    name = "memories"

    def recall(self, call) -> list[Any]:  # type: ignore[no-untyped-def]
        res, settings = call.resolution, call.settings
        if res.tombstone:
            raise Skipped("record is pending deletion")
        record_ids = res.record_ids
        if not record_ids:
            raise Skipped("no record" if call.request.record is None else "record not found")
        recent = call.store.recent_memories(record_ids, org=call.org, limit=settings.recent_memories)
        tier1 = [MemoryItem(id=m.id, record_id=m.record, text=m.text, created_at=m.created_at, tier="recent") for m in recent]
        route = call.route["memories"]
        route.detail["recent"] = len(tier1)
        if not call.message:
            return tier1
        if not self._semantic_enabled(call):
            route.detail["semantic"] = "off for this org"
            return tier1
        tier2 = call.guarded("memories", lambda: self._semantic(call, record_ids, tier1), what="semantic memory tier")
        if tier2 is None:
            route.fallback_reason = "semantic_error"
            return tier1
        route.detail["semantic"] = len(tier2)
        return tier2 + tier1

    @staticmethod
    def _semantic_enabled(call) -> bool:  # type: ignore[no-untyped-def]
        settings = call.settings
        allow = settings.semantic_memory_orgs
        return settings.semantic_memories_enabled and (allow is None or call.org in allow)

    def _semantic(self, call, record_ids: list[str], tier1: list[MemoryItem]) -> list[MemoryItem]:  # type: ignore[no-untyped-def]
        """Tier 2: memories close to the question by meaning (above the floor) or by words (full
        text), fused by reciprocal rank; the recent tier's own items are left out."""
        settings = call.settings
        floor = settings.thresholds.memory_semantic
        wanted = settings.semantic_memories + len(tier1)
        hits = call.store.search_vectors("memory", call.query_vector(), org=call.org, parents=record_ids, limit=wanted)
        recent = {m.id: m for m in tier1}
        cosine = {h.id: h.score for h in hits}
        for memory_id, score in cosine.items():
            if memory_id in recent:
                recent[memory_id].score = score
        above = [h for h in hits if h.id not in recent and h.score >= floor]
        words = call.guarded(
            "memories",
            lambda: call.store.search_text("memory", call.message, org=call.org, parents=record_ids, limit=wanted),
            what="full-text memory search",
        )
        lexical = [h for h in words or [] if h.id not in recent]
        fused = (
            call.engine.fuse([above, lexical], settings.memory_rrf_k, [1.0, settings.memory_text_weight])
            if lexical
            else {h.id: 1.0 / (i + 60) for i, h in enumerate(above)}
        )
        chosen = sorted(fused, key=lambda i: (-fused[i], i))[: settings.semantic_memories]
        for hit in hits:
            if hit.id not in recent and hit.score < floor and hit.id not in chosen:
                call.note("memories", hit.id, "recall", "dropped", "below_threshold", hit.score)
        found = {m.id: m for m in call.store.get_memories(chosen, org=call.org)}
        out = []
        for memory_id in chosen:
            m = found.get(memory_id)
            if m is not None:
                out.append(MemoryItem(id=m.id, record_id=m.record, text=m.text, created_at=m.created_at,
                                      tier="semantic", score=cosine.get(m.id)))  # fmt: skip
        return out
