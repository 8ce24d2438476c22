"""Fault injection: each step made to raise; the call still answers, statuses and ``partial`` say what
failed, and nothing else is lost (compared with the same call on a healthy store)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Iterator

import pytest

import dossier
from dossier.sources.external import HttpJsonSource

from .conftest import ids
from .faults import FaultyStore, always, kind_is

CALL = {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "What discount rules apply to annual prepay?",
        "budget": {"totalTokens": 50_000}}  # fmt: skip


def ask(engine: dossier.Engine, **extra) -> dossier.RetrieveResponse:  # type: ignore[no-untyped-def]
    return engine.retrieve({**CALL, **extra}, org="northwind", caller="ana")


@pytest.fixture
def healthy(sample_engine: dossier.Engine) -> dossier.RetrieveResponse:
    return ask(sample_engine)


@pytest.mark.parametrize(
    ("operation", "check", "broken", "status", "route_fallback"),
    [
        ("search_vectors_many", kind_is("memory", parents=True), "memories", "ok", "semantic_error"),
        ("search_vectors", kind_is("section", parents=False), "documents", "ok", "vector_error"),
        ("search_text", kind_is("section"), "documents", "ok", "lexical_error"),
        ("edges_around", always, "graph", "error", None),
        ("recent_memories", always, "memories", "error", None),
        ("records_by_domain", always, None, None, None),
    ],
)
def test_one_failing_step_degrades_only_its_source(
    fresh_engine: dossier.Engine, healthy: dossier.RetrieveResponse, operation, check, broken, status, route_fallback  # type: ignore[no-untyped-def]
) -> None:
    fresh_engine.store = FaultyStore(fresh_engine.store, {operation: check})  # type: ignore[assignment]
    response = ask(fresh_engine)
    assert response.partial is True
    if broken:
        result = response.sources[broken]
        assert result.status == status
        # the failure is named by its class; its message (a store's can name hosts, paths, SQL) stays in the log
        assert "InjectedFault" in (result.error or "") and "injected failure" not in (result.error or "")
        if route_fallback:
            assert response.route[broken].fallback_reason == route_fallback
    for source in ("properties", "memories", "documents", "graph"):
        if source == broken:
            continue
        assert response.sources[source].error is None, source
        if operation != "records_by_domain" or source in ("properties", "documents"):
            assert ids(response, source) == ids(healthy, source), source


def test_both_document_retrievers_failing_is_an_error_not_a_crash(fresh_engine: dossier.Engine) -> None:
    fresh_engine.store = FaultyStore(
        fresh_engine.store, {"search_vectors": kind_is("section", parents=False), "search_text": always}
    )  # type: ignore[assignment]
    response = ask(fresh_engine)
    assert response.sources["documents"].status == "error" and response.sources["documents"].items == []
    assert response.sources["memories"].status == "ok" and response.partial is True


def test_visibility_check_failure_drops_every_document(fresh_engine: dossier.Engine) -> None:
    fresh_engine.store = FaultyStore(fresh_engine.store, {"get_documents": always})  # type: ignore[assignment]
    response = ask(fresh_engine)
    assert response.sources["documents"].items == [] and response.sources["documents"].status == "error"
    assert "visibility check failed" in (response.sources["documents"].error or "")


def test_fusion_failure_falls_back_to_vector_ranking(fresh_engine: dossier.Engine) -> None:
    def broken_fusion(*_args, **_kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("fusion exploded")

    fresh_engine.fuse = broken_fusion
    response = ask(fresh_engine)
    route = response.route["documents"]
    assert (route.backend, route.fallback_reason) == ("vector", "fusion_error")
    assert response.sources["documents"].items and response.partial is True


class _Endpoint(BaseHTTPRequestHandler):
    status = 200
    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        payload = {"items": [{"id": "t-1", "text": f"Ticket about {body['record']['id']}", "score": 0.9}]}
        data = json.dumps(payload).encode() if self.status == 200 else b"boom"
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[tuple[str, type[_Endpoint]]]:
    handler = type("Handler", (_Endpoint,), {"status": 200, "seen": []})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/items", handler
    server.shutdown()


def test_external_http_source_is_opt_in_and_gets_the_resolved_record(
    fresh_engine: dossier.Engine, endpoint: tuple[str, type[_Endpoint]]
) -> None:
    url, handler = endpoint
    fresh_engine.register_external(HttpJsonSource(name="tickets", url=url))
    assert ask(fresh_engine).sources["external"].status == "skipped"
    response = ask(fresh_engine, sources={"external": True})
    assert response.sources["external"].status == "ok"
    assert ids(response, "external") == ["tickets/t-1"]
    assert handler.seen[-1]["record"]["id"] == "rec-jane" and handler.seen[-1]["org"] == "northwind"


def test_external_source_failure_is_reported(fresh_engine: dossier.Engine, endpoint: tuple[str, type[_Endpoint]]) -> None:
    url, handler = endpoint
    handler.status = 500
    fresh_engine.register_external(HttpJsonSource(name="tickets", url=url))
    response = ask(fresh_engine, sources={"external": True})
    assert response.sources["external"].status == "error"
    assert "HTTP 500" in (response.sources["external"].error or "")
    assert response.partial is True and response.sources["memories"].status == "ok"


def test_external_items_sharing_an_id_are_all_paged_through(fresh_engine: dossier.Engine) -> None:
    """Two items of one external source with one id (an explicit "0", and one without an id named by its
    place): each is delivered once across the pages, none dropped because the other was packed."""
    from dossier.schema import ExternalItem

    class Tickets:
        name = "crm"

        def fetch(self, *, org: str, record: Any, message: str, timeout: float) -> list[ExternalItem]:
            texts = ["First ticket " + "a" * 120, "Second ticket " + "b" * 120, "Third ticket " + "c" * 120]
            return [ExternalItem(id=i, source="crm", text=t) for i, t in zip(["0", "0", "2"], texts)]

    fresh_engine.register_external(Tickets())  # type: ignore[arg-type]
    first = ask(fresh_engine, sources={"external": True, "memories": False, "documents": False, "properties": False,
                                       "graph": False}, budget={"totalTokens": 200})  # fmt: skip
    texts = [i.text for i in first.sources["external"].items]
    token = first.continuation
    while token:
        page = fresh_engine.retrieve({"continuation": token, "budget": {"totalTokens": 200}}, org="northwind", caller="ana")
        texts += [i.text for i in page.sources["external"].items]
        token = page.continuation
    assert sorted(t.split(" ")[0] for t in texts) == ["First", "Second", "Third"]


def test_with_every_section_vector_read_failing_the_best_full_text_candidate_still_comes(fresh_engine: dossier.Engine) -> None:
    """The org-wide vector search and the scoring of the full-text candidates by meaning both fail: the
    documents source cannot judge by meaning at all, and returned nothing. Now the best full-text candidate
    comes, as low confidence, and the route says why."""
    fresh_engine.store = FaultyStore(fresh_engine.store, {"search_vectors": kind_is("section")})  # type: ignore[assignment]
    response = ask(fresh_engine)
    documents = response.sources["documents"]
    assert len(documents.items) == 1 and documents.items[0].confidence == "low"
    assert response.route["documents"].fallback_reason == "vector_error"
    assert response.route["documents"].detail["fallback"] == "best_full_text"
    assert response.partial is True
