"""Synthesis (opt-in): answers only from the packed context the caller gets, cites [M#]/[D#] mapped to
the returned items, masks personal data before the prompt and restores it in the answer, runs deferred
in the background, and fails with ``answer: null`` and the full context."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dossier
from dossier import cli
from dossier.layers.budget import packed_context
from dossier.schema import SOURCE_NAMES, PropertyItem
from tests.scripted_llm import Reply, ScriptedLLM, scripted, scripted_server  # noqa: F401 - fixtures

from .conftest import ids

SAMPLE_ORG = Path(__file__).resolve().parents[2] / "examples" / "sample-org.json"

pytest.importorskip("openai")

QUESTION = "What pricing did we discuss, and what discount rules apply?"
CALL = {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": QUESTION, "budget": {"totalTokens": 8000}}
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_PHONE = re.compile(r"\+?\d[\d ().-]{6,}\d")


@pytest.fixture
def engine(fresh_engine: dossier.Engine, scripted: ScriptedLLM) -> dossier.Engine:
    fresh_engine.use_llm(scripted.llm(timeouts={"synthesize": 0.4, "select": 2.0}))
    return fresh_engine


def ask(engine: dossier.Engine, caller: str = "ana", **extra) -> dossier.RetrieveResponse:  # type: ignore[no-untyped-def]
    return engine.retrieve({**CALL, **extra}, org="northwind", caller=caller)


def context_of(body: dict) -> str:
    """The context part of a synthesis prompt."""
    return body["messages"][-1]["content"].split("Context:\n", 1)[1].rsplit("\n\nQuestion: ", 1)[0]


def test_the_model_sees_exactly_the_packed_context_and_citations_map_to_items(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    scripted.on("synthesize", {
        "answer": "Jane asked to keep the 8% discount [M2]; the 100-249 band allows up to 15% [D1][M2]. See [M99].",
        "reasoning": "M2 is the renewal call; D1 is the discount policy.", "confidence": 0.8, "sources_used": ["M2", "[D1]"],
    })  # fmt: skip
    response = ask(engine, synthesize=True)
    synthesis = response.synthesis
    assert synthesis is not None and synthesis.error is None and synthesis.confidence == 0.8
    memories, documents = response.sources["memories"].items, response.sources["documents"].items
    assert synthesis.citations == {"M2": memories[1].id, "D1": documents[0].section_id}
    assert synthesis.sources_used == [memories[1].id, documents[0].section_id]
    assert synthesis.unknown_citations == ["M99"]
    assert synthesis.answer.startswith("Jane asked")  # "Jane" was masked in the prompt and restored here
    # one budget: the prompt's context is the caller's packed context, line for line, behind labels
    sent = context_of(scripted.bodies("synthesize")[0])
    labels = [line.split("] ", 1)[0] + "]" for line in sent.splitlines() if re.match(r"\[[PMDGX]\d+\] ", line)]
    assert len(labels) == sum(len(response.sources[s].items) for s in SOURCE_NAMES)
    assert labels[0] == "[P1]" and "[M1]" in labels and "[D1]" in labels and "[G1]" in labels
    unlabelled = re.sub(r"^\[[PMDGX]\d+\] ", "", sent, flags=re.MULTILINE) + "\n"
    assert len(unlabelled) > 0.9 * len(packed_context(response))  # masked, so not byte for byte
    assert len(unlabelled.splitlines()) == len(packed_context(response).splitlines())
    route = response.route["synthesize"]
    assert route.ran and route.detail["items"] == len(labels) and route.detail["masked"] > 0
    assert response.route["model"].detail["steps"]["synthesize"]["calls"] == 1


def test_no_personal_data_reaches_the_model(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    def answer(body: dict) -> dict:
        prompt = body["messages"][-1]["content"]
        email = re.search(r"<EMAIL_\d+>", prompt.rsplit("Question: ", 1)[1])  # the one in the question
        name = re.search(r"<VALUE_\d+>", prompt)
        return {"answer": f"Write to {email.group() if email else '?'}, says {name.group() if name else '?'} [P1].",
                "reasoning": "", "confidence": 0.5, "sources_used": ["P1"]}  # fmt: skip

    scripted.on("synthesize", answer)
    scripted.on("select", {"picks": []})
    question = "What pricing did we discuss with jane@acme.com (+1 415 555 0100), and what discount rules apply?"
    response = ask(engine, synthesize=True, depth="deep", budget={"totalTokens": 50_000}, message=question)
    # what is personal: the resolved record's and its aliases' identifiers and property values, every
    # property in the context, and whatever looks like an email or a phone number in it
    record_ids = [response.record.id, *response.record.aliases] if response.record else []
    records = engine.store.get_records(record_ids, org="northwind")
    secrets: set[str] = set()
    for record in records:
        ids_ = record.identifiers
        secrets.update(v for v in (ids_.email, ids_.phone, ids_.profile_url) if v)
        secrets.update(str(v) for v in record.properties.values() if isinstance(v, str) and len(v) >= 3)
    context = packed_context(response)
    secrets.update(str(i.value) for s in SOURCE_NAMES for i in response.sources[s].items
                   if isinstance(i, PropertyItem) and isinstance(i.value, str) and len(i.value) >= 3)  # fmt: skip
    secrets.update(_EMAIL.findall(context))
    secrets.update(m for m in _PHONE.findall(context) if len(re.sub(r"\D", "", m)) >= 7 and not re.match(r"\d{4}-\d\d-\d\d", m))
    assert "jane@acme.com" in secrets and "Jane Doe" in secrets and len(secrets) > 20
    sent = scripted.bodies()
    assert {b["step"] for b in sent} == {"filters", "rephrase", "select", "synthesize"}
    for body in sent:
        text = "\n".join(m["content"] for m in body["messages"])
        for secret in secrets:
            assert not re.search(rf"(?<!\w){re.escape(secret)}(?!\w)", text, re.IGNORECASE), (body["step"], secret)
        assert "415 555 0100" not in text and "14155550100" not in text
    # restored in the answer
    assert response.synthesis is not None and response.synthesis.answer is not None
    assert response.synthesis.answer.startswith("Write to jane@acme.com, says ")
    assert "<" not in response.synthesis.answer


@pytest.mark.parametrize("failure", [Reply(status=500), Reply("no json"), Reply({"answer": "late"}, delay=1.5)], ids=["500", "malformed", "timeout"])
def test_synthesis_failure_returns_no_answer_and_the_full_context(engine: dossier.Engine, scripted: ScriptedLLM, failure: Reply) -> None:
    plain = ask(engine)
    engine.use_llm(scripted.llm(timeouts={"synthesize": 0.3}, retries={"synthesize": 1}))
    scripted.on("synthesize", failure)
    response = ask(engine, synthesize=True)
    assert response.synthesis is not None and response.synthesis.answer is None
    timed_out = failure.delay > 0  # the model did not answer within the step's timeout
    assert ("synthesis timed out" if timed_out else "synthesis failed") in (response.synthesis.error or "")
    assert response.route["synthesize"].fallback_reason == ("synthesis_timeout" if timed_out else "synthesis_error")
    for source in SOURCE_NAMES:
        assert ids(response, source) == ids(plain, source)
    assert packed_context(response) == packed_context(plain)


def test_synthesis_retries_a_rate_limit(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    scripted.on("synthesize", Reply(status=429), {"answer": "The context does not say [M1].", "confidence": 0.1})
    response = ask(engine, synthesize=True)
    assert response.synthesis is not None and response.synthesis.answer == "The context does not say [M1]."
    assert len(scripted.bodies("synthesize")) == 2


def test_an_empty_context_is_answered_without_a_model(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    response = engine.retrieve({"mode": "scout", "message": "zzqx vlorp", "synthesize": True,
                                "sources": {"documents": False, "properties": False}}, org="northwind", caller="ana")  # fmt: skip
    assert response.synthesis is not None and response.synthesis.confidence == 0.0
    assert "does not answer" in (response.synthesis.answer or "")
    assert scripted.requests == []


# -- deferred ------------------------------------------------------------------------------------------
def test_deferred_returns_the_context_at_once_and_the_answer_later(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    engine.use_llm(scripted.llm(timeouts={"synthesize": 5.0}))
    scripted.on("synthesize", Reply({"answer": "Up to 15% [D1].", "confidence": 0.7, "sources_used": ["D1"]}, delay=0.8))
    started = time.perf_counter()
    response = ask(engine, synthesize=True, deferred=True)
    assert time.perf_counter() - started < 0.8
    assert response.synthesis is not None and response.synthesis.pending and response.synthesis.answer is None
    assert response.sources["documents"].items  # the context is all there already
    assert engine.result(response.call_id, org="northwind", caller="ana").pending
    with pytest.raises(dossier.NotFound):
        engine.result(response.call_id, org="northwind", caller="ben")  # another caller
    with pytest.raises(dossier.NotFound):
        engine.result(response.call_id, org="southwind", caller="ana")
    with pytest.raises(dossier.NotFound):
        engine.result("no-such-call", org="northwind", caller="ana")
    done = engine.result(response.call_id, org="northwind", caller="ana", wait=5.0)
    assert not done.pending and done.answer == "Up to 15% [D1]."
    assert done.sources_used == [response.sources["documents"].items[0].section_id]
    assert done.usage is not None and done.usage["calls"] == 1 and done.usage["prompt_tokens"] > 0
    # stored: an engine in another process (here: another handle on the same file) can fetch it too
    with dossier.open(engine.store.url, embedder=engine.embedder, llm="none") as other:
        assert other.result(response.call_id, org="northwind", caller="ana").answer == "Up to 15% [D1]."
        with pytest.raises(dossier.NotFound):
            other.result(response.call_id, org="northwind", caller="ben")


def _jane(**change: object) -> dict:
    record = next(r for r in json.loads(SAMPLE_ORG.read_text())["records"] if r["id"] == "rec-jane")
    return {"records": [{**record, **change}]}


def test_a_deferred_answer_is_withheld_once_what_it_drew_on_is_hidden(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    """An answer kept for later is checked again whenever it is served: once the record it is about is
    pending deletion, it is withheld, in this engine and from the store alike, and nothing says why
    beyond the rule; while everything stays visible the answer comes back unchanged."""
    from dossier.layers.synthesize import WITHHELD

    engine.use_llm(scripted.llm(timeouts={"synthesize": 5.0}))
    scripted.on("synthesize", Reply({"answer": "Jane asked about 12 Secret Lane [M1].", "confidence": 0.7, "sources_used": ["M1"]}))
    response = ask(engine, synthesize=True, deferred=True)
    assert response.sources["memories"].items
    done = engine.result(response.call_id, org="northwind", caller="ana", wait=5.0)
    assert done.answer == "Jane asked about 12 Secret Lane [M1]." and done.citations
    engine.load_bundle(_jane(pending_deletion=True))
    for reader in (engine, dossier.open(engine.store.url, embedder=engine.embedder, llm="none")):
        hidden = reader.result(response.call_id, org="northwind", caller="ana")
        assert (hidden.answer, hidden.reasoning, hidden.citations, hidden.sources_used, hidden.error) == (None, None, {}, [], WITHHELD)
        assert "Secret" not in hidden.model_dump_json() and "rec-jane" not in hidden.model_dump_json()
        if reader is not engine:
            reader.close()
    engine.load_bundle(_jane(pending_deletion=False))  # visible again: served again
    assert engine.result(response.call_id, org="northwind", caller="ana").answer == "Jane asked about 12 Secret Lane [M1]."


def test_a_deferred_answer_is_withheld_once_the_caller_may_no_longer_see_a_document(
    engine: dossier.Engine, scripted: ScriptedLLM
) -> None:
    bundle = json.loads(SAMPLE_ORG.read_text())
    restricted = next(d for d in bundle["documents"] if d.get("visible_to_roles"))
    role = restricted["visible_to_roles"][0]
    caller = next(c for c in bundle["callers"] if c["org"] == "northwind" and role in c["roles"] and "admin" not in c["roles"])
    engine.use_llm(scripted.llm(timeouts={"synthesize": 5.0}))
    scripted.on("synthesize", Reply({"answer": "See [D1].", "confidence": 0.5, "sources_used": ["D1"]}))
    response = ask(engine, caller=caller["id"], synthesize=True, deferred=True, record=None,
                   message=restricted["sections"][0]["heading"] + " " + restricted["title"],
                   mode="scout")  # fmt: skip
    shown = {i.document_id for i in response.sources["documents"].items}
    assert restricted["id"] in shown
    assert engine.result(response.call_id, org="northwind", caller=caller["id"], wait=5.0).answer == "See [D1]."
    engine.load_bundle({"callers": [{**caller, "roles": [r for r in caller["roles"] if r != role] or ["none"]}]})
    assert engine.result(response.call_id, org="northwind", caller=caller["id"]).answer is None


def test_a_deferred_failure_is_a_result_too(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    scripted.on("synthesize", Reply(status=500))
    engine.use_llm(scripted.llm(retries={"synthesize": 0}))
    response = ask(engine, synthesize=True, deferred=True)
    failed = engine.result(response.call_id, org="northwind", caller="ana", wait=5.0)
    assert failed.answer is None and "HTTP 500" in (failed.error or "") and not failed.pending


def test_a_deferred_synthesis_refused_before_it_starts_is_its_result(engine: dossier.Engine) -> None:
    from dossier.layers.synthesize import NO_MESSAGE, NO_MODEL

    response = ask(engine, synthesize=True, deferred=True, message=None)  # a model, but nothing to answer
    assert response.synthesis is not None and response.synthesis.error == NO_MESSAGE and not response.synthesis.pending
    kept = engine.result(response.call_id, org="northwind", caller="ana", wait=5.0)
    assert (kept.answer, kept.error, kept.pending) == (None, NO_MESSAGE, False)
    with pytest.raises(dossier.NotFound):  # the caller's own, as every result
        engine.result(response.call_id, org="northwind", caller="ben")
    engine.use_llm(None)
    response = ask(engine, synthesize=True, deferred=True)
    assert engine.result(response.call_id, org="northwind", caller="ana", wait=5.0).error == NO_MODEL


def test_cli_deferred_synthesis_and_result(fresh_engine: dossier.Engine, scripted: ScriptedLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.console, "_width", 500)
    monkeypatch.setenv("OPENAI_BASE_URL", scripted.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("DOSSIER_LLM", raising=False)
    scripted.on("synthesize", Reply({"answer": "Discounts need approval [D1].", "confidence": 0.6, "sources_used": ["D1"]}, delay=0.3))
    db = fresh_engine.store.url
    runner = CliRunner()
    made = runner.invoke(cli.app, ["retrieve", "--org", "northwind", "--caller", "ana", "--email", "jane@acme.com",
                                   "-m", QUESTION, "--deferred", "--llm", "openai:scripted", "--json", "--db", db])  # fmt: skip
    assert made.exit_code == 0, made.output
    response = json.loads(made.stdout)
    assert response["synthesis"]["pending"] is True and "dossier result" in made.stderr
    # the command waited for the background synthesis before it exited, and stored it
    shown = runner.invoke(cli.app, ["result", response["call_id"], "--org", "northwind", "--caller", "ana", "--db", db])
    assert shown.exit_code == 0, shown.output
    assert "Discounts need approval [D1]." in shown.stdout and f"D1={response['sources']['documents']['items'][0]['section_id']}" in shown.stdout
    as_json = runner.invoke(cli.app, ["result", response["call_id"], "--org", "northwind", "--caller", "ana", "--json", "--db", db])
    assert json.loads(as_json.stdout)["answer"] == "Discounts need approval [D1]."
    other = runner.invoke(cli.app, ["result", response["call_id"], "--org", "northwind", "--caller", "ben", "--db", db])
    assert other.exit_code == 1 and "no result" in other.stderr


def test_result_of_a_call_still_running_exits_3(tmp_path: Path, fresh_engine: dossier.Engine) -> None:
    fresh_engine.store.put_result("c1", {"caller": "ana", "synthesis": {"pending": True}}, org="northwind")
    shown = CliRunner().invoke(cli.app, ["result", "c1", "--org", "northwind", "--caller", "ana", "--db", fresh_engine.store.url])
    assert shown.exit_code == 3 and "still running" in shown.stdout
