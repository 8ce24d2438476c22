"""Layer 12, report: statuses, ``partial``, routes, budget use and the trace, as one response.

The routes are built here, in one place, from what the layers recorded in ``call.events``
(:mod:`dossier.pipeline.events`): each layer's decisions, the model steps that fell back (the documents
route's depth) and the failures the call survived (``partial``).

The trace is filtered here, in one place: layers note every candidate they touch (recall notes items
before governance has judged them), and the caller sees the decisions about items governance cleared
for it (``Call.cleared``) or that were returned to it. Every other item is counted per layer and
reason in ``withheld``, with no id, score or title, so an item that exists but may not be seen reads
like one that does not exist.

``route["deadline"]`` says how the call kept to its deadline (:meth:`dossier.deadline.Deadline.report`),
and ``route["model"].detail["circuit"]`` the state of each model URL's circuit breaker.
"""

from __future__ import annotations

import re
from typing import Sequence

from ..deadline import current_deadline
from ..schema import SOURCE_NAMES, BudgetReport, ResolvedRecord, RetrieveResponse, Route, Synthesis, TraceEntry, item_key
from ..pipeline.call import Call
from ..pipeline.events import Decision, Event


def report(call: Call) -> None:
    assert call.plan is not None
    call.route = routes(call.events)
    _depth(call)
    _page(call)
    for source in SOURCE_NAMES:
        result = call.results[source]
        if result.status in ("skipped", "error"):
            continue
        result.status = "ok" if result.items or result.dropped else "empty"
    res = call.resolution
    record = None
    if res.record is not None:
        record = ResolvedRecord(id=res.record.id, kind=res.record.kind, tombstone=res.tombstone)
        if not res.tombstone:
            record.aliases = [a.id for a in res.aliases]
            record.merged_from = list(res.merged_from)
    synthesis = call.synthesis  # layer 10 (layers/synthesize.py)
    if synthesis is None and call.request.synthesize:
        synthesis = Synthesis(error="synthesis needs a chat model: set DOSSIER_LLM=openai:<model>")
    llm = call.steps.llm
    if call.meter.calls or llm is not None:  # what the model steps of this call cost, per step
        call.route["model"] = Route(ran=bool(call.meter.calls), backend=getattr(llm, "name", None), detail=call.meter.summary())
        models = (llm, call.steps.reranker)
        circuits = {b.url: b.status() for b in (getattr(m, "breaker", None) for m in models) if b is not None}
        if circuits:
            call.route["model"].detail["circuit"] = circuits
    deadline = current_deadline()
    if deadline is not None:
        call.route["deadline"] = Route(ran=True, detail=deadline.report())
    if call.session is None and "session" in call.route:  # opened by keep_session: listed last, after the call's costs
        call.route["session"] = call.route.pop("session")
    trace, withheld = caller_trace(call)
    call.response = RetrieveResponse(
        call_id=call.call_id,
        mode=call.plan.mode,
        record=record,
        sources=dict(call.results),
        partial=call.degraded or any(r.status == "error" for r in call.results.values()),
        route=call.route,
        budget=BudgetReport(
            total_bytes=call.request.budget.totalTokens,
            share={s: call.shares.get(s, 0) for s in SOURCE_NAMES},
            used={s: call.results[s].bytes_used for s in SOURCE_NAMES},
            dropped={s: call.results[s].dropped for s in SOURCE_NAMES},
        ),
        synthesis=synthesis,
        continuation=call.continuation,
        trace=trace,
        withheld=withheld,
    )


def routes(events: Sequence[Event]) -> dict[str, Route]:
    """The routes the layers' decisions describe, in the order they were first decided about."""
    out: dict[str, Route] = {}
    for event in events:
        if isinstance(event, Decision):
            route = out.setdefault(event.route, Route())
            for name, value in event.fields.items():
                setattr(route, name, value)
            route.detail.update(event.detail)
            for name, value in event.append.items():
                route.detail.setdefault(name, []).append(value)
    return out


def _depth(call: Call) -> None:
    """The documents route's depth, from the plan and the model steps that fell back (``call.events``):
    requested and effective depth, the first reason the depth was lowered (unless the documents source
    or selector gave one of its own) and every fallback by step."""
    plan, documents = call.planned, call.route.get("documents")
    if documents is None or not plan.sources.get("documents"):
        return
    fallbacks = call.fallbacks
    documents.requested_depth = plan.requested_depth
    documents.effective_depth = call.effective_depth
    first = plan.depth_fallback or (fallbacks[0].reason if fallbacks else None)
    documents.fallback_reason = documents.fallback_reason or first
    if fallbacks:
        documents.detail["deep_fallbacks"] = {f.step: f.text for f in fallbacks}


def _page(call: Call) -> None:
    """An expand page's sources were served by the session, not by recall (which skipped them)."""
    for source in call.session.page if call.session is not None else ():
        route = call.route.get(source)
        if route is not None:
            route.ran, route.backend = True, "session"
            route.detail.pop("skipped", None)


_WORD = re.compile(r"[a-z_]+")


def caller_trace(call: Call) -> tuple[list[TraceEntry] | None, dict[str, dict[str, int]] | None]:
    """The trace this caller may read, and the counts of what it may not (None, None without ``trace``).

    ``Call.full_trace`` (in-process only, for ``dossier eval``) returns every decision unfiltered."""
    if not call.request.trace:
        return None, None
    if call.full_trace:
        return list(call.trace), None
    seen = set(call.cleared)
    seen.update((source, item_key(item)) for source in SOURCE_NAMES for item in call.results[source].items)
    shown: list[TraceEntry] = []
    withheld: dict[str, dict[str, int]] = {}
    # a page of a session another caller opened: what governance removed was the opener's, not counted
    others_page = call.session is not None and not call.session.own
    for entry in call.trace:
        if (entry.source, entry.id) in seen:
            shown.append(entry)
        elif entry.decision == "dropped" and not others_page:  # its "kept" entries say nothing its drop does not
            layer = entry.layer if _WORD.fullmatch(entry.layer) else "other"
            reason = (entry.reason or "dropped").split(":", 1)[0]  # "replaced_by_sibling:<id>" names an id
            reason = reason if _WORD.fullmatch(reason) else "other"
            counts = withheld.setdefault(layer, {})
            counts[reason] = counts.get(reason, 0) + 1
    return shown, withheld
