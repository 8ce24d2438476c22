"""Graph: active edges around the record (and its merged-away records), 1-3 hops, stubs excluded."""

from __future__ import annotations

from typing import Any

from ..pipeline.call import Call
from ..schema import EdgeItem, SourceName
from ..stores.base import EdgeHop
from . import Skipped


class GraphSource:
    name: SourceName = "graph"

    def prefetch(self, call: Call) -> None:
        """Start the walk in the background (when the store reads concurrently); :meth:`recall` takes it."""
        res = call.resolution
        if res.tombstone or res.record is None:
            return
        started = call.steps.background(self._walk, call)
        if started is not None:
            call.prefetched["graph.walk"] = started

    def recall(self, call: Call) -> list[Any]:
        res = call.resolution
        if res.tombstone:
            raise Skipped("record is pending deletion")
        if res.record is None:
            raise Skipped("no record" if call.request.record is None else "record not found")
        hops = call.take("graph.walk", lambda: self._walk(call))
        return [
            EdgeItem(id=h.edge.id, src=h.edge.src, dst=h.edge.dst, type=h.edge.type, confidence=h.edge.confidence,
                     weight=h.edge.weight, hops=h.hops)  # fmt: skip
            for h in hops
        ]

    @staticmethod
    def _walk(call: Call) -> list[EdgeHop]:
        res, settings = call.resolution, call.settings
        assert res.record is not None  # recall and prefetch walk only around a resolved record
        return call.store.edges_around(
            [res.record.id, *res.merged_from], org=call.org, max_hops=settings.graph_max_hops,
            limit=settings.graph_max_edges, include_stubs=settings.include_stub_edges,
        )  # fmt: skip
