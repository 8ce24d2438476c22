"""``dossier.Client`` and ``dossier.AsyncClient`` against a real ``dossier serve``: the same request gives
the same items as the library, every method returns the library's typed objects, and HTTP errors come back
as the library's error tree. On SQLite, and on PostgreSQL (a real server, as the store tests start one)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

import dossier
from dossier.providers.embeddings import OnnxMiniLM
from dossier.schema import Synthesis
from dossier.service import NewDocument
from dossier.stores.service_base import Feedback
from tests.postgres_server import TestServer
from tests.scripted_llm import ScriptedLLM, scripted, scripted_server  # noqa: F401 - fixtures

from .conftest import BRIEF, SAMPLE, Served, item_keys, keys_for, serve

REQUESTS: list[dict[str, Any]] = [
    BRIEF,
    {**BRIEF, "depth": "fast", "budget": {"totalTokens": 1500}},
    {"mode": "scout", "message": "Which customers are in the evaluation stage?"},
    {"mode": "fetch", "fetch": ["doc-refund"], "message": "How long is the refund window?"},
    {"record": {"website": "acme.com"}, "message": "Who are the contacts and what did they ask for?", "trace": True},
]


def same_answer(remote: dossier.RetrieveResponse, local: dossier.RetrieveResponse) -> None:
    assert isinstance(remote, dossier.RetrieveResponse)
    assert item_keys(remote) == item_keys(local)
    assert remote.record == local.record and remote.mode == local.mode and remote.partial == local.partial
    assert {s: r.status for s, r in remote.sources.items()} == {s: r.status for s, r in local.sources.items()}
    assert remote.budget == local.budget
    for source, result in remote.sources.items():  # the same items, field for field (scores to float noise)
        for got, want in zip(result.items, local.sources[source].items):
            g, w = got.model_dump(), want.model_dump()
            assert g.pop("score", None) == pytest.approx(w.pop("score", None), abs=1e-4), (source, g)
            assert g == w


@pytest.mark.parametrize("request_body", REQUESTS, ids=["brief", "fast-small", "scout", "fetch", "company-trace"])
def test_the_client_returns_what_the_library_returns(served: Served, engine_of: Callable[[str], dossier.Engine],
                                                     request_body: dict[str, Any]) -> None:  # fmt: skip
    engine = engine_of(served.store_url)
    with dossier.Client(served.url, served.keys["ana"]) as client:
        remote = client.retrieve(request_body)
    same_answer(remote, engine.retrieve(request_body, org="northwind", caller="ana"))


def test_the_async_client_returns_what_the_library_returns(served: Served,
                                                           engine_of: Callable[[str], dossier.Engine]) -> None:  # fmt: skip
    async def both() -> list[dossier.RetrieveResponse]:
        async with dossier.AsyncClient(served.url, served.keys["ana"]) as client:
            return list(await asyncio.gather(client.retrieve(BRIEF), client.retrieve(REQUESTS[2])))

    brief, scout = asyncio.run(both())
    engine = engine_of(served.store_url)
    same_answer(brief, engine.retrieve(BRIEF, org="northwind", caller="ana"))
    same_answer(scout, engine.retrieve(REQUESTS[2], org="northwind", caller="ana"))


def test_a_typed_request_and_the_key_decide_org_and_caller(served: Served) -> None:
    request = dossier.RetrieveRequest.model_validate(BRIEF)
    with dossier.Client(served.url, served.keys["zoe"]) as client:  # southwind: jane is not one of its records
        response = client.retrieve(request)
        assert client.org == "southwind"
    assert response.record is None or response.record.id != "rec-jane"


def test_writes_return_the_library_types_and_are_found_again(served: Served) -> None:
    with dossier.Client(served.url, served.keys["admin"]) as client:
        by_email = client.remember({"email": "Marta@Globex.com"}, "Marta asked for a Polish invoice template.")
        by_id = client.remember("rec-marta", "Marta wants the renewal quote by Friday.")
        for memory in (by_email, by_id):
            assert isinstance(memory, dossier.Memory) and memory.org == "northwind" and memory.record == "rec-marta"
        document = client.add_document({"markdown": "# Travel policy\n\n## Flights\nEconomy below six hours.\n\n"
                                        "## Hotels\nUp to 180 EUR a night.", "doc_type": "policy", "tags": ["travel"]})  # fmt: skip
        assert isinstance(document, dossier.Document) and document.org == "northwind"
        assert [s.heading for s in document.sections] == ["Flights", "Hotels"]
        typed = dossier.Document(id="doc-parking", org="northwind", title="Parking",
                                 sections=[dossier.Section(id="doc-parking-1", heading="Visitors", text="Bay 4.")])  # fmt: skip
        assert client.add_document(typed) == typed
        report = client.load_bundle({"records": [{"id": "rec-new", "kind": "contact", "identifiers": {"email": "new@initech.com"}}]})
        assert isinstance(report, dossier.LoadReport) and report.inserted == {"records": 1}
        found = client.retrieve({"record": {"email": "marta@globex.com"}, "message": "invoice template"})
        assert {by_email.id, by_id.id} <= {m.id for m in found.sources["memories"].items}
        fetched = client.retrieve({"fetch": [document.id]})
        assert [s.section_id for s in fetched.sources["documents"].items] == [s.id for s in document.sections]
        rated = client.feedback(found.call_id, 5, "had the invoice ask")
        assert isinstance(rated, Feedback) and (rated.org, rated.caller, rated.rating) == ("northwind", "admin", 5)


def test_a_bundle_file_loads_through_the_client(served: Served, tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"records": [{"id": "rec-file", "org": "northwind", "kind": "company",
                                             "identifiers": {"website": "file.example"}}]}))  # fmt: skip
    with dossier.Client(served.url, served.keys["admin"]) as client:
        assert client.load_bundle(path).inserted == {"records": 1}
        assert client.load_bundle(str(path)).unchanged == {"records": 1}
        with pytest.raises(dossier.UsageError, match="cannot read bundle"):
            client.load_bundle(tmp_path / "missing.json")


def test_http_errors_are_the_library_errors(served: Served, engine_of: Callable[[str], dossier.Engine]) -> None:
    with dossier.Client(served.url, "dk_nope_nope") as client:
        with pytest.raises(dossier.Unauthorized):
            client.retrieve(BRIEF)
    with dossier.Client(served.url, served.keys["ana"]) as client:
        with pytest.raises(dossier.InvalidRequest) as local:  # validated before anything is sent
            client.retrieve({**BRIEF, "budget": {"totalTokens": 50_001}})
        assert local.value.field == "budget.totalTokens"
        with pytest.raises(dossier.InvalidRequest) as remote:  # refused by the server
            client.retrieve({"continuation": "never-issued"})
        assert remote.value.field == "continuation"
        call_id = client.retrieve(BRIEF).call_id
        with pytest.raises(dossier.NotFound, match="not deferred"):
            client.result(call_id)
        with pytest.raises(dossier.NotFound):
            client.result("0" * 32)
        with pytest.raises(dossier.NotFound, match="no record with email"):
            client.remember({"email": "nobody@acme.com"}, "anything")
        with pytest.raises(dossier.Forbidden, match="admin"):  # ana may not load bundles
            client.load_bundle({"records": []})
        with pytest.raises(dossier.InvalidRequest):
            client.feedback(call_id, 6)
    with dossier.Client(served.url, served.keys["zoe"]) as other:  # another org's call reads like an unknown one
        with pytest.raises(dossier.NotFound, match=f"no call '{call_id}'"):
            other.result(call_id)
        with pytest.raises(dossier.NotFound, match=f"no call '{call_id}'"):
            other.feedback(call_id, 3)
    bad = {"memories": [{"id": "m-x", "org": "northwind", "record": "rec-nobody", "text": "hi",
                         "created_at": "2025-01-01T00:00:00Z"}]}  # fmt: skip
    with dossier.Client(served.url, served.keys["admin"]) as admin:
        with pytest.raises(dossier.BundleError) as broken:
            admin.load_bundle(bad)
    with pytest.raises(dossier.BundleError) as in_process:
        engine_of(served.store_url).load_bundle(bad)
    assert broken.value.problems == in_process.value.problems and broken.value.problems[0].item_id == "m-x"


@pytest.mark.parametrize("named", ["mapping", "new-document"])
def test_a_document_naming_another_org_is_refused_as_the_server_refuses_it(
    served: Served, engine_of: Callable[[str], dossier.Engine], named: str
) -> None:
    body = {"org": "southwind", "id": f"sw-{named}", "title": "T", "markdown": "# T\n\nx"}
    with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {served.keys['admin']}"}) as http:
        assert http.post("/v1/documents", json=body).status_code == 403  # what the server says to the body itself
    with dossier.Client(served.url, served.keys["admin"]) as client:  # a key of northwind
        with pytest.raises(dossier.Forbidden, match="org 'southwind' is not this key's org 'northwind'"):
            client.add_document(body if named == "mapping" else NewDocument.model_validate(body))

    async def run() -> None:
        async with dossier.AsyncClient(served.url, served.keys["admin"]) as client:
            with pytest.raises(dossier.Forbidden, match="org 'southwind' is not this key's org 'northwind'"):
                await client.add_document(body if named == "mapping" else NewDocument.model_validate(body))

    asyncio.run(run())
    engine = engine_of(served.store_url)
    for org in ("northwind", "southwind"):  # nothing written, under either org
        assert engine.store.get_documents([body["id"]], org=org) == []
    with dossier.Client(served.url, served.keys["admin"]) as client:  # naming the key's own org is fine
        own = client.add_document({**body, "org": "northwind"})
    stored = engine.store.get_documents([body["id"]], org="northwind")
    assert own.org == "northwind" and [d.org for d in stored] == ["northwind"]


ODD_IDS = ["abc?wait=5", "abc#x", "a b", "%41", "caf\u00e9&x=1", "a;b", "..x"]


def test_a_call_id_reaches_the_server_whole(served: Served) -> None:
    """Each id is one path segment, percent-encoded: the server's NotFound names the whole id."""
    with dossier.Client(served.url, served.keys["ana"]) as client:
        for call_id in ODD_IDS:
            with pytest.raises(dossier.NotFound) as refused:
                client.result(call_id)
            assert str(refused.value) == f"no call {call_id!r}"
        for call_id in ("", ".", "..", "a/b", 12345):  # no segment, or not one: refused before anything is sent
            with pytest.raises(dossier.InvalidRequest):
                client.result(call_id)  # type: ignore[arg-type]

    async def run() -> list[str]:
        async with dossier.AsyncClient(served.url, served.keys["ana"]) as client:
            refusals = []
            for call_id in ODD_IDS:
                with pytest.raises(dossier.NotFound) as refused:
                    await client.result(call_id)
                refusals.append(str(refused.value))
            return refusals

    assert asyncio.run(run()) == [f"no call {call_id!r}" for call_id in ODD_IDS]


def test_an_unreachable_service_is_store_unavailable() -> None:
    from tests.service.conftest import free_port

    with dossier.Client(f"http://127.0.0.1:{free_port()}", "dk_a_b", timeout=5) as client:
        with pytest.raises(dossier.StoreUnavailable, match="cannot reach"):
            client.retrieve(BRIEF)
    with pytest.raises(dossier.UsageError):
        dossier.Client("127.0.0.1:8000", "dk_a_b")


def test_a_closed_client_and_a_client_on_another_event_loop_raise_the_library_s_error(served: Served) -> None:
    client = dossier.Client(served.url, served.keys["ana"])
    client.close()
    with pytest.raises(dossier.UsageError, match="this client is closed"):
        client.retrieve(BRIEF)
    reused = dossier.AsyncClient(served.url, served.keys["ana"])
    assert asyncio.run(reused.org()) == "northwind"
    with pytest.raises(dossier.UsageError, match="serves one event loop, the one it was first used on"):
        asyncio.run(reused.retrieve(BRIEF))  # its connections belong to the first loop
    finished = dossier.AsyncClient(served.url, served.keys["ana"])
    assert asyncio.run(finished.org()) == "northwind"
    asyncio.run(finished.aclose())  # from another loop once the first is closed: its connections are dropped
    with pytest.raises(dossier.UsageError, match="this client is closed"):
        asyncio.run(finished.retrieve(BRIEF))
    closed = dossier.AsyncClient(served.url, served.keys["ana"])
    asyncio.run(closed.aclose())
    with pytest.raises(dossier.UsageError, match="this client is closed"):
        asyncio.run(closed.retrieve(BRIEF))


def test_an_async_client_refuses_another_event_loop_before_sending() -> None:
    """On another loop than its first, a request used to go out on the first loop's pooled connection and fail
    after the server had run (and charged) it, reported as not sent. The rule is now checked first: nothing
    reaches the server. Closing it from another loop while its own still runs is refused the same way."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json={"org": "northwind", "items": [], "net": 0})

    client = dossier.AsyncClient("http://dossier.test", "dk_a_b", transport=httpx.MockTransport(handler))
    first = asyncio.new_event_loop()
    try:
        assert first.run_until_complete(client.org()) == "northwind"
        with pytest.raises(dossier.UsageError, match="serves one event loop"):
            asyncio.run(client.retrieve(BRIEF))
        assert seen == ["/v1/usage"]
        with pytest.raises(dossier.UsageError, match="another event loop, still open"):
            asyncio.run(client.aclose())
        first.run_until_complete(client.aclose())
    finally:
        first.close()


@contextmanager
def dripping_server(slow: str) -> Iterator[str]:
    """A server on 127.0.0.1 that reads a request and answers one byte every 0.2 s, for 10 s at most: the
    headers at once and then the body (``slow="body"``), or the headers themselves. No read waits long, so
    httpx's timeout, which bounds each read, never trips."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)

    def answer(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                if slow == "body":
                    conn.sendall(head)
                until = time.monotonic() + 10
                for byte in b" " * 1000 if slow == "body" else head:
                    if stop.wait(0.2) or time.monotonic() > until:
                        return
                    conn.sendall(bytes([byte]))
            except OSError:  # the client has hung up
                pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join()
        listener.close()


@pytest.mark.parametrize("slow", ["body", "headers"])
def test_the_timeout_bounds_the_whole_answer(slow: str) -> None:
    """``timeout`` is the whole request's: a server that answers a byte at a time is StoreUnavailable once it
    has passed (it used to be waited for as long as it kept sending), sync and async."""
    with dripping_server(slow) as url:
        with dossier.Client(url, "dk_a_b", timeout=1.0) as client:
            started = time.monotonic()
            with pytest.raises(dossier.StoreUnavailable, match="did not answer within 1 s"):
                client.retrieve(BRIEF)
            assert time.monotonic() - started < 2.5

        async def run() -> float:
            async with dossier.AsyncClient(url, "dk_a_b", timeout=1.0) as client:
                started = time.monotonic()
                with pytest.raises(dossier.StoreUnavailable, match="did not answer within 1 s"):
                    await client.retrieve(BRIEF)
                return time.monotonic() - started

        assert asyncio.run(run()) < 2.5


@pytest.mark.parametrize("key", ["dk_ab_se\ncret", "dk_ab_se\rcret", "dk_ab_se\x00cret", "dk_ab_s\u00e9cret", "dk_ab se"])
def test_a_key_no_header_can_carry_is_refused_without_quoting_it(key: str) -> None:
    """httpx refused such a key at the first request with a message quoting it whole ("Illegal header value
    b'Bearer dk_...'"), or raised a bare UnicodeEncodeError: the client refuses it when it is made."""
    for make in (dossier.Client, dossier.AsyncClient):
        with pytest.raises(dossier.UsageError, match="no dossier key has") as refused:
            make("http://127.0.0.1:9", key)
        assert "dk_ab" not in str(refused.value) and "se" not in str(refused.value).replace("used", "")


KEY = "dk_0123abcd_s3cr3t-Value"
ECHOES: dict[str, tuple[str, Callable[[str], httpx.Response], type[dossier.DossierError]]] = {
    "401 message": ("retrieve", lambda said: httpx.Response(401, json={"detail": {"message": f"bad {said}"}}),
                    dossier.Unauthorized),
    "422 problems": ("load_bundle", lambda said: httpx.Response(422, json={"detail": {"problems": [f"record r: {said}"]}}),
                     dossier.BundleError),
    "422 field": ("retrieve", lambda said: httpx.Response(422, json={"detail": {"message": "m", "field": said}}),
                  dossier.InvalidRequest),
    "502 body": ("retrieve", lambda said: httpx.Response(502, text=f"upstream got {said}"), dossier.ProviderError),
    "tool error": ("remember", lambda said: httpx.Response(200, json={"result": {"isError": True, "content": [
        {"type": "text", "text": f"unknown key {said}"}]}}), dossier.NotFound),
    "redirect": ("retrieve", lambda said: httpx.Response(302, headers={"Location": f"http://x.test/?k={said}"}),
                 dossier.UsageError),
    "wrong shape": ("feedback", lambda said: httpx.Response(201, json={"call_id": "c1", "caller": "ana", "rating": 3,
                                                                       "comment": None, "at": said}), dossier.StoreError),
}  # fmt: skip


@pytest.mark.parametrize("echo", ECHOES, ids=list(ECHOES))
def test_no_message_quotes_the_key_a_server_echoes(echo: str) -> None:
    """A server that echoes the Authorization header into its error, or a driver that quotes it, puts no key
    into the exception: its text, a bundle's problems, the field, a provider's body show ``***``."""
    method, answer, kind = ECHOES[echo]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/usage":
            return httpx.Response(200, json={"org": "northwind", "items": [], "net": 0})
        return answer(request.headers["authorization"])

    with dossier.Client("http://dossier.test", KEY, transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(kind) as raised:
            {"retrieve": lambda: client.retrieve(BRIEF), "load_bundle": lambda: client.load_bundle({"records": []}),
             "remember": lambda: client.remember({"email": "jane@acme.com"}, "t"),
             "feedback": lambda: client.feedback("c1", 3)}[method]()  # fmt: skip
    error = raised.value
    told = [str(error), repr(vars(error))] + [str(p) for p in getattr(error, "problems", [])]
    assert not [text for text in told if "s3cr3t" in text] and "***" in str(error) + repr(vars(error))


def test_a_driver_s_words_and_a_url_s_password_are_hidden() -> None:
    """A driver's message that quotes the key, and a URL's password, reach no message: a URL with
    ``user:password@`` is refused (httpx would send it in place of the key), a ``password=`` is shown as ``***``."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused {request.headers['authorization']}", request=request)

    with dossier.Client("http://dossier.test", KEY, transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(dossier.StoreUnavailable, match="refused Bearer [*]{3}") as unreachable:
            client.retrieve(BRIEF)
    assert "s3cr3t" not in str(unreachable.value)
    with pytest.raises(dossier.UsageError, match="user or password") as refused:
        dossier.Client("http://ana:pa55word@127.0.0.1:9", KEY)
    assert "pa55word" not in str(refused.value)
    from tests.service.conftest import free_port

    with dossier.Client(f"http://127.0.0.1:{free_port()}/?password=pa55word", KEY, timeout=5) as client:
        with pytest.raises(dossier.StoreUnavailable, match="cannot reach") as unreachable:
            client.retrieve(BRIEF)
    assert "pa55word" not in str(unreachable.value) and "password=***" in str(unreachable.value)


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


FEEDBACK_ROW = {"call_id": "c1", "caller": "ana", "rating": 3, "comment": None, "at": "2025-01-01T00:00:00+00:00"}
NOT_AN_ANSWER = dossier.StoreError
#: (call, status, body, the error): answers of the wrong shape; each escaped the error tree or was taken as success
MALFORMED: dict[str, tuple[str, int, bytes, type[dossier.DossierError]]] = {
    "retrieve {}": ("retrieve", 200, _json({}), NOT_AN_ANSWER),
    "retrieve []": ("retrieve", 200, _json([]), NOT_AN_ANSWER),
    "retrieve null": ("retrieve", 200, _json(None), NOT_AN_ANSWER),
    "retrieve html": ("retrieve", 200, b"<html>hi</html>", NOT_AN_ANSWER),
    "retrieve deep": ("retrieve", 200, b"[" * 100_000 + b"]" * 100_000, NOT_AN_ANSWER),
    "retrieve not utf-8": ("retrieve", 200, b"\xff\xfe{", NOT_AN_ANSWER),
    "retrieve 204": ("retrieve", 204, b"", NOT_AN_ANSWER),
    "org {}": ("org", 200, _json({}), NOT_AN_ANSWER),
    "org list": ("org", 200, _json([1]), NOT_AN_ANSWER),
    "org null": ("org", 200, _json({"org": None}), NOT_AN_ANSWER),
    "org NaN": ("org", 200, b'{"org": NaN}', NOT_AN_ANSWER),
    "result []": ("result", 200, _json([]), NOT_AN_ANSWER),
    "result bad synthesis": ("result", 200, _json({"synthesis": {"confidence": "high"}}), NOT_AN_ANSWER),
    "remember tool {}": ("remember-email", 200, _json({}), NOT_AN_ANSWER),
    "remember tool []": ("remember-email", 200, _json([]), NOT_AN_ANSWER),
    "remember tool text": ("remember-email", 200, _json({"result": {"content": [{"type": "text", "text": "hi"}]}}),
                           NOT_AN_ANSWER),
    "remember tool error": ("remember-email", 200, _json({"error": "boom"}), NOT_AN_ANSWER),
    "remember id {}": ("remember-id", 200, _json({}), NOT_AN_ANSWER),
    "remember id bad row": ("remember-id", 200, _json({"memories": [{"id": 5}]}), NOT_AN_ANSWER),
    "feedback {}": ("feedback", 200, _json({}), NOT_AN_ANSWER),
    "feedback rating": ("feedback", 200, _json({**FEEDBACK_ROW, "rating": "five"}), NOT_AN_ANSWER),
    "feedback at": ("feedback", 200, _json({**FEEDBACK_ROW, "at": 5}), NOT_AN_ANSWER),
    "add_document {}": ("add_document", 200, _json({}), NOT_AN_ANSWER),
    "add_document rows": ("add_document", 200, _json({"documents": "x"}), NOT_AN_ANSWER),
    "load_bundle {}": ("load_bundle", 200, _json({}), NOT_AN_ANSWER),
    "load_bundle counts": ("load_bundle", 200, _json({"inserted": "x", "updated": {}, "unchanged": {}, "embedded": 0,
                                                      "seconds": 0}), NOT_AN_ANSWER),
    "422 problems 5": ("load_bundle", 422, _json({"detail": {"problems": 5}}), dossier.InvalidRequest),
    "422 problems text": ("load_bundle", 422, _json({"detail": {"problems": "abc"}}), dossier.InvalidRequest),
    "500 deep": ("retrieve", 500, b"[" * 100_000 + b"]" * 100_000, dossier.DossierError),
    "302 with JSON": ("org", 302, _json({"org": "northwind"}), dossier.UsageError),
    "301 to evil": ("retrieve", 301, _json({}), dossier.UsageError),
}  # fmt: skip
CALLS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "retrieve": ("retrieve", (BRIEF,)), "result": ("result", ("c1",)),
    "remember-email": ("remember", ({"email": "jane@acme.com"}, "t")), "remember-id": ("remember", ("rec-jane", "t")),
    "feedback": ("feedback", ("c1", 3)), "add_document": ("add_document", ({"title": "T", "markdown": "# T\n\nhi"},)),
    "load_bundle": ("load_bundle", ({"records": []},)),
}  # fmt: skip


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_an_answer_of_the_wrong_shape_is_one_dossier_error(case: str) -> None:
    """A 2xx whose body is not the answer asked for raised pydantic's, json's or Python's own errors (KeyError,
    TypeError, RecursionError...) from every method, a 422 with odd problems a TypeError, and a 3xx was read as
    a success. Each is one error of dossier's tree now: StoreError "not a dossier answer", the 4xx's own class,
    UsageError for a redirect (not followed). Sync and async alike."""
    call, status, body, kind = MALFORMED[case]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/usage" and call != "org":
            return httpx.Response(200, json={"org": "northwind", "items": [], "net": 0})
        headers = {"Location": "http://evil.test/steal"} if 300 <= status < 400 else {}
        return httpx.Response(status, content=body, headers={**headers, "Content-Type": "application/json"})

    with dossier.Client("http://dossier.test", "dk_a_b", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(dossier.DossierError) as raised:
            if call == "org":
                client.org
            else:
                getattr(client, CALLS[call][0])(*CALLS[call][1])
    assert type(raised.value) is kind, raised.value
    if kind is NOT_AN_ANSWER:
        assert str(raised.value).startswith("the answer of http://dossier.test/") and "not a dossier answer" in str(raised.value)

    async def run() -> None:
        async with dossier.AsyncClient("http://dossier.test", "dk_a_b", transport=httpx.MockTransport(handler)) as client:
            with pytest.raises(kind) as raised:
                await (client.org() if call == "org" else getattr(client, CALLS[call][0])(*CALLS[call][1]))
            assert type(raised.value) is kind

    asyncio.run(run())


def test_async_errors_and_writes(served: Served) -> None:
    async def run() -> None:
        async with dossier.AsyncClient(served.url, served.keys["ben"]) as client:
            assert await client.org() == "northwind"  # a method here, a property on Client (README)
            memory = await client.remember({"phone": "+1 415 555 0100"}, "Jane's team moves to the EU region in May.")
            assert memory.record == "rec-jane" and memory.org == "northwind"
            with pytest.raises(dossier.Forbidden):
                await client.load_bundle({"records": []})
            with pytest.raises(dossier.NotFound):
                await client.result("f" * 32)

    asyncio.run(run())


def test_a_deferred_answer_comes_back_as_a_synthesis(tmp_path: Path, sample_db: Path, embedder: OnnxMiniLM,
                                                     scripted: ScriptedLLM) -> None:  # noqa: F811  # fmt: skip
    scripted.on("synthesize", {"answer": "Up to 15% [D1].", "confidence": 0.7, "sources_used": ["D1"]})
    path = tmp_path / "deferred.db"
    path.write_bytes(sample_db.read_bytes())
    store_url = f"sqlite:///{path}"
    keys = keys_for(store_url, embedder)
    for base in serve(store_url, DOSSIER_LLM="openai:scripted", OPENAI_BASE_URL=scripted.base_url,
                      OPENAI_API_KEY="test"):  # fmt: skip
        with dossier.Client(base, keys["ana"]) as client:
            response = client.retrieve({**BRIEF, "synthesize": True, "deferred": True})
            assert response.synthesis is not None and response.synthesis.pending
            answer = client.result(response.call_id, wait=20)
            assert isinstance(answer, Synthesis) and not answer.pending and answer.answer == "Up to 15% [D1]."
        with dossier.Client(base, keys["ben"]) as colleague:  # the same org; the answer is ana's
            with pytest.raises(dossier.NotFound):
                colleague.result(response.call_id)


@pytest.fixture(scope="module")
def served_postgres(postgres_server: TestServer, embedder: OnnxMiniLM) -> Iterator[Served]:
    url = postgres_server.create_database()
    try:
        with dossier.open(url, embedder=embedder) as engine:
            engine.load_bundle(SAMPLE)
        keys = keys_for(url, embedder)
        for base in serve(url):
            yield Served(url=base, store_url=url, keys=keys)
    finally:
        postgres_server.drop_database(url)


def test_the_client_returns_what_the_library_returns_on_postgres(served_postgres: Served,
                                                                 engine_of: Callable[[str], dossier.Engine]) -> None:  # fmt: skip
    engine = engine_of(served_postgres.store_url)
    with dossier.Client(served_postgres.url, served_postgres.keys["ana"]) as client:
        for request_body in (BRIEF, REQUESTS[2], REQUESTS[4]):
            same_answer(client.retrieve(request_body), engine.retrieve(request_body, org="northwind", caller="ana"))
