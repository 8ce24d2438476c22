"""MCP end to end with the official client: over stdio (``dossier mcp`` as a subprocess) and over
streamable HTTP (``/mcp`` of the live server); the same items as the Python API, and org isolation."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
from typing import Any, Awaitable, Callable

import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from .conftest import BRIEF, Live, item_keys, org_ids, principal, response_ids

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
        env={"DOSSIER_API_KEY": live.keys[caller], "DOSSIER_DATABASE_URL": f"sqlite:///{live.db}"},
    )  # fmt: skip

    async def run() -> Any:
        async with Client(params, read_timeout_seconds=120) as client:
            return await work(client)

    return asyncio.run(run())


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


def test_a_stdio_line_that_is_no_json_rpc_message_is_answered_with_its_error_and_the_session_goes_on(live: Live) -> None:
    """JSON-RPC 2.0: a line that is not JSON gets a parse error (-32700), JSON that is no message an invalid
    request (-32600), both with id null, instead of no answer; the requests after them are served."""
    env = {**os.environ, "DOSSIER_API_KEY": live.keys["ana"], "DOSSIER_DATABASE_URL": f"sqlite:///{live.db}"}
    process = subprocess.Popen([sys.executable, "-m", "dossier.cli", "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, env=env, text=True)  # fmt: skip
    assert process.stdin is not None and process.stdout is not None

    def ask(line: str) -> dict[str, Any]:
        process.stdin.write(line + "\n")  # type: ignore[union-attr]
        process.stdin.flush()  # type: ignore[union-attr]
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, f"no answer to {line!r} within 60 s"
        return json.loads(process.stdout.readline())  # type: ignore[union-attr]

    try:
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
        assert ask("this is not json {") == {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32700, "message": "Parse error: the line is not JSON"}}
        assert ask(json.dumps({"hello": "world"}))["error"]["code"] == -32600
        answer = ask(json.dumps(initialize))
        assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"] == "dossier"
        process.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        assert ask("[1, 2")["error"]["code"] == -32700  # in the session too
        listed = ask(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}))
        assert listed["id"] == 2 and {t["name"] for t in listed["result"]["tools"]} == TOOLS
    finally:
        process.stdin.close()
        if process.wait(timeout=60) != 0:
            raise AssertionError(f"dossier mcp exited with {process.returncode}")


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
