"""MCP end to end with the official client: over stdio (``dossier mcp`` as a subprocess) and over
streamable HTTP (``/mcp`` of the live server); the same items as the Python API, and org isolation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any, Awaitable, Callable, Iterator

import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from dossier.schema import RetrieveRequest
from dossier.service import FeedbackRequest

from .conftest import BRIEF, Live, item_keys, org_ids, principal, response_ids, table_text

TOOLS = {"retrieve_unified", "remember", "add_document", "feedback"}
Session = Callable[[Client], Awaitable[Any]]


def over_http(live: Live, caller: str, work: Session) -> Any:
    async def run() -> Any:
        async with create_mcp_http_client(headers=live.auth(caller)) as http:
            async with Client(streamable_http_client(f"{live.url}/mcp", http_client=http)) as client:
                return await work(client)

    return asyncio.run(run())


def over_stdio(live: Live, caller: str, work: Session) -> Any:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "dossier.cli", "mcp"],
        env={"DOSSIER_API_KEY": live.keys[caller], "DOSSIER_DATABASE_URL": f"sqlite:///{live.db}",
             **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}},  # the package under test, where it is set
    )  # fmt: skip

    async def run() -> Any:
        async with Client(params, read_timeout_seconds=120) as client:
            return await work(client)

    return asyncio.run(run())


def refusals(live: Live, n: int) -> list[dict[str, Any]]:
    """The shapes of the org's ``n`` newest audit rows."""
    rows = live.service.store.audit_rows(org="northwind", limit=n)
    return [{"error": r.error_type, "front_end": r.front_end, **json.loads(r.shape)} for r in rows]


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> Any:
    result = await client.call_tool(tool, arguments)
    text = result.content[0].text  # type: ignore[union-attr]
    return ("error", text) if result.is_error else json.loads(text)


@pytest.mark.parametrize("transport", [over_http, over_stdio], ids=["http", "stdio"])
def test_tools_are_listed_described_and_retrieve_matches_the_python_api(live: Live, transport: Any) -> None:
    async def work(client: Client) -> Any:
        tools = (await client.list_tools()).tools
        return tools, await call(client, "retrieve_unified", BRIEF)

    tools, response = transport(live, "ana", work)
    assert {t.name for t in tools} == TOOLS
    by_name = {t.name: t for t in tools}
    schema = by_name["retrieve_unified"].input_schema
    assert {"mode", "record", "message", "sources", "depth", "budget", "filters", "infer_filters", "augmentation",
            "fetch", "continuation", "synthesize", "deferred", "trace", "deadline_ms"} == set(schema["properties"])  # fmt: skip
    assert "org" not in schema["properties"] and schema.get("additionalProperties") is False
    assert all(len(t.description or "") > 200 for t in tools)
    expected = live.engine.retrieve(BRIEF, org="northwind", caller="ana")
    assert item_keys(response) == item_keys(expected)


@pytest.mark.parametrize("transport", [over_http, over_stdio], ids=["http", "stdio"])
def test_the_key_decides_the_org_and_an_org_argument_is_refused(live: Live, transport: Any) -> None:
    async def work(client: Client) -> Any:
        return (await call(client, "retrieve_unified", BRIEF),
                await call(client, "retrieve_unified", {**BRIEF, "org": "northwind"}),
                await call(client, "retrieve_unified", {"continuation": "never-issued"}))  # fmt: skip

    mine, forged, unknown = transport(live, "zoe", work)
    assert mine["record"]["id"] == "b-jane" and not response_ids(mine) & org_ids("northwind")
    assert forged[0] == "error" and "org" in forged[1]
    assert unknown[0] == "error" and "unknown or has expired" in unknown[1]


def test_remember_add_document_and_feedback_over_stdio(live: Live) -> None:
    async def work(client: Client) -> Any:
        memory = await call(client, "remember", {"record": {"email": "raj@acme.com"}, "text": "Raj moves to the Berlin office in July."})
        document = await call(client, "add_document", {"title": "Desk booking", "markdown": "## Rules\nBook a desk a day ahead.",
                                                        "tags": ["office"]})  # fmt: skip
        found = await call(client, "retrieve_unified", {"mode": "brief", "record": {"email": "raj@acme.com"},
                                                         "message": "Where is Raj moving?"})  # fmt: skip
        rated = await call(client, "feedback", {"call_id": found["call_id"], "rating": 5, "comment": "found the move"})
        return memory, document, found, rated

    memory, document, found, rated = over_stdio(live, "ana", work)
    assert memory["record_id"] == "rec-raj"
    assert document == {"id": "desk-booking", "title": "Desk booking", "sections": ["desk-booking--rules"]}
    assert memory["id"] in response_ids(found)
    assert rated["recorded"] is True
    row = live.service.store.get_audit(found["call_id"])
    assert row is not None and row.front_end == "mcp" and row.caller == "ana"


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
Ask = Callable[..., dict[str, Any]]


@contextlib.contextmanager
def stdio_lines(live: Live, key: str) -> Iterator[Ask]:
    """``dossier mcp`` as a subprocess, spoken to line by line: ``ask(line)`` sends one line (text, bytes or a
    message) and returns the one message that answers it (``answered=False`` for a notification)."""
    env = {**os.environ, "DOSSIER_API_KEY": key, "DOSSIER_DATABASE_URL": f"sqlite:///{live.db}"}
    process = subprocess.Popen([sys.executable, "-m", "dossier.cli", "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, env=env)  # fmt: skip
    assert process.stdin is not None and process.stdout is not None

    def ask(line: str | bytes | dict[str, Any], *, answered: bool = True) -> dict[str, Any]:
        raw = json.dumps(line).encode() if isinstance(line, dict) else line.encode() if isinstance(line, str) else line
        process.stdin.write(raw + b"\n")  # type: ignore[union-attr]
        process.stdin.flush()  # type: ignore[union-attr]
        if not answered:
            return {}
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, f"no answer to {raw[:100]!r} within 60 s"
        return json.loads(process.stdout.readline())  # type: ignore[union-attr]

    try:
        yield ask
    finally:
        process.stdin.close()
        if process.wait(timeout=60) != 0:
            raise AssertionError(f"dossier mcp exited with {process.returncode}")


def test_a_stdio_line_that_is_no_json_rpc_message_is_answered_with_its_error_and_the_session_goes_on(live: Live) -> None:
    """JSON-RPC 2.0: a line that is not JSON gets a parse error (-32700), JSON that is no message an invalid
    request (-32600), both with id null, instead of no answer; the requests after them are served."""
    with stdio_lines(live, live.keys["ana"]) as ask:
        assert ask("this is not json {") == {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32700, "message": "Parse error: the line is not JSON"}}
        assert ask(json.dumps({"hello": "world"}))["error"]["code"] == -32600
        answer = ask(INITIALIZE)
        assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"] == "dossier"
        ask({"jsonrpc": "2.0", "method": "notifications/initialized"}, answered=False)
        assert ask("[1, 2")["error"]["code"] == -32700  # in the session too
        listed = ask({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
        assert listed["id"] == 2 and {t["name"] for t in listed["result"]["tools"]} == TOOLS


def test_a_stdio_line_of_no_utf8_or_no_text_is_a_parse_error_that_names_what_is_wrong_and_is_audited(live: Live) -> None:
    """As ``/mcp`` over HTTP (-32700) and ``/v1`` (422): a line with bytes that are no UTF-8 is refused, not read with
    U+FFFD in their place (and stored so); a lone surrogate escape is JSON, but no text, and the error says that."""
    remember = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "remember", "arguments": {
        "record": {"email": "jane@acme.com"}, "text": "Jane collects TEXT stamps."}}}
    raw = json.dumps(remember).encode().replace(b"TEXT", b"\xff\xfe")
    lone = json.dumps(remember).replace("TEXT", "\\ud800")
    with stdio_lines(live, live.keys["ana"]) as ask:
        ask(INITIALIZE)
        ask({"jsonrpc": "2.0", "method": "notifications/initialized"}, answered=False)
        assert ask(raw) == {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32700, "message": "Parse error: the line is not valid UTF-8"}}
        [row] = refusals(live, 1)
        assert (row["error"], row["route"]) == ("ParseError", "stdio")
        assert ask(lone) == {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32700, "message": "Parse error: a lone surrogate escape (\\ud800-\\udfff) is not text"}}
        assert ask({"jsonrpc": "2.0", "id": 6, "method": "ping"}) == {"jsonrpc": "2.0", "id": 6, "result": {}}
    memories = live.engine.store.recent_memories(["rec-jane"], org="northwind", limit=1000)
    assert not any("\ufffd" in m.text or "stamps" in m.text for m in memories)


def test_over_stdio_every_request_checks_the_key_and_one_before_initialize_says_so(live: Live) -> None:
    row, key = live.service.create_key("northwind", "ana", name="revoked-in-test")
    list_tools = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    with stdio_lines(live, key) as ask:
        early = ask(list_tools)
        assert early["error"]["code"] == -32602 and "send initialize first" in early["error"]["message"]
        ask(INITIALIZE)
        ask({"jsonrpc": "2.0", "method": "notifications/initialized"}, answered=False)
        assert {t["name"] for t in ask(list_tools)["result"]["tools"]} == TOOLS
        live.service.revoke_key(row.id)
        refused = ask(list_tools)
        assert refused["error"]["code"] == -32600 and "unknown or revoked" in refused["error"]["message"]
        assert ask({"jsonrpc": "2.0", "id": 3, "method": "ping"})["result"] == {}


def test_feedback_on_another_orgs_call_is_refused_over_http_as_if_unknown(live: Live) -> None:
    call_id = live.service.retrieve(principal("ana"), BRIEF).call_id
    unknown = "f" * len(call_id)

    def feedback(on: str) -> Any:
        async def work(client: Client) -> Any:
            return await call(client, "feedback", {"call_id": on, "rating": 1})

        return over_http(live, "zoe", work)

    outcome, stand_in = feedback(call_id), feedback(unknown)
    assert outcome[0] == "error" and f"no call {call_id!r}" in outcome[1]
    assert outcome[1].replace(call_id, "ID") == stand_in[1].replace(unknown, "ID")  # nothing tells that it exists


WRONG_TYPES = [  # (tool, arguments, the argument refused, what it should be)
    ("retrieve_unified", {"message": "refund", "trace": "yes"}, "trace", "boolean"),
    ("retrieve_unified", {"message": "refund", "infer_filters": 1}, "infer_filters", "boolean"),
    ("retrieve_unified", {"message": "refund", "synthesize": "true"}, "synthesize", "boolean"),
    ("retrieve_unified", {"message": "refund", "deadline_ms": "5000"}, "deadline_ms", "integer"),
    ("retrieve_unified", {"message": "refund", "deadline_ms": 5000.0}, "deadline_ms", "integer"),
    ("retrieve_unified", {"message": 5}, "message", "string"),
    ("retrieve_unified", {"message": "refund", "fetch": '["doc-refund"]'}, "fetch", "list"),
    ("retrieve_unified", {"message": "refund", "record": '{"id": "rec-jane"}'}, "record", "dictionary"),
    ("feedback", {"call_id": "CALL", "rating": "5"}, "rating", "integer"),
    ("feedback", {"call_id": "CALL", "rating": True}, "rating", "integer"),
    ("feedback", {"call_id": 12, "rating": 5}, "call_id", "string"),
    ("remember", {"record": {"id": "rec-jane"}, "text": 7}, "text", "string"),
    ("add_document", {"markdown": "# T\n\nx", "tags": "office"}, "tags", "list"),
]


def test_tool_arguments_are_never_coerced(live: Live) -> None:
    """docs/retrieve.md, Strictness: `"yes"`, `1` and `"true"` are no booleans, `"5000"` and `5.0` no integers,
    a number no string and a string no list or object (not even one holding JSON); each is a tool error naming
    the argument, as any invalid argument is, and a string holding JSON is a string."""
    call_id = live.service.retrieve(principal("ana"), BRIEF).call_id

    async def work(client: Client) -> Any:
        refused = []
        for tool, arguments, _, _ in WRONG_TYPES:
            refused.append(await call(client, tool, {k: call_id if v == "CALL" else v for k, v in arguments.items()}))
        json_text = {"mode": "scout", "message": '["refund", "window"]', "trace": True}
        as_text = await call(client, "retrieve_unified", json_text)
        rated = await call(client, "feedback", {"call_id": call_id, "rating": 5})
        return refused, as_text, rated

    refused, as_text, rated = over_http(live, "ana", work)
    expected = [("error", f"Error executing tool {tool}: invalid arguments: {argument}: Input should be a valid {kind}")
                for tool, _, argument, kind in WRONG_TYPES]  # fmt: skip
    got = [(o[0], o[1][: len(e[1])]) if isinstance(o, tuple) else ("accepted", "") for o, e in zip(refused, expected)]
    assert got == expected
    assert as_text["mode"] == "scout" and as_text["trace"] is not None  # the JSON in a string is the message itself
    assert rated == {"call_id": call_id, "rating": 5, "recorded": True}


def test_mcp_over_http_without_a_key_is_401(live: Live) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    response = httpx.post(f"{live.url}/mcp", json=body, headers={"Accept": "application/json, text/event-stream"})
    assert response.status_code == 401


def test_a_tool_names_a_store_or_provider_failure_by_its_class_as_the_http_api_does() -> None:
    from dossier.errors import NotFound, ProviderError, StoreError, StoreUnavailable
    from dossier.mcp import public_message

    assert public_message(StoreError("PostgreSQL write failed at db.internal: index row size ...")) == (
        "the store is unavailable: StoreError")  # fmt: skip
    assert public_message(StoreUnavailable("cannot reach 10.0.0.7:5432")) == "the store is unavailable: StoreUnavailable"
    assert public_message(ProviderError("https://llm.internal/v1 said 500")) == "a model provider failed: ProviderError"
    assert "rec-nobody" in public_message(NotFound("no record with id 'rec-nobody' in this org"))


@pytest.mark.parametrize("transport", [over_http, over_stdio], ids=["http", "stdio"])
def test_an_unknown_tool_is_refused_quoting_a_little_of_its_name_and_audited(live: Live, transport: Any) -> None:
    name = "jane.secret@acme.com" + "x" * 10_000  # (the client sends it in a header too: under uvicorn's limit)

    async def work(client: Client) -> Any:
        return await call(client, name, {"message": "refund"})

    outcome = transport(live, "ana", work)
    assert outcome[0] == "error" and "Unknown tool: jane.secret" in outcome[1] and len(outcome[1]) < 400
    [row] = refusals(live, 1)
    assert row == {"error": "UnknownTool", "front_end": "mcp", "route": "tool ?", "status": None, "invalid_field": None}
    assert "jane.secret" not in table_text(live.db, "audit")


def test_json_rpc_errors_over_http_quote_a_little_of_the_input_and_are_audited(live: Live) -> None:
    """A body that is not JSON is the transport's 400 with JSON-RPC's parse error, an unknown method is JSON-RPC's
    -32601 naming at most 200 characters of it; both are audited (docs/service.md, Audit), without the text."""
    headers = {**live.auth("ana"), "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    unparsed = httpx.post(f"{live.url}/mcp", content=b"jane.secret@acme.com {", headers=headers)
    assert unparsed.status_code == 400 and unparsed.json()["error"]["code"] == -32700
    [row] = refusals(live, 1)
    assert row == {"error": "ParseError", "front_end": "mcp", "route": "POST /mcp", "status": 400, "invalid_field": None}
    method = "jane.secret@acme.com/" + "m" * 300_000
    unknown = httpx.post(f"{live.url}/mcp", json={"jsonrpc": "2.0", "id": 7, "method": method}, headers=headers)
    error = unknown.json()["error"]
    assert error["code"] == -32601 and len(unknown.text) < 1000
    [row] = refusals(live, 1)
    assert row == {"error": "MethodNotFound", "front_end": "mcp", "route": "method ?", "status": None, "invalid_field": None}
    assert "jane.secret" not in table_text(live.db, "audit")


def test_mcp_tool_calls_run_on_the_call_threads_of_v1_retrieve(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tool calls share ``/v1/retrieve``'s call threads (``Settings.service.call_threads``, 2), so a flood of them
    cannot take the threads that key checks and ``/healthz`` run on."""
    running, most, lock = 0, 0, threading.Lock()
    retrieve = live.service.retrieve

    def slow(*args: Any, **kwargs: Any) -> Any:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            time.sleep(0.3)
            return retrieve(*args, **kwargs)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(live.service, "retrieve", slow)

    async def work(client: Client) -> Any:
        async with httpx.AsyncClient(base_url=live.url, headers=live.auth("ana"), timeout=120) as http:
            v1 = [http.post("/v1/retrieve", json=BRIEF) for _ in range(3)]
            tools = [call(client, "retrieve_unified", BRIEF) for _ in range(5)]
            return await asyncio.gather(*v1, *tools)

    answers = over_http(live, "ana", work)
    assert [a.status_code for a in answers[:3]] == [200] * 3 and all("call_id" in a for a in answers[3:])
    assert most == live.engine.settings.service.call_threads == 2


SAME_ARGUMENTS = [  # retrieve arguments, and whether the API takes them (the library, HTTP and MCP alike)
    ({"message": "refund", "augmentation": "pricing"}, True),  # one rephrasing: a list of one
    ({"message": "refund", "budget": None}, False),
    ({"message": "refund", "sources": None}, False),
    ({"message": "refund", "augmentation": ["pricing"] * 11}, False),
    ({"message": "refund", "augmentation": ["p" * 4001]}, False),
    ({"continuation": "c" * 300}, False),
    ({"message": "refund", "fetch": [""]}, False),
]


def test_mcp_takes_exactly_the_retrieve_arguments_the_http_api_takes_and_publishes_their_schema(live: Live) -> None:
    async def work(client: Client) -> Any:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        return tools, [await call(client, "retrieve_unified", arguments) for arguments, _ in SAME_ARGUMENTS]

    tools, outcomes = over_http(live, "ana", work)
    for (arguments, taken), outcome in zip(SAME_ARGUMENTS, outcomes):
        response = httpx.post(f"{live.url}/v1/retrieve", json=arguments, headers=live.auth("ana"))
        assert (response.status_code == 200, not isinstance(outcome, tuple)) == (taken, taken), (arguments, outcome)
        if not taken:  # the same field named
            assert f"invalid arguments: {response.json()['detail']['field']}:" in outcome[1], (arguments, outcome)
    assert tools["retrieve_unified"].input_schema == RetrieveRequest.model_json_schema()
    assert tools["feedback"].input_schema == FeedbackRequest.model_json_schema()
    schema = tools["retrieve_unified"].input_schema
    assert schema["properties"]["continuation"]["anyOf"][0]["maxLength"] == 200
    assert schema["properties"]["augmentation"]["anyOf"][0]["maxItems"] == 10
