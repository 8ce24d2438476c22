"""Model-backed steps of a ``deep`` call (filter inference, rephrasings, section selection, rerank),
driven through the real ``openai`` client against a scripted server on localhost.

For every step: the happy path; a timeout; malformed JSON; HTTP 429 and 500; and, for the selector, a
pick that does not exist. In every case the call answers, the documents route names the fallback, and
nothing retrieved is lost (the response equals the one the fallback alone would have given)."""

from __future__ import annotations

import pytest
from rich.console import Console

import dossier
from dossier.bundle import Document
from dossier.evaluation.dataset import load_dataset
from dossier.evaluation.render import render_eval
from dossier.evaluation.runner import run
from dossier.pipeline.call import SectionCandidate
from dossier.layers.model_steps import ModelSelector
from dossier.providers.llm import Meter, metered
from dossier.providers.rerank import HttpReranker
from dossier.schema import SOURCE_NAMES
from tests.scripted_llm import Reply, ScriptedLLM, question_of, scripted, scripted_server  # noqa: F401 - fixtures

from .conftest import SAMPLE, ids

pytest.importorskip("openai")

STEPS = ("filters", "rephrase", "select", "rerank", "synthesize")
TIMEOUTS = dict.fromkeys(STEPS, 0.4)
QUESTION = "How long do we keep customer data after the contract ends?"
CALL = {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": QUESTION, "budget": {"totalTokens": 50_000}}
PICK = {"picks": [{"section_id": "doc-retention-s2", "relevance": 5}]}
FAILURES = {
    "timeout": Reply({"picks": []}, delay=1.5),
    "malformed": Reply("{'picks': [oops"),
    "http_429": Reply(status=429),
    "http_500": Reply(status=500),
}


@pytest.fixture
def engine(fresh_engine: dossier.Engine, scripted: ScriptedLLM) -> dossier.Engine:
    fresh_engine.use_llm(scripted.llm(timeouts=TIMEOUTS))
    return fresh_engine


def ask(engine: dossier.Engine, **extra) -> dossier.RetrieveResponse:  # type: ignore[no-untyped-def]
    return engine.retrieve({**CALL, **extra}, org="northwind", caller="ana")


def everything(response: dossier.RetrieveResponse) -> dict[str, list[str]]:
    return {source: ids(response, source) for source in SOURCE_NAMES}


def test_standard_and_fast_never_call_the_model(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    for depth in ("fast", "standard"):
        response = ask(engine, depth=depth)
        assert response.route["documents"].effective_depth == depth and response.route["documents"].fallback_reason is None
        assert response.route["model"].ran is False and response.route["model"].detail["calls"] == 0
    assert scripted.requests == []


def test_deep_runs_every_model_step(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    scripted.on("filters", {"doc_types": ["policy"], "tags": ["retention", "made-up"], "confidence": 0.9, "reason": "retention"})
    rephrasings = ["retention period for customer data after termination", "Data after termination", "delete data contract end"]
    scripted.on("rephrase", {"rephrasings": rephrasings})
    scripted.on("select", {"picks": [{"section_id": "doc-retention-s2", "relevance": 5},
                                     {"section_id": "doc-retention-s3", "relevance": 4}]})  # fmt: skip
    response = ask(engine, depth="deep")
    documents, understand = response.route["documents"], response.route["understand"]
    assert (documents.requested_depth, documents.effective_depth, documents.fallback_reason) == ("deep", "deep", None)
    assert documents.detail["selector"] == "model" and not response.partial
    # filters: applied (>= 0.7), only from the vocabulary this caller may see
    assert understand.detail["filters_source"] == "inferred"
    assert understand.detail["filters"] == {"doc_types": ["policy"], "tags": ["retention"]}
    assert "made-up" in understand.detail["inferred_filters"]["reason"]
    filters_prompt = scripted.bodies("filters")[0]["messages"][-1]["content"]
    assert "retention" in filters_prompt and "compensation" not in filters_prompt  # finance-only Commission Plan
    assert "instructions" not in filters_prompt  # system documents' tags
    # rephrasings: appended to the document query
    assert understand.detail["augmentation"] == "model" and understand.detail["rephrasings"] == rephrasings
    # selection: the model's picks, in its order
    high = [i.section_id for i in response.sources["documents"].items if i.confidence == "high"]
    assert high == ["doc-retention-s2", "doc-retention-s3"]
    # cost per step, on the call
    steps = response.route["model"].detail["steps"]
    assert {s: steps[s]["calls"] for s in steps} == {"filters": 1, "rephrase": 1, "select": 1}
    assert all(steps[s]["prompt_tokens"] > 0 and steps[s]["completion_tokens"] > 0 for s in steps)


@pytest.mark.parametrize("confidence", [0.69, 0.0])
def test_inferred_filters_below_the_bar_are_not_applied(engine: dossier.Engine, scripted: ScriptedLLM, confidence: float) -> None:
    scripted.on("filters", {"doc_types": ["policy"], "tags": [], "confidence": confidence})
    understand = ask(engine, depth="deep").route["understand"]
    assert understand.detail["filters_source"] == "none" and understand.detail["filters"] is None
    assert understand.detail["inferred_filters"]["applied"] is False


def test_caller_augmentation_replaces_the_rephrasings(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    response = ask(engine, depth="deep", augmentation=["data after termination"])
    assert response.route["understand"].detail["augmentation"] == "caller"
    assert "rephrase" not in scripted.steps()


@pytest.mark.parametrize("failure", sorted(FAILURES))
@pytest.mark.parametrize("step", ["filters", "rephrase", "select"])
def test_a_failing_model_step_falls_back_and_loses_nothing(
    engine: dossier.Engine, scripted: ScriptedLLM, step: str, failure: str
) -> None:
    scripted.on("select", PICK)
    # what the fallback alone gives: a neutral model (no filter, no rephrasing), or the heuristic selector
    expected = ask(engine, depth="standard" if step == "select" else "deep")
    before = len(scripted.bodies(step))
    scripted.on(step, FAILURES[failure])
    response = ask(engine, depth="deep")
    route = response.route["documents"]
    assert (route.requested_depth, route.effective_depth) == ("deep", "standard")
    assert route.fallback_reason == ("deep_timeout" if failure == "timeout" else "deep_error")
    assert step in route.detail["deep_fallbacks"]
    assert response.partial and f"{step} step failed" in (response.sources["documents"].error or "")
    assert everything(response) == everything(expected)
    assert len(scripted.bodies(step)) - before == 1  # a request-time step is never retried past its deadline
    cost = response.route["model"].detail["steps"][step]
    assert cost["calls"] == 1 and cost["errors"] == 1
    if step == "select":
        assert route.detail["selector"] == "heuristic" and route.detail["selector_fallback"] == "selector_error"


def test_a_pick_that_does_not_exist_is_ignored_and_reported(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    expected = ask(engine, depth="standard")
    scripted.on("select", {"picks": [{"section_id": "doc-retention-s99", "relevance": 5}]})
    response = ask(engine, depth="deep")
    route = response.route["documents"]
    assert route.detail["unknown_picks"] == ["doc-retention-s99"]
    assert route.fallback_reason == "deep_error" and route.detail["selector"] == "heuristic"
    assert everything(response) == everything(expected)
    assert "doc-retention-s99" not in ids(response, "documents")


def test_known_picks_survive_an_unknown_one(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    scripted.on("select", {"picks": [{"section_id": "doc-nope-s1", "relevance": 5},
                                     {"section_id": "doc-retention-s3", "relevance": 4}]})  # fmt: skip
    response = ask(engine, depth="deep")
    route = response.route["documents"]
    assert route.detail["unknown_picks"] == ["doc-nope-s1"] and route.fallback_reason is None
    assert [i.section_id for i in response.sources["documents"].items if i.confidence == "high"] == ["doc-retention-s3"]


# -- rerank -------------------------------------------------------------------------------------------
@pytest.fixture
def reranked(engine: dossier.Engine, scripted: ScriptedLLM) -> dossier.Engine:
    engine.reranker = HttpReranker(f"{scripted.base_url}/rerank", model="bge-reranker", timeout=0.4)
    return engine


def test_rerank_reorders_the_fused_candidates(reranked: dossier.Engine, scripted: ScriptedLLM) -> None:
    # the scripted reranker prefers the last text it was sent
    scripted.on("select", PICK)
    reranker, reranked.reranker = reranked.reranker, None
    ask(reranked, depth="deep")
    assert "[doc-retention]" in scripted.bodies("select")[-1]["messages"][-1]["content"]  # fused: the best documents
    reranked.reranker = reranker
    scripted.reset()
    scripted.on("rerank", lambda body: {"results": [{"index": i, "relevance_score": float(i)} for i in range(len(body["documents"]))]})
    scripted.on("select", PICK)
    response = ask(reranked, depth="deep")
    route = response.route["documents"]
    assert route.detail["rerank"] == "rerank:bge-reranker" and route.detail["reranked"] > 1
    assert route.effective_depth == "deep" and route.fallback_reason is None
    body = scripted.bodies("rerank")[0]
    assert body["model"] == "bge-reranker" and body["query"] == QUESTION and len(body["documents"]) == route.detail["reranked"]
    assert response.route["model"].detail["steps"]["rerank"]["calls"] == 1
    # the selector saw the reranked candidates: its catalogue (sorted by id, for the prompt cache) holds the
    # best-reranked document
    catalogue = scripted.bodies("select")[0]["messages"][-1]["content"]
    best_title = body["documents"][-1].split(" > ", 1)[0]
    assert f"] {best_title} (type:" in catalogue  # the reranker's favourite made the selector's shortlist
    assert [i.section_id for i in response.sources["documents"].items if i.confidence == "high"] == ["doc-retention-s2"]


@pytest.mark.parametrize("failure", ["timeout", "malformed", "http_500"])
def test_rerank_failure_keeps_the_fused_order(reranked: dossier.Engine, scripted: ScriptedLLM, failure: str) -> None:
    scripted.on("select", PICK)
    reranker, reranked.reranker = reranked.reranker, None
    expected = ask(reranked, depth="deep")
    reranked.reranker = reranker
    scripted.on("rerank", FAILURES[failure])
    response = ask(reranked, depth="deep")
    route = response.route["documents"]
    assert route.fallback_reason == ("deep_timeout" if failure == "timeout" else "deep_error")
    assert route.detail["rerank_fallback"] == "rerank_error" and "rerank" in route.detail["deep_fallbacks"]
    assert everything(response) == everything(expected)


# -- the prompt --------------------------------------------------------------------------------------------
def _sample_documents() -> dict[str, Document]:
    bundle = dossier.Bundle.model_validate_json(SAMPLE.read_text(encoding="utf-8"))
    return {d.id: d for d in bundle.documents if d.id.startswith(("doc-pricing", "doc-refund", "doc-retention"))}


def test_selector_prompts_of_two_questions_share_everything_but_the_question(scripted: ScriptedLLM) -> None:
    documents = _sample_documents()
    candidates = [SectionCandidate(section_id=s.id, document_id=d.id, score=0.5) for d in documents.values() for s in d.sections]
    selector = ModelSelector(scripted.llm())
    meter = Meter()
    with metered(meter):
        selector.select("Who approves a 25% discount?", candidates, documents)
        selector.select("How long is the refund window?", list(reversed(candidates)), documents)
    first, second = (body["messages"] for body in scripted.bodies("select"))
    assert first[0] == second[0]  # the instructions
    stable_first, question_first = first[-1]["content"].rsplit("Question: ", 1)
    stable_second, question_second = second[-1]["content"].rsplit("Question: ", 1)
    assert stable_first == stable_second  # the catalogue, whatever order the candidates came in
    assert (question_first, question_second) == ("Who approves a 25% discount?", "How long is the refund window?")
    assert "doc-pricing-s3: Discount approval chain" in stable_first
    # a provider's prompt cache can reuse all of it: the scripted server reports the shared prefix as cached
    cold, warm = meter.calls
    assert cold.cached_tokens == 0 and warm.cached_tokens >= 0.95 * warm.prompt_tokens


def test_the_question_comes_last_in_every_model_prompt(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    scripted.on("select", PICK)
    ask(engine, depth="deep", synthesize=True)
    assert sorted(set(scripted.steps())) == ["filters", "rephrase", "select", "synthesize"]
    for body in scripted.bodies():
        assert question_of(body) == QUESTION
        assert body["messages"][0]["role"] == "system" and "Question:" not in body["messages"][0]["content"]


# -- evaluation --------------------------------------------------------------------------------------------
def test_eval_reports_model_calls_and_tokens_per_layer(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    dataset = load_dataset(SAMPLE.parent / "eval" / "sample-questions.json")
    dataset.questions = [q for q in dataset.questions if q.category == "paraphrase"][:3]
    scripted.on("select", {"picks": []})
    report = run(engine, dataset, request={"depth": "deep", "synthesize": True})
    assert report.model_calls == sum(layer["calls"] for layer in report.model_by_layer.values()) > 0
    assert report.tokens > 0
    assert set(report.model_by_layer) <= {"understand", "select", "synthesize"}
    assert report.model_by_layer["understand"]["calls"] == 2 * len(dataset.questions)  # filters + rephrase
    assert report.model_by_layer["synthesize"]["calls"] == len(dataset.questions)
    assert report.as_dict()["model_by_layer"] == report.model_by_layer
    console = Console(record=True, width=160)
    render_eval(console, report)
    shown = console.export_text()
    assert "model cost per layer" in shown and "synthesize" in shown and f"model calls {report.model_calls}," in shown
    standard = run(engine, dataset, request={"depth": "standard"})
    assert standard.model_calls == 0 and standard.tokens == 0 and standard.model_by_layer == {}


def test_deep_without_a_model_still_says_no_model(sample_engine: dossier.Engine) -> None:
    response = sample_engine.retrieve({**CALL, "depth": "deep", "synthesize": True}, org="northwind", caller="ana")
    assert response.route["documents"].fallback_reason == "no_model"
    assert "model" not in response.route
    assert response.synthesis is not None and response.synthesis.answer is None
    assert "DOSSIER_LLM" in (response.synthesis.error or "")

