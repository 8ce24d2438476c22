"""Small shared steps of the sources."""

from __future__ import annotations

import logging
from typing import Callable, Sequence, TypeVar

from ..pipeline.call import public_error
from ..pipeline.source_io import Found, SourceQuery, SourceTools
from ..schema import SourceName
from ..stores.base import VectorKind

_log = logging.getLogger("dossier")
T = TypeVar("T")


def similarity_by_key(query: SourceQuery, tools: SourceTools, kind: VectorKind, parents: Sequence[str],
                      limit: int) -> dict[str, float]:  # fmt: skip
    """Cosine similarity of the question to each vector of ``kind`` under ``parents`` (top ``limit``)."""
    hits = tools.store.search_vectors(kind, tools.query_vector(), org=query.org, limit=limit, parents=list(parents))
    return {hit.id: hit.score for hit in hits}


def guarded(found: Found, source: SourceName, step: Callable[[], T], *, what: str) -> T | None:
    """Run ``step``; on failure record the error against ``source`` (its items stand) and return None."""
    try:
        return step()
    except Exception as exc:  # noqa: BLE001 - every source failure is reported, never raised
        _log.warning("%s of %s failed", what, source, exc_info=exc)
        found.fail(source, f"{what} failed: {public_error(exc)}")
        return None
