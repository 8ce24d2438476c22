"""The MCP front end: dossier as tools for agents, over stdio (``dossier mcp``) or streamable HTTP (``/mcp``).

Tools: ``retrieve_unified`` (the retrieve call; its arguments are the request fields of DESIGN.md
section 1), ``remember``, ``add_document`` and ``feedback``. The API key decides the org and the
caller: over stdio it is ``DOSSIER_API_KEY`` (checked again on every request, so revoking it takes effect at
once), over HTTP the ``Authorization: Bearer`` header of each request. No tool takes an org or a caller,
and arguments a tool does not define are refused; ``retrieve_unified`` and ``feedback`` read their arguments
with the models that read the HTTP API's bodies. Tool calls run on the service's call threads
(:class:`~dossier.service.CallThreads`), which ``/v1/retrieve`` shares.

This module is ``dossier.mcp``; the SDK is the top-level ``mcp`` package, which absolute imports (the
Python 3 default) always reach.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Annotated, Any, Callable, cast

import anyio
import anyio.to_thread

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    ToolAnnotations,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from .bundle import MEMORY_TEXT_MAX
from .errors import DossierError, http_status
from .identifiers import clip
from .schema import RecordRef, RetrieveRequest
from .service import (
    FIELD_ECHO,
    MESSAGE_ECHO,
    CallThreads,
    FeedbackRequest,
    NewDocument,
    Principal,
    Service,
    _validate,
    bearer_key,
)

#: Who a request acts for, from the transport's request (the Starlette request over HTTP, None over stdio).
PrincipalOf = Callable[[Any], Principal]

INSTRUCTIONS = """\
dossier is the organisation's memory about its customers. Before you answer a question about a customer \
or act on one (reply, quote, escalate, renew), call retrieve_unified once with the customer's identifier \
and your question: it returns, inside one byte budget, the customer's properties, memories of past \
interactions, the section of the policy that applies, and who they are connected to. Cite what you use \
by its id. When you learn a durable fact in the conversation, save it with remember. Rate results with \
feedback so the retrieval can be tuned."""

RETRIEVE = """\
Retrieve what the organisation knows about one customer record (or about the whole organisation) to \
answer one question, inside one byte budget. Returns JSON: `record` (who it resolved to; `tombstone: true` \
means the record is being deleted and nothing may be used), `sources.<properties|memories|documents|graph>` \
with `status` (ok, empty, error, skipped), `items` (each with the id it was stored under: memories `id`, \
document sections `document_id`/`section_id` with `confidence` high/low/supplementary, properties \
`record_id`/`name`, edges `id`/`src`/`dst`/`type`), `dropped` (items that did not fit), `partial` (true when \
something degraded: say so if you rely on it), `call_id` (for feedback) and `continuation`.

How to call it:
- Name the customer with `record`: exactly one of id, email, phone, website, profile_url. Leave it out \
for organisation-wide questions (policies, playbooks).
- Put the actual question in `message`; it decides which memories and document sections come back.
- `mode`: "brief" (everything: properties, memories, documents, graph; best before acting on a customer), \
"scout" (properties, memories, documents), "fetch" (read the documents listed in `fetch`, up to 20 ids), \
"filter" (documents matching `filters` {doc_types, tags}), "expand" (the next page of an earlier result: \
pass only `continuation`). Left out, it is inferred.
- If `continuation` is not null, more items did not fit: call again with {"continuation": "<id>"} to get \
the next page (it expires after an hour unused).
- `depth`: "fast" (vector search only), "standard" (default: vector + full text), "deep" (model-assisted \
when the server has a model). `budget.totalTokens` is the size of the packed context in bytes (default \
8000, at most 50000).
- `sources` switches a source on or off ({"graph": false}); `synthesize: true` asks for a cited answer \
when the server has a chat model.
- `deadline_ms` (default 10000, at most 120000; the server may lower it) bounds the call: model steps \
that cannot finish in time fall back and `route.deadline` names them; an answer not ready in time is \
null with its error, and the context comes back complete.
Your organisation and identity come from your API key; never pass them."""

REMEMBER = """\
Save one durable fact learned in this interaction as a memory on a customer record, so that later \
retrieve_unified calls (yours and other agents') find it. Name the record with exactly one of id, email, \
phone, website, profile_url (merged records are followed to the surviving one). Write `text` as one \
self-contained sentence a colleague could use without this conversation: who, what, and when (for example \
"Jane agreed to a 12% discount on the 40-seat renewal, pending finance sign-off, on 3 March"). One fact per \
memory; do not store secrets or payment data. Returns the new memory's id and the record it was saved on."""

ADD_DOCUMENT = """\
Add (or replace, by id) an organisational document: a policy, guideline, playbook or FAQ, written in \
markdown. It is split into sections at its headings, and each section becomes retrievable on its own by \
retrieve_unified, so give every section a heading that says what it covers. `title` names the document \
(or start the markdown with "# Title"); `doc_type` (e.g. policy, guideline, playbook) and `tags` let \
callers filter; `visible_to_roles` limits who may see it (leave it out for the whole organisation). \
Returns the document id and its section ids."""

FEEDBACK = """\
Rate a retrieve_unified result by its `call_id`: 1 = useless or wrong, 3 = partly useful, 5 = exactly \
what was needed. Add a short `comment` saying what was missing, wrong or superfluous (no customer data \
needed). Ratings are used to measure and tune retrieval."""


def build_server(service: Service, principal_of: PrincipalOf, *, front_end: str = "mcp",
                 calls: CallThreads | None = None) -> MCPServer:  # fmt: skip
    """An MCP server whose tools act for the principal that ``principal_of`` finds in each request. Every tool
    call runs on ``calls`` (the threads ``/v1/retrieve`` runs on, when the HTTP app passes its own)."""
    calls = calls or CallThreads(service.engine.settings.service.call_threads)

    def act(request: Any, tool: str, work: Callable[[Principal], Any]) -> Any:
        try:
            who = principal_of(request)
        except DossierError as exc:  # no valid key: no org to file the refusal under
            raise ToolError(clip(str(exc), MESSAGE_ECHO, quote=False)) from exc
        try:
            return work(who)
        except DossierError as exc:  # audited as the HTTP API audits it (by its class and field name only)
            service.refused_error(who, exc, front_end=front_end, route=f"tool {tool}")
            raise ToolError(public_message(exc)) from exc

    async def run(ctx: Context, tool: str, work: Callable[[Principal], Any]) -> Any:
        """The key check and the work, on one of the call threads (never anyio's default pool, which key
        checks and ``/healthz`` share)."""
        return await calls.run(act, ctx.request_context.request, tool, work)

    async def retrieve_unified(ctx: Context, request: RetrieveRequest) -> str:
        def work(p: Principal) -> str:
            return service.retrieve(p, request, front_end=front_end).model_dump_json()

        return cast(str, await run(ctx, "retrieve_unified", work))

    async def remember(
        ctx: Context,
        record: RecordRef,
        text: Annotated[str, Field(min_length=1, max_length=MEMORY_TEXT_MAX)],
    ) -> str:
        def work(p: Principal) -> str:
            memory = service.remember(p, record, text)
            return json.dumps({"id": memory.id, "record_id": memory.record, "created_at": memory.created_at.isoformat()})

        return cast(str, await run(ctx, "remember", work))

    async def add_document(
        ctx: Context,
        markdown: Annotated[str, Field(min_length=1)],
        title: str | None = None,
        id: str | None = None,  # noqa: A002 - the document id, as in bundles
        doc_type: str = "guideline",
        tags: list[str] | None = None,
        visible_to_roles: list[str] | None = None,
    ) -> str:
        given = {"markdown": markdown, "title": title, "id": id, "doc_type": doc_type, "tags": tags or [],
                 "visible_to_roles": visible_to_roles}  # fmt: skip

        def work(p: Principal) -> str:
            [document] = service.add_documents(p, [_validate(NewDocument, given)])
            sections = [s.id for s in document.sections]
            return json.dumps({"id": document.id, "title": document.title, "sections": sections})

        return cast(str, await run(ctx, "add_document", work))

    async def feedback(ctx: Context, request: FeedbackRequest) -> str:
        def work(p: Principal) -> str:
            row = service.feedback(p, request)
            return json.dumps({"call_id": row.call_id, "rating": row.rating, "recorded": True})

        return cast(str, await run(ctx, "feedback", work))

    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    writing = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
    tools = [
        _whole(Tool.from_function(retrieve_unified, title="Retrieve customer context", description=RETRIEVE,
                                  annotations=reading, structured_output=False), RetrieveRequest),
        _strict(Tool.from_function(remember, title="Remember a fact about a customer", description=REMEMBER,
                                   annotations=writing, structured_output=False)),
        _strict(Tool.from_function(add_document, title="Add an organisational document", description=ADD_DOCUMENT,
                                   annotations=writing, structured_output=False)),
        _whole(Tool.from_function(feedback, title="Rate a retrieval", description=FEEDBACK,
                                  annotations=writing, structured_output=False), FeedbackRequest),
    ]  # fmt: skip

    def refused(request: Any, route: str, error: str, field: str | None = None) -> None:
        """Audit a refusal by its shape (:meth:`Service.refused`), when the request's key is valid."""
        try:
            who = principal_of(request)
        except DossierError:
            return  # no valid key: no org to file the refusal under
        service.refused(who, error, front_end=front_end, route=route, field=field)

    return _Server("dossier", refused, principal_of, instructions=INSTRUCTIONS, tools=tools, log_level="WARNING")


#: What the audit calls each JSON-RPC error a server answers (the name of the error class, as for HTTP refusals).
ERROR_NAMES = {PARSE_ERROR: "ParseError", INVALID_REQUEST: "InvalidMessage", METHOD_NOT_FOUND: "MethodNotFound",
               INVALID_PARAMS: "InvalidParams"}  # fmt: skip
#: Methods served without a valid key: the handshake and its liveness check.
KEYLESS = frozenset({"initialize", "ping"})
#: The SDK's error, with no data, for a request sent before ``initialize`` (its "pinned compat" shape).
PRE_INITIALIZE = "Invalid request parameters"
#: Audits a refusal: the transport's request, the route, the error's name, the offending field.
Refused = Callable[[Any, str, str, str | None], None]


class _Server(MCPServer):
    """The SDK's server, with every refusal audited (by its shape) and quoting at most a little of the input:
    tool calls whose arguments do not validate (by the field's name) or that name no tool, JSON-RPC errors
    (an unknown method, invalid parameters, a request before ``initialize``), and over stdio the lines that
    are no JSON-RPC message. Every request but the handshake checks the key again (a tool call in its tool)."""

    def __init__(self, name: str, refused: Refused, principal_of: PrincipalOf, **kwargs: Any) -> None:
        super().__init__(name, middleware=[self._guard], **kwargs)
        self._refused = refused
        self._principal_of = principal_of

    async def _guard(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.request_id is None:  # a notification: answered by nothing, so refused by nothing
            return await call_next(ctx)
        if ctx.method not in KEYLESS and ctx.method != "tools/call":  # a tool call checks the key in its tool
            try:
                await anyio.to_thread.run_sync(self._principal_of, ctx.request)
            except DossierError as exc:  # over HTTP the Gate answered 401 before; over stdio a key revoked since
                message = clip(f"Unauthorized: {exc}", MESSAGE_ECHO, quote=False)
                raise MCPError(code=INVALID_REQUEST, message=message) from exc
        try:
            return await call_next(ctx)
        except MCPError as exc:
            error = exc.error
            known = ctx.method in KEYLESS or self._lowlevel_server.get_request_handler(ctx.method) is not None
            route = f"method {ctx.method if known else '?'}"  # an unknown method's name is the caller's text
            name = ERROR_NAMES.get(error.code, "JSONRPCError")
            message, data = error.message, error.data
            if (error.code, message, data) == (INVALID_PARAMS, PRE_INITIALIZE, "") and ctx.session.client_params is None:
                name, message = "NotInitialized", f"{message}: the session is not initialized (send initialize first)"
            await anyio.to_thread.run_sync(self._refused, ctx.request, route, name, None)
            if isinstance(data, str):
                data = clip(data, FIELD_ECHO, quote=False)
            raise MCPError(code=error.code, message=clip(message, MESSAGE_ECHO, quote=False), data=data) from exc
        except ValidationError:  # parameters that are no such request's (answered by the SDK as invalid parameters)
            await anyio.to_thread.run_sync(self._refused, ctx.request, f"method {ctx.method}", "InvalidParams", None)
            raise

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None) -> Any:
        request = context.request_context.request if context is not None else None
        if self._tool_manager.get_tool(name) is None:
            # audited under "tool ?": its name is the caller's text
            await anyio.to_thread.run_sync(self._refused, request, "tool ?", "UnknownTool", None)
            raise ToolError(f"Unknown tool: {clip(name, FIELD_ECHO, quote=False)}")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ValidationError):
                raise
            first = cause.errors()[0] if cause.errors() else {"loc": (), "msg": "invalid", "type": ""}
            field = ".".join(str(p) for p in first["loc"])
            await anyio.to_thread.run_sync(self._refused, request, f"tool {name}", "InvalidArguments", field or None)
            where = clip(field or "arguments", FIELD_ECHO, quote=False)
            message = "unknown argument" if first["type"] == "extra_forbidden" else str(first["msg"])
            raise ToolError(f"Error executing tool {name}: invalid arguments: {where}: {clip(message, 200, quote=False)}") from cause

    async def run_stdio_async(self) -> None:
        """The SDK's stdio transport, but reading stdin as strict UTF-8 (the SDK's replaces what does not decode,
        so a line with raw ``\\xff`` bytes would be stored with U+FFFD), and answering a line that is no JSON-RPC
        message with JSON-RPC's error (:func:`_unread`, id null) instead of not at all, so a client waiting on it
        learns at once what went wrong; the refusal is audited under the route ``stdio``."""
        # Bytes that are no UTF-8 stay in the line as lone surrogates, which no JSON parse accepts (nor any tool).
        sys.stdin.reconfigure(encoding="utf-8", errors="surrogateescape")  # type: ignore[union-attr]
        async with stdio_server(stdin=anyio.wrap_file(sys.stdin)) as (read_stream, write_stream):
            sifted_send, sifted = anyio.create_memory_object_stream[SessionMessage | Exception](0)

            async def sift() -> None:
                async with sifted_send:
                    async for item in read_stream:
                        if isinstance(item, Exception):
                            error = _unread(item)
                            await anyio.to_thread.run_sync(self._refused, None, "stdio", ERROR_NAMES[error.code], None)
                            await write_stream.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=None, error=error)))
                        else:
                            await sifted_send.send(item)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(sift)
                await self._lowlevel_server.run(sifted, write_stream, self._lowlevel_server.create_initialization_options())
                tasks.cancel_scope.cancel()


def _unread(exc: Exception) -> ErrorData:
    """JSON-RPC's error for a line the transport could not read: -32700 (parse error) when it is no UTF-8, holds a
    lone surrogate escape (``"\\ud800"``: JSON, but no text) or is not JSON; -32600 (invalid request) when it is
    JSON but no JSON-RPC 2.0 message."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if any(e["type"] == "string_unicode" for e in errors):  # the bytes the reader kept as lone surrogates
        return ErrorData(code=PARSE_ERROR, message="Parse error: the line is not valid UTF-8")
    if not errors or any(e["type"] == "json_invalid" for e in errors):
        line = errors[0].get("input") if errors else None
        if isinstance(line, str) and _SURROGATE_ESCAPE.search(line) and _is_json(line):
            return ErrorData(code=PARSE_ERROR, message=f"Parse error: {LONE_SURROGATE}")
        return ErrorData(code=PARSE_ERROR, message="Parse error: the line is not JSON")
    return ErrorData(code=INVALID_REQUEST, message="Invalid Request: the line is JSON but not a JSON-RPC 2.0 message")


LONE_SURROGATE = "a lone surrogate escape (\\ud800-\\udfff) is not text"
#: A ``\\uD800``-``\\uDFFF`` escape (a pair is two of them).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _is_json(line: str) -> bool:
    """Whether Python's parser, which (unlike the SDK's) takes lone surrogate escapes, reads ``line`` as JSON."""
    try:
        json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # nested deeper than Python's parser goes: not read as text either
        return False
    return True


def _no_constant(name: str) -> Any:
    raise ValueError(name)


class _Exact(FuncMetadata):
    """The SDK's metadata without its pre-parse of JSON held in a string: a string argument stays a string
    (``'["a"]'`` is a message, not a list) and a string is no list or object."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        return data


class _Whole(_Exact):
    """Arguments read as one request body (``model``), by the model the HTTP API reads that body with, and
    handed to the tool whole as its ``request``: one validation for both front ends."""

    model: Annotated[type[BaseModel], WithJsonSchema(None)]

    def validate_arguments(self, arguments_to_validate: dict[str, Any]) -> dict[str, Any]:
        return {"request": self.model.model_validate(arguments_to_validate)}


def public_message(exc: DossierError) -> str:
    """What a tool's caller is told of an error, as the HTTP API tells it: a store's or a model provider's own
    message can name hosts, paths or SQL (it goes to the server's log), so those are named by their class."""
    status = http_status(exc)
    if status == 503:
        return f"the store is unavailable: {type(exc).__name__}"
    if status == 502:
        return f"a model provider failed: {type(exc).__name__}"
    if status == 500:
        return f"internal error: {type(exc).__name__}"
    return clip(str(exc), MESSAGE_ECHO, quote=False)


def _strict(tool: Tool) -> Tool:
    """Refuse arguments the tool does not define (an ``org`` or ``caller`` above all), and coerce none
    (docs/retrieve.md, Strictness: ``"true"`` and ``1`` are no booleans, ``"5"`` is no integer)."""
    meta = tool.fn_metadata
    base = meta.arg_model
    config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)
    strict = cast("type[ArgModelBase]", type(base.__name__, (base,), {"model_config": config}))
    fields = {name: getattr(meta, name) for name in FuncMetadata.model_fields}
    tool.fn_metadata = _Exact(**{**fields, "arg_model": strict})
    tool.parameters = strict.model_json_schema(by_alias=True)
    return tool


def _whole(tool: Tool, model: type[BaseModel]) -> Tool:
    """A tool whose arguments are one request body: validated by ``model``, as the HTTP API validates it (unknown
    arguments refused, nothing coerced), and published as ``model``'s JSON schema (no looser than what it takes)."""
    fields = {name: getattr(tool.fn_metadata, name) for name in FuncMetadata.model_fields}
    tool.fn_metadata = _Whole(**fields, model=model)
    tool.parameters = model.model_json_schema(by_alias=True)
    return tool


def stdio_principal(service: Service, key: str | None) -> PrincipalOf:
    """Over stdio the key is the process's (``DOSSIER_API_KEY``), checked on every call."""
    service.authenticate(key)  # fail at start, not on the first call
    return lambda request: service.authenticate(key)


def http_principal(service: Service) -> PrincipalOf:
    """Over HTTP the key is each request's ``Authorization: Bearer`` header."""

    def principal_of(request: Any) -> Principal:
        headers = getattr(request, "headers", None) or {}  # the Starlette request
        return service.authenticate(bearer_key(headers.get("authorization")))

    return principal_of


def serve_stdio(service: Service, key: str | None) -> None:
    """Run the MCP server on stdin/stdout until the client closes it."""
    build_server(service, stdio_principal(service, key)).run("stdio")


__all__ = ["build_server", "http_principal", "serve_stdio", "stdio_principal"]
