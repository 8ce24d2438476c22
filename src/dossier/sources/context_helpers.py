"""Small shared steps of the sources."""

from __future__ import annotations

import logging
from typing import Callable, Sequence, TypeVar

from ..pipeline.call import public_error
from ..pipeline.source_io import Found, SourceQuery, SourceTools
from ..schema import SourceName
from ..stores.base import TextKind, VectorKind

_log = logging.getLogger("dossier")
T = TypeVar("T")

#: A full-text search of this many rows or more takes longer than what embedding the question on one core
#: instead of every core costs (a record of 20,000 or 100,000 memories: 7-9 ms; the sample org's: under
#: 1 ms, against 3.5-4 ms for the embedding on two cores and 6-7 ms on one)
LONG_TEXT_SCOPE = 5_000


def long_text_read(query: SourceQuery, tools: SourceTools, kind: TextKind, parents: Sequence[str] | None) -> bool:
    """Whether to embed the question ahead, on one core, while this source's full-text search runs on the
    call's thread (``tools.embed_ahead``; the sources ask only on a store that reads there, SQLite): when
    the search covers at least :data:`LONG_TEXT_SCOPE` rows (counted once per index state). A shorter one
    ends long before the model, which is then faster on every core after it. A failed count counts as
    short: the search reports its own failure."""
    store = tools.store
    try:
        return store.text_scope_rows(kind, org=query.org, most=LONG_TEXT_SCOPE, parents=parents) >= LONG_TEXT_SCOPE
    except Exception:  # noqa: BLE001
        return False


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
