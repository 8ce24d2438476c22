"""Rerankers: score (question, section) pairs after fusion; optional, and only in ``deep`` calls.

Spec strings (``DOSSIER_RERANK``; :func:`reranker_from_env`):

* ``cross-encoder:<local path>`` -- a sentence-transformers ``CrossEncoder`` loaded from a directory
  on disk (``dossier-engine[torch]``); nothing is downloaded.
* ``openai:<model>`` -- the ``/rerank`` route of the OpenAI-compatible server at ``OPENAI_BASE_URL``
  (vLLM and others serve it there), with ``OPENAI_API_KEY`` if set.
* ``http(s)://host/path#model`` -- any rerank endpoint that takes ``{"model", "query", "documents"}``
  and answers ``{"results": [{"index", "relevance_score"}]}`` (Cohere, Jina, vLLM) or a list of
  ``{"index", "score"}`` (text-embeddings-inference); the fragment names the model, if it needs one.

A reranker only raises; the rerank layer keeps the fused order when it does and reports it. Inside a
call, an HTTP reranker's request is given its timeout or the time left before the rerank step's end
time, whichever is shorter (:mod:`dossier.deadline`), and a URL that keeps timing out is not asked
for a while (:mod:`dossier.providers.circuit`).
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence
from urllib.parse import urldefrag

from ..deadline import MIN_STEP_SECONDS, current_deadline
from ..errors import ConfigError, MissingExtra, ProviderError, ProviderTimeout
from .circuit import CircuitBreaker, breaker_for
from .llm import DEFAULT_TIMEOUTS, ModelCall, record


class Reranker(Protocol):
    """Scores each text's relevance to ``query`` (higher is better), aligned with ``texts``."""

    name: str
    remote: bool  # whether texts leave the process (then personal data is masked first)

    def rerank(self, query: str, texts: Sequence[str]) -> list[float]: ...


class CrossEncoderReranker:
    """A sentence-transformers cross-encoder from a local directory."""

    remote = False

    def __init__(self, path: str | Path, *, batch_size: int = 16) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if not Path(path).is_dir():
            raise ConfigError(f"cross-encoder model directory not found: {path}")
        try:
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            raise MissingExtra("the cross-encoder reranker", "torch") from exc
        self._model = CrossEncoder(str(path), device="cpu")
        self.batch_size = batch_size
        self.name = f"cross-encoder:{Path(path).name}"

    def rerank(self, query: str, texts: Sequence[str]) -> list[float]:
        started = time.perf_counter()
        try:
            scores = self._model.predict([(query, t) for t in texts], batch_size=self.batch_size)
        except Exception as exc:  # noqa: BLE001 - translated at the boundary
            record(ModelCall("rerank", self.name, seconds=round(time.perf_counter() - started, 4), error=type(exc).__name__))
            raise ProviderError(f"{self.name} failed: {type(exc).__name__}: {exc}") from exc
        record(ModelCall("rerank", self.name, seconds=round(time.perf_counter() - started, 4)))
        return [float(s) for s in scores]


class HttpReranker:
    """A rerank endpoint over HTTP (JSON in, JSON out); see the module docstring for the formats."""

    remote = True

    def __init__(self, url: str, *, model: str | None = None, api_key: str | None = None,
                 timeout: float = DEFAULT_TIMEOUTS["rerank"], breaker: CircuitBreaker | None = None) -> None:  # fmt: skip
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"a rerank endpoint must be an http(s) URL, not {url!r}")
        self.url, self.model, self.api_key, self.timeout = url, model, api_key, timeout
        self.name = f"rerank:{model}" if model else f"rerank:{url}"
        self.breaker = breaker if breaker is not None else breaker_for(url)

    def _given(self) -> float:
        """Seconds this request may take: its timeout, or less under a call's deadline; raises
        ProviderTimeout, sending nothing, when no time is left or the URL's circuit is open."""
        deadline = current_deadline()
        given = self.timeout if deadline is None else min(self.timeout, deadline.remaining("rerank"))
        if given < MIN_STEP_SECONDS:
            if deadline is not None:
                deadline.mark("rerank", "no_time")
            raise ProviderTimeout(f"{self.name} was not asked: no time was left before the rerank step's end time")
        if not self.breaker.allow():
            if deadline is not None:
                deadline.mark("rerank", "circuit_open")
            raise ProviderTimeout(f"{self.name} was {self.breaker.describe()}")
        return given

    def rerank(self, query: str, texts: Sequence[str]) -> list[float]:
        body: dict[str, Any] = {"query": query, "documents": list(texts)}
        if self.model:
            body["model"] = self.model
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        given = self._given()
        started = time.perf_counter()

        def done(error: str | None = None, tokens: int = 0) -> None:
            record(ModelCall("rerank", self.name, prompt_tokens=tokens, seconds=round(time.perf_counter() - started, 4), error=error))

        def timed_out() -> ProviderTimeout:
            done("timeout")
            self.breaker.timed_out(given)
            return ProviderTimeout(f"{self.name} did not answer within {given:.3g} s")

        try:
            with urllib.request.urlopen(request, timeout=given) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            done(f"http_{exc.code}")
            self.breaker.answered()
            text = exc.read().decode("utf-8", "replace")[:2000]
            raise ProviderError(f"{self.name} answered with HTTP {exc.code}", status_code=exc.code, body=text) from exc
        except (TimeoutError, socket.timeout) as exc:
            raise timed_out() from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (TimeoutError, socket.timeout)):
                raise timed_out() from exc
            done("connection")
            raise ProviderError(f"cannot reach {self.name} at {self.url}: {exc.reason}") from exc
        self.breaker.answered()
        try:
            scores, tokens = _scores(json.loads(raw), len(texts))
        except (ValueError, KeyError, TypeError) as exc:
            done("malformed_output")
            raise ProviderError(f"{self.name} gave malformed output: {exc}", status_code=200, body=raw[:2000].decode("utf-8", "replace")) from exc
        done(tokens=tokens)
        return scores


def _scores(data: Any, n: int) -> tuple[list[float], int]:
    """Scores in input order from a Cohere/Jina/vLLM (``results``) or TEI (list) reply, and tokens used."""
    results = data["results"] if isinstance(data, dict) else data
    if not isinstance(results, list):
        raise ValueError("no 'results' list")
    scores: list[float | None] = [None] * n
    for r in results:
        score = r.get("relevance_score", r.get("score"))
        scores[int(r["index"])] = float(score)
    if any(s is None for s in scores):
        raise ValueError(f"scores for {sum(s is not None for s in scores)} of {n} texts")
    usage = (data.get("usage") or {}) if isinstance(data, dict) else {}
    tokens = int(usage.get("total_tokens") or usage.get("prompt_tokens") or 0) if isinstance(usage, dict) else 0
    return [float(s) for s in scores if s is not None], tokens


def reranker_from_spec(spec: str | None) -> Reranker | None:
    """``cross-encoder:<path>``, ``openai:<model>``, ``http(s)://...#model``; empty or ``none``: no reranker."""
    spec = (spec or "").strip()
    if spec.lower() in ("", "none", "off"):
        return None
    if spec.startswith("cross-encoder:") and len(spec) > len("cross-encoder:"):
        return CrossEncoderReranker(spec.split(":", 1)[1])
    if spec.startswith("openai:") and len(spec) > len("openai:"):
        base = os.environ.get("OPENAI_BASE_URL")
        if not base:
            raise ConfigError("the openai: reranker posts to $OPENAI_BASE_URL/rerank; set OPENAI_BASE_URL")
        return HttpReranker(base.rstrip("/") + "/rerank", model=spec.split(":", 1)[1], api_key=os.environ.get("OPENAI_API_KEY"))
    if spec.startswith(("http://", "https://")):
        url, fragment = urldefrag(spec)
        return HttpReranker(url, model=fragment or None)
    raise ConfigError(f"unknown reranker {spec!r}; expected 'cross-encoder:<path>', 'openai:<model>' or an http(s) URL")


def reranker_from_env(environ: Mapping[str, str] | None = None) -> Reranker | None:
    """The reranker named by ``DOSSIER_RERANK``, or None when it is unset."""
    return reranker_from_spec((os.environ if environ is None else environ).get("DOSSIER_RERANK"))
