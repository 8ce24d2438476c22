"""Graph: active edges around the record (and its merged-away records), 1-3 hops, stubs excluded."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from ..pipeline.source_io import Found, SourceQuery, SourceTools, recalled
from ..schema import EdgeItem, SourceName
from ..stores.base import EdgeHop, Store
from . import Skipped


class GraphSource:
    name: SourceName = "graph"

    def prefetch(self, query: SourceQuery, tools: SourceTools) -> dict[str, Future[Any]]:
        """Start the walk in the background where the store reads concurrently; elsewhere (SQLite) walk now,
        on the call's thread, while the question may still be embedding (the walk needs no vector).
        :meth:`recall` takes it."""
        if query.tombstone or query.record is None:
            return {}
        started = tools.ahead(self._walk, query, tools.store)
        return {} if started is None else {"graph.walk": started}

    def recall(self, query: SourceQuery, tools: SourceTools) -> Found:
        return recalled(lambda found: self._recall(query, tools), trace=query.trace)

    def _recall(self, query: SourceQuery, tools: SourceTools) -> list[Any]:
        if query.tombstone:
            raise Skipped("record is pending deletion")
        if query.record is None:
            raise Skipped("record not found" if query.record_named else "no record")
        hops = tools.take("graph.walk", lambda: self._walk(query, tools.store))
        return [
            EdgeItem(id=h.edge.id, src=h.edge.src, dst=h.edge.dst, type=h.edge.type, confidence=h.edge.confidence,
                     weight=h.edge.weight, hops=h.hops)  # fmt: skip
            for h in hops
        ]

    @staticmethod
    def _walk(query: SourceQuery, store: Store) -> list[EdgeHop]:
        settings = query.settings
        assert query.record is not None  # recall and prefetch walk only around a resolved record
        return store.edges_around(
            [query.record.id, *query.merged_from], org=query.org, max_hops=settings.graph_max_hops,
            limit=settings.graph_max_edges, include_stubs=settings.include_stub_edges,
        )  # fmt: skip
