"""One deadline per call (docs/retrieve.md, Deadline), through the Python API against a scripted model on
localhost driven by the real ``openai`` client: a model that answers after 30 s, or with garbage, cannot
hold a deep call with synthesis past its deadline; the context comes back complete, every downgrade is
named in the route, and nothing the call paid for is lost (an answer that comes late is kept).

The hanging model takes 30 s and the deadlines here are 1-3 s, so asserting that a call came back within
its deadline plus one second cannot flake."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from rich.console import Console
from typer.testing import CliRunner

import dossier
from dossier.cli import app
from dossier.evaluation.dataset import load_dataset
from dossier.evaluation.render import render_eval
from dossier.evaluation.runner import run
from dossier.providers.circuit import CircuitBreaker, reset_breakers
from dossier.schema import SOURCE_NAMES
from tests.scripted_llm import Reply, ScriptedLLM, scripted, scripted_server  # noqa: F401 - fixtures

from .conftest import SAMPLE, ids

pytest.importorskip("openai")

SLOW = 30.0
QUESTION = "What pricing did we discuss, and what discount rules apply?"
CALL = {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": QUESTION, "depth": "deep", "synthesize": True}
STEPS = ("filters", "rephrase", "select", "synthesize")
HANG = Reply({}, delay=SLOW)
GARBAGE = Reply("{'answer': oops")
ANSWER = {"answer": "Up to 15% [D1].", "reasoning": "D1 is the discount policy.", "confidence": 0.7, "sources_used": ["D1"]}


@pytest.fixture(autouse=True)
def fresh_breakers() -> Iterator[None]:
    reset_breakers()
    yield
    reset_breakers()


@pytest.fixture
def engine(fresh_engine: dossier.Engine, scripted: ScriptedLLM) -> dossier.Engine:
    fresh_engine.use_llm(scripted.llm())  # the shipped step timeouts (5-60 s): only the deadline bounds the call
    return fresh_engine


def script(scripted: ScriptedLLM, reply: Reply | Any, steps: tuple[str, ...] = STEPS) -> None:
    for step in steps:
        scripted.on(step, reply)


def timed(engine: dossier.Engine, **extra: Any) -> tuple[dossier.RetrieveResponse, float]:
    started = time.monotonic()
    response = engine.retrieve({**CALL, **extra}, org="northwind", caller="ana")
    return response, time.monotonic() - started


def everything(response: dossier.RetrieveResponse) -> dict[str, list[str]]:
    return {source: ids(response, source) for source in SOURCE_NAMES}


def wait_for_answer(engine: dossier.Engine, call_id: str) -> dossier.Synthesis:
    return engine.result(call_id, org="northwind", caller="ana", wait=SLOW / 2)


def test_a_model_answering_garbage_degrades_every_step_at_once(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    script(scripted, GARBAGE)
    response, seconds = timed(engine)  # the default deadline: every reply comes long before its step's end
    assert seconds < 10 + 1
    documents = response.route["documents"]
    assert (documents.effective_depth, documents.fallback_reason) == ("standard", "deep_error")
    assert set(documents.detail["deep_fallbacks"]) == {"filters", "rephrase", "select"}
    assert response.synthesis is not None and response.synthesis.answer is None
    assert "malformed output" in (response.synthesis.error or "") and not response.synthesis.pending
    assert response.route["synthesize"].fallback_reason == "synthesis_error"
    steps = response.route["deadline"].detail["steps"]
    assert {s: t["outcome"] for s, t in steps.items()} == dict.fromkeys(STEPS, "error")
    assert response.route["deadline"].detail["missed"] == []


@pytest.mark.parametrize("deadline_ms", [1000, 2500])
def test_a_hanging_model_cannot_hold_a_deep_call_past_its_deadline(
    engine: dossier.Engine, scripted: ScriptedLLM, deadline_ms: int
) -> None:
    script(scripted, GARBAGE)
    fallback, _ = timed(engine, deadline_ms=deadline_ms)  # what the heuristics alone give
    plain = engine.retrieve({**CALL, "depth": "standard", "synthesize": False}, org="northwind", caller="ana")
    script(scripted, HANG)
    response, seconds = timed(engine, deadline_ms=deadline_ms)
    assert seconds < deadline_ms / 1000 + 1
    # the context is complete: exactly what the heuristics give when every model step fails at once
    assert everything(response) == everything(fallback) and response.sources["documents"].items
    for source in ("properties", "memories", "graph"):  # the sources no model step touches: as without a model
        assert ids(response, source) == ids(plain, source)
    # every downgrade is named
    documents, understand = response.route["documents"], response.route["understand"]
    assert (documents.requested_depth, documents.effective_depth, documents.fallback_reason) == ("deep", "standard", "deep_timeout")
    assert documents.detail["deep_fallbacks"] == {
        "filters": "deep_timeout: rules", "rephrase": "deep_timeout: no rephrasings", "select": "deep_timeout: heuristic",
    }  # fmt: skip
    assert set(understand.detail["deep_fallbacks"]) == {"filters", "rephrase"}
    assert documents.detail["selector"] == "heuristic" and response.partial
    synthesis = response.synthesis
    assert synthesis is not None and synthesis.answer is None and "timed out" in (synthesis.error or "")
    assert response.route["synthesize"].fallback_reason == "synthesis_timeout"
    deadline = response.route["deadline"].detail
    assert (deadline["deadline_ms"], deadline["source"]) == (deadline_ms, "request")
    assert sorted(deadline["missed"]) == sorted(STEPS)
    for step in STEPS:  # each step was cut at its end time within the deadline (or not sent, with no time left)
        assert deadline["steps"][step]["end_ms"] <= deadline_ms
        assert deadline["steps"][step]["outcome"] in ("timeout", "no_time")
    assert set(deadline["layers"]) >= {"plan", "resolve", "understand", "recall", "select_sections", "synthesize"}
    model = response.route["model"].detail
    assert model["steps"]["filters"]["errors"] == model["steps"]["rephrase"]["errors"] == 1


def test_filter_inference_and_rephrasings_ask_the_model_at_the_same_time(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    script(scripted, HANG, ("filters", "rephrase"))
    response, _ = timed(engine, deadline_ms=2000, synthesize=False)
    steps = response.route["deadline"].detail["steps"]
    filters, rephrase = steps["filters"], steps["rephrase"]
    # both were out at once: each started before the other ended
    assert filters["start_ms"] < rephrase["start_ms"] + rephrase["ms"]
    assert rephrase["start_ms"] < filters["start_ms"] + filters["ms"]
    assert {b["step"] for b in scripted.bodies()[:2]} == {"filters", "rephrase"}


def test_a_hanging_rephrasing_cannot_eat_the_answers_time(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    scripted.on("rephrase", HANG)
    scripted.on("filters", {"doc_types": [], "tags": ["discounts"], "confidence": 0.9, "reason": "discount rules"})
    scripted.on("synthesize", Reply(ANSWER, delay=0.3))
    response, seconds = timed(engine, deadline_ms=5000)
    assert seconds < 5 + 1
    assert response.synthesis is not None and response.synthesis.answer == "Up to 15% [D1]."
    # what answered in time is used: the inferred filter, though the rephrasings did not come
    understand = response.route["understand"]
    assert understand.detail["filters_source"] == "inferred" and understand.detail["filters"]["tags"] == ["discounts"]
    assert understand.detail["deep_fallbacks"] == {"rephrase": "deep_timeout: no rephrasings"}
    assert response.route["deadline"].detail["missed"] == ["rephrase"]
    assert response.route["model"].detail["steps"]["synthesize"]["calls"] == 1


def test_an_answer_that_comes_after_the_deadline_is_kept(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    scripted.on("synthesize", Reply(ANSWER, delay=3.0))  # the other steps answer at once
    response, seconds = timed(engine, deadline_ms=2500)
    assert seconds < 2.5 + 1
    synthesis = response.synthesis
    assert synthesis is not None and synthesis.answer is None and synthesis.pending
    assert "goes on in the background" in (synthesis.error or "")
    assert response.route["synthesize"].detail["continues_in_background"] is True
    assert response.route["deadline"].detail["missed"] == ["synthesize"]
    late = wait_for_answer(engine, response.call_id)
    assert not late.pending and late.answer == "Up to 15% [D1]."
    assert late.sources_used == [response.sources["documents"].items[0].section_id]
    assert late.usage is not None and late.usage["calls"] == 1 and late.usage["prompt_tokens"] > 0
    assert len(scripted.bodies("synthesize")) == 1  # the request that was paid for, not a second one


def test_an_answer_still_out_when_its_engine_closes_is_stored_as_failed(fresh_engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    scripted.on("synthesize", HANG)
    with dossier.open(fresh_engine.store.url, embedder=fresh_engine.embedder, llm=scripted.llm()) as other:
        response = other.retrieve({**CALL, "deadline_ms": 1500}, org="northwind", caller="ana")
        assert response.synthesis is not None and response.synthesis.pending
        assert other.result(response.call_id, org="northwind", caller="ana").pending
    stored = fresh_engine.result(response.call_id, org="northwind", caller="ana")  # read back from the store
    assert not stored.pending and stored.answer is None and "closed" in (stored.error or "")


def test_a_deferred_synthesis_started_under_the_deadline_finishes_in_the_background(
    engine: dossier.Engine, scripted: ScriptedLLM
) -> None:
    script(scripted, HANG, ("filters", "rephrase", "select"))
    scripted.on("synthesize", Reply(ANSWER, delay=2.0))  # longer than the whole deadline
    response, seconds = timed(engine, deadline_ms=1000, deferred=True)
    assert seconds < 1 + 1
    assert response.synthesis is not None and response.synthesis.pending and response.synthesis.error is None
    deadline = response.route["deadline"].detail
    assert sorted(deadline["missed"]) == ["filters", "rephrase", "select"] and "synthesize" not in deadline["steps"]
    done = wait_for_answer(engine, response.call_id)
    assert not done.pending and done.answer == "Up to 15% [D1]." and done.error is None


def test_a_model_that_keeps_timing_out_is_not_asked_and_the_route_says_so(
    fresh_engine: dossier.Engine, scripted: ScriptedLLM
) -> None:
    breaker = CircuitBreaker(scripted.base_url, threshold=3, cool_down=30.0, min_wait=0.2)
    fresh_engine.use_llm(scripted.llm(breaker=breaker))
    script(scripted, HANG)
    # 6 s: select is given 3.4 s minus the retrieval before it, far above the breaker's 0.2 s even on a
    # busy machine (with 4 s a slow retrieval once left select less than 0.2 s, which does not count)
    response, seconds = timed(fresh_engine, deadline_ms=6000)
    assert seconds < 6 + 1
    # filters, rephrase and select each timed out after more than 0.2 s: the third opened the circuit, and
    # synthesis was not asked at all
    assert [b["step"] for b in scripted.bodies() if b["step"] == "synthesize"] == []
    circuit = response.route["model"].detail["circuit"][scripted.base_url]
    assert circuit["state"] == "open" and circuit["timeouts_in_a_row"] == 3 and circuit["retry_in_s"] > 0
    steps = response.route["deadline"].detail["steps"]
    assert steps["synthesize"]["outcome"] == "circuit_open"
    assert response.route["synthesize"].fallback_reason == "synthesis_timeout"
    assert "circuit" in (response.synthesis.error if response.synthesis else "")
    sent = len(scripted.bodies())
    again, seconds = timed(fresh_engine, deadline_ms=6000)
    assert seconds < 6 + 1 and len(scripted.bodies()) == sent  # during the cool-down: no request at all
    assert {s: t["outcome"] for s, t in again.route["deadline"].detail["steps"].items()} == dict.fromkeys(STEPS, "circuit_open")
    assert again.route["documents"].fallback_reason == "deep_timeout"
    assert everything(again) == everything(response)


# -- the request field --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [99, 120_001, "2000", 2000.5, True])
def test_deadline_ms_is_a_whole_number_of_milliseconds_in_range(sample_engine: dossier.Engine, value: Any) -> None:
    with pytest.raises(dossier.InvalidRequest) as caught:
        sample_engine.retrieve({**CALL, "deadline_ms": value}, org="northwind", caller="ana")
    assert caught.value.field == "deadline_ms"


def test_the_default_deadline_and_a_lower_maximum_are_reported(sample_engine: dossier.Engine) -> None:
    default = sample_engine.retrieve({**CALL, "depth": "standard"}, org="northwind", caller="ana")
    detail = default.route["deadline"].detail
    assert (detail["deadline_ms"], detail["source"]) == (10_000, "default") and "requested_ms" not in detail
    assert detail["steps"] == {} and detail["missed"] == []
    lowered = sample_engine.retrieve({**CALL, "deadline_ms": 60_000}, org="northwind", caller="ana", max_deadline_ms=5000)
    detail = lowered.route["deadline"].detail
    assert (detail["deadline_ms"], detail["requested_ms"], detail["source"]) == (5000, 60_000, "request")
    within = sample_engine.retrieve({**CALL, "deadline_ms": 2000}, org="northwind", caller="ana", max_deadline_ms=5000)
    assert within.route["deadline"].detail["deadline_ms"] == 2000 and "requested_ms" not in within.route["deadline"].detail


# -- evaluation ---------------------------------------------------------------------------------------------
def test_eval_shows_the_steps_that_most_often_ran_out_of_time(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    dataset = load_dataset(SAMPLE.parent / "eval" / "sample-questions.json")
    dataset.questions = [q for q in dataset.questions if q.category == "paraphrase"][:2]
    scripted.on("rephrase", HANG)
    scripted.on("select", {"picks": []})
    report = run(engine, dataset, request={"depth": "deep", "deadline_ms": 2000})
    assert list(report.deadline)[0] == "rephrase"  # most often out of time first
    assert report.deadline["rephrase"]["out_of_time"] == report.deadline["rephrase"]["questions"] == 2
    assert report.deadline["filters"]["out_of_time"] == 0 and report.deadline["filters"]["questions"] == 2
    assert report.as_dict()["deadline"] == report.deadline
    assert all(r.deadline["rephrase"]["outcome"] == "timeout" for r in report.results)
    console = Console(record=True, width=160)
    render_eval(console, report)
    table = console.export_text().split("model steps against the deadline", 1)[1]
    assert table.index("rephrase") < table.index("filters")


def test_eval_cli_with_a_deadline(
    fresh_engine: dossier.Engine, tmp_path: Path, scripted: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", scripted.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    small = json.loads((SAMPLE.parent / "eval" / "sample-questions.json").read_text(encoding="utf-8"))
    small["bundle"] = str(SAMPLE.parent / "eval" / small["bundle"])
    small["questions"] = [q for q in small["questions"] if q["category"] == "paraphrase"][:2]
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small), encoding="utf-8")
    scripted.on("filters", HANG)
    scripted.on("select", {"picks": []})
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["eval", str(path), "--depth", "deep", "--deadline-ms", "2000", "--llm",
                                      "openai:scripted", "--json", str(out), "--store", fresh_engine.store.url])  # fmt: skip
    assert result.exit_code == 0, result.output
    table = result.stdout.split("model steps against the deadline", 1)[1]
    assert table.index("filters") < table.index("rephrase")
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["deadline"]["filters"]["out_of_time"] == 2
    assert all(q["deadline"]["filters"]["outcome"] == "timeout" for q in report["per_question"])
