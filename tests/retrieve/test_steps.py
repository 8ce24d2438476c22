"""Layers run on a call alone: no engine, no store, no model. A call holds the steps it runs with
(``Steps``), its plan is frozen, and what a layer decides or survives is an event that report reads."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from dossier.bundle import Caller
from dossier.errors import ProviderTimeout
from dossier.layers.plan import plan
from dossier.layers.report import routes
from dossier.layers.sections import HeuristicSelector
from dossier.layers.understand import NoAugmenter, RuleFilterInferrer, understand
from dossier.pipeline.call import Call
from dossier.pipeline.events import Decision, Degraded, Fallback
from dossier.pipeline.steps import Steps
from dossier.retrieve import parse_request
from dossier.settings import Settings
from dossier.sources.documents import rrf


def _fail(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("this layer needs no store, model or background thread")


_unused: Any = _fail  # stands for the store, the model loaders and the background pool


def call_of(request: dict[str, Any]) -> Call:
    steps = Steps(
        store=_unused, embed_query=lambda text: np.zeros(4, dtype=np.float32), embedder=_unused, fuse=rrf,
        sources=(), selector=HeuristicSelector(), filter_inferrer=RuleFilterInferrer(), augmenter=NoAugmenter(),
        llm=None, reranker=None, background=_unused, embed_ahead=_unused, while_embedding=_unused,
        service_store=_unused, defer=_unused, keep_late=_unused,
    )  # fmt: skip
    return Call(steps=steps, request=parse_request(request), org="acme", caller=Caller(id="ana", org="acme"),
                settings=Settings())  # fmt: skip


def test_plan_and_understand_run_without_an_engine() -> None:
    call = call_of({"message": "What does tag:pricing say about discounts?", "depth": "deep"})
    plan(call)
    understand(call)
    assert call.planned.mode == "scout" and call.planned.effective_depth == "standard"  # no model: standard
    assert call.planned.depth_fallback == "no_model"
    assert call.understanding.filters is not None and call.understanding.filters.tags == ["pricing"]
    understood = routes(call.events)["understand"]
    assert understood.ran and understood.detail["filters_source"] == "inferred"


def test_the_plan_is_frozen_and_a_fallback_is_an_event() -> None:
    call = call_of({"message": "refund rules?", "depth": "deep"})
    plan(call)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(call.planned, "effective_depth", "fast")  # noqa: B010 - what a later layer may no longer do
    call.step_failed("rerank", ProviderTimeout("too slow"), fallback="fused order")
    assert call.fallbacks == [Fallback("rerank", "deep_timeout", "fused order", call.fallbacks[0].error)]
    assert call.effective_depth == "standard" and call.degraded
    assert any(isinstance(e, Degraded) and e.where == "documents" for e in call.events)
    assert "rerank step failed, fused order used" in (call.results["documents"].error or "")


def test_routes_are_built_from_decisions_in_the_order_first_decided() -> None:
    events = [
        Decision("resolve", fields={"ran": False}),
        Decision("documents", fields={"ran": True, "backend": "hybrid"}, detail={"vector_candidates": 3}),
        Decision("resolve", detail={"not_found": "no record"}),
        Decision("documents", append={"siblings": ["a", "b"]}),
        Decision("documents", append={"siblings": ["c", "d"]}, detail={"vector_candidates": 4}),
    ]
    built = routes(events)
    assert list(built) == ["resolve", "documents"]
    assert (built["resolve"].ran, built["resolve"].detail) == (False, {"not_found": "no record"})
    documents = built["documents"]
    assert (documents.ran, documents.backend) == (True, "hybrid")
    assert documents.detail == {"vector_candidates": 4, "siblings": [["a", "b"], ["c", "d"]]}
