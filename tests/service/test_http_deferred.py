"""A deferred synthesis fetched over HTTP (``GET /v1/calls/{call_id}``), with a scripted chat model on
localhost driven through the real ``openai`` client; and what synthesis costs."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("openai")

from tests.scripted_llm import Reply, ScriptedLLM, scripted, scripted_server  # noqa: E402, F401 - fixtures

from .conftest import BRIEF, Live  # noqa: E402


def test_a_deferred_answer_is_fetched_by_its_caller_only(live: Live, scripted: ScriptedLLM) -> None:  # noqa: F811
    scripted.on("synthesize", Reply({"answer": "Up to 15% [D1].", "confidence": 0.7, "sources_used": ["D1"]}, delay=0.5))
    live.engine.use_llm(scripted.llm(timeouts={"synthesize": 5.0}))
    try:
        with httpx.Client(base_url=live.url, timeout=60) as http:
            before = http.get("/v1/usage", headers=live.auth("ana")).json()["net"]
            body = {**BRIEF, "depth": "fast", "synthesize": True, "deferred": True}
            response = http.post("/v1/retrieve", json=body, headers=live.auth("ana")).json()
            assert response["synthesis"]["pending"] is True and response["sources"]["documents"]["items"]
            call_id = response["call_id"]
            done = http.get(f"/v1/calls/{call_id}", params={"wait": 10}, headers=live.auth("ana")).json()
            assert done["synthesis"]["answer"] == "Up to 15% [D1]." and not done["synthesis"]["pending"]
            assert done["summary"]["shape"]["deferred"] is True
            assert http.get(f"/v1/calls/{call_id}", headers=live.auth("ben")).status_code == 404  # same org, another caller
            org_admin = http.get(f"/v1/calls/{call_id}", headers=live.auth("admin")).json()  # the org's admin: the shape alone
            assert org_admin["synthesis"] is None and org_admin["summary"]["caller"] == "ana"
            assert http.get(f"/v1/calls/{call_id}", headers=live.auth("zoe")).status_code == 404  # as if unknown
            assert http.get("/v1/usage", headers=live.auth("ana")).json()["net"] == before + 1 + 5
    finally:
        live.engine.use_llm(None)
