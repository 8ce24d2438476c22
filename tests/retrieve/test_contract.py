"""The request contract: invalid requests raise InvalidRequest naming the field; the schema prints."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import dossier
from dossier.cli import app
from dossier.retrieve import parse_request


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"mode": "browse"}, "mode"),
        ({"budget": {"totalTokens": 50_001}}, "budget.totalTokens"),
        ({"budget": {"totalTokens": 0}}, "budget.totalTokens"),
        ({"fetch": [f"doc-{i}" for i in range(21)]}, "fetch"),
        ({"record": {"email": "not-an-email"}}, "record.email"),
        ({"record": {"website": "http://"}}, "record.website"),
        ({"record": {"email": "a@b.com", "phone": "+1 415 555 0100"}}, "record"),
        ({"message": "hi", "colour": "blue"}, "colour"),
        ({"sources": {"memories": True, "weather": True}}, "sources.weather"),
        ({"depth": "abyss"}, "depth"),
        ({"budget": {"totalTokens": 100, "shares": {"memories": 2.0}}}, "budget.shares.memories"),
    ],
)
def test_invalid_requests_name_the_field(body: dict, field: str) -> None:
    with pytest.raises(dossier.InvalidRequest) as caught:
        parse_request(body)
    assert caught.value.field == field
    assert field in str(caught.value)


def test_valid_request_normalises_identifiers() -> None:
    request = parse_request({"record": {"email": "  Jane@ACME.com "}, "budget": {"totalTokens": 50_000}})
    assert request.record is not None and request.record.email == "jane@acme.com"
    assert parse_request({"augmentation": "one rephrasing"}).augmentation == ["one rephrasing"]


def test_retrieve_rejects_invalid_request_before_touching_the_store(sample_engine: dossier.Engine) -> None:
    with pytest.raises(dossier.InvalidRequest):
        sample_engine.retrieve({"mode": "brief", "budget": {"totalTokens": -5}}, org="northwind", caller="ana")


def test_unknown_org_or_caller_is_not_found(sample_engine: dossier.Engine) -> None:
    with pytest.raises(dossier.NotFound):
        sample_engine.retrieve({"message": "x"}, org="nowhere", caller="ana")
    with pytest.raises(dossier.NotFound):
        sample_engine.retrieve({"message": "x"}, org="northwind", caller="zoe")  # zoe is southwind's


def test_schema_command_prints_both_schemas() -> None:
    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0
    schemas = json.loads(result.stdout)
    request_fields = set(schemas["request"]["properties"])
    assert {"mode", "record", "message", "sources", "depth", "budget", "filters", "infer_filters", "augmentation",
            "fetch", "continuation", "synthesize", "deferred", "trace"} <= request_fields  # fmt: skip
    assert {"call_id", "record", "sources", "partial", "route", "budget", "synthesis", "continuation", "trace"} <= set(
        schemas["response"]["properties"]
    )
