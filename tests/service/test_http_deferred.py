"""A deferred synthesis fetched over HTTP (``GET /v1/calls/{call_id}``), with a scripted chat model on
localhost driven through the real ``openai`` client; and what synthesis costs."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

import dossier
from dossier.http import create_app
from dossier.service import Service

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


def test_callers_waiting_for_an_answer_hold_no_thread_of_the_worker(live: Live, scripted: ScriptedLLM) -> None:  # noqa: F811
    """Fifty requests waiting (``?wait=``) for one slow deferred answer leave the worker's threads free: a
    health check and another org's call are answered while the answer is still pending."""
    scripted.on("synthesize", Reply({"answer": "Up to 15% [D1].", "confidence": 0.7, "sources_used": ["D1"]}, delay=6.0))
    live.engine.use_llm(scripted.llm(timeouts={"synthesize": 20.0}))
    try:
        with httpx.Client(base_url=live.url, timeout=60) as http, ThreadPoolExecutor(50) as pool:
            body = {**BRIEF, "depth": "fast", "synthesize": True, "deferred": True}
            call_id = http.post("/v1/retrieve", json=body, headers=live.auth("ana")).json()["call_id"]

            def wait_for_it() -> dict:
                with httpx.Client(base_url=live.url, timeout=60) as own:
                    return own.get(f"/v1/calls/{call_id}", params={"wait": 15}, headers=live.auth("ana")).json()

            waiting = [pool.submit(wait_for_it) for _ in range(50)]
            time.sleep(1.0)  # every waiter is in
            assert http.get("/healthz").json() == {"status": "ok"}
            assert http.get("/v1/usage", headers=live.auth("zoe")).status_code == 200
            # answered before the model did (it takes 6 s): the waiters held no thread the others needed
            assert http.get(f"/v1/calls/{call_id}", headers=live.auth("ana")).json()["synthesis"]["pending"] is True
            answers = [w.result(timeout=60) for w in waiting]
            assert all(a["synthesis"]["answer"] == "Up to 15% [D1]." for a in answers)
    finally:
        live.engine.use_llm(None)


def test_a_serving_worker_closes_its_engine_so_no_answer_stays_pending(
    db_path: Path, embedder: Any, scripted: ScriptedLLM  # noqa: F811
) -> None:
    """The app of ``dossier serve`` owns its engine: shutting it down finishes the syntheses still running and
    stores them, so a restarted server serves the answer instead of ``pending`` for ever."""
    engine = dossier.open(f"sqlite:///{db_path}", embedder=embedder)
    engine.use_llm(scripted.llm(timeouts={"synthesize": 10.0}))
    scripted.on("synthesize", Reply({"answer": "Up to 15% [D1].", "confidence": 0.7, "sources_used": ["D1"]}, delay=1.5))
    service = Service(engine)
    _, key = service.create_key("northwind", "ana")
    with TestClient(create_app(service, mcp=False, owns_engine=True)) as http:
        body = {**BRIEF, "depth": "fast", "synthesize": True, "deferred": True}
        call_id = http.post("/v1/retrieve", json=body, headers={"Authorization": f"Bearer {key}"}).json()["call_id"]
    # the server is down; the answer was stored before it exited, not left running in a thread
    with dossier.open(f"sqlite:///{db_path}", embedder=embedder, llm="none") as restarted:
        done = restarted.result(call_id, org="northwind", caller="ana")
        assert (done.pending, done.answer) == (False, "Up to 15% [D1].")


def test_an_answer_pending_in_the_store_long_after_its_process_stopped_is_reported_lost(sample: dossier.Engine) -> None:
    from dossier.layers.synthesize import LOST, LOST_AFTER

    pending = {"caller": "ana", "synthesis": {"pending": True}, "drawn": {}}
    sample.store.put_result("call-old", {**pending, "at": time.time() - LOST_AFTER - 60}, org="northwind")
    sample.store.put_result("call-new", {**pending, "at": time.time() - 60}, org="northwind")
    lost = sample.result("call-old", org="northwind", caller="ana")
    assert (lost.pending, lost.answer, lost.error) == (False, None, LOST)
    assert sample.result("call-new", org="northwind", caller="ana").pending  # a synthesis may take minutes
