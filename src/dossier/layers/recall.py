"""Layer 5, recall: ask every planned source for candidates; a failing source is reported, not fatal.

Sources never see the call: each is given a :class:`SourceQuery` and :class:`SourceTools` built here, and
returns what it found with the events it wants recorded. This layer alone writes them into the call, in the
order the source recorded them."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import cast

from ..pipeline.call import Call
from ..pipeline.events import Degraded
from ..pipeline.source_io import Found, SourceEvent, SourceQuery, SourceTools
from ..schema import SOURCE_NAMES, SourceName, TraceEntry, item_key


def recall(call: Call) -> None:
    assert call.plan is not None
    query, tools = source_query(call), source_tools(call)
    _prefetch(call, query, tools)
    try:
        _recall(call, query, tools)
    finally:
        for future in call.prefetched.values():  # a read no source took (cancelling a finished one does nothing)
            future.cancel()
        call.prefetched.clear()


def source_query(call: Call) -> SourceQuery:
    """What the sources may read about ``call``."""
    plan, res, understanding = call.planned, call.resolution, call.understanding
    return SourceQuery(
        org=call.org, roles=tuple(call.caller.roles), message=call.message,
        record_named=call.request.record is not None, record=res.record, tombstone=res.tombstone,
        merged_from=tuple(res.merged_from), record_ids=tuple(res.record_ids), mode=plan.mode,
        depth=plan.effective_depth, document_query=understanding.document_query,
        memory_query=understanding.memory_query, parts=understanding.parts, filters=understanding.filters,
        fetch=tuple(call.request.fetch or ()), settings=call.settings, trace=bool(call.request.trace),
        full_trace=call.full_trace and bool(call.request.trace),
    )  # fmt: skip


def source_tools(call: Call) -> SourceTools:
    """What the sources run with: the call's steps, its one query embedding and its prefetched reads (read only)."""
    steps = call.steps
    return SourceTools(store=steps.store, embed_query=steps.embed_query, query_vector=call.query_vector,
                       embedder=steps.embedder, fuse=steps.fuse, background=steps.background,
                       embed_ahead=steps.embed_ahead, while_embedding=steps.while_embedding,
                       prefetched=MappingProxyType(call.prefetched))  # fmt: skip


def _prefetch(call: Call, query: SourceQuery, tools: SourceTools) -> None:
    """Let planned sources start their store reads in the background (a failure here is not reported:
    the source then reads in the foreground, where a failure is)."""
    assert call.plan is not None
    for source in call.steps.sources:
        if call.plan.sources.get(source.name):
            try:
                call.prefetched.update(source.prefetch(query, tools))
            except Exception:  # noqa: BLE001, S110 - the foreground read reports it
                pass


def _recall(call: Call, query: SourceQuery, tools: SourceTools) -> None:
    assert call.plan is not None
    for source in call.steps.sources:
        # Engine.sources is a tuple of concrete classes whose ``name`` class attributes are inferred as plain
        # ``str``; each is one of the SourceName literals (the Source protocol says so).
        name = cast(SourceName, source.name)
        result = call.results[name]
        if not call.plan.sources.get(name):
            call.decide(name, detail={"skipped": "not requested"})
            continue
        call.decide(name, ran=True)
        result.status = "empty"
        try:
            found = source.recall(query, tools)
        except Exception as exc:  # noqa: BLE001 - one source failing never sinks the call
            found = Found().stopped(exc)
        for event in found.events:
            _record(call, event)
        if found.skipped is not None:
            result.status = "skipped"
            call.decide(name, ran=False, detail={"skipped": found.skipped})
            continue
        if found.failed:
            result.status = "error"
            call.degrade(name, "failed")  # the source's events said why
            continue
        if found.error is not None:
            call.fail(name, found.error)
            continue
        call.candidates[name] = found.items
        if found.lead is not None and found.lead.record_id in query.record_ids:  # a later source may read it
            query = dataclasses.replace(query, memory_lead=found.lead)
        if name != "documents":  # the documents source notes its candidates itself, with how each was found
            for item in found.items:
                call.note(name, item_key(item), "recall", "kept", getattr(item, "tier", None), getattr(item, "score", None))


def _record(call: Call, event: SourceEvent) -> None:
    """Write one event a source recorded into the call."""
    if isinstance(event, TraceEntry):
        if call.request.trace:
            call.trace.append(event)
    elif isinstance(event, Degraded) and event.where in SOURCE_NAMES:
        call.fail(cast(SourceName, event.where), event.error, keep_items=True)  # the source's items stand
    else:
        call.events.append(event)
