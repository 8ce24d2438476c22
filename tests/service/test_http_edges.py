"""The edges of the HTTP API over a real socket (uvicorn in a thread, driven with httpx): bodies that are not
text or not JSON, lone surrogates, unknown fields, coercion, capped echoes, the one error shape for every
status, the MCP endpoint's methods, and the audit row every refused request leaves (field names only)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Iterator

import httpx
import pytest

import dossier
from dossier.http import ErrorBody

from .conftest import BRIEF, Live, table_text


@pytest.fixture(scope="module")
def http(live: Live) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client


def send(http: httpx.Client, live: Live, path: str, body: Any, caller: str = "ana") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post(path, content=content, headers={**live.auth(caller), "Content-Type": "application/json"})


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The error body, checked against the one shape: ``{"detail": {"field"?, "message", "problems"?}}``."""
    data = response.json()
    assert set(data) == {"detail"}, data
    assert set(data["detail"]) <= {"field", "message", "problems"} and isinstance(data["detail"]["message"], str)
    ErrorBody.model_validate(data)
    return data["detail"]


def refusals(live: Live, n: int) -> list[dict[str, Any]]:
    """The shapes of the org's ``n`` newest audit rows."""
    rows = live.service.store.audit_rows(org="northwind", limit=n)
    return [{"error": r.error_type, "outcome": r.outcome, **json.loads(r.shape)} for r in rows]


# -- lone surrogates and NUL characters -------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "field", "why"),
    [
        ("/v1/documents", b'{"title": "Pricing \\ud800", "markdown": "## A\\nB"}', "title", "surrogate"),
        ("/v1/documents", b'{"markdown": "# Surrogate\\n\\n## A\\nB \\udfff"}', "markdown", "surrogate"),
        ("/v1/documents", b'[{"markdown": "# Fine\\n\\n## A\\nB"}, {"markdown": "# X\\ud800"}]', "1.markdown", "surrogate"),
        ("/v1/records", b'{"id": "rec-sur", "kind": "contact", "properties": {"note": "\\ud800"}}', "properties.note", "surrogate"),
        ("/v1/records", b'{"id": "rec-sur", "kind": "contact", "properties": {"\\ud800": 1}}', "properties", "surrogate"),
        ("/v1/memories", b'{"record": "rec-jane", "text": "a \\udc00 b", "id": "mem-sur"}', "text", "surrogate"),
        ("/v1/retrieve", b'{"message": "\\ud800"}', "message", "surrogate"),
        ("/v1/feedback", b'{"call_id": "x", "rating": 3, "comment": "\\ud800"}', "comment", "surrogate"),
        # PostgreSQL cannot store a NUL character: both stores refuse it where it comes in, never a 503
        ("/v1/retrieve", b'{"record": {"email": "ja\\u0000ne@acme.com"}, "message": "x"}', "record.email", "NUL"),
        ("/v1/retrieve", b'{"continuation": "a\\u0000b"}', "continuation", "NUL"),
        ("/v1/memories", b'{"record": "rec-jane", "text": "a \\u0000 b", "id": "mem-sur"}', "text", "NUL"),
        ("/v1/records", b'{"id": "rec-sur", "kind": "contact", "properties": {"note": "x\\u0000"}}', "properties.note", "NUL"),
        ("/v1/feedback", b'{"call_id": "x", "rating": 3, "comment": "\\u0000"}', "comment", "NUL"),
    ],
)
def test_a_string_that_is_no_text_is_422_naming_the_field_and_nothing_is_written(
    http: httpx.Client, live: Live, path: str, body: bytes, field: str, why: str
) -> None:
    response = send(http, live, path, body)
    assert response.status_code == 422, response.text
    detail = error_of(response)
    assert detail["field"] == field and why in detail["message"]
    store = live.engine.store
    assert store.get_documents(["fine", "surrogate", "pricing"], org="northwind") == []
    assert store.get_records(["rec-sur"], org="northwind") == []
    assert store.get_memories(["mem-sur"], org="northwind") == []


def test_a_nul_character_is_refused_by_the_library_before_any_store_reads_it(http: httpx.Client, live: Live) -> None:
    assert http.get("/v1/calls/a%00b", headers=live.auth("ana")).status_code == 404  # no call id holds one
    with pytest.raises(dossier.InvalidRequest) as caught:
        live.engine.retrieve({"record": {"id": "rec-\x00jane"}, "message": "x"}, org="northwind", caller="ana")
    assert caught.value.field == "record.id" and "NUL" in str(caught.value)
    with pytest.raises(dossier.BundleError) as broken:
        live.engine.load_bundle({"memories": [{"id": "mem-nul", "org": "northwind", "record": "rec-jane", "text": "a\x00",
                                               "created_at": "2026-01-01T00:00:00Z"}]})  # fmt: skip
    assert "text: a NUL character" in str(broken.value) and live.engine.store.get_memories(["mem-nul"], org="northwind") == []


def test_a_surrogate_pair_is_text_and_loads(http: httpx.Client, live: Live) -> None:
    response = send(http, live, "/v1/documents", b'{"markdown": "# Emoji \\ud83d\\ude00\\n\\n## A\\nB"}')
    assert response.status_code == 200, response.text
    assert response.json()["documents"][0]["title"] == "Emoji \U0001f600"


# -- bodies that are not JSON ------------------------------------------------------------------------
PARSE_ERRORS = {
    "nested 10,000 deep": (b"[" * 10_000 + b"]" * 10_000, "nested"),
    "objects nested 100 deep": (b'{"a":' * 100 + b"1" + b"}" * 100, "nested"),
    "invalid UTF-8": (b'{"message": "caf\xe9"}', "UTF-8"),
    "1e5000": (b'{"message": "x", "budget": {"totalTokens": 1e5000}}', "out of range"),
    "-1e5000": (b"-1e5000", "out of range"),
    "an integer beyond 64 bits": (b'{"budget": {"totalTokens": 123456789012345678901234567890}}', "64 bits"),
    "NaN": (b'{"budget": {"totalTokens": NaN}}', "NaN"),
    "truncated": (b'{"mode": "brief", "message": "wha', "not valid JSON"),
    "trailing garbage": (b'{"mode": "brief"} x', "not valid JSON"),
    "empty": (b"", "empty"),
    "whitespace": (b"  \n ", "empty"),
}
JSON_ROUTES = ["/v1/retrieve", "/v1/feedback", "/v1/records", "/v1/memories", "/v1/documents", "/v1/bundles"]


@pytest.mark.parametrize("case", list(PARSE_ERRORS))
def test_a_body_that_is_not_strict_json_is_422_in_the_one_shape(http: httpx.Client, live: Live, case: str) -> None:
    body, words = PARSE_ERRORS[case]
    for path in JSON_ROUTES:
        response = send(http, live, path, body, caller="admin")
        assert response.status_code == 422, (path, response.text)
        detail = error_of(response)
        assert detail["field"] == "body" and words in detail["message"], (path, detail)
        assert len(response.content) < 600


def test_refusals_before_the_body_use_the_one_shape(http: httpx.Client, live: Live) -> None:
    statuses = {
        401: http.post("/v1/retrieve", json=BRIEF),
        403: send(http, live, "/v1/bundles", {"records": []}),  # ana has no admin role
        404: http.get("/v1/calls/" + "0" * 32, headers=live.auth("ana")),
        405: http.get("/v1/retrieve", headers=live.auth("ana")),
        413: send(http, live, "/v1/retrieve", {"message": "x" * (1 << 20)}),
    }
    for status, response in statuses.items():
        assert response.status_code == status, (status, response.text)
        detail = error_of(response)
        assert "field" not in detail
    assert statuses[405].headers["allow"] == "POST"
    unknown = http.get("/v1/nowhere", headers=live.auth("ana"))
    assert unknown.status_code == 404 and error_of(unknown)["message"].startswith("no such route")
    assert http.get("/nowhere").status_code == 404 and error_of(http.get("/nowhere"))
    assert http.put("/healthz").status_code == 405 and error_of(http.put("/healthz"))


def test_the_key_is_checked_before_the_body(http: httpx.Client) -> None:
    for body in (b"{", b"[" * 10_000, b"x" * (2 << 20)):
        response = http.post("/v1/retrieve", content=body, headers={"Authorization": "Bearer dk_nope_nope"})
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert error_of(response)["message"]


# -- strict types and unknown fields -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**BRIEF, "trace": "true"}, "trace"),
        ({**BRIEF, "sources": {"memories": "yes"}}, "sources.memories"),
        ({**BRIEF, "synthesize": 1}, "synthesize"),
        ({**BRIEF, "budget": {"totalTokens": "8000"}}, "budget.totalTokens"),
        ({**BRIEF, "budget": {"totalTokens": 8000.5}}, "budget.totalTokens"),
        ({**BRIEF, "infer_filters": "false"}, "infer_filters"),
        ({**BRIEF, "budget": {"shares": {"zz": 0.5}}}, "budget.shares.zz"),  # an unknown source, named by its key
    ],
)
def test_strings_are_never_coerced_in_a_request(http: httpx.Client, live: Live, body: dict[str, Any], field: str) -> None:
    response = send(http, live, "/v1/retrieve", body)
    assert response.status_code == 422, response.text
    assert error_of(response)["field"] == field


def test_strings_are_never_coerced_in_writes(http: httpx.Client, live: Live) -> None:
    call_id = send(http, live, "/v1/retrieve", BRIEF).json()["call_id"]
    rated = send(http, live, "/v1/feedback", {"call_id": call_id, "rating": "5"})
    assert rated.status_code == 422 and error_of(rated)["field"] == "rating"
    assert live.service.store.get_feedback(call_id, org="northwind") == []
    pending = send(http, live, "/v1/records", {"id": "rec-coerce", "kind": "contact", "pending_deletion": "yes"})
    assert pending.status_code == 422 and error_of(pending)["field"] == "pending_deletion"
    assert live.engine.store.get_records(["rec-coerce"], org="northwind") == []


RECORD = {"id": "rec-strict", "kind": "contact", "identifiers": {"email": "strict@acme.com"}}


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/records", {**RECORD, "zzz": 1}, "zzz"),
        ("/v1/records", [RECORD, {**RECORD, "id": "rec-strict-2", "zzz": 1}], "1.zzz"),
        ("/v1/records", {**RECORD, "identifiers": {"email": "strict@acme.com", "fax": "+1 415"}}, "identifiers.fax"),
        ("/v1/memories", {"record": "rec-jane", "text": "A fact.", "id": "mem-strict", "zzz": 1}, "zzz"),
        ("/v1/documents", {"id": "doc-strict", "markdown": "# T\n\n## A\nB", "zzz": 1}, "zzz"),
        ("/v1/documents", {"id": "doc-strict", "title": "T", "sections": [{"id": "s1", "text": "x", "zzz": 1}]},
         "sections.0.zzz"),
        ("/v1/feedback", {"call_id": "c", "rating": 3, "zzz": 1}, "zzz"),
    ],
)  # fmt: skip
def test_an_unknown_field_in_a_single_item_write_is_422_naming_it_and_nothing_is_written(
    http: httpx.Client, live: Live, path: str, body: Any, field: str
) -> None:
    response = send(http, live, path, body)
    assert response.status_code == 422, response.text
    detail = error_of(response)
    assert detail["field"] == field and "unknown field" in detail["message"]
    store = live.engine.store
    assert store.get_records(["rec-strict", "rec-strict-2"], org="northwind") == []
    assert store.get_memories(["mem-strict"], org="northwind") == []
    assert store.get_documents(["doc-strict"], org="northwind") == []


def test_a_bundle_with_nothing_loadable_is_refused_and_a_bundle_lists_what_it_ignored(http: httpx.Client, live: Live) -> None:
    refused = send(http, live, "/v1/bundles", {"widgets": [{"id": "w1", "name": "sprocket"}]}, caller="admin")
    assert refused.status_code == 422, refused.text
    detail = error_of(refused)
    assert "nothing to load" in detail["message"] and "widgets" in detail["message"] and detail["problems"]
    robot = send(http, live, "/v1/bundles", {"records": [{"id": "rec-robot", "kind": "robot"}]}, caller="admin")
    assert robot.status_code == 422 and error_of(robot)["field"] == "record:rec-robot"  # kind:id (docs/service.md)
    record = {"id": "rec-bundled", "kind": "contact", "identifiers": {"fax": "+1 415"}, "colour": "teal"}
    loaded = send(http, live, "/v1/bundles", {"records": [record], "widgets": [{"id": "w1"}]}, caller="admin")
    assert loaded.status_code == 200, loaded.text
    summary = loaded.json()
    assert summary["inserted"] == {"records": 1} and summary["ignored_keys"] == ["widgets"]
    assert summary["ignored_fields"] == {"records": {"colour": 1, "identifiers.fax": 1}}


# -- capped echoes -----------------------------------------------------------------------------------
BIG = 100_000


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/records", {"id": "rec-big", "kind": "contact", "identifiers": {"profile_url": "https://x.com/" + "p" * BIG}}),
        ("/v1/records", {"id": "rec-big", "kind": "contact", "identifiers": {"email": "q" * BIG}}),
        ("/v1/records", {"id": "rec-big", "kind": "contact", "w" * BIG: 1}),
        ("/v1/records", {"id": "r" * BIG, "kind": "contact"}),
        ("/v1/retrieve", {"record": {"email": "q" * BIG}}),
        ("/v1/retrieve", {"record": {"profile_url": "https://x.com/" + "p" * BIG}}),
        ("/v1/retrieve", {"mode": "q" * BIG}),
        ("/v1/retrieve", {"z" * BIG: 1}),
        ("/v1/memories", {"record": "rec-jane", "text": "x", "created_at": "2" * BIG}),
        ("/v1/documents", {"markdown": "# T\n\n## A\nB", "tags": ["t" * BIG]}),
        ("/v1/bundles", {"records": [{"id": "r" * BIG, "kind": "robot", "x" * BIG: "y"}]}),
        ("/v1/retrieve", b'{"budget": {"totalTokens": 1' + b"0" * BIG + b"}}"),
        ("/v1/retrieve", b'{"message": "' + b"m" * BIG + b'"'),
    ],
)
def test_no_error_echoes_more_than_about_200_characters_of_the_input(
    http: httpx.Client, live: Live, path: str, body: Any
) -> None:
    response = send(http, live, path, body, caller="admin")
    assert response.status_code == 422, response.text[:300]
    error_of(response)
    text = response.text
    for char in "pqwrzmtx20":
        assert char * 201 not in text, (path, char)
    assert len(text) < 2_000


def test_a_memory_for_a_record_not_in_the_org_names_the_field_and_writes_nothing(http: httpx.Client, live: Live) -> None:
    before = live.service.engine.store.counts(org="northwind")["memories"]
    answers = []
    for record in ("rec-nobody", "b-jane"):  # unknown, and another org's record: the same answer
        response = http.post("/v1/memories", json={"record": record, "text": "t"}, headers=live.auth("ana"))
        assert response.status_code == 422, response.text
        error = error_of(response)
        assert error["field"] == "record" and error["message"] == f"record: no record {record!r} in this org", error
        answers.append(error["message"].replace(record, "?"))
    assert answers[0] == answers[1]
    listed = [{"record": "rec-jane", "text": "fine"}, {"record": "rec-nobody", "text": "t"}]
    response = http.post("/v1/memories", json=listed, headers=live.auth("ana"))
    assert response.status_code == 422 and error_of(response)["field"] == "1.record", response.text
    assert live.service.engine.store.counts(org="northwind")["memories"] == before  # the good one is not written either


def test_a_document_without_a_title_names_the_field(http: httpx.Client, live: Live) -> None:
    response = http.post("/v1/documents", json={"markdown": "## Only a section\nText."}, headers=live.auth("admin"))
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert error["field"] == "title" and "the document needs a title" in error["message"], error


def test_an_unknown_call_id_is_quoted_shortened(http: httpx.Client, live: Live) -> None:
    for call_id in ("a" * 3000, "b" * 120):
        response = http.get(f"/v1/calls/{call_id}", headers=live.auth("ana"))
        assert response.status_code == 404, response.text[:300]
        message = error_of(response)["message"]
        assert call_id[0] * 100 not in message and len(message) < 130, message
    short = "0" * 32
    assert error_of(http.get(f"/v1/calls/{short}", headers=live.auth("ana")))["message"] == f"no call {short!r}"


# -- the MCP endpoint --------------------------------------------------------------------------------
def test_get_and_delete_on_the_stateless_mcp_endpoint_are_405_at_once(http: httpx.Client, live: Live) -> None:
    headers = {**live.auth("ana"), "Accept": "text/event-stream"}
    for method in ("GET", "DELETE"):
        with httpx.Client(base_url=live.url, timeout=5) as client:  # an endless stream would time out here
            response = client.request(method, "/mcp", headers=headers)
        assert response.status_code == 405, response.text
        assert response.headers["allow"] == "POST" and response.headers["content-type"] == "application/json"
        assert "not allowed" in error_of(response)["message"]
    assert http.get("/mcp", headers={"Accept": "text/event-stream"}).status_code == 401


# -- the audit of refused requests -------------------------------------------------------------------
def test_every_refused_request_is_audited_by_its_field_name_only(http: httpx.Client, live: Live) -> None:
    secret = "jane.secret@acme.com"
    cases = [
        ("/v1/retrieve", {**BRIEF, "trace": "true"}, 422, "trace"),
        ("/v1/retrieve", {**BRIEF, secret: 1}, 422, "?"),  # the unknown field's name is the caller's text
        ("/v1/records", {**RECORD, "properties": {secret: 1e400}}, 422, "body"),
        ("/v1/records", b'{"id": "' + secret.encode() + b'", "kind": "contact", "zzz": 1}', 422, "?"),
        ("/v1/memories", {"record": "rec-jane", "text": secret, "id": "m" * 300}, 422, "id"),
        ("/v1/documents", {"title": secret + "\ud800", "markdown": "x"}, 422, "title"),
        ("/v1/feedback", {"call_id": secret, "rating": 9}, 422, "rating"),
        ("/v1/bundles", {"records": []}, 403, None),
        ("/v1/retrieve", {"message": secret * 60_000}, 413, None),
    ]
    for path, body, status, field in cases:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = http.post(path, content=content, headers=live.auth("ana"))
        assert response.status_code == status, (path, response.text)
        [row] = refusals(live, 1)
        assert row["outcome"] == "error" and row["status"] == status and row["route"] == f"POST {path}", row
        assert row["invalid_field"] == field, row
    assert http.get("/v1/calls/" + "0" * 32, headers=live.auth("ana")).status_code == 404
    assert refusals(live, 1)[0] | {"invalid_field": None} == {
        "error": "NotFound", "outcome": "error", "route": "GET /v1/calls/{call_id}", "status": 404, "invalid_field": None}
    assert http.get("/mcp", headers=live.auth("ana")).status_code == 405
    assert refusals(live, 1)[0] | {"invalid_field": None} == {
        "error": "MethodNotAllowed", "outcome": "error", "route": "GET /mcp", "status": 405, "invalid_field": None}
    audit = table_text(live.db, "audit")
    assert secret not in audit and "jane" not in audit and "0" * 32 not in audit


def test_an_mcp_call_with_invalid_arguments_is_audited_by_its_field_name(live: Live) -> None:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def run() -> Any:
        async with create_mcp_http_client(headers=live.auth("ana")) as client:
            async with Client(streamable_http_client(f"{live.url}/mcp", http_client=client)) as session:
                return await session.call_tool("remember", {"record": {"email": "jane@acme.com"}, "text": "t",
                                                            "caller-secret-" + "k" * 500: 1})  # fmt: skip

    result = asyncio.run(run())
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert "unknown argument" in text and "k" * 201 not in text
    [row] = refusals(live, 1)
    assert (row["error"], row["route"], row["invalid_field"]) == ("InvalidArguments", "tool remember", "?")
    assert "caller-secret" not in table_text(live.db, "audit")


def test_an_mcp_call_the_service_refuses_is_audited_as_the_http_api_audits_it(http: httpx.Client, live: Live) -> None:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    secret = "f" * 32  # a call id nobody made: refused like another org's call, and never written down

    async def run() -> Any:
        async with create_mcp_http_client(headers=live.auth("ana")) as client:
            async with Client(streamable_http_client(f"{live.url}/mcp", http_client=client)) as session:
                return await session.call_tool("feedback", {"call_id": secret, "rating": 1})

    result = asyncio.run(run())
    assert result.is_error
    [row] = refusals(live, 1)
    assert row == {"error": "NotFound", "outcome": "error", "route": "tool feedback", "status": 404, "invalid_field": None}
    response = http.post("/v1/feedback", json={"call_id": secret, "rating": 1}, headers=live.auth("ana"))
    assert response.status_code == 404
    [row] = refusals(live, 1)  # the same refusal over HTTP: the same row but for the route
    assert row == {"error": "NotFound", "outcome": "error", "route": "POST /v1/feedback", "status": 404, "invalid_field": None}
    assert secret not in table_text(live.db, "audit")
