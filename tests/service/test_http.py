"""The HTTP API end to end over a real socket on 127.0.0.1 (uvicorn in a thread), driven with httpx."""

from __future__ import annotations

import json
import time
from typing import Any, Iterator

import httpx
import pytest

from .conftest import BRIEF, Live, item_keys, org_ids, response_ids, table_text


@pytest.fixture(scope="module")
def http(live: Live) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client


def post(http: httpx.Client, live: Live, path: str, body: Any, caller: str = "ana") -> httpx.Response:
    return http.post(path, json=body, headers=live.auth(caller))


def test_health_and_openapi_need_no_key(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    spec = http.get("/openapi.json").json()
    assert {"/v1/retrieve", "/v1/calls/{call_id}", "/v1/feedback", "/v1/bundles", "/v1/records", "/v1/memories",
            "/v1/documents", "/healthz"} <= set(spec["paths"])  # fmt: skip
    assert "RetrieveRequest" in spec["components"]["schemas"]
    # no third-party script runs on the service's origin (where the inspector keeps a pasted key) unless asked
    assert http.get("/docs").status_code == 404 and http.get("/redoc").status_code == 404


def test_swagger_ui_is_served_when_asked(live: Live) -> None:
    from fastapi.testclient import TestClient

    from dossier.http import create_app

    with TestClient(create_app(live.service, mcp=False, api_docs=True)) as client:
        assert client.get("/docs").status_code == 200 and "swagger-ui" in client.get("/docs").text
        assert client.get("/redoc").status_code == 404


def test_retrieve_over_http_returns_what_the_python_api_returns(http: httpx.Client, live: Live) -> None:
    response = post(http, live, "/v1/retrieve", BRIEF)
    assert response.status_code == 200, response.text
    expected = live.engine.retrieve(BRIEF, org="northwind", caller="ana")
    assert item_keys(response.json()) == item_keys(expected)
    assert response.json()["record"]["id"] == "rec-jane"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer"}, {"Authorization": "Basic YTpi"},
                                     {"Authorization": "Bearer dk_nope_nope"}, {"Authorization": "Bearer garbage"}])  # fmt: skip
def test_no_key_or_a_bad_key_is_401(http: httpx.Client, headers: dict[str, str]) -> None:
    for method, path, body in (("POST", "/v1/retrieve", BRIEF), ("GET", "/v1/calls/abc", None), ("POST", "/mcp", {})):
        response = http.request(method, path, json=body, headers=headers)
        assert response.status_code == 401, (path, response.text)
        assert response.headers["www-authenticate"] == "Bearer"


def test_a_revoked_key_is_401_at_once(http: httpx.Client, live: Live) -> None:
    row, key = live.service.create_key("northwind", "dev")
    assert http.post("/v1/retrieve", json=BRIEF, headers={"Authorization": f"Bearer {key}"}).status_code == 200
    live.service.revoke_key(row.id)
    assert http.post("/v1/retrieve", json=BRIEF, headers={"Authorization": f"Bearer {key}"}).status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "body"),
        (b"", "body"),
        (b"[1, 2]", "body"),
        (b'"just a string"', "body"),
        (json.dumps({**BRIEF, "org": "southwind"}).encode(), "org"),
        (json.dumps({**BRIEF, "caller": "admin"}).encode(), "caller"),
        (json.dumps({**BRIEF, "budget": {"totalTokens": "lots"}}).encode(), "budget.totalTokens"),
        (json.dumps({**BRIEF, "budget": {"totalTokens": 50_001}}).encode(), "budget.totalTokens"),
        (json.dumps({**BRIEF, "record": {"email": "not-an-email"}}).encode(), "record.email"),
        (json.dumps({**BRIEF, "record": {"email": "a@b.com", "phone": "+1 415 555 0100"}}).encode(), "record"),
        (json.dumps({**BRIEF, "mode": "everything"}).encode(), "mode"),
        (json.dumps({"fetch": [f"d{i}" for i in range(21)]}).encode(), "fetch"),
        (json.dumps({"mode": "fetch"}).encode(), "fetch"),
        (json.dumps({"continuation": "never-issued"}).encode(), "continuation"),
        (json.dumps({**BRIEF, "message": 42}).encode(), "message"),
    ],
)
def test_an_invalid_body_is_422_naming_the_field(http: httpx.Client, live: Live, body: bytes, field: str) -> None:
    response = http.post("/v1/retrieve", content=body, headers={**live.auth("ana"), "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["detail"]["field"] == field


def test_a_body_over_its_limit_is_413_before_it_is_read(http: httpx.Client, live: Live) -> None:
    big = json.dumps({**BRIEF, "augmentation": ["x" * (1 << 20)]}).encode()
    response = http.post("/v1/retrieve", content=big, headers=live.auth("ana"))
    assert response.status_code == 413 and "1 MiB" in response.json()["detail"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(40):
            yield b" " * 65536

    response = http.post("/v1/retrieve", content=chunks(), headers=live.auth("ana"))
    assert response.status_code == 413
    medium = json.dumps({"records": [{"id": f"r{i}", "kind": "contact", "properties": {"n": "x" * 1000}}
                                     for i in range(1500)]})  # fmt: skip
    assert 1 << 20 < len(medium) < 20 << 20
    assert post(http, live, "/v1/bundles", json.loads(medium)).status_code == 403  # under the bundle limit: read (ana is no admin)
    assert http.post("/v1/records", content=b"x" * (6 << 20), headers=live.auth("ana")).status_code == 413


BAD_BODIES = [b"", b"null", b"{", b"[]", b"[{}]", b'{"a": 1}', b"\xff\xfe", b'{"records": "x"}', b"1e999",
              b'{"id": null}', b"[" * 5000 + b"]" * 5000, json.dumps({"x": "\u0000"}).encode()]  # fmt: skip
ENDPOINTS = ["/v1/retrieve", "/v1/feedback", "/v1/bundles", "/v1/records", "/v1/memories", "/v1/documents"]


@pytest.mark.parametrize("path", ENDPOINTS)
def test_bad_input_is_never_a_500(http: httpx.Client, live: Live, path: str) -> None:
    for caller in ("ana", "admin"):
        for body in BAD_BODIES:
            response = http.post(path, content=body, headers=live.auth(caller))
            assert response.status_code < 500, (path, body[:20], response.status_code, response.text)
            assert response.status_code < 300 or "detail" in response.json()


def test_a_key_of_another_org_gets_nothing_of_this_org(http: httpx.Client, live: Live) -> None:
    northwind, southwind = org_ids("northwind"), org_ids("southwind")
    for body in (BRIEF, {**BRIEF, "record": {"phone": "+1 415 555 0100"}}, {"message": "discount approval chain"},
                 {"fetch": ["doc-pricing", "doc-commission"]}, {"filters": {"tags": ["pricing"]}}):  # fmt: skip
        response = post(http, live, "/v1/retrieve", body, caller="zoe")
        assert response.status_code == 200, response.text
        ids = response_ids(response.json())
        assert not ids & northwind, (body, ids & northwind)
        assert ids <= southwind | {""}
    assert post(http, live, "/v1/retrieve", BRIEF, caller="zoe").json()["record"]["id"] == "b-jane"


def test_another_orgs_calls_sessions_and_feedback_read_like_unknown_ones(http: httpx.Client, live: Live) -> None:
    first = post(http, live, "/v1/retrieve", {**BRIEF, "budget": {"totalTokens": 1200}}).json()
    call_id, continuation = first["call_id"], first["continuation"]
    assert continuation
    assert post(http, live, "/v1/feedback", {"call_id": call_id, "rating": 5, "comment": "spot on"}).status_code == 201
    zoe = live.auth("zoe")
    unknown_call, unknown_session = "f" * len(call_id), "f" * len(continuation)

    def same(a: httpx.Response, b: httpx.Response, secret: str, stand_in: str) -> None:
        # the same status and the same body, the id aside: nothing tells that another org's id exists
        assert a.status_code == b.status_code and a.status_code in (404, 422), (a.status_code, b.status_code)
        assert a.text.replace(secret, "ID") == b.text.replace(stand_in, "ID")

    same(http.get(f"/v1/calls/{call_id}", headers=zoe), http.get(f"/v1/calls/{unknown_call}", headers=zoe), call_id, unknown_call)
    same(http.get(f"/v1/calls/{call_id}/feedback", headers=zoe), http.get(f"/v1/calls/{unknown_call}/feedback", headers=zoe),
         call_id, unknown_call)  # fmt: skip
    same(http.post("/v1/feedback", json={"call_id": call_id, "rating": 1}, headers=zoe),
         http.post("/v1/feedback", json={"call_id": unknown_call, "rating": 1}, headers=zoe), call_id, unknown_call)  # fmt: skip
    same(http.post("/v1/retrieve", json={"continuation": continuation}, headers=zoe),
         http.post("/v1/retrieve", json={"continuation": unknown_session}, headers=zoe), continuation, unknown_session)  # fmt: skip
    assert http.get("/v1/calls/" + "0" * 32, headers=live.auth("ana")).status_code == 404
    for wait in ("inf", "nan", "-1", "31"):  # at most 30 seconds, a number
        refused = http.get(f"/v1/calls/{call_id}", params={"wait": wait}, headers=live.auth("ana"))
        assert refused.status_code == 422 and refused.json()["detail"]["field"] == "wait", (wait, refused.text)
    ben = live.auth("ben")  # same org, another caller: ana's call reads like an unknown one to him too
    same(http.get(f"/v1/calls/{call_id}", headers=ben), http.get(f"/v1/calls/{unknown_call}", headers=ben), call_id, unknown_call)
    same(http.get(f"/v1/calls/{call_id}/feedback", headers=ben), http.get(f"/v1/calls/{unknown_call}/feedback", headers=ben),
         call_id, unknown_call)  # fmt: skip
    org_admin = http.get(f"/v1/calls/{call_id}", headers=live.auth("admin")).json()  # the org's admin reads any
    assert org_admin["summary"]["mode"] == "brief" and org_admin["summary"]["caller"] == "ana"
    assert [f["rating"] for f in http.get(f"/v1/calls/{call_id}/feedback", headers=live.auth("ana")).json()] == [5]
    page = post(http, live, "/v1/retrieve", {"continuation": continuation}, caller="ben")
    assert page.status_code == 200 and page.json()["mode"] == "expand"


def test_loading_stays_in_the_keys_org(http: httpx.Client, live: Live) -> None:
    record = {"id": "rec-http", "kind": "contact", "identifiers": {"email": "http@acme.com"}, "properties": {"tier": "gold"}}
    assert post(http, live, "/v1/records", record).json()["inserted"] == {"records": 1}
    assert post(http, live, "/v1/records", [{**record, "id": "rec-x", "org": "southwind"}]).status_code == 403
    assert post(http, live, "/v1/records", {**record, "kind": "robot"}).status_code == 422
    memory = post(http, live, "/v1/memories", {"record": "rec-http", "text": "Prefers calls after 4pm."}).json()
    assert memory["memories"][0]["record_id"] == "rec-http"
    assert post(http, live, "/v1/memories", {"record": "rec-http", "text": "x", "org": "southwind"}).status_code == 403
    assert post(http, live, "/v1/memories", {"record": "b-jane", "text": "southwind's record"}).status_code == 422
    doc = post(http, live, "/v1/documents", {"markdown": "# Call hours\n\n## Evenings\nCall after 4pm.", "tags": ["x"]})
    assert doc.json()["documents"][0]["id"] == "call-hours"
    assert post(http, live, "/v1/bundles", {"memories": []}).status_code == 403  # ana is no admin
    assert post(http, live, "/v1/bundles", {"orgs": [{"id": "northwind"}]}, caller="b-admin").status_code == 403
    bundle = {"memories": [{"id": "m-http", "record": "rec-http", "text": "Renewal due in June.", "created_at": "2025-01-01"}]}
    assert post(http, live, "/v1/bundles", bundle, caller="admin").json()["inserted"] == {"memories": 1}
    found = post(http, live, "/v1/retrieve", {"mode": "brief", "record": {"email": "http@acme.com"},
                                             "message": "When is the renewal due, and what are the call hours?"})  # fmt: skip
    assert {"m-http", memory["memories"][0]["id"]} <= response_ids(found.json())
    assert "rec-http" not in response_ids(post(http, live, "/v1/retrieve", {"record": {"id": "rec-http"}}, "zoe").json())


def test_usage_and_the_audit_over_the_wire(http: httpx.Client, live: Live) -> None:
    before = http.get("/v1/usage", headers=live.auth("zoe")).json()["net"]
    assert post(http, live, "/v1/retrieve", {**BRIEF, "depth": "fast"}, caller="zoe").status_code == 200
    assert http.get("/v1/usage", headers=live.auth("zoe")).json()["net"] == before + 1
    audit = table_text(live.db, "audit")
    for secret in (BRIEF["message"], "jane@acme.com", "jane", "rec-jane", "b-jane", "Prefers calls after 4pm"):
        assert secret not in audit, secret
    assert "|http|" in audit


def test_a_store_that_hangs_on_the_key_check_never_holds_healthz(http: httpx.Client, live: Live,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A database that stops answering (not refusing) makes the key check wait: that wait is a worker thread's,
    so the event loop, and the liveness probe, go on answering."""
    import threading

    released = threading.Event()
    real = live.service.authenticate

    def hangs(key: object) -> object:
        released.wait(20)
        return real(key)  # type: ignore[arg-type]

    monkeypatch.setattr(live.service, "authenticate", hangs)
    waiting = threading.Thread(target=lambda: httpx.post(f"{live.url}/v1/retrieve", json=BRIEF, headers=live.auth("ana"),
                                                         timeout=30))  # fmt: skip
    waiting.start()
    try:
        time.sleep(0.5)  # the retrieve is in its key check
        started = time.monotonic()
        assert http.get("/healthz", timeout=5).json() == {"status": "ok"}
        assert time.monotonic() - started < 2
    finally:
        released.set()
        waiting.join(30)


def test_answers_behind_a_key_are_never_cached_or_sniffed_and_two_keys_are_refused(http: httpx.Client, live: Live) -> None:
    for response in (post(http, live, "/v1/retrieve", BRIEF), http.get("/v1/usage", headers=live.auth("ana")),
                     http.get("/v1/usage")):  # a refusal too  # fmt: skip
        assert response.headers["cache-control"] == "no-store"
        assert response.headers["x-content-type-options"] == "nosniff"
    assert "no-store" not in http.get("/healthz").headers.get("cache-control", "")  # public routes are left as they are
    two = [("Authorization", f"Bearer {live.keys['zoe']}"), ("Authorization", f"Bearer {live.keys['ana']}")]
    refused = http.get("/v1/usage", headers=httpx.Headers(two))
    assert refused.status_code == 401 and "more than one Authorization header" in refused.json()["detail"]["message"]
