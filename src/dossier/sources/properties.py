"""Properties: the typed values of the resolved record, most relevant to the question first; with no
record but a question, records discovered by what their properties mean (a list value is one property,
embedded as ``name: v1, v2``). Records pending deletion are never discovered: they have no vectors."""

from __future__ import annotations

from typing import Any

from ..pipeline.call import Call
from ..schema import PropertyItem, SourceName
from ..stores.base import property_key
from . import Skipped
from .context_helpers import similarity_by_key


class PropertiesSource:
    name: SourceName = "properties"

    def prefetch(self, call: Call) -> None:
        """Nothing to start ahead: this source's reads are quick, or depend on each other."""

    def recall(self, call: Call) -> list[Any]:
        res = call.resolution
        if res.tombstone:
            raise Skipped("record is pending deletion")
        if res.record is not None:
            return self._of_record(call)
        if call.request.record is None and call.message:
            return self._discover(call)
        raise Skipped("no record" if call.request.record is None else "record not found")

    def _of_record(self, call: Call) -> list[PropertyItem]:
        record = call.resolution.record
        assert record is not None  # recall asks for the record's own properties only when there is one
        items = [PropertyItem(record_id=record.id, name=n, value=v) for n, v in record.properties.items()]
        if call.message and items:
            scores = call.guarded(
                "properties",
                lambda: similarity_by_key(call, "property", [record.id], len(items)),
                what="property ranking",
            )
            if scores:
                for item in items:
                    item.score = scores.get(property_key(record.id, item.name))
                items.sort(key=lambda i: -(i.score if i.score is not None else -1.0))
        return items

    def _discover(self, call: Call) -> list[PropertyItem]:
        settings = call.settings
        floor = settings.thresholds.property_discovery
        # records pending deletion have no property vectors (loading drops them), so none is ever a hit
        hits = call.store.search_vectors("property", call.query_vector(), org=call.org, limit=settings.discovered_records * 6)
        best: dict[str, list[tuple[str, float]]] = {}
        for hit in hits:
            if hit.score < floor:
                call.note("properties", hit.id, "recall", "dropped", "below_threshold", hit.score)
                continue
            if hit.parent in best or len(best) < settings.discovered_records:
                best.setdefault(hit.parent, []).append((hit.id[len(hit.parent) + 1 :], hit.score))  # "record/name"
        records = call.store.get_records(list(best), org=call.org)
        items: list[PropertyItem] = []
        for record in records:
            if record.pending_deletion or record.merged_into:
                call.note("properties", record.id, "recall", "dropped", "record_not_live")
                continue
            matched = dict(best[record.id])
            for name, value in record.properties.items():
                if name in matched:
                    items.append(PropertyItem(record_id=record.id, name=name, value=value, matched=True, score=matched[name]))
        items.sort(key=lambda i: -(i.score or 0.0))
        return items
