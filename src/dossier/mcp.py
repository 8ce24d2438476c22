"""The MCP front end: dossier as tools for agents, over stdio (``dossier mcp``) or streamable HTTP (``/mcp``).

Tools: ``retrieve_unified`` (the retrieve call; its arguments are the request fields of DESIGN.md
section 1), ``remember``, ``add_document`` and ``feedback``. The API key decides the org and the
caller: over stdio it is ``DOSSIER_API_KEY`` (checked again on every call, so revoking it takes effect at
once), over HTTP the ``Authorization: Bearer`` header of each request. No tool takes an org or a caller,
and arguments a tool does not define are refused.

This module is ``dossier.mcp``; the SDK is the top-level ``mcp`` package, which absolute imports (the
Python 3 default) always reach.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Callable, cast

import anyio
import anyio.to_thread

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError, ToolAnnotations
from pydantic import ConfigDict, Field, ValidationError

from .bundle import MEMORY_TEXT_MAX
from .errors import DossierError, http_status
from .identifiers import clip
from .schema import MAX_DEADLINE_MS, MIN_DEADLINE_MS, Budget, Depth, Filters, Mode, RecordRef, SourceFlags
from .service import MESSAGE_ECHO, FeedbackRequest, NewDocument, Principal, Service, _validate, bearer_key

PrincipalOf = Callable[[Context], Principal]

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


def build_server(service: Service, principal_of: PrincipalOf, *, front_end: str = "mcp") -> MCPServer:
    """An MCP server whose tools act for the principal that ``principal_of`` finds in each request."""

    def act(ctx: Context, tool: str, work: Callable[[Principal], Any]) -> Any:
        try:
            who = principal_of(ctx)
        except DossierError as exc:  # no valid key: no org to file the refusal under
            raise ToolError(clip(str(exc), MESSAGE_ECHO, quote=False)) from exc
        try:
            return work(who)
        except DossierError as exc:  # audited as the HTTP API audits it (by its class and field name only)
            service.refused_error(who, exc, front_end=front_end, route=f"tool {tool}")
            raise ToolError(public_message(exc)) from exc

    def retrieve_unified(
        ctx: Context,
        mode: Mode | None = None,
        record: RecordRef | None = None,
        message: Annotated[str | None, Field(max_length=4000)] = None,
        sources: SourceFlags | None = None,
        depth: Depth = "standard",
        budget: Budget | None = None,
        filters: Filters | None = None,
        infer_filters: bool = True,
        augmentation: list[str] | None = None,
        fetch: Annotated[list[str] | None, Field(max_length=20)] = None,
        continuation: str | None = None,
        synthesize: bool = False,
        deferred: bool = False,
        trace: bool = False,
        deadline_ms: Annotated[int | None, Field(ge=MIN_DEADLINE_MS, le=MAX_DEADLINE_MS)] = None,
    ) -> str:
        given = {
            "mode": mode, "record": record, "message": message, "sources": sources, "depth": depth, "budget": budget,
            "filters": filters, "infer_filters": infer_filters, "augmentation": augmentation, "fetch": fetch,
            "continuation": continuation, "synthesize": synthesize, "deferred": deferred, "trace": trace,
            "deadline_ms": deadline_ms,
        }  # fmt: skip
        request = {k: v.model_dump(exclude_none=True) if hasattr(v, "model_dump") else v
                   for k, v in given.items() if v is not None}  # fmt: skip
        response = act(ctx, "retrieve_unified", lambda p: service.retrieve(p, request, front_end=front_end))
        return response.model_dump_json()

    def remember(
        ctx: Context,
        record: RecordRef,
        text: Annotated[str, Field(min_length=1, max_length=MEMORY_TEXT_MAX)],
    ) -> str:
        memory = act(ctx, "remember", lambda p: service.remember(p, record, text))
        return json.dumps({"id": memory.id, "record_id": memory.record, "created_at": memory.created_at.isoformat()})

    def add_document(
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
        [document] = act(ctx, "add_document", lambda p: service.add_documents(p, [_validate(NewDocument, given)]))
        return json.dumps({"id": document.id, "title": document.title, "sections": [s.id for s in document.sections]})

    def feedback(
        ctx: Context,
        call_id: str,
        rating: Annotated[int, Field(ge=1, le=5)],
        comment: Annotated[str | None, Field(max_length=2000)] = None,
    ) -> str:
        row = act(ctx, "feedback", lambda p: service.feedback(p, FeedbackRequest(call_id=call_id, rating=rating, comment=comment)))
        return json.dumps({"call_id": row.call_id, "rating": row.rating, "recorded": True})

    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    writing = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
    tools = [
        _strict(Tool.from_function(retrieve_unified, title="Retrieve customer context", description=RETRIEVE,
                                   annotations=reading, structured_output=False)),
        _strict(Tool.from_function(remember, title="Remember a fact about a customer", description=REMEMBER,
                                   annotations=writing, structured_output=False)),
        _strict(Tool.from_function(add_document, title="Add an organisational document", description=ADD_DOCUMENT,
                                   annotations=writing, structured_output=False)),
        _strict(Tool.from_function(feedback, title="Rate a retrieval", description=FEEDBACK,
                                   annotations=writing, structured_output=False)),
    ]  # fmt: skip
    def refused(ctx: Context, tool: str, error: ValidationError) -> None:
        try:
            who = principal_of(ctx)
        except DossierError:
            return  # no valid key: no org to file the refusal under
        loc = error.errors()[0]["loc"] if error.errors() else ()
        service.refused(who, "InvalidArguments", front_end=front_end, route=f"tool {tool}",
                        field=".".join(str(p) for p in loc) or None)  # fmt: skip

    return _Server("dossier", refused, instructions=INSTRUCTIONS, tools=tools, log_level="WARNING")


class _Server(MCPServer):
    """The SDK's server, auditing calls whose arguments do not validate (by the field's name) and quoting at
    most a little of the arguments in the tool error."""

    def __init__(self, name: str, refused: Callable[[Context, str, ValidationError], None], **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._refused = refused

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ValidationError):
                raise
            if context is not None:
                await anyio.to_thread.run_sync(self._refused, context, name, cause)
            first = cause.errors()[0] if cause.errors() else {"loc": (), "msg": "invalid", "type": ""}
            where = clip(".".join(str(p) for p in first["loc"]) or "arguments", 200, quote=False)
            message = "unknown argument" if first["type"] == "extra_forbidden" else str(first["msg"])
            raise ToolError(f"Error executing tool {name}: invalid arguments: {where}: {clip(message, 200, quote=False)}") from cause

    async def run_stdio_async(self) -> None:
        """The SDK's stdio transport, but a line that is not a JSON-RPC message is answered with JSON-RPC's error
        (:func:`_unread`, id null) instead of not at all, so a client waiting on it learns at once what went wrong."""
        async with stdio_server() as (read_stream, write_stream):
            sifted_send, sifted = anyio.create_memory_object_stream[SessionMessage | Exception](0)

            async def sift() -> None:
                async with sifted_send:
                    async for item in read_stream:
                        if isinstance(item, Exception):
                            await write_stream.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=None, error=_unread(item))))
                        else:
                            await sifted_send.send(item)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(sift)
                await self._lowlevel_server.run(sifted, write_stream, self._lowlevel_server.create_initialization_options())
                tasks.cancel_scope.cancel()


def _unread(exc: Exception) -> ErrorData:
    """JSON-RPC's error for a line the transport could not read: -32700 (parse error) when it is not JSON,
    -32600 (invalid request) when it is JSON but no JSON-RPC 2.0 message."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if not errors or any(e["type"] == "json_invalid" for e in errors):
        return ErrorData(code=PARSE_ERROR, message="Parse error: the line is not JSON")
    return ErrorData(code=INVALID_REQUEST, message="Invalid Request: the line is JSON but not a JSON-RPC 2.0 message")


class _Exact(FuncMetadata):
    """The SDK's metadata without its pre-parse of JSON held in a string: a string argument stays a string
    (``'["a"]'`` is a message, not a list) and a string is no list or object."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        return data


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


def stdio_principal(service: Service, key: str | None) -> PrincipalOf:
    """Over stdio the key is the process's (``DOSSIER_API_KEY``), checked on every call."""
    service.authenticate(key)  # fail at start, not on the first call
    return lambda ctx: service.authenticate(key)


def http_principal(service: Service) -> PrincipalOf:
    """Over HTTP the key is each request's ``Authorization: Bearer`` header."""

    def principal_of(ctx: Context) -> Principal:
        headers = getattr(ctx.request_context.request, "headers", None) or {}  # the Starlette request
        return service.authenticate(bearer_key(headers.get("authorization")))

    return principal_of


def serve_stdio(service: Service, key: str | None) -> None:
    """Run the MCP server on stdin/stdout until the client closes it."""
    build_server(service, stdio_principal(service, key)).run("stdio")


__all__ = ["build_server", "http_principal", "serve_stdio", "stdio_principal"]
