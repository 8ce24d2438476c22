"""Rerankers: the HTTP adapter (Cohere/Jina/vLLM and TEI reply formats), its errors, and the specs."""

from __future__ import annotations

import pytest

import dossier
from dossier.providers.llm import Meter, metered
from dossier.providers.rerank import CrossEncoderReranker, HttpReranker, reranker_from_env, reranker_from_spec
from tests.scripted_llm import Reply, ScriptedLLM, scripted, scripted_server  # noqa: F401 - fixtures


def test_http_reranker_scores_in_input_order(scripted: ScriptedLLM) -> None:
    scripted.on("rerank", {"results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.2}],
                           "usage": {"total_tokens": 42}})  # fmt: skip
    meter = Meter()
    with metered(meter):
        scores = HttpReranker(f"{scripted.base_url}/rerank", model="bge").rerank("q", ["a", "b"])
    assert scores == [0.2, 0.9]
    sent = scripted.bodies("rerank")[0]
    assert (sent["query"], sent["documents"], sent["model"], sent["path"]) == ("q", ["a", "b"], "bge", "/v1/rerank")
    assert meter.calls[0].step == "rerank" and meter.calls[0].prompt_tokens == 42


def test_tei_list_format(scripted: ScriptedLLM) -> None:
    scripted.on("rerank", [{"index": 0, "score": 1.5}, {"index": 1, "score": -2.0}])
    assert HttpReranker(f"{scripted.base_url}/rerank").rerank("q", ["a", "b"]) == [1.5, -2.0]


@pytest.mark.parametrize(
    ("reply", "error", "status"),
    [
        (Reply(status=500), dossier.ProviderError, 500),
        (Reply({"results": [{"index": 0, "relevance_score": 1}]}), dossier.ProviderError, 200),  # one score of two
        (Reply("not json"), dossier.ProviderError, 200),
        (Reply({"results": []}, delay=1.0), dossier.ProviderTimeout, None),
    ],
)
def test_http_reranker_errors(scripted: ScriptedLLM, reply: Reply, error: type, status: int | None) -> None:
    scripted.on("rerank", reply)
    with pytest.raises(error) as caught:
        HttpReranker(f"{scripted.base_url}/rerank", timeout=0.3).rerank("q", ["a", "b"])
    assert caught.value.status_code == status


def test_specs(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert reranker_from_spec(None) is None and reranker_from_env({}) is None
    http = reranker_from_spec("http://localhost:8080/rerank#bge-reranker-base")
    assert isinstance(http, HttpReranker) and (http.url, http.model) == ("http://localhost:8080/rerank", "bge-reranker-base")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:8000/v1/")
    via = reranker_from_env({"DOSSIER_RERANK": "openai:bge"})
    assert isinstance(via, HttpReranker) and via.url == "http://localhost:8000/v1/rerank"
    with pytest.raises(dossier.ConfigError):
        reranker_from_spec("cross-encoder:/no/such/dir")
    with pytest.raises(dossier.ConfigError):
        reranker_from_spec("bogus")
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        with pytest.raises(dossier.MissingExtra) as caught:
            CrossEncoderReranker(tmp_path)
        assert caught.value.extra == "torch"
