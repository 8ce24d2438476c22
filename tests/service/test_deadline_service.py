"""One deadline per call over HTTP and MCP (both transports), against a scripted chat model on localhost that
answers after 30 s or with garbage: a deep call with synthesis comes back within its deadline plus one second
(the default deadline and a custom one), the context complete and every downgrade named; a longer deadline
than the service allows is lowered and says so; an answer that comes after the deadline is fetched by call id.

The hanging model takes 30 s, so asserting that a call came back within 10 + 1 s (or 1.5 + 1 s) cannot flake."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any, Iterator

import httpx
import pytest

pytest.importorskip("openai")

from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

from dossier.providers.circuit import reset_breakers  # noqa: E402
from tests.scripted_llm import Reply, ScriptedLLM, scripted, scripted_server  # noqa: E402, F401 - fixtures

from .conftest import BRIEF, Live, item_keys  # noqa: E402

SLOW = 30.0
STEPS = ("filters", "rephrase", "select", "synthesize")
DEEP = {**BRIEF, "depth": "deep", "synthesize": True}
HANG = Reply({}, delay=SLOW)
GARBAGE = Reply("<html>502 Bad Gateway</html>")
ANSWER = {"answer": "Up to 15% [D1].", "reasoning": "", "confidence": 0.7, "sources_used": ["D1"]}


@pytest.fixture
def model(live: Live, scripted: ScriptedLLM) -> Iterator[ScriptedLLM]:
    """The live server's engine asks the scripted model (with the shipped step timeouts)."""
    reset_breakers()
    live.engine.use_llm(scripted.llm())
    try:
        yield scripted
    finally:
        live.engine.use_llm(None)
        reset_breakers()


def script(scripted: ScriptedLLM, reply: Reply) -> None:
    for step in STEPS:
        scripted.on(step, reply)


def post(live: Live, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    with httpx.Client(base_url=live.url, timeout=2 * SLOW) as http:
        started = time.monotonic()
        response = http.post("/v1/retrieve", json=body, headers=live.auth("ana"))
        return response, time.monotonic() - started


def assert_downgrades_named(response: dict[str, Any], *, circuit_opened: bool = False) -> None:
    documents, understand = response["route"]["documents"], response["route"]["understand"]
    assert (documents["effective_depth"], documents["fallback_reason"]) == ("standard", "deep_timeout")
    assert set(documents["detail"]["deep_fallbacks"]) == {"filters", "rephrase", "select"}
    assert set(understand["detail"]["deep_fallbacks"]) == {"filters", "rephrase"}
    assert response["partial"] is True
    synthesis = response["synthesis"]
    assert synthesis["answer"] is None and "timed out" in synthesis["error"]
    assert response["route"]["synthesize"]["fallback_reason"] == "synthesis_timeout"
    steps = response["route"]["deadline"]["detail"]["steps"]
    assert set(steps) == set(STEPS)
    if circuit_opened:  # three timeouts in a row, each given over a second: synthesis was not asked
        assert steps["synthesize"]["outcome"] == "circuit_open" and "circuit" in synthesis["error"]
        assert set(response["route"]["deadline"]["detail"]["missed"]) == {"filters", "rephrase", "select"}
        circuit = next(iter(response["route"]["model"]["detail"]["circuit"].values()))
        assert circuit["state"] == "open" and circuit["timeouts_in_a_row"] == 3
    else:
        assert set(response["route"]["deadline"]["detail"]["missed"]) == set(STEPS)


def test_http_default_deadline(live: Live, model: ScriptedLLM) -> None:
    script(model, GARBAGE)
    fallback, seconds = post(live, DEEP)
    assert fallback.status_code == 200 and seconds < 10 + 1
    assert fallback.json()["route"]["documents"]["fallback_reason"] == "deep_error"
    script(model, HANG)
    asked = len(model.bodies("synthesize"))
    response, seconds = post(live, DEEP)
    assert response.status_code == 200 and seconds < 10 + 1
    body = response.json()
    assert (body["route"]["deadline"]["detail"]["deadline_ms"], body["route"]["deadline"]["detail"]["source"]) == (10_000, "default")
    assert item_keys(body) == item_keys(fallback.json()) and body["sources"]["documents"]["items"]
    assert_downgrades_named(body, circuit_opened=True)
    assert len(model.bodies("synthesize")) == asked  # the circuit was open: synthesis was not sent


def test_http_custom_deadline(live: Live, model: ScriptedLLM) -> None:
    script(model, GARBAGE)
    fallback, _ = post(live, {**DEEP, "deadline_ms": 1500})
    script(model, HANG)
    response, seconds = post(live, {**DEEP, "deadline_ms": 1500})
    assert response.status_code == 200 and seconds < 1.5 + 1
    body = response.json()
    assert body["route"]["deadline"]["detail"]["deadline_ms"] == 1500
    assert item_keys(body) == item_keys(fallback.json()) and body["sources"]["documents"]["items"]
    assert_downgrades_named(body)


def test_the_service_lowers_a_longer_deadline_and_refuses_one_out_of_range(live: Live, model: ScriptedLLM) -> None:
    script(model, GARBAGE)
    response, _ = post(live, {**DEEP, "deadline_ms": 60_000})
    detail = response.json()["route"]["deadline"]["detail"]
    assert (detail["deadline_ms"], detail["requested_ms"]) == (30_000, 60_000)  # Settings.service.max_deadline_ms
    for value in (120_001, 99, "2000"):
        refused, _ = post(live, {**DEEP, "deadline_ms": value})
        assert refused.status_code == 422 and refused.json()["detail"]["field"] == "deadline_ms"


def test_an_answer_after_the_deadline_is_fetched_by_call_id(live: Live, model: ScriptedLLM) -> None:
    model.on("synthesize", Reply(ANSWER, delay=3.0))  # the other steps answer at once
    response, seconds = post(live, {**DEEP, "deadline_ms": 2500})
    body = response.json()
    assert seconds < 2.5 + 1 and body["synthesis"]["answer"] is None and body["synthesis"]["pending"] is True
    with httpx.Client(base_url=live.url, timeout=2 * SLOW) as http:
        done = http.get(f"/v1/calls/{body['call_id']}", params={"wait": SLOW / 2}, headers=live.auth("ana")).json()
        other = http.get(f"/v1/calls/{body['call_id']}", headers=live.auth("ben"))  # same org, another caller: unknown
        org_admin = http.get(f"/v1/calls/{body['call_id']}", headers=live.auth("admin")).json()  # the shape, not the answer
    assert done["synthesis"]["answer"] == "Up to 15% [D1]." and not done["synthesis"]["pending"]
    shape = done["summary"]["shape"]
    assert shape["synthesis_background"] is True and shape["deadline_missed"] == ["synthesize"] and shape["deadline_ms"] == 2500
    assert other.status_code == 404 and org_admin["synthesis"] is None and org_admin["summary"]["caller"] == "ana"


# -- MCP -------------------------------------------------------------------------------------------------
Calls = list[tuple[dict[str, Any], float]]


async def _calls(client: Client, scripted: ScriptedLLM, arguments: dict[str, Any]) -> Calls:
    """The call with a model answering garbage (what the heuristics give), then with a hanging one."""
    out: Calls = []
    for reply in (GARBAGE, HANG):
        script(scripted, reply)
        started = time.monotonic()
        result = await client.call_tool("retrieve_unified", arguments)
        seconds = time.monotonic() - started
        assert not result.is_error, result.content
        out.append((json.loads(getattr(result.content[0], "text")), seconds))
    return out


def over_http(live: Live, scripted: ScriptedLLM, arguments: dict[str, Any]) -> Calls:
    async def run() -> Calls:
        async with create_mcp_http_client(headers=live.auth("ana")) as http:
            async with Client(streamable_http_client(f"{live.url}/mcp", http_client=http)) as client:
                return await _calls(client, scripted, arguments)

    return asyncio.run(run())


def over_stdio(live: Live, scripted: ScriptedLLM, arguments: dict[str, Any]) -> Calls:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "dossier.cli", "mcp"],
        env={"DOSSIER_API_KEY": live.keys["ana"], "DOSSIER_DATABASE_URL": f"sqlite:///{live.db}",
             "DOSSIER_LLM": "openai:scripted", "OPENAI_BASE_URL": scripted.base_url, "OPENAI_API_KEY": "test-key"},
    )  # fmt: skip

    async def run() -> Calls:
        async with Client(params, read_timeout_seconds=120) as client:
            return await _calls(client, scripted, arguments)

    return asyncio.run(run())


@pytest.mark.parametrize("transport", [over_http, over_stdio], ids=["http", "stdio"])
def test_mcp_custom_deadline(live: Live, model: ScriptedLLM, transport: Any) -> None:
    (fallback, _), (response, seconds) = transport(live, model, {**DEEP, "deadline_ms": 1500})
    assert seconds < 1.5 + 1
    assert response["route"]["deadline"]["detail"]["deadline_ms"] == 1500
    assert item_keys(response) == item_keys(fallback) and response["sources"]["documents"]["items"]
    assert_downgrades_named(response)
