"""Chat models: one adapter over the ``openai`` client, so hosted APIs, vLLM, Ollama and llama.cpp all work.

A spec names the model: ``openai:<model>`` (``DOSSIER_LLM``; :func:`llm_from_env`). The ``openai``
client then reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` as usual; a local server without keys
works with ``OPENAI_BASE_URL`` alone.

Every step asks for JSON and gets back a validated pydantic model (:meth:`ChatModel.complete`), or an
error from the tree: :class:`~dossier.errors.ProviderTimeout` when the step's timeout passed,
:class:`~dossier.errors.ProviderError` (with ``status_code`` and ``body``) for HTTP errors, refused
connections and output that is not the JSON asked for.

Inside a retrieve call (:mod:`dossier.deadline`) a request is given the step's own timeout or the time
left before the step's end time, whichever is shorter, and is not sent at all when less than
``MIN_STEP_SECONDS`` is left. Retries are only where they are safe and fit: outside a call's deadline
(a synthesis running in the background) they are the client's own (backoff, ``Retry-After``), for
the steps ``DEFAULT_RETRIES`` allows (synthesis: 429s, 5xxs, dropped connections); under a deadline a
failed request is retried only when the server's ``Retry-After`` (or a short backoff) and another
attempt of at least ``MIN_RETRY_SECONDS`` still fit before the step's end time. A URL that keeps timing
out is not asked for a while (:mod:`dossier.providers.circuit`).

Each request's token use (prompt, completion, and cached prompt tokens when the server reports
``usage.prompt_tokens_details.cached_tokens``) is recorded on the :class:`Meter` of the call that made
it (:func:`metered`), so a response can say what each step cost.
"""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from threading import Lock
from typing import Any, Iterator, Literal, Mapping, Protocol, Sequence, TypeVar

from pydantic import BaseModel, ValidationError

from ..deadline import MIN_STEP_SECONDS, current_deadline
from ..errors import ConfigError, MissingExtra, ProviderError, ProviderTimeout
from .circuit import CircuitBreaker, breaker_for

T = TypeVar("T", bound=BaseModel)
Message = Mapping[str, str]
JsonMode = Literal["json_object", "json_schema", "none"]

#: Seconds each step may take (one request; see :class:`OpenAIChat`). Filter inference is the 5 s of
#: DESIGN.md; the others bound how long a ``deep`` call can wait before it falls back.
DEFAULT_TIMEOUTS: Mapping[str, float] = {
    "filters": 5.0, "rephrase": 8.0, "select": 15.0, "rerank": 8.0, "synthesize": 60.0,
}  # fmt: skip
#: Retries per step: request-time steps have a deadline and none; synthesis may retry.
DEFAULT_RETRIES: Mapping[str, int] = {"filters": 0, "rephrase": 0, "select": 0, "rerank": 0, "synthesize": 2}
#: Under a deadline, a retry is made only when at least this many seconds are left for it.
MIN_RETRY_SECONDS = 0.5
#: HTTP statuses worth a retry (as the ``openai`` client has them), and the longest backoff (seconds).
RETRY_STATUSES = frozenset({408, 409, 429})
MAX_BACKOFF = 4.0


# -- metering ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelCall:
    """One request to a model: which step, what it cost, and how it ended."""

    step: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    seconds: float = 0.0
    error: str | None = None  # "timeout" | "http_429" | "malformed_output" | ... ; None when it answered


@dataclass
class Meter:
    """The model calls of one retrieve call (or one background synthesis)."""

    calls: list[ModelCall] = field(default_factory=list)
    _lock: Lock = field(default_factory=Lock, repr=False)

    def record(self, call: ModelCall) -> None:
        with self._lock:
            self.calls.append(call)

    def summary(self) -> dict[str, Any]:
        """Totals and per-step totals, as reported in ``route["model"].detail``."""
        with self._lock:
            calls = list(self.calls)
        steps: dict[str, dict[str, Any]] = {}
        for c in calls:
            totals(steps.setdefault(c.step, _zero()), c)
        out = _zero()
        for c in calls:
            totals(out, c)
        out["steps"] = steps
        return out


def _zero() -> dict[str, Any]:
    return {"calls": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "seconds": 0.0}


def totals(into: dict[str, Any], c: ModelCall) -> None:
    into["calls"] += 1
    into["errors"] += c.error is not None
    into["prompt_tokens"] += c.prompt_tokens
    into["completion_tokens"] += c.completion_tokens
    into["cached_tokens"] += c.cached_tokens
    into["seconds"] = round(into["seconds"] + c.seconds, 4)


_METER: ContextVar[Meter | None] = ContextVar("dossier_meter", default=None)


@contextmanager
def metered(meter: Meter) -> Iterator[Meter]:
    """Record the model calls made inside this block (in this thread or context) on ``meter``."""
    token = _METER.set(meter)
    try:
        yield meter
    finally:
        _METER.reset(token)


def record(call: ModelCall) -> None:
    """Record ``call`` on the current meter, if any (adapters call this once per request)."""
    meter = _METER.get()
    if meter is not None:
        meter.record(call)


# -- the interface -------------------------------------------------------------------------------------
class ChatModel(Protocol):
    """A chat model that answers with JSON validated against ``output``."""

    name: str

    def complete(self, messages: Sequence[Message], *, output: type[T], step: str) -> T:
        """The model's answer to ``messages`` as an ``output``; raises ProviderError / ProviderTimeout."""
        ...


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def parse_json(text: str | None, output: type[T]) -> T:
    """Validate a model's reply as ``output``; code fences around the JSON are tolerated."""
    if not text or not text.strip():
        raise ProviderError("malformed output: empty reply", status_code=200, body=text or "")
    fenced = _FENCE.match(text)
    raw = fenced.group(1) if fenced else text
    try:
        return output.model_validate(json.loads(raw))
    except (json.JSONDecodeError, ValidationError) as exc:
        first = str(exc).splitlines()[0] if isinstance(exc, json.JSONDecodeError) else _first_error(exc)
        raise ProviderError(f"malformed output: {first}", status_code=200, body=text[:2000]) from exc


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"]) or "reply"
    return f"{where}: {error['msg']}"


class OpenAIChat:
    """Any OpenAI-compatible ``/chat/completions`` endpoint, through the official ``openai`` client.

    ``timeouts`` and ``retries`` (per step, merged over :data:`DEFAULT_TIMEOUTS` /
    :data:`DEFAULT_RETRIES`) bound each request; a call's deadline bounds it further (module
    docstring). ``json_mode`` asks for ``{"type": "json_object"}`` (widely supported), a JSON schema
    (``json_schema``; OpenAI, vLLM, recent Ollama) or nothing (the prompt alone asks for JSON); the
    reply is validated either way. ``breaker`` defaults to the process's breaker of the base URL.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeouts: Mapping[str, float] | None = None,
        retries: Mapping[str, int] | None = None,
        json_mode: JsonMode = "json_object",
        temperature: float | None = 0.0,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        try:
            import openai
        except ImportError as exc:
            raise MissingExtra("the OpenAI chat model", "openai") from exc
        if not model:
            raise ConfigError("a chat model needs a name: openai:<model>")
        self._openai = openai
        self.model = model
        self.name = f"openai:{model}"
        self.timeouts = {**DEFAULT_TIMEOUTS, **(timeouts or {})}
        self.retries = {**DEFAULT_RETRIES, **(retries or {})}
        self.json_mode = json_mode
        self.temperature = temperature
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        # A local server (Ollama, llama.cpp, vLLM) needs no key, but the client insists on one.
        api_key = api_key or os.environ.get("OPENAI_API_KEY") or ("unused" if base_url else None)
        try:
            self._client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        except openai.OpenAIError as exc:
            raise ConfigError(f"cannot configure the chat model {self.name}: {exc} (set OPENAI_API_KEY, or "
                              "OPENAI_BASE_URL for a local server)") from exc  # fmt: skip
        self.base_url = str(self._client.base_url)
        self.breaker = breaker if breaker is not None else breaker_for(self.base_url)

    def __repr__(self) -> str:
        return f"OpenAIChat({self.model!r}, base_url={self.base_url!r})"

    def _response_format(self, output: type[BaseModel]) -> dict[str, Any] | None:
        if self.json_mode == "json_object":
            return {"type": "json_object"}
        if self.json_mode == "json_schema":
            return {"type": "json_schema", "json_schema": {"name": output.__name__, "schema": output.model_json_schema()}}
        return None

    def complete(self, messages: Sequence[Message], *, output: type[T], step: str) -> T:
        kwargs: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages]}
        response_format = self._response_format(output)
        if response_format is not None:
            kwargs["response_format"] = response_format
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        timeout, retries = self.timeouts.get(step, 30.0), self.retries.get(step, 0)
        deadline = current_deadline()
        if deadline is None:  # a background synthesis, or a step outside a call: the client's own retries
            self._admit(step, None)
            return self._request(kwargs, output, step, timeout, retries, {})
        for attempt in range(retries + 1):
            given = min(timeout, deadline.remaining(step))
            self._admit(step, given)
            hints: dict[str, Any] = {}
            try:
                return self._request(kwargs, output, step, given, 0, hints)
            except ProviderError:
                asked = hints.get("retry_after")  # the server's wait is kept; our own backoff is short
                wait = float(asked) if asked is not None else min(0.5 * 2**attempt, MAX_BACKOFF)
                if attempt == retries or not hints.get("retryable") or deadline.remaining(step) < wait + MIN_RETRY_SECONDS:
                    raise
                time.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _admit(self, step: str, given: float | None) -> None:
        """Raise ProviderTimeout, sending nothing, when the deadline leaves no time or the URL's circuit is open."""
        deadline = current_deadline()
        if given is not None and given < MIN_STEP_SECONDS:
            if deadline is not None:
                deadline.mark(step, "no_time")
            raise ProviderTimeout(f"{self.name} was not asked the {step} step: no time was left before its end time")
        if not self.breaker.allow():
            if deadline is not None:
                deadline.mark(step, "circuit_open")
            raise ProviderTimeout(f"{self.name} was {self.breaker.describe()}")

    def _request(self, kwargs: dict[str, Any], output: type[T], step: str, timeout: float, retries: int,
                 hints: dict[str, Any]) -> T:  # fmt: skip
        """One request (which the client retries ``retries`` times); ``hints`` learns whether a retry
        could help (``retryable``) and what the server asked to wait (``retry_after``, seconds)."""
        openai = self._openai
        client = self._client.with_options(timeout=timeout, max_retries=retries)
        started = time.perf_counter()

        def failed(kind: str) -> None:
            record(ModelCall(step, self.name, seconds=round(time.perf_counter() - started, 4), error=kind))

        try:
            response = client.chat.completions.create(**kwargs)
        except openai.APITimeoutError as exc:
            failed("timeout")
            self.breaker.timed_out(timeout)
            raise ProviderTimeout(f"{self.name} did not answer the {step} step within {timeout:.3g} s") from exc
        except openai.APIStatusError as exc:
            failed(f"http_{exc.status_code}")
            self.breaker.answered()
            hints["retryable"] = exc.status_code in RETRY_STATUSES or exc.status_code >= 500
            hints["retry_after"] = _retry_after(exc.response.headers if exc.response is not None else {})
            body = exc.response.text if exc.response is not None else str(exc.body)
            raise ProviderError(f"{self.name} answered the {step} step with HTTP {exc.status_code}: {exc.message}",
                                status_code=exc.status_code, body=body[:2000]) from exc  # fmt: skip
        except openai.APIConnectionError as exc:
            failed("connection")
            hints["retryable"] = True
            raise ProviderError(f"cannot reach {self.name} at {self.base_url}: {exc}") from exc
        except openai.OpenAIError as exc:
            failed(type(exc).__name__)
            raise ProviderError(f"{self.name} failed in the {step} step: {exc}") from exc
        self.breaker.answered()
        usage = getattr(response, "usage", None)
        details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
        content = response.choices[0].message.content if response.choices else None

        def spent(error: str | None) -> None:
            record(ModelCall(
                step, self.name,
                prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
                cached_tokens=int(getattr(details, "cached_tokens", 0) or 0),
                seconds=round(time.perf_counter() - started, 4), error=error,
            ))  # fmt: skip

        try:
            value = parse_json(content, output)
        except ProviderError as exc:
            spent("malformed_output")
            raise ProviderError(f"{self.name} gave {exc} in the {step} step", status_code=exc.status_code, body=exc.body) from exc
        spent(None)
        return value


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a server asked to wait (``retry-after-ms`` or ``retry-after`` in seconds), if it said."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return max(float(value) / divisor, 0.0)
            except ValueError:
                continue
    return None


# -- configuration ---------------------------------------------------------------------------------
def llm_from_spec(spec: str | None) -> ChatModel | None:
    """``openai:<model>`` -> :class:`OpenAIChat`; empty or ``none`` -> no model (heuristics only)."""
    spec = (spec or "").strip()
    if spec.lower() in ("", "none", "off"):
        return None
    if spec.startswith("openai:") and len(spec) > len("openai:"):
        return OpenAIChat(spec.split(":", 1)[1])
    raise ConfigError(f"unknown chat model {spec!r}; expected 'openai:<model>' (e.g. DOSSIER_LLM=openai:gpt-4o-mini)")


def llm_from_env(environ: Mapping[str, str] | None = None) -> ChatModel | None:
    """The chat model named by ``DOSSIER_LLM``, or None when it is unset."""
    return llm_from_spec((os.environ if environ is None else environ).get("DOSSIER_LLM"))
