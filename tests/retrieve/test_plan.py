"""Plan: mode inference, per-mode sources, explicit false wins, external opt-in, depth reporting."""

from __future__ import annotations

import pytest

import dossier
from dossier.layers.plan import choose_sources, infer_mode
from dossier.retrieve import parse_request


@pytest.mark.parametrize(
    ("body", "mode"),
    [
        ({"fetch": ["doc-refund"]}, "fetch"),
        ({"filters": {"tags": ["pricing"]}}, "filter"),
        ({"continuation": "abc"}, "expand"),
        ({"message": "hello"}, "scout"),
        ({"mode": "brief", "fetch": ["doc-refund"]}, "brief"),
    ],
)
def test_mode_is_inferred_from_the_shape(body: dict, mode: str) -> None:
    assert infer_mode(parse_request(body)) == mode


def test_mode_defaults_and_explicit_switches() -> None:
    brief = choose_sources("brief", parse_request({}))
    assert brief == {"properties": True, "memories": True, "documents": True, "graph": True, "external": False}
    scout = choose_sources("scout", parse_request({}))
    assert scout["graph"] is False and scout["documents"] is True
    assert choose_sources("fetch", parse_request({}))["memories"] is False
    off = choose_sources("brief", parse_request({"sources": {"documents": False, "external": True}}))
    assert off["documents"] is False and off["external"] is True


def test_explicit_false_wins_in_the_response(sample_engine: dossier.Engine) -> None:
    response = sample_engine.retrieve(
        {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "discounts", "sources": {"memories": False, "graph": False}},
        org="northwind", caller="ana",
    )  # fmt: skip
    assert response.sources["memories"].status == "skipped" and response.sources["memories"].items == []
    assert response.sources["graph"].status == "skipped"
    assert response.sources["documents"].status == "ok"


def test_deep_without_a_model_reports_the_downgrade(sample_engine: dossier.Engine) -> None:
    response = sample_engine.retrieve({"message": "refund window", "depth": "deep"}, org="northwind", caller="ana")
    route = response.route["documents"]
    assert (route.requested_depth, route.effective_depth, route.fallback_reason) == ("deep", "standard", "no_model")
    assert route.backend == "hybrid"


def test_fast_depth_uses_vectors_only(sample_engine: dossier.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    searched: list[str] = []
    search_text = sample_engine.store.search_text
    monkeypatch.setattr(sample_engine.store, "search_text", lambda kind, *a, **k: searched.append(kind) or search_text(kind, *a, **k))
    response = sample_engine.retrieve({"message": "refund window", "depth": "fast"}, org="northwind", caller="ana")
    assert response.route["documents"].backend == "vector"
    assert "section" not in searched  # no full-text search of the sections ran


def test_expand_with_an_unknown_continuation_is_a_usage_error(sample_engine: dossier.Engine) -> None:
    with pytest.raises(dossier.UsageError, match="unknown or has expired"):
        sample_engine.retrieve({"continuation": "nope"}, org="northwind", caller="ana")


def test_fetch_mode_needs_ids(sample_engine: dossier.Engine) -> None:
    with pytest.raises(dossier.InvalidRequest) as caught:
        sample_engine.retrieve({"mode": "fetch"}, org="northwind", caller="ana")
    assert caught.value.field == "fetch"
