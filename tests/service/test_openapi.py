"""The OpenAPI document says what the server does: every status and body it answers is declared, and a
property-based run of generated requests (schemathesis: fixed seed, bounded examples) over a real socket
finds no 5xx, no undeclared status and no body that breaks its declared schema."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from .conftest import Live

EXAMPLES = 15  # per operation and mode: about 330 requests, well under a minute

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)


def test_every_status_the_server_answers_is_declared_with_the_real_error_body(live: Live) -> None:
    spec = httpx.get(f"{live.url}/openapi.json").json()
    schemas = spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas  # FastAPI's default 422 body
    expected = {
        ("post", "/v1/retrieve"): {"200", "401", "403", "413", "422", "502", "503"},
        ("get", "/v1/calls/{call_id}"): {"200", "401", "403", "404", "422", "503"},
        ("get", "/v1/calls/{call_id}/feedback"): {"200", "401", "403", "404", "422", "503"},
        ("post", "/v1/feedback"): {"201", "401", "403", "404", "413", "422", "503"},
        ("get", "/v1/usage"): {"200", "401", "503"},
        ("post", "/v1/bundles"): {"200", "401", "403", "413", "422", "503"},
        ("post", "/v1/records"): {"200", "401", "403", "413", "422", "503"},
        ("post", "/v1/memories"): {"200", "401", "403", "413", "422", "503"},
        ("post", "/v1/documents"): {"200", "401", "403", "413", "422", "503"},
        ("get", "/healthz"): {"200"},
        ("get", "/readyz"): {"200", "503"},
    }
    declared = {(m, p): set(op["responses"]) for p, ops in spec["paths"].items() for m, op in ops.items()}
    assert declared == expected
    for (method, path), statuses in expected.items():
        for status in statuses - {"200", "201"}:
            body = spec["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
            assert body == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)
    assert spec["paths"]["/v1/bundles"]["post"]["requestBody"]["required"] is True


OPERATIONS = [("POST", "/v1/retrieve"), ("GET", "/v1/calls/{call_id}"), ("GET", "/v1/calls/{call_id}/feedback"),
              ("POST", "/v1/feedback"), ("GET", "/v1/usage"), ("POST", "/v1/bundles"), ("POST", "/v1/records"),
              ("POST", "/v1/memories"), ("POST", "/v1/documents"), ("GET", "/healthz"), ("GET", "/readyz")]  # fmt: skip
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def api_schema(live: Live) -> Any:
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    schema.config.update(base_url=live.url)
    return schema


NO_INPUT = {("GET", "/v1/usage"), ("GET", "/healthz"), ("GET", "/readyz")}  # nothing to send that breaks them
RUNS = [(m, p, mode) for m, p in OPERATIONS for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        if mode is GenerationMode.POSITIVE or (m, p) not in NO_INPUT]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "mode"), RUNS, ids=[f"{m} {p} {mode.value}" for m, p, mode in RUNS])
def test_generated_requests_get_no_5xx_and_no_undeclared_status(
    api_schema: Any, live: Live, method: str, path: str, mode: GenerationMode
) -> None:
    """Requests generated from the document (valid ones, and ones that break it), sent by the admin of
    northwind; the responses are checked against what the document declares."""
    operation = api_schema[path][method]

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        response = case.call(headers=live.auth("admin"), timeout=60)
        case.validate_response(response, checks=CHECKS)

    run()
