"""One regression test per way evidence was silently lost (DESIGN.md section 2). Each fails if its fix
is reverted: lexical-only hits dropped in fusion; tier 1 lost when tier 2 fails; items missing from the
packed context without an omission report; two budgets that disagree; a caller setting ignored."""

from __future__ import annotations

from collections import defaultdict

import pytest

import dossier
from dossier.layers.budget import packed_context, size
from dossier.schema import SOURCE_NAMES

from .conftest import ids
from .faults import FaultyStore, kind_is


def test_lexical_only_candidate_survives_fusion_and_skips_the_clear_winner(fresh_engine: dossier.Engine) -> None:
    # A code only full text can find, in a section whose meaning is far from the question.
    fresh_engine.load_bundle({"documents": [{
        "id": "doc-facilities", "org": "northwind", "title": "Facilities Handbook", "doc_type": "guideline",
        "sections": [{"id": "doc-facilities-s1", "heading": "Server room access",
                      "text": "Badge code QX-7731 opens the server room; facilities rotates it every month."}]}]})  # fmt: skip
    fresh_engine.org_settings["northwind"] = fresh_engine.settings.replace(document_candidates=2)
    response = fresh_engine.retrieve(
        {"message": "Which discount approval chain applies to QX-7731?", "trace": True}, org="northwind", caller="ana"
    )
    recall = {t.id: t.reason for t in response.trace or [] if t.layer == "recall" and t.source == "documents"}
    assert recall["doc-facilities-s1"] == "lexical_only"
    assert "doc-facilities-s1" in ids(response, "documents")
    assert response.route["documents"].detail["lexical_only"] >= 1
    assert response.route["documents"].detail["selector"] != "clear_winner"


def test_recent_tier_survives_a_failing_semantic_tier(fresh_engine: dossier.Engine) -> None:
    failing = kind_is("memory", parents=True)  # the record's memory vectors, asked alone or with the adapted vector
    fresh_engine.store = FaultyStore(fresh_engine.store, {"search_vectors": failing, "search_vectors_many": failing})  # type: ignore[assignment]
    response = fresh_engine.retrieve(
        {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "annual prepay discount", "budget": {"totalTokens": 50_000}},
        org="northwind", caller="ana",
    )  # fmt: skip
    memories = response.sources["memories"]
    assert memories.status == "ok"
    assert len(memories.items) == 25 and all(m.tier == "recent" for m in memories.items)
    assert "semantic memory tier failed" in (memories.error or "")
    assert response.partial is True
    assert response.route["memories"].fallback_reason == "semantic_error"


@pytest.mark.parametrize("budget", [600, 2500, 8000])
def test_every_recalled_item_is_packed_or_reported(sample_engine: dossier.Engine, budget: int) -> None:
    response = sample_engine.retrieve(
        {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "What pricing did we discuss?",
         "budget": {"totalTokens": budget}, "trace": True},
        org="northwind", caller="ana",
    )  # fmt: skip
    decisions: dict[tuple[str, str], list[tuple[str, str, str | None]]] = defaultdict(list)
    for t in response.trace or []:
        decisions[(t.source, t.id)].append((t.layer, t.decision, t.reason))
    for source in SOURCE_NAMES:
        result = response.sources[source]
        packed = set(ids(response, source))
        over_budget = {i for (s, i), d in decisions.items() if s == source and ("budget", "dropped", "over_budget") in d}
        survived = {
            i for (s, i), d in decisions.items()
            if s == source and not any(layer in ("govern", "select", "filter") and what == "dropped" for layer, what, _ in d)
            and any(layer == "recall" and what == "kept" for layer, what, _ in d)
        }  # fmt: skip
        assert result.dropped == len(over_budget), source
        if source != "documents":  # sections are cut from documents by the select layer, checked there
            assert survived == packed | over_budget, source
    assert sum(r.dropped for r in response.sources.values()) > 0 or budget == 8000


@pytest.mark.parametrize("budget", [300, 1200, 8000, 50_000])
def test_one_budget_feeds_the_caller_and_the_model(sample_engine: dossier.Engine, budget: int) -> None:
    response = sample_engine.retrieve(
        {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "What pricing did we discuss?",
         "budget": {"totalTokens": budget}},
        org="northwind", caller="ana",
    )  # fmt: skip
    context = packed_context(response)
    used = sum(response.budget.used.values())
    assert len(context.encode("utf-8")) == used <= budget
    for source in SOURCE_NAMES:
        result = response.sources[source]
        assert result.bytes_used == response.budget.used[source] == sum(size(i) for i in result.items)
        assert response.budget.dropped[source] == result.dropped


@pytest.mark.parametrize("depth", ["fast", "standard", "deep"])
@pytest.mark.parametrize("mode", ["scout", "brief", "fetch"])
def test_switching_filter_inference_off_holds_on_every_path(sample_engine: dossier.Engine, mode: str, depth: str) -> None:
    body = {"mode": mode, "message": "tag:security how long are backups kept?", "depth": depth, "trace": True,
            "record": {"email": "raj@acme.com"}}  # fmt: skip
    if mode == "fetch":
        body["fetch"] = ["doc-retention", "doc-pricing"]
    # the full (in-process) trace: the whole evidence, whatever the caller may see
    on = sample_engine.retrieve(body, org="northwind", caller="ana", full_trace=True)
    off = sample_engine.retrieve({**body, "infer_filters": False}, org="northwind", caller="ana", full_trace=True)
    assert on.route["understand"].detail["filters_source"] == "inferred"
    assert off.route["understand"].detail["filters_source"] == "off"
    assert off.route["understand"].detail["filters"] is None
    assert not [t for t in off.trace or [] if t.reason == "filtered_out"]
    if mode != "fetch":  # the searches are held to the documents tagged security when the filter applies
        owner = {s.id: d for d in sample_engine.store.find_documents(org="northwind", limit=1000) for s in d.sections}

        def recalled(response: dossier.RetrieveResponse) -> set[str]:
            return {t.id for t in response.trace or [] if t.source == "documents" and t.layer == "recall"}

        assert recalled(on) and all("security" in owner[i].tags for i in recalled(on)), "the inferred filter applied"
        assert not all("security" in owner[i].tags for i in recalled(off))
