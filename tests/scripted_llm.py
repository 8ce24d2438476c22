"""A scripted OpenAI-compatible server on 127.0.0.1, for driving the real ``openai`` client in tests.

``POST /v1/chat/completions`` answers each request with the next scripted :class:`Reply` for its step
(told apart by the first line of the system prompt, see ``dossier.layers.model_steps.TITLES``);
``POST /v1/rerank`` is the ``rerank`` step. A step's last reply repeats. Unscripted steps get a
neutral default. Every request body is kept in ``requests`` (with its ``step``), so a test can inspect
exactly what a model would have been sent. ``usage`` is reported like a provider with a prompt cache:
prompt tokens ~ characters / 4, and cached tokens for the prefix shared with an earlier prompt.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from dossier.layers.model_steps import TITLES
from dossier.providers.llm import OpenAIChat

STEP_OF_TITLE = {title: step for step, title in TITLES.items()}


@dataclass
class Reply:
    """One scripted answer: ``content`` (dict/list -> JSON text; str as is; or a callable of the request
    body returning either) with ``status`` 200, or an error ``status`` with ``body``; after ``delay`` s."""

    content: Any = None
    status: int = 200
    delay: float = 0.0
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


NEUTRAL: dict[str, Any] = {
    "filters": {"doc_types": [], "tags": [], "confidence": 0.0, "reason": "no clear filter"},
    "rephrase": lambda body: {"rephrasings": [question_of(body)]},  # the question itself: no rephrasing
    "select": {"picks": []},
    "synthesize": {"answer": "The context does not say.", "reasoning": "", "confidence": 0.1, "sources_used": []},
    "rerank": lambda body: {"results": [{"index": i, "relevance_score": 0.0} for i in range(len(body["documents"]))]},
}


def question_of(body: dict) -> str:
    """The question at the end of a chat request's last message."""
    return body["messages"][-1]["content"].rsplit("Question: ", 1)[-1]


def prompt_of(body: dict) -> str:
    if "messages" in body:
        return "\n".join(m["content"] for m in body["messages"])
    return json.dumps(body)


def step_of(body: dict, path: str) -> str:
    if path.rstrip("/").endswith("/rerank"):
        return "rerank"
    system = next((m["content"] for m in body.get("messages", []) if m["role"] == "system"), "")
    return STEP_OF_TITLE.get(system.splitlines()[0] if system else "", "unknown")


class ScriptedLLM:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self._script: dict[str, list[Reply]] = {}
        self._prompts: list[str] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                status, payload, headers, delay = server._answer(self.path, body)
                time.sleep(delay)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- scripting ---------------------------------------------------------------------------------
    def on(self, step: str, *replies: Reply | Any) -> "ScriptedLLM":
        """Script ``step``'s replies in order (the last one repeats); a bare value is ``Reply(value)``."""
        with self._lock:
            self._script[step] = [r if isinstance(r, Reply) else Reply(r) for r in replies]
        return self

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self._script.clear()
            self._prompts.clear()

    def bodies(self, step: str | None = None) -> list[dict]:
        with self._lock:
            return [r for r in self.requests if step is None or r["step"] == step]

    def steps(self) -> list[str]:
        return [r["step"] for r in self.bodies()]

    def llm(self, model: str = "scripted", **kwargs: Any) -> OpenAIChat:
        """A chat model on this server, through the real ``openai`` client."""
        return OpenAIChat(model, base_url=self.base_url, api_key="test-key", **kwargs)

    # -- answering ---------------------------------------------------------------------------------
    def _answer(self, path: str, body: dict) -> tuple[int, Any, dict[str, str], float]:
        step = step_of(body, path)
        with self._lock:
            self.requests.append({**body, "step": step, "path": path})
            queue = self._script.get(step)
            reply = (queue.pop(0) if len(queue) > 1 else queue[0]) if queue else Reply(NEUTRAL.get(step, {}))
            prompt = prompt_of(body)
            shared = max((_common_prefix(prompt, p) for p in self._prompts), default=0)
            self._prompts.append(prompt)
        if reply.status != 200:
            error = reply.body if reply.body is not None else {"error": {"message": f"scripted {reply.status}", "type": "scripted"}}
            return reply.status, error, {"retry-after-ms": "10", **reply.headers}, reply.delay
        content = reply.content(body) if callable(reply.content) else reply.content
        if step == "rerank":
            return 200, content, reply.headers, reply.delay
        text = content if isinstance(content, str) else json.dumps(content)
        payload = {
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": max(1, len(text) // 4),
                      "total_tokens": len(prompt) // 4 + max(1, len(text) // 4),
                      "prompt_tokens_details": {"cached_tokens": shared // 4}},
        }  # fmt: skip
        return 200, payload, reply.headers, reply.delay


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.fixture(scope="module")
def scripted_server() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM()
    yield server
    server.close()


@pytest.fixture
def scripted(scripted_server: ScriptedLLM) -> Iterator[ScriptedLLM]:
    """The module's scripted server, with a clean script and request log for each test."""
    scripted_server.reset()
    yield scripted_server
    scripted_server.reset()

