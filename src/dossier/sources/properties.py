"""Properties: the typed values of the resolved record, most relevant to the question first; with no
record but a question, records discovered by what their properties mean (a list value is one property,
embedded as ``name: v1, v2``). Records pending deletion are never discovered: they have no vectors."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from ..pipeline.source_io import Found, SourceQuery, SourceTools, recalled
from ..schema import PropertyItem, SourceName
from ..stores.base import property_key
from . import Skipped
from .context_helpers import guarded, similarity_by_key


class PropertiesSource:
    name: SourceName = "properties"

    def prefetch(self, query: SourceQuery, tools: SourceTools) -> dict[str, Future[Any]]:
        """Nothing to start ahead: this source's reads are quick, or depend on each other."""
        return {}

    def recall(self, query: SourceQuery, tools: SourceTools) -> Found:
        return recalled(lambda found: self._recall(query, tools, found), trace=query.trace)

    def _recall(self, query: SourceQuery, tools: SourceTools, found: Found) -> list[Any]:
        if query.tombstone:
            raise Skipped("record is pending deletion")
        if query.record is not None:
            return self._of_record(query, tools, found)
        if not query.record_named and query.message:
            return self._discover(query, tools, found)
        raise Skipped("record not found" if query.record_named else "no record")

    def _of_record(self, query: SourceQuery, tools: SourceTools, found: Found) -> list[PropertyItem]:
        record = query.record
        assert record is not None  # recall asks for the record's own properties only when there is one
        items = [PropertyItem(record_id=record.id, name=n, value=v) for n, v in record.properties.items()]
        if query.message and items:
            scores = guarded(
                found, "properties",
                lambda: similarity_by_key(query, tools, "property", [record.id], len(items)),
                what="property ranking",
            )  # fmt: skip
            if scores:
                for item in items:
                    item.score = scores.get(property_key(record.id, item.name))
                items.sort(key=lambda i: -(i.score if i.score is not None else -1.0))
        return items

    def _discover(self, query: SourceQuery, tools: SourceTools, found: Found) -> list[PropertyItem]:
        settings = query.settings
        floor = settings.thresholds.property_discovery
        # records pending deletion have no property vectors (loading drops them), so none is ever a hit; the
        # hits of records merged away (into a live record, or into one pending deletion, and hidden with it)
        # are passed over before they take a place or are counted, and the search reads further (once, eight
        # times as far) when they crowd it
        limit = settings.discovered_records * 6
        for read in range(2):
            hits = tools.store.search_vectors("property", tools.query_vector(), org=query.org, limit=limit)
            rows = {r.id: r for r in tools.store.get_records(sorted({h.parent for h in hits}), org=query.org)}
            live = {i for i, r in rows.items() if not r.pending_deletion and not r.merged_into}
            shown = [h for h in hits if h.parent in live]
            enough = len({h.parent for h in shown}) >= settings.discovered_records
            if read or enough or len(hits) < limit or hits[-1].score < floor:  # nothing further would place
                break
            limit *= 8
        best: dict[str, list[tuple[str, float]]] = {}
        for hit in shown:
            if hit.score < floor:
                found.note("properties", hit.id, "recall", "dropped", "below_threshold", hit.score)
                continue
            if hit.parent in best or len(best) < settings.discovered_records:
                best.setdefault(hit.parent, []).append((hit.id[len(hit.parent) + 1 :], hit.score))  # "record/name"
        records = [rows[i] for i in best]
        items: list[PropertyItem] = []
        for record in records:
            matched = dict(best[record.id])
            for name, value in record.properties.items():
                if name in matched:
                    items.append(PropertyItem(record_id=record.id, name=name, value=value, matched=True, score=matched[name]))
        items.sort(key=lambda i: -(i.score or 0.0))
        return items
