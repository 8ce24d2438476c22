"""The chat adapter over the real ``openai`` client, against a scripted server on localhost: JSON out,
schema validation, timeouts, HTTP errors, retries only where safe, token accounting, configuration."""

from __future__ import annotations

import sys

import pytest
from pydantic import BaseModel

import dossier
from dossier.providers.llm import Meter, OpenAIChat, llm_from_env, llm_from_spec, metered, parse_json
from tests.scripted_llm import Reply, ScriptedLLM, scripted, scripted_server  # noqa: F401 - fixtures

pytest.importorskip("openai")

SYSTEM = {"role": "system", "content": "# Section selection\nReply with JSON."}


class Answer(BaseModel):
    value: int
    note: str = ""


def ask(llm: OpenAIChat, step: str = "select", question: str = "what?") -> Answer:
    system = {"role": "system", "content": {"select": SYSTEM["content"], "synthesize": "# Grounded answer\nJSON."}[step]}
    return llm.complete([system, {"role": "user", "content": f"Question: {question}"}], output=Answer, step=step)


def test_happy_path_validates_json_and_counts_tokens(scripted: ScriptedLLM) -> None:
    scripted.on("select", {"value": 3, "note": "ok"})
    meter = Meter()
    with metered(meter):
        first = ask(scripted.llm(), question="first question")
        second = ask(scripted.llm(), question="second question")
    assert first == Answer(value=3, note="ok") and second.value == 3
    body = scripted.bodies("select")[0]
    assert body["model"] == "scripted" and body["response_format"] == {"type": "json_object"} and body["temperature"] == 0
    summary = meter.summary()
    assert summary["calls"] == 2 and summary["errors"] == 0
    assert summary["prompt_tokens"] > 0 and summary["completion_tokens"] > 0
    # the second prompt shares its prefix with the first: the server reports cached tokens, and they are kept
    assert meter.calls[0].cached_tokens == 0 < meter.calls[1].cached_tokens < meter.calls[1].prompt_tokens
    assert summary["steps"]["select"]["calls"] == 2


def test_code_fences_are_tolerated() -> None:
    assert parse_json('```json\n{"value": 1}\n```', Answer).value == 1


@pytest.mark.parametrize("content", ["not json at all", '{"value": "many"}', '{"note": "no value"}', "", "[1, 2]"])
def test_malformed_output_is_a_provider_error_with_the_body(scripted: ScriptedLLM, content: str) -> None:
    scripted.on("select", Reply(content))
    meter = Meter()
    with metered(meter), pytest.raises(dossier.ProviderError) as caught:
        ask(scripted.llm())
    assert "malformed output" in str(caught.value)
    assert caught.value.status_code == 200 and caught.value.body == content
    assert [c.error for c in meter.calls] == ["malformed_output"]
    assert meter.calls[0].prompt_tokens > 0  # tokens were spent even though the reply was unusable


def test_timeout_is_provider_timeout_and_not_retried(scripted: ScriptedLLM) -> None:
    scripted.on("select", Reply({"value": 1}, delay=1.5))
    meter = Meter()
    with metered(meter), pytest.raises(dossier.ProviderTimeout):
        ask(scripted.llm(timeouts={"select": 0.3}))  # request-time steps: no retries by default
    assert len(scripted.bodies("select")) == 1
    assert [c.error for c in meter.calls] == ["timeout"]
    assert isinstance(dossier.ProviderTimeout("x"), dossier.ProviderError)


@pytest.mark.parametrize("status", [429, 500, 503])
def test_http_errors_carry_status_and_body_and_request_time_steps_do_not_retry(scripted: ScriptedLLM, status: int) -> None:
    scripted.on("select", Reply(status=status, body={"error": {"message": "slow down", "type": "scripted"}}))
    with pytest.raises(dossier.ProviderError) as caught:
        ask(scripted.llm())
    assert caught.value.status_code == status and "slow down" in (caught.value.body or "")
    assert not isinstance(caught.value, dossier.ProviderTimeout)
    assert len(scripted.bodies("select")) == 1


def test_synthesis_retries_429_and_5xx(scripted: ScriptedLLM) -> None:
    scripted.on("synthesize", Reply(status=429), Reply(status=500), Reply({"value": 7}))
    meter = Meter()
    with metered(meter):
        assert ask(scripted.llm(), step="synthesize").value == 7
    assert len(scripted.bodies("synthesize")) == 3
    assert meter.summary()["calls"] == 1  # one logical call; the client's retries are inside it


def test_persistent_errors_end_after_the_retries(scripted: ScriptedLLM) -> None:
    scripted.on("synthesize", Reply(status=500))
    with pytest.raises(dossier.ProviderError) as caught:
        ask(scripted.llm(retries={"synthesize": 1}), step="synthesize")
    assert caught.value.status_code == 500
    assert len(scripted.bodies("synthesize")) == 2


def test_a_server_that_is_not_there_is_a_provider_error() -> None:
    llm = OpenAIChat("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    with pytest.raises(dossier.ProviderError) as caught:
        ask(llm)
    assert "cannot reach" in str(caught.value)


def test_json_schema_mode_sends_the_schema(scripted: ScriptedLLM) -> None:
    scripted.on("select", {"value": 2})
    ask(scripted.llm(json_mode="json_schema"))
    response_format = scripted.bodies("select")[0]["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["schema"]["required"] == ["value"]


def test_spec_and_environment(scripted: ScriptedLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", scripted.base_url)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # a local server needs no key
    llm = llm_from_env({"DOSSIER_LLM": "openai:local-model"})
    assert isinstance(llm, OpenAIChat) and llm.name == "openai:local-model"
    scripted.on("select", {"value": 5})
    assert ask(llm).value == 5 and scripted.bodies("select")[0]["model"] == "local-model"
    assert llm_from_env({}) is None and llm_from_spec("none") is None
    for bad in ("gpt-4o", "openai:", "anthropic:claude"):
        with pytest.raises(dossier.ConfigError):
            llm_from_spec(bad)


def test_open_reads_dossier_llm_and_an_argument_wins(tmp_path, monkeypatch: pytest.MonkeyPatch, embedder) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("DOSSIER_LLM", "openai:from-env")
    with dossier.open(f"sqlite:///{tmp_path}/a.db", embedder=embedder) as engine:
        assert engine.llm is not None and engine.llm.name == "openai:from-env"
        assert engine.selector.name == "model"
    with dossier.open(f"sqlite:///{tmp_path}/b.db", embedder=embedder, llm="none") as engine:
        assert engine.llm is None and engine.selector.name == "heuristic"
    with dossier.open(f"sqlite:///{tmp_path}/c.db", embedder=embedder, llm="openai:argument") as engine:
        assert engine.llm is not None and engine.llm.name == "openai:argument"


def test_without_the_openai_package_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # import openai -> ImportError
    with pytest.raises(dossier.MissingExtra) as caught:
        llm_from_spec("openai:gpt-4o-mini")
    assert caught.value.extra == "openai" and '"openai"' in str(caught.value)
