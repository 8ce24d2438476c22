"""Small shared steps of the sources."""

from __future__ import annotations

from ..pipeline.call import Call

from typing import Sequence

from ..stores.base import VectorKind


def similarity_by_key(call: Call, kind: VectorKind, parents: Sequence[str], limit: int) -> dict[str, float]:
    """Cosine similarity of the question to each vector of ``kind`` under ``parents`` (top ``limit``)."""
    hits = call.store.search_vectors(kind, call.query_vector(), org=call.org, limit=limit, parents=list(parents))
    return {hit.id: hit.score for hit in hits}
