"""The HTTP front end (FastAPI): the retrieve call, call results, feedback, loading, and MCP at ``/mcp``.

``dossier serve`` runs :func:`app_from_env` under uvicorn. Every ``/v1/`` route and ``/mcp`` needs
``Authorization: Bearer <key>``; the key decides the org and the caller. Workers keep no state (keys,
sessions, audit, feedback and the ledger are in the store), so several can run side by side.

A request passes the :class:`Gate` first: the key (401), the body's size (413, ``Settings.service``: 1 MiB
for retrieve, feedback and MCP, 5 MiB for records, memories and documents, 20 MiB for bundles) and, on the
JSON routes, the body itself, read as strict JSON (422: not UTF-8, not JSON, nested over
:data:`MAX_DEPTH`, a number out of range, a lone surrogate). Then the route: 403 an item written into
another org (or a bundle without the admin role); 404 an unknown call, another org's call (word for word
the same) or an unknown route; 405 a method the route does not serve (``GET /mcp`` included: the MCP endpoint is stateless and
offers no event stream); 422 an invalid body; 502 a model provider failed; 503 the store is unavailable.
Every error is ``{"detail": {"field"?: ..., "message": ...}}`` (:class:`ErrorBody`), and every refusal of
a request whose key is known is audited by its shape (:meth:`Service.refused`). Bad input never gets a 500.

This module is ``dossier.http``; absolute imports (the Python 3 default) still reach the standard library's
``http`` package.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import os
import re
import time
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Callable, Coroutine, Union

from fastapi import Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import BundleError, DossierError, InvalidRequest, Unauthorized, http_status
from .identifiers import NUL_MESSAGE, clip
from .inspector import routes as inspector_routes
from .schema import RetrieveRequest, RetrieveResponse
from .service import (
    FIELD_ECHO,
    MESSAGE_ECHO,
    CallThreads,
    FeedbackRequest,
    NewDocument,
    NewMemory,
    NewRecord,
    Principal,
    Service,
    bearer_key,
)
from .settings import ServiceSettings

_UNION_TAG = re.compile(r"^(list\[.*\]|New[A-Z]\w*|function-\w+\[.*\])$")  # pydantic's tags of union members
_bearer = HTTPBearer(auto_error=False, description="An API key from `dossier keys create`.")
#: The deepest nesting of arrays and objects a body may have.
MAX_DEPTH = 64
#: Routes whose body is JSON, read by the :class:`Gate` (the MCP endpoint reads its own).
JSON_ROUTES = frozenset({"/v1/retrieve", "/v1/feedback", "/v1/records", "/v1/memories", "/v1/documents", "/v1/bundles"})
_PRINCIPAL, _BODY = "dossier.principal", "dossier.body"  # what the Gate leaves in the ASGI scope


# -- the error body and the OpenAPI description of each status -----------------------------------------
class ErrorDetail(BaseModel):
    field: str | None = Field(default=None, description="The offending field (422 only): a dotted path, `body` "
                              "for the body as a whole.")  # fmt: skip
    message: str = Field(description="What went wrong, for a person; quotes at most a little of the input.")
    problems: list[str] | None = Field(default=None, description="A refused bundle's problems, one per line "
                                       "(at most 100).")  # fmt: skip


class ErrorBody(BaseModel):
    """Every error the API answers: ``{"detail": {"field"?, "message"}}``."""

    detail: ErrorDetail


_WHY = {
    401: "No API key, or a malformed, unknown or revoked one (with `WWW-Authenticate: Bearer`).",
    403: "An item written into another org; a bundle without the admin role.",
    404: "An unknown call, or another org's or another caller's (the admin role reads any of its org's).",
    413: "The body is over this route's limit; refused before it is parsed.",
    422: "An invalid body or parameter: not UTF-8 or not JSON, nested too deeply, a number out of range, a lone "
         "surrogate or a NUL character, a wrong type, an unknown field, a value out of its limits; a broken bundle.",
    502: "A model provider failed.",
    503: "The store is unavailable.",
}  # fmt: skip


def _responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody, "description": _WHY[status]} for status in statuses}


class LoadSummary(BaseModel):
    inserted: dict[str, int]
    updated: dict[str, int]
    unchanged: dict[str, int]
    embedded: int
    seconds: float
    ignored_keys: list[str] = Field(default_factory=list, description="Top-level keys of a bundle that were not loaded.")
    ignored_fields: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="Per list, the unknown fields a bundle's items had, and on how many items."
    )


class MemoryWritten(BaseModel):
    id: str
    record_id: str
    created_at: str


class MemoriesWritten(BaseModel):
    memories: list[MemoryWritten]


class DocumentWritten(BaseModel):
    id: str
    title: str
    sections: list[str]


class DocumentsWritten(BaseModel):
    documents: list[DocumentWritten]


class FeedbackRow(BaseModel):
    call_id: str
    caller: str
    rating: int
    comment: str | None
    at: str


class UsageItem(BaseModel):
    item: str
    calls: int
    charged: int
    refunded: int
    net: int


class Usage(BaseModel):
    org: str
    items: list[UsageItem]
    net: int


class CallResult(BaseModel):
    call_id: str
    status: str
    summary: dict[str, Any]
    synthesis: dict[str, Any] | None


class Status(BaseModel):
    status: str


# -- the app -----------------------------------------------------------------------------------------
def create_app(service: Service, *, mcp: bool = True, allowed_hosts: list[str] | None = None,
               owns_engine: bool = False, api_docs: bool = False) -> FastAPI:  # fmt: skip
    """The HTTP API over ``service``; with ``mcp``, MCP over streamable HTTP at ``/mcp`` too. With
    ``owns_engine`` (``dossier serve``'s workers) the service's engine is closed when the app shuts down.
    ``api_docs`` serves Swagger UI at ``/docs``; off by default, since its script comes from a CDN and would
    run on the service's origin, where the inspector page keeps the key pasted into it.

    ``allowed_hosts`` (``host:port`` patterns) turns on the MCP SDK's DNS-rebinding check of the
    ``Host`` header; ``dossier serve`` sets it when it listens on a loopback address.
    """
    limits = service.engine.settings.service
    calls = CallThreads(int(os.environ.get("DOSSIER_CALL_THREADS") or 0) or limits.call_threads)  # /v1 and /mcp alike
    mcp_server = None
    if mcp:
        from mcp.server.transport_security import TransportSecuritySettings

        from .mcp import build_server, http_principal

        mcp_server = build_server(service, http_principal(service), calls=calls)
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=bool(allowed_hosts),
            allowed_hosts=list(allowed_hosts or []),
            allowed_origins=[f"http://{h}" for h in allowed_hosts or []],
        )
        mcp_app = mcp_server.streamable_http_app(
            streamable_http_path="/mcp", stateless_http=True, json_response=True, transport_security=security,
            max_request_body_size=limits.max_retrieve_bytes,
        )  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(service.engine.embed_query, "warm up")  # load the model before the first call
        # What is alive now (the model, the app, the imported modules) lives as long as the worker: moved
        # out of the collector's sight, full collections no longer rescan it in the middle of a call.
        gc.collect()
        gc.freeze()
        try:
            if mcp_server is None:
                yield
            else:
                async with mcp_server.session_manager.run():
                    yield
        finally:
            if owns_engine:  # syntheses still running finish (or are stored as failed) before the worker exits
                await run_in_threadpool(service.engine.close)

    app = FastAPI(
        title="dossier",
        version=_version(),
        summary="One call about one customer record: properties, memories, document sections and graph edges, "
        "inside one byte budget.",
        lifespan=lifespan,
        docs_url="/docs" if api_docs else None,
        redoc_url=None,
    )
    app.router.route_class = _ParsedJSONRoute
    _errors(app, service)

    async def principal(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Principal:
        found = request.scope.get(_PRINCIPAL)  # the Gate checked the key before the body was read
        if isinstance(found, Principal):
            return found
        return service.authenticate(credentials.credentials if credentials else None)

    public = {"model": ErrorBody}
    authed = (401, 503)  # every route behind a key
    writes = (401, 403, 413, 422, 503)

    @app.get("/healthz", tags=["service"], response_model=Status)
    def healthz() -> dict[str, str]:
        """Liveness: the process answers (the store is not touched; `/readyz` checks it). No key needed."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["service"], response_model=Status,
             responses={503: {**public, "description": "The store cannot be read or written (a full disk, a "
                              "read-only database, an unreachable server)."}})  # fmt: skip
    def readyz() -> Any:
        """Readiness: the store can be read and written (one small committed write). No key needed."""
        try:
            service.ready()
        except Exception as exc:  # noqa: BLE001 - whatever the cause, this worker cannot serve
            reason = clip(str(exc) or type(exc).__name__, 200, quote=False)
            return _detail(503, f"not ready: the store cannot be read and written ({type(exc).__name__}: {reason})")
        return {"status": "ready"}

    @app.post("/v1/retrieve", response_model=RetrieveResponse, tags=["retrieve"],
              responses=_responses(401, 403, 413, 422, 502, 503))  # fmt: skip
    async def retrieve(body: RetrieveRequest, who: Principal = Depends(principal)) -> Response:
        """The retrieve call of docs/retrieve.md, as the key's caller in the key's org (a body naming
        `org` or `caller` is refused). Charged to the org's ledger and audited (shape only)."""
        response = await calls.run(service.retrieve, who, body, front_end="http")
        return Response(response.model_dump_json(), media_type="application/json")

    @app.get("/v1/calls/{call_id}", tags=["retrieve"], response_model=CallResult,
             responses=_responses(401, 403, 404, 422, 503))  # fmt: skip
    async def get_call(call_id: str, wait: float = Query(0.0, ge=0, le=30, allow_inf_nan=False),
                       who: Principal = Depends(principal)) -> dict[str, Any]:  # fmt: skip
        """One of your earlier calls (any of your org's for the admin role): its audited shape and, for your
        own `deferred` call, its `synthesis` (`pending: true` while it runs; `?wait=S` waits up to S seconds, at
        most 30)."""
        # The wait is spent on the event loop, asking again every 0.2 s, never in one of the worker's threads:
        # those serve every key check and /healthz, and many waiters would hold them all.
        until = time.monotonic() + wait
        while True:
            out = await run_in_threadpool(service.call, who, call_id)
            pending = bool((out.get("synthesis") or {}).get("pending"))
            if not pending or time.monotonic() >= until:
                return out
            await asyncio.sleep(min(0.2, max(until - time.monotonic(), 0.0)))

    @app.get("/v1/calls/{call_id}/feedback", tags=["feedback"], response_model=list[FeedbackRow],
             responses=_responses(401, 403, 404, 422, 503))  # fmt: skip
    def get_feedback(call_id: str, who: Principal = Depends(principal)) -> list[dict[str, Any]]:
        """The ratings given to one of your calls (any of your org's for the admin role)."""
        return [_feedback(f) for f in service.feedback_for(who, call_id)]

    @app.post("/v1/feedback", status_code=201, tags=["feedback"], response_model=FeedbackRow,
              responses=_responses(401, 403, 404, 413, 422, 503))  # fmt: skip
    def post_feedback(body: FeedbackRequest, who: Principal = Depends(principal)) -> dict[str, Any]:
        """Rate one of your calls (any of your org's for the admin role), 1-5, with an optional comment."""
        return _feedback(service.feedback(who, body))

    @app.get("/v1/usage", tags=["service"], response_model=Usage, responses=_responses(*authed))
    def usage(who: Principal = Depends(principal)) -> dict[str, Any]:
        """Your org's billing ledger, summed per billed item (units are documented in docs/service.md)."""
        lines = service.usage(who.org)
        return {
            "org": who.org,
            "items": [{"item": u.item, "calls": u.calls, "charged": u.charged, "refunded": u.refunded, "net": u.net}
                      for u in lines],  # fmt: skip
            "net": sum(u.net for u in lines),
        }

    @app.post("/v1/bundles", tags=["load"], response_model=LoadSummary, responses=_responses(*writes),
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
                  "type": "object", "description": "A bundle (docs/bundles.md): lists of orgs, callers, records, "
                  "memories, documents and edges."}}}}})  # fmt: skip
    async def post_bundle(request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
        """Load a bundle (docs/bundles.md) into your org: all of it or nothing, idempotent by id. Items
        may leave `org` out; one naming another org is refused. Needs the admin role. Keys and fields
        the bundle format does not know are listed in `ignored_keys` and `ignored_fields`; a bundle with
        nothing to load is refused (422)."""
        body = await request.json()
        return _report(await run_in_threadpool(service.load_bundle, who, body))

    @app.post("/v1/records", tags=["load"], response_model=LoadSummary, responses=_responses(*writes))
    def post_records(body: Union[NewRecord, list[NewRecord]], who: Principal = Depends(principal)) -> dict[str, Any]:
        """Add or update records (one, or a list) in your org. An unknown field is refused (422)."""
        return _report(service.add_records(who, body if isinstance(body, list) else [body]))

    @app.post("/v1/memories", tags=["load"], response_model=MemoriesWritten, responses=_responses(*writes))
    def post_memories(body: Union[NewMemory, list[NewMemory]], who: Principal = Depends(principal)) -> dict[str, Any]:
        """Add memories (one, or a list) to records of your org; `id` and `created_at` default to new and now."""
        memories = service.add_memories(who, body if isinstance(body, list) else [body])
        return {"memories": [{"id": m.id, "record_id": m.record, "created_at": m.created_at.isoformat()} for m in memories]}

    @app.post("/v1/documents", tags=["load"], response_model=DocumentsWritten, responses=_responses(*writes))
    def post_documents(body: Union[NewDocument, list[NewDocument]], who: Principal = Depends(principal)) -> dict[str, Any]:
        """Add or replace documents (one, or a list), given as sections or as markdown split at headings."""
        documents = service.add_documents(who, body if isinstance(body, list) else [body])
        return {"documents": [{"id": d.id, "title": d.title, "sections": [s.id for s in d.sections]} for d in documents]}

    app.router.routes.extend(inspector_routes())  # /inspect: a static page over the key-checked API
    if mcp_server is not None:
        for route in mcp_app.routes:
            if isinstance(route, Route):  # stateless, JSON responses: POST only (GET and DELETE are 405)
                endpoint = _AuditedMCP(route.endpoint, service)
                app.router.routes.append(Route(route.path, endpoint, methods=["POST"], include_in_schema=False))
    app.add_middleware(Gate, service=service, limits=limits)
    return app


def app_from_env() -> FastAPI:
    """The app ``dossier serve`` runs (one per worker): the store of ``DOSSIER_DATABASE_URL``."""
    import dossier

    threads = int(os.environ.get("DOSSIER_EMBED_THREADS") or 0)
    embedder = None
    if threads:  # several workers on few cores: one inference thread each, no thread pools spinning
        from .providers.embeddings import OnnxMiniLM

        embedder = OnnxMiniLM(threads=threads)
    engine = dossier.open(os.environ.get("DOSSIER_DATABASE_URL") or None, embedder=embedder)
    hosts = [h for h in os.environ.get("DOSSIER_ALLOWED_HOSTS", "").split(",") if h]
    return create_app(Service(engine), allowed_hosts=hosts or None, owns_engine=True,
                      api_docs=os.environ.get("DOSSIER_API_DOCS") == "1")  # fmt: skip


# -- errors ------------------------------------------------------------------------------------------
def _detail(status: int, message: str, field: str | None = None, *, headers: dict[str, str] | None = None,
            **extra: Any) -> JSONResponse:  # fmt: skip
    """The one error body: ``{"detail": {"field"?, "message"}}``, quoting at most a little of the input."""
    detail: dict[str, Any] = {"message": _text(message, MESSAGE_ECHO)}
    if field is not None or status == 422:
        detail["field"] = None if field is None else _text(field, FIELD_ECHO)
    detail.update(extra)
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _text(value: str, limit: int) -> str:
    """``value`` cut to ``limit`` characters, with any lone surrogate replaced (it cannot be sent as UTF-8)."""
    return clip(value.encode("utf-8", "replace").decode("utf-8"), limit, quote=False)


class BodyError(Exception):
    """A body that is not strict JSON (raised by :func:`parse_json`): 422 naming ``field``."""

    def __init__(self, message: str, field: str = "body") -> None:
        super().__init__(message)
        self.field = field


def _route(request: Request) -> str:
    """The route template of a request (``GET /v1/calls/{call_id}``), never its raw path; ``?`` when no
    route matched (an unknown path is the caller's text). ``/mcp`` is its own template: its POST-only
    route is Starlette's, which names no route in the scope when it refuses another method."""
    route = request.scope.get("route")
    path = getattr(route, "path", None) or ("/mcp" if request.url.path == "/mcp" else None)
    return f"{request.method} {path}" if path else f"{request.method} ?"


async def _refused(service: Service, request: Request, error: BaseException | str, status: int,
                   field: str | None = None) -> None:  # fmt: skip
    """Audit a refusal when the request's key is known (a request without a valid key has no org to file it under)."""
    who = request.scope.get(_PRINCIPAL)
    if isinstance(who, Principal):
        await run_in_threadpool(service.refused, who, error, front_end="http", route=_route(request), status=status,
                                field=field)  # fmt: skip


def _first_error(exc: RequestValidationError) -> tuple[str, str]:
    """The field and message of the error to report: the first, of the form that was sent (one item or a list)."""
    errors = list(exc.errors())
    as_list = isinstance(getattr(exc, "body", None), list)
    errors.sort(key=lambda e: (len(e.get("loc", ())) > 1 and str(e["loc"][1]).startswith("list[")) != as_list)
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid body", "type": "value_error"}
    loc = [str(p) for p in first.get("loc", ()) if not _UNION_TAG.match(str(p)) and p != "[key]"]
    where = ".".join(loc[1:] if loc[:1] in (["body"], ["query"], ["path"]) and len(loc) > 1 else loc) or "body"
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        message = "unknown field"
    elif kind == "missing" and where == "body":
        message = "a JSON body is required"
    else:
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return where, message


def _errors(app: FastAPI, service: Service) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        where, message = _first_error(exc)
        await _refused(service, request, "InvalidRequest", 422, where)
        return _detail(422, f"invalid request: {_text(where, FIELD_ECHO)}: {message}", where)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = "no such route (the API is under /v1; its OpenAPI document is /openapi.json)"
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"method {request.method} is not allowed here" + (f"; allowed: {allowed}" if allowed else "")
        else:
            message = str(exc.detail)
        await _refused(service, request, type(exc).__name__ if exc.status_code != 405 else "MethodNotAllowed",
                       exc.status_code)  # fmt: skip
        return _detail(exc.status_code, message, headers=dict(exc.headers or {}) or None)

    @app.exception_handler(DossierError)
    async def dossier_error(request: Request, exc: DossierError) -> JSONResponse:
        who = request.scope.get(_PRINCIPAL)
        if isinstance(who, Principal):  # the caller's errors (4xx) are audited, as over MCP
            await run_in_threadpool(service.refused_error, who, exc, front_end="http", route=_route(request))
        return _for(exc)

    @app.exception_handler(Exception)
    async def crash(_: Request, exc: Exception) -> JSONResponse:
        return _detail(500, f"internal error: {type(exc).__name__}")


def _for(exc: DossierError) -> JSONResponse:
    """The status (:func:`~dossier.errors.http_status`) and body of a :class:`DossierError`."""
    status = http_status(exc)
    if isinstance(exc, BundleError):
        first = exc.problems[0] if exc.problems else None
        field = f"{first.kind}:{first.item_id}" if first and first.item_id else (first.kind if first else None)
        problems = [_text(str(p), MESSAGE_ECHO) for p in exc.problems[:100]]
        return _detail(status, str(exc), field, problems=problems)
    if status == 503:
        return _detail(status, f"the store is unavailable: {type(exc).__name__}")
    if status == 502:
        return _detail(status, f"a model provider failed: {type(exc).__name__}")
    if status == 500:
        return _detail(status, f"internal error: {type(exc).__name__}")
    return _detail(status, str(exc), getattr(exc, "field", None) if isinstance(exc, InvalidRequest) else None)


# -- strict JSON -------------------------------------------------------------------------------------
def parse_json(raw: bytes) -> Any:
    """A request body as JSON, strictly: UTF-8, at most :data:`MAX_DEPTH` levels, finite numbers, integers
    within 64 bits, no ``NaN``/``Infinity``, no lone surrogate escape (``"\\ud800"``) in any string or key.
    :class:`BodyError` naming where, quoting at most a few characters, otherwise."""
    if not raw.strip():
        raise BodyError("the body is empty: send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(f"the body is not valid UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text, parse_float=_finite, parse_int=_int64, parse_constant=_no_constant)
    except RecursionError:
        raise BodyError(f"the body is nested more than {MAX_DEPTH} levels deep") from None
    except json.JSONDecodeError as exc:
        raise BodyError(f"the body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:  # raised by the number hooks
        raise BodyError(str(exc)) from None
    _check(value, strings=_SURROGATE_ESCAPE.search(raw) is not None or _NUL_ESCAPE.search(raw) is not None)
    return value


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"the body holds a number out of range: {clip(text, 40, quote=False)}")
    return number


def _int64(text: str) -> int:
    if len(text.lstrip("-")) > 19 or not -(2**63) <= int(text) < 2**63:
        raise ValueError(f"the body holds an integer beyond 64 bits: {clip(text, 40, quote=False)} (send it as a string)")
    return int(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"the body holds {name}, which is not JSON")


def _has_surrogate(text: str) -> bool:
    return not text.isascii() and any("\ud800" <= c <= "\udfff" for c in text)


def _not_text(text: str) -> str | None:
    """What makes ``text`` no text: a lone surrogate, or a NUL character (PostgreSQL cannot store one)."""
    if "\x00" in text:
        return NUL_MESSAGE
    if _has_surrogate(text):
        return "a lone surrogate escape (\\ud800-\\udfff) is not text"
    return None


#: A ``\uD800``-``\uDFFF`` escape: valid UTF-8 holds no surrogate, so only an escape can make one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
#: A ``\u0000`` escape: JSON holds a NUL character only as an escape.
_NUL_ESCAPE = re.compile(rb"\\u0000")


def _check(value: Any, *, strings: bool) -> None:
    """Depth, and (when ``strings``) lone surrogates in strings and keys; walked without recursion, visiting
    only containers' children."""
    if strings and isinstance(value, str) and (why := _not_text(value)):
        raise BodyError(why)
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())] if isinstance(value, (dict, list)) else []
    while stack:
        item, path = stack.pop()
        if len(path) >= MAX_DEPTH:
            raise BodyError(f"the body is nested more than {MAX_DEPTH} levels deep")
        for key, child in item.items() if isinstance(item, dict) else enumerate(item):
            if isinstance(child, (dict, list)):
                stack.append((child, (*path, str(key))))
            elif strings and isinstance(child, str) and (why := _not_text(child)):
                raise BodyError(why, _where((*path, str(key))))
            if strings and isinstance(key, str) and (why := _not_text(key)):
                raise BodyError(f"{why} (in a key)", _where(path))


def _where(path: tuple[str, ...]) -> str:
    return ".".join(path) or "body"


class _ParsedJSONRequest(Request):
    async def json(self) -> Any:
        if _BODY in self.scope:  # read and checked by the Gate
            return self.scope[_BODY]
        return await super().json()


class _ParsedJSONRoute(APIRoute):
    """FastAPI's route, handed the body the :class:`Gate` already read as strict JSON (no second parse)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(_ParsedJSONRequest(request.scope, request.receive))

        return handle


def _report(report: Any) -> dict[str, Any]:
    return {"inserted": report.inserted, "updated": report.updated, "unchanged": report.unchanged,
            "embedded": report.embedded, "seconds": round(report.seconds, 3),
            "ignored_keys": list(getattr(report, "ignored_keys", [])),
            "ignored_fields": dict(getattr(report, "ignored_fields", {}))}  # fmt: skip


def _feedback(row: Any) -> dict[str, Any]:
    at = datetime.fromtimestamp(row.at, timezone.utc).isoformat()
    return {"call_id": row.call_id, "caller": row.caller, "rating": row.rating, "comment": row.comment, "at": at}


def _version() -> str:
    from . import __version__

    return __version__


# -- ASGI pieces -------------------------------------------------------------------------------------
class Gate:
    """What every request passes before a route sees it, in this order:

    1. ``/v1/`` and ``/mcp`` need a valid API key, in one ``Authorization`` header: 401 before anything else (503
       if the store cannot say). Every answer of theirs, refusals included, carries ``Cache-Control: no-store`` and
       ``X-Content-Type-Options: nosniff``.
    2. A body over the limit of its path is refused with 413 before anything parses it: by
       ``Content-Length`` when given, else by counting the bytes as they arrive.
    3. The body of a JSON route is read as strict JSON (:func:`parse_json`): 422 otherwise. Bodies of
       ``/v1/`` routes are read as JSON whatever their ``Content-Type`` says (``curl -d`` sends a form type).

    Refusals of 2 and 3 are audited (the key is known by then)."""

    def __init__(self, app: ASGIApp, *, service: Service, limits: ServiceSettings) -> None:
        self.app = app
        self.service = service
        self.limits = limits

    def limit(self, path: str) -> int:
        if path.startswith("/v1/bundles"):
            return self.limits.max_bundle_bytes
        if path.startswith(("/v1/records", "/v1/memories", "/v1/documents")):
            return self.limits.max_item_bytes
        return self.limits.max_retrieve_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path.startswith("/v1/") or path == "/mcp" or path.startswith("/mcp/")):
            await self.app(scope, receive, send)
            return
        send = _private(send)
        raw = scope.get("headers", [])
        if sum(1 for k, _ in raw if k.lower() == b"authorization") > 1:  # proxies and frameworks disagree on which counts
            await _detail(401, "more than one Authorization header: send one")(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        try:  # one indexed read, on a worker thread: a database that hangs must not hold the event loop (and /healthz)
            who = await run_in_threadpool(self.service.authenticate, bearer_key(headers.get("authorization")))
        except Unauthorized as exc:
            await _detail(401, str(exc))(scope, receive, send)
            return
        except DossierError as exc:
            await _detail(503, f"the store is unavailable: {type(exc).__name__}")(scope, receive, send)
            return
        scope = {**scope, _PRINCIPAL: who}
        method = scope["method"]
        if method in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        route = f"{method} {path}" if path in JSON_ROUTES or path == "/mcp" else f"{method} ?"
        limit = self.limit(path)

        async def refuse(status: int, message: str, error: str, field: str | None = None) -> None:
            await run_in_threadpool(self.service.refused, who, error, front_end="http", route=route, status=status,
                                    field=field)  # fmt: skip
            await _detail(status, message, field)(scope, receive, send)

        too_large = f"the body is over the {_size(limit)} limit of this route"
        declared = headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            await refuse(413, too_large, "BodyTooLarge")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await refuse(413, too_large, "BodyTooLarge")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False
        if method == "POST" and path in JSON_ROUTES:
            try:
                # a big body (a bundle) is parsed off the event loop
                scope[_BODY] = parse_json(body) if len(body) < 1 << 16 else await run_in_threadpool(parse_json, body)
            except BodyError as exc:
                await refuse(422, f"invalid request: {exc.field}: {exc}", "InvalidBody", exc.field)
                return

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        if path.startswith("/v1/"):  # the API speaks JSON only: read any body as JSON
            kept = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-type"]
            scope["headers"] = [*kept, (b"content-type", b"application/json")]
        await self.app(scope, replay, send)


class _AuditedMCP:
    """The MCP SDK's endpoint, with each refusal of its transport audited (the JSON-RPC errors inside a session
    are audited by the server itself, :mod:`dossier.mcp`): a body that is not JSON (``ParseError``) or no
    JSON-RPC message, a missing ``Accept`` or protocol version (``InvalidMessage``), with the HTTP status."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status, body = 0, b""
        who = scope.get(_PRINCIPAL)

        async def watch(message: Message) -> None:
            nonlocal status, body
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and 400 <= status < 500 and isinstance(who, Principal):
                body += message.get("body", b"")[: 1 << 16]
                if not message.get("more_body", False):  # audited before it is answered, as every refusal
                    await run_in_threadpool(self.service.refused, who, _transport_error(body), front_end="mcp",
                                            route="POST /mcp", status=status)  # fmt: skip
            await send(message)

        await self.app(scope, receive, watch)


def _transport_error(body: bytes) -> str:
    """What the audit calls a refusal of the MCP transport, by the JSON-RPC error code of its body."""
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    return "ParseError" if code == -32700 else "InvalidMessage"


def _private(send: Send) -> Send:
    """``send`` with what every answer behind a key carries: no cache may keep it (``no-store``, unless the route
    set its own ``Cache-Control``), and no browser may read it as anything but its declared type."""

    async def private(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            names = {k.lower() for k, _ in headers}
            if b"cache-control" not in names:
                headers.append((b"cache-control", b"no-store"))
            if b"x-content-type-options" not in names:
                headers.append((b"x-content-type-options", b"nosniff"))
            message = {**message, "headers": headers}
        await send(message)

    return private


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"
