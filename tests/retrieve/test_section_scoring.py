"""Section candidates scored within their documents: the cosine of a candidate found by words alone and
every candidate's cosine to the adapted question come from one search of the candidates' documents, and
equal what a search of each candidate's own document gives; when that search fails, both stay unknown,
the route says so, and the call still answers."""

from __future__ import annotations

import numpy as np
import pytest

import dossier
from dossier.evaluation.fit import prepared_call
from dossier.providers import adapter as adapters

from .faults import FaultyStore, kind_is

QUESTIONS = ["What discount rules apply to annual prepay?", "Who approves a refund above the usual limit?",
             "How long do we keep customer data after a contract ends?", "What is the escalation path for a Sev1?"]  # fmt: skip


def _call(engine: dossier.Engine, message: str):  # type: ignore[no-untyped-def]
    # no record: the document query is the question itself, embedded alone
    return prepared_call(engine, {"mode": "brief", "message": message, "budget": {"totalTokens": 8000}},
                         org="northwind", caller="ana")  # fmt: skip


@pytest.mark.parametrize("message", QUESTIONS)
def test_each_candidate_is_scored_as_a_search_of_its_own_document_scores_it(sample_engine: dossier.Engine, message: str) -> None:
    call = _call(sample_engine, message)
    candidates = call.sections
    assert any(c.lexical_only for c in candidates), "the question must reach sections by words alone"
    embedder, store = sample_engine.embedder, sample_engine.store
    vector = embedder.embed_query(message)
    adapted = adapters.load("sections", embedder.model_id, embedder.dimensions).apply(vector)
    for c in candidates:
        own = {h.id: h.score for h in store.search_vectors("section", vector, org="northwind", limit=500, parents=[c.document_id])}
        tuned = {h.id: h.score for h in store.search_vectors("section", adapted, org="northwind", limit=500, parents=[c.document_id])}
        assert c.score == pytest.approx(own[c.section_id], abs=1e-5), c.section_id
        assert c.adapted == pytest.approx(tuned[c.section_id], abs=1e-5), c.section_id
        assert c.score > 0


def test_a_failing_search_within_the_documents_leaves_scores_unknown_and_the_call_answers(fresh_engine: dossier.Engine) -> None:
    message = QUESTIONS[0]
    healthy = fresh_engine.retrieve({"mode": "brief", "message": message, "trace": True}, org="northwind", caller="ana")
    fresh_engine.store = FaultyStore(fresh_engine.store, {"search_vectors_many": kind_is("section", parents=True)})  # type: ignore[assignment]
    call = _call(fresh_engine, message)
    lexical = [c for c in call.sections if c.lexical_only]
    assert lexical and all(c.score == 0.0 for c in lexical)
    assert all(c.adapted is None for c in call.sections)
    response = fresh_engine.retrieve({"mode": "brief", "message": message, "trace": True}, org="northwind", caller="ana")
    documents = response.sources["documents"]
    assert response.partial is True and documents.status == "ok"
    assert "InjectedFault" in (documents.error or "") and "injected failure" not in (documents.error or "")
    assert "adapter" not in response.route["documents"].detail  # no adapted scores: the route does not claim them
    assert healthy.route["documents"].detail["adapter"] == "sections"
    assert documents.items, "the candidates found by meaning still answer"
    assert np.isfinite([getattr(i, "score", 0.0) or 0.0 for i in documents.items]).all()
