"""Layer 9, report: statuses, ``partial``, routes, budget use and the trace, as one response."""

from __future__ import annotations

from ..schema import SOURCE_NAMES, BudgetReport, ResolvedRecord, RetrieveResponse, Route, Synthesis
from .context import Call
from .session import keep


def report(call: Call) -> None:
    assert call.plan is not None
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
    synthesis = call.synthesis  # layer 8 (layers/synthesize.py)
    if synthesis is None and call.request.synthesize:
        synthesis = Synthesis(error="synthesis needs a chat model: set DOSSIER_LLM=openai:<model>")
    llm = getattr(call.engine, "llm", None)
    if call.meter.calls or llm is not None:  # what the model steps of this call cost, per step
        call.route["model"] = Route(ran=bool(call.meter.calls), backend=getattr(llm, "name", None), detail=call.meter.summary())
    continuation = keep(call)  # layer 10: what did not fit waits in a session (layers/session.py)
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
        continuation=continuation,
        trace=call.trace if call.request.trace else None,
    )
