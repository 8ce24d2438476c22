"""The HTTP front end (FastAPI): the retrieve call, call results, feedback, loading, and MCP at ``/mcp``.

``dossier serve`` runs :func:`app_from_env` under uvicorn. Every route but ``/healthz`` needs
``Authorization: Bearer <key>``; the key decides the org and the caller. Workers keep no state (keys,
sessions, audit, feedback and the ledger are in the store), so several can run side by side.

Statuses: 401 no or bad key; 403 a call, session or item of another org (or loading a bundle without the
admin role); 404 an unknown call of your own org; 413 a body over its limit (``Settings.service``: 1 MiB
for retrieve, feedback and MCP, 5 MiB for records, memories and documents, 20 MiB for bundles), refused
before it is parsed; 422 an invalid body, ``{"detail": {"field": ..., "message": ...}}``; 503 the store
is unavailable. Bad input never gets a 500.

This module is ``dossier.http``; absolute imports (the Python 3 default) still reach the standard library's
``http`` package.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Awaitable, Callable, Union

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import (
    BundleError,
    DossierError,
    Forbidden,
    InvalidRequest,
    NotFound,
    ProviderError,
    StoreError,
    Unauthorized,
    UsageError,
)
from .schema import RetrieveRequest, RetrieveResponse
from .service import FeedbackRequest, NewDocument, NewMemory, NewRecord, Principal, Service, bearer_key
from .settings import ServiceSettings

_UNION_TAG = re.compile(r"^(list\[.*\]|New[A-Z]\w*|function-\w+\[.*\])$")  # pydantic's tags of union members
_bearer = HTTPBearer(auto_error=False, description="An API key from `dossier keys create`.")


def create_app(service: Service, *, mcp: bool = True, allowed_hosts: list[str] | None = None) -> FastAPI:
    """The HTTP API over ``service``; with ``mcp``, MCP over streamable HTTP at ``/mcp`` too.

    ``allowed_hosts`` (``host:port`` patterns) turns on the MCP SDK's DNS-rebinding check of the
    ``Host`` header; ``dossier serve`` sets it when it listens on a loopback address.
    """
    limits = service.engine.settings.service
    mcp_server = None
    if mcp:
        from mcp.server.transport_security import TransportSecuritySettings

        from .mcp import build_server, http_principal

        mcp_server = build_server(service, http_principal(service))
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=bool(allowed_hosts),
            allowed_hosts=list(allowed_hosts or []),
            allowed_origins=[f"http://{h}" for h in allowed_hosts or []],
        )
        mcp_app = mcp_server.streamable_http_app(
            streamable_http_path="/mcp", stateless_http=True, json_response=True, transport_security=security,
            max_request_body_size=limits.max_retrieve_bytes,
        )  # fmt: skip

    calls = CallThreads(int(os.environ.get("DOSSIER_CALL_THREADS") or 0) or limits.call_threads)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(service.engine.embed_query, "warm up")  # load the model before the first call
        # What is alive now (the model, the app, the imported modules) lives as long as the worker: moved
        # out of the collector's sight, full collections no longer rescan it in the middle of a call.
        gc.collect()
        gc.freeze()
        if mcp_server is None:
            yield
            return
        async with mcp_server.session_manager.run():
            yield

    app = FastAPI(
        title="dossier",
        version=_version(),
        summary="One call about one customer record: properties, memories, document sections and graph edges, "
        "inside one byte budget.",
        lifespan=lifespan,
    )
    _errors(app)

    async def principal(credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Principal:
        # one indexed read of a small table: cheaper on the event loop than a hop to a worker thread
        return service.authenticate(credentials.credentials if credentials else None)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        """Liveness and store reachability (no key needed)."""
        service.engine.store.get_org(org="healthz")
        return {"status": "ok"}

    @app.post("/v1/retrieve", response_model=RetrieveResponse, tags=["retrieve"])
    async def retrieve(body: RetrieveRequest, who: Principal = Depends(principal)) -> Response:
        """The retrieve call of docs/retrieve.md, as the key's caller in the key's org (a body naming
        `org` or `caller` is refused). Charged to the org's ledger and audited (shape only)."""
        response = await calls.run(service.retrieve, who, body, front_end="http")
        return Response(response.model_dump_json(), media_type="application/json")

    @app.get("/v1/calls/{call_id}", tags=["retrieve"])
    def get_call(call_id: str, wait: float = 0.0, who: Principal = Depends(principal)) -> dict[str, Any]:
        """An earlier call of your org: its audited shape and, for your own `deferred` call, its
        `synthesis` (`pending: true` while it runs; `?wait=S` waits up to S seconds, at most 30)."""
        return service.call(who, call_id, wait=wait)

    @app.get("/v1/calls/{call_id}/feedback", tags=["feedback"])
    def get_feedback(call_id: str, who: Principal = Depends(principal)) -> list[dict[str, Any]]:
        """The ratings given to one of your org's calls."""
        return [_feedback(f) for f in service.feedback_for(who, call_id)]

    @app.post("/v1/feedback", status_code=201, tags=["feedback"])
    def post_feedback(body: FeedbackRequest, who: Principal = Depends(principal)) -> dict[str, Any]:
        """Rate one of your org's calls (1-5), with an optional comment."""
        return _feedback(service.feedback(who, body))

    @app.get("/v1/usage", tags=["service"])
    def usage(who: Principal = Depends(principal)) -> dict[str, Any]:
        """Your org's billing ledger, summed per billed item (units are documented in docs/service.md)."""
        lines = service.usage(who.org)
        return {
            "org": who.org,
            "items": [{"item": u.item, "calls": u.calls, "charged": u.charged, "refunded": u.refunded, "net": u.net}
                      for u in lines],  # fmt: skip
            "net": sum(u.net for u in lines),
        }

    @app.post("/v1/bundles", tags=["load"])
    async def post_bundle(request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
        """Load a bundle (docs/bundles.md) into your org: all of it or nothing, idempotent by id. Items
        may leave `org` out; one naming another org is refused. Needs the admin role."""
        body = await _json_body(request)
        return _report(await run_in_threadpool(service.load_bundle, who, body))

    @app.post("/v1/records", tags=["load"])
    def post_records(body: Union[NewRecord, list[NewRecord]], who: Principal = Depends(principal)) -> dict[str, Any]:
        """Add or update records (one, or a list) in your org."""
        return _report(service.add_records(who, body if isinstance(body, list) else [body]))

    @app.post("/v1/memories", tags=["load"])
    def post_memories(body: Union[NewMemory, list[NewMemory]], who: Principal = Depends(principal)) -> dict[str, Any]:
        """Add memories (one, or a list) to records of your org; `id` and `created_at` default to new and now."""
        memories = service.add_memories(who, body if isinstance(body, list) else [body])
        return {"memories": [{"id": m.id, "record_id": m.record, "created_at": m.created_at.isoformat()} for m in memories]}

    @app.post("/v1/documents", tags=["load"])
    def post_documents(body: Union[NewDocument, list[NewDocument]], who: Principal = Depends(principal)) -> dict[str, Any]:
        """Add or replace documents (one, or a list), given as sections or as markdown split at headings."""
        documents = service.add_documents(who, body if isinstance(body, list) else [body])
        return {"documents": [{"id": d.id, "title": d.title, "sections": [s.id for s in d.sections]} for d in documents]}

    if mcp_server is not None:
        for route in mcp_app.routes:
            if isinstance(route, Route):
                app.router.routes.append(Route(route.path, RequireKey(service, route.endpoint), methods=route.methods))
    app.add_middleware(BodyLimit, limits=limits)
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
    return create_app(Service(engine), allowed_hosts=hosts or None)


# -- errors ------------------------------------------------------------------------------------------
def _detail(status: int, message: str, field: str | None = None, **extra: Any) -> JSONResponse:
    detail: dict[str, Any] = {"message": message}
    if field is not None or status == 422:
        detail["field"] = field
    detail.update(extra)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        # a body that may be one item or a list: report the errors of the form that was sent
        as_list = isinstance(getattr(exc, "body", None), list)
        errors.sort(key=lambda e: (len(e.get("loc", ())) > 1 and str(e["loc"][1]).startswith("list[")) != as_list)
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid body", "type": "value_error"}
        loc = [str(p) for p in first.get("loc", ()) if not _UNION_TAG.match(str(p))]
        where = ".".join(loc[1:] if loc[:1] == ["body"] and len(loc) > 1 else loc) or "body"
        kind = first.get("type", "")
        if kind == "extra_forbidden":
            message = "unknown field"
        elif kind == "json_invalid":
            where, message = "body", "the body is not valid JSON"
        else:
            message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        return _detail(422, f"invalid request: {where}: {message}", where)

    @app.exception_handler(DossierError)
    async def dossier_error(_: Request, exc: DossierError) -> JSONResponse:
        if isinstance(exc, Unauthorized):
            return _detail(401, str(exc))
        if isinstance(exc, Forbidden):
            return _detail(403, str(exc))
        if isinstance(exc, NotFound):
            return _detail(404, str(exc))
        if isinstance(exc, BundleError):
            first = exc.problems[0] if exc.problems else None
            field = f"{first.kind}:{first.item_id}" if first and first.item_id else (first.kind if first else None)
            return _detail(422, str(exc), field, problems=[str(p) for p in exc.problems])
        if isinstance(exc, InvalidRequest):
            return _detail(422, str(exc), exc.field)
        if isinstance(exc, UsageError):
            return _detail(422, str(exc), None)
        if isinstance(exc, StoreError):
            return _detail(503, f"the store is unavailable: {type(exc).__name__}")
        if isinstance(exc, ProviderError):
            return _detail(502, f"a model provider failed: {type(exc).__name__}")
        return _detail(500, f"internal error: {type(exc).__name__}")

    @app.exception_handler(Exception)
    async def crash(_: Request, exc: Exception) -> JSONResponse:
        return _detail(500, f"internal error: {type(exc).__name__}")


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidRequest("the body is not valid JSON", field="body") from None


def _report(report: Any) -> dict[str, Any]:
    return {"inserted": report.inserted, "updated": report.updated, "unchanged": report.unchanged,
            "embedded": report.embedded, "seconds": round(report.seconds, 3)}  # fmt: skip


def _feedback(row: Any) -> dict[str, Any]:
    at = datetime.fromtimestamp(row.at, timezone.utc).isoformat()
    return {"call_id": row.call_id, "caller": row.caller, "rating": row.rating, "comment": row.comment, "at": at}


def _version() -> str:
    from . import __version__

    return __version__


# -- ASGI pieces -------------------------------------------------------------------------------------
class CallThreads:
    """Retrieve calls run on at most ``size`` worker threads per process: they are CPU-bound and share one
    GIL, so more threads only add switching (the query embedding releases the GIL, so two overlap well)."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._limiter: Any = None

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        import functools

        import anyio.to_thread

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.size)
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self._limiter)


class RequireKey:
    """An ASGI app (the MCP endpoint) behind the same API keys as the rest: 401 before any MCP processing."""

    def __init__(self, service: Service, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.service = service
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            await run_in_threadpool(self.service.authenticate, bearer_key(headers.get("authorization")))
        except Unauthorized as exc:
            await _detail(401, str(exc))(scope, receive, send)
            return
        except DossierError as exc:
            await _detail(503, f"the store is unavailable: {type(exc).__name__}")(scope, receive, send)
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuse request bodies over the limit of their path with 413, before anything parses them: by
    ``Content-Length`` when given, else by counting the bytes as they arrive. Bodies of ``/v1/`` routes
    are read as JSON whatever their ``Content-Type`` says (``curl -d`` sends a form type)."""

    def __init__(self, app: ASGIApp, *, limits: ServiceSettings) -> None:
        self.app = app
        self.limits = limits

    def limit(self, path: str) -> int:
        if path.startswith("/v1/bundles"):
            return self.limits.max_bundle_bytes
        if path.startswith(("/v1/records", "/v1/memories", "/v1/documents")):
            return self.limits.max_item_bytes
        return self.limits.max_retrieve_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope["path"])
        too_large = _detail(413, f"the body is over the {_size(limit)} limit of {scope['path']}")
        for name, value in scope.get("headers", []):
            if name.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _detail(400, "bad Content-Length")(scope, receive, send)
                    return
                if declared > limit:
                    await too_large(scope, receive, send)
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
                await too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        if scope["path"].startswith("/v1/"):  # the API speaks JSON only: read any body as JSON
            headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, replay, send)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"
