"""The retrieve call: the layers, in order, over one context object.

``PIPELINE`` is data (as in sqlglot's optimizer): a tuple of plain functions, each reading and
writing the :class:`~dossier.pipeline.call.Call`. Governance runs before selection so that nothing
a caller may not see is ever selected, packed or shown to a model.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping

from pydantic import ValidationError

from .deadline import within
from .errors import InvalidRequest, NotFound
from .identifiers import NUL_MESSAGE, clip, nul_path
from .layers.budget import pack
from .layers.govern import govern
from .layers.plan import call_deadline, plan
from .layers.recall import recall
from .layers.report import report
from .layers.rerank import rerank
from .layers.resolve import resolve
from .layers.sections import select_sections
from .layers.session import keep_session, restore_session
from .layers.synthesize import synthesize
from .layers.understand import understand
from .pipeline.call import Call
from .providers.llm import metered
from .schema import RetrieveRequest, RetrieveResponse

if TYPE_CHECKING:
    from .engine import Engine

PIPELINE = (
    restore_session, plan, resolve, understand, recall, govern, rerank, select_sections, pack, synthesize, keep_session,
    report,
)


def parse_request(request: RetrieveRequest | Mapping[str, Any]) -> RetrieveRequest:
    """Validate a request; the error names the offending field (``record.email``, ``budget.totalTokens``)."""
    where = nul_path(request.model_dump(mode="json") if isinstance(request, RetrieveRequest) else request)
    if where is None and isinstance(request, RetrieveRequest):
        return _expand_alone(request)
    if where is not None:  # no text (PostgreSQL cannot hold it): refused alike on both stores
        raise InvalidRequest(f"invalid request: {where or 'request'}: {NUL_MESSAGE}", field=where or "request")
    try:
        return _expand_alone(RetrieveRequest.model_validate(request))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if p != "[key]") or "request"  # a map's key: named by itself"
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "unknown field"
        where = clip(where, quote=False)  # a field name the caller made up is quoted no longer than any input
        raise InvalidRequest(f"invalid request: {where}: {message}", field=where) from None


def _expand_alone(request: RetrieveRequest) -> RetrieveRequest:
    """A ``continuation`` pages through what an earlier call could not fit: the session holds who that call was
    about and what it found, so a request naming another record, fetch list, filters or rephrasings beside it
    would be answered about something else than it says (a record there replaced the session's, and the items
    of the session's record were dropped for good). Refused, naming the field. A ``message`` is the question a
    synthesis of the page answers, and stays allowed."""
    if not request.continuation:
        return request
    if request.mode not in (None, "expand"):
        raise InvalidRequest(f"invalid request: mode: a continuation pages through an earlier call (mode expand), "
                             f"not {request.mode}", field="mode")  # fmt: skip
    given = {"record": request.record is not None, "fetch": request.fetch is not None,
             "filters": request.filters is not None, "augmentation": request.augmentation is not None}  # fmt: skip
    for name, present in given.items():
        if present:
            raise InvalidRequest(f"invalid request: {name}: an expand call pages through what its continuation's "
                                 "session holds: leave it out", field=name)  # fmt: skip
    return request


def retrieve(
    engine: "Engine", request: RetrieveRequest | Mapping[str, Any], *, org: str, caller: str, call_id: str | None = None,
    full_trace: bool = False, max_deadline_ms: int | None = None,
) -> RetrieveResponse:
    """``full_trace`` is for in-process operators' tools only (``dossier eval``): with ``trace: true`` the
    trace then also names the items this caller may not see. It is no field of the request, so no front
    end (HTTP, MCP, CLI retrieve) can ask for it. ``max_deadline_ms`` lowers a longer deadline (the
    service's maximum); the deadline counts from here (``dossier.deadline``)."""
    started = time.monotonic()
    parsed = parse_request(request)
    if not org or engine.store.get_org(org=org) is None:
        raise NotFound(f"unknown org {clip(org)}")
    who = engine.store.get_caller(caller, org=org)
    if who is None:
        raise NotFound(f"unknown caller {clip(caller)} in org {clip(org)}")
    steps = engine.steps(org=org, caller=caller)
    call = Call(steps=steps, request=parsed, org=org, caller=who, settings=engine.settings_for(org), full_trace=full_trace)
    if call_id:  # the service names the call before it runs: it is charged up front under that id
        call.call_id = call_id
    deadline = call_deadline(parsed, call.settings, model=steps.llm is not None,
                             max_ms=max_deadline_ms, started=started)  # fmt: skip
    with metered(call.meter), within(deadline):  # every model request is counted on the call, and keeps to its deadline
        for layer in PIPELINE:
            with deadline.layer(layer.__name__):
                layer(call)
    assert call.response is not None
    return call.response
