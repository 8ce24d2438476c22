"""Layer 2, plan: which mode, which sources, which depth, and how the depth was downgraded; and the
call's deadline (:func:`call_deadline`, chosen before the first layer runs)."""

from __future__ import annotations

import time

from ..deadline import Deadline
from ..errors import InvalidRequest
from ..schema import SOURCE_NAMES, Mode, RetrieveRequest, SourceName
from ..settings import Settings
from ..pipeline.call import Call, Plan

MODE_SOURCES: dict[Mode, frozenset[SourceName]] = {
    "brief": frozenset({"properties", "memories", "documents", "graph"}),
    "scout": frozenset({"properties", "memories", "documents"}),
    "fetch": frozenset({"documents"}),
    "filter": frozenset({"documents"}),
    "expand": frozenset(),
}


def infer_mode(request: RetrieveRequest) -> Mode:
    """An explicit mode wins; otherwise the shape decides: fetch list, filters, continuation, else scout."""
    if request.mode:
        return request.mode
    if request.fetch:
        return "fetch"
    if request.filters and not request.filters.empty:
        return "filter"
    if request.continuation:
        return "expand"
    return "scout"


def choose_sources(mode: Mode, request: RetrieveRequest) -> dict[SourceName, bool]:
    """The mode's defaults, overridden by explicit flags; ``external`` only when asked for."""
    flags = request.sources
    chosen: dict[SourceName, bool] = {}
    for name in SOURCE_NAMES:
        explicit = getattr(flags, name)
        default = name in MODE_SOURCES[mode]
        chosen[name] = bool(explicit) if explicit is not None else (default and name != "external")
    return chosen


def plan(call: Call) -> None:
    request = call.request
    mode = infer_mode(request)
    if mode == "fetch" and not request.fetch:
        raise InvalidRequest("fetch mode needs a 'fetch' list of document ids", field="fetch")
    if mode == "filter" and (request.filters is None or request.filters.empty) and not request.message:
        raise InvalidRequest("filter mode needs 'filters' (doc_types or tags) or a message", field="filters")
    if mode == "expand":  # the next page of an earlier call's leftovers, restored by restore_session
        assert call.session is not None
        call.plan = Plan(
            mode="expand",
            sources={s: False for s in SOURCE_NAMES},  # nothing is recalled: the page comes from the session
            requested_depth=request.depth,
            effective_depth=call.session.state.get("depth", request.depth),
        )
        return
    requested = request.depth
    effective, fallback = requested, None
    if requested == "deep" and call.steps.llm is None:
        effective, fallback = "standard", "no_model"
    call.plan = Plan(
        mode=mode,
        sources=choose_sources(mode, request),
        requested_depth=requested,
        effective_depth=effective,
        depth_fallback=fallback,
        model_steps=effective == "deep",  # fast and standard never call a model (synthesis is asked for apart)
    )


def call_deadline(request: RetrieveRequest, settings: Settings, *, model: bool, max_ms: int | None = None,
                  started: float | None = None) -> Deadline:  # fmt: skip
    """The deadline of a call: the request's ``deadline_ms``, else ``settings.deadline_ms``; lowered to
    ``max_ms`` when that is given and shorter (a service's maximum). Its model steps' end times leave
    room for synthesis when the call waits for one (``synthesize``, not ``deferred``, a ``model``)."""
    ms = request.deadline_ms if request.deadline_ms is not None else settings.deadline_ms
    lowered = max_ms is not None and ms > max_ms
    return Deadline.plan(
        (max_ms if lowered and max_ms is not None else ms) / 1000,
        synthesis=request.synthesize and not request.deferred and model,
        started=time.monotonic() if started is None else started,
        source="request" if request.deadline_ms is not None else "default",
        requested_ms=ms if lowered else None,
    )
