"""A multi-part question about a record searches documents with what its best memory says: "Tomas got a
fine in Germany. What was it for, and who pays it?" needs the rule on what the fine was for, which only the
memory tells (sources/documents.py, ``Settings.memory_informed_weight``)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import dossier
from dossier.layers.understand import question_parts
from dossier.pipeline.events import Decision
from dossier.pipeline.source_io import Found, MemoryLead, SourceQuery, SourceTools
from dossier.schema import MemoryItem
from dossier.settings import Settings
from dossier.sources.documents import DocumentsSource, rrf
from dossier.sources.memories import MemoriesSource
from dossier.stores.base import Store
from tests.fake_embedder import HashEmbedder

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-org.json"
TWO_PARTS = "What did Jane ask for last time, and what rules apply?"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    path = tmp_path_factory.mktemp("informed") / "sample.db"
    with dossier.open(f"sqlite:///{path}", embedder=HashEmbedder()) as engine:
        engine.load_bundle(SAMPLE)
        yield engine.store


class _Symmetric(HashEmbedder):
    symmetric = True  # it ignores the kind: a stored vector is the text's query vector


def _tools(store: Store, embedded: list[str], model: HashEmbedder | None = None) -> SourceTools:
    model = model or HashEmbedder()

    def embed_query(text: str) -> np.ndarray:
        embedded.append(text)
        return model.embed_batch([text], kind="query")[0]

    return SourceTools(store=store, embed_query=embed_query, query_vector=cache(lambda: embed_query(TWO_PARTS)),
                       embedder=lambda: model, fuse=rrf)  # fmt: skip


def _query(store: Store, **fields: Any) -> SourceQuery:
    (jane,) = store.get_records(["rec-jane"], org="northwind")
    query = SourceQuery(org="northwind", roles=("sales",), message=TWO_PARTS, record_named=True, record=jane,
                        record_ids=("rec-jane",), document_query=TWO_PARTS, memory_query=TWO_PARTS,
                        parts=len(question_parts(TWO_PARTS)), settings=Settings())  # fmt: skip
    return replace(query, **fields)


def _lead_for(store: Store, found: Found) -> tuple[str, MemoryLead]:
    """A section the question's vector search alone does not put first, and a lead memory saying what it says."""
    first = next(c.section_id for c in found.items if c.vector_rank == 1)
    (document,) = store.get_documents(["doc-refund"], org="northwind")
    section = next(s for s in reversed(document.sections) if s.id != first)
    return section.id, MemoryLead(id="mem-0001", record_id="rec-jane", text=f"{section.heading} {section.text}")


def _details(found: Found) -> dict[str, Any]:
    return {k: v for e in found.events if isinstance(e, Decision) and e.route == "documents" for k, v in e.detail.items()}


def test_questions_are_counted_in_parts() -> None:
    assert len(question_parts("Tomas got a fine in Germany. What was it for, and who pays it?")) == 2
    assert len(question_parts(TWO_PARTS)) == 2
    assert len(question_parts("How long can Luis drive before he has to take a break?")) == 1
    assert len(question_parts("refund rules?")) == 1


def test_the_best_memory_steers_a_multi_part_questions_document_search(store: Store) -> None:
    plain = DocumentsSource().recall(_query(store), _tools(store, []))
    assert plain.items and "memory_informed" not in _details(plain)
    section_id, lead = _lead_for(store, plain)
    embedded: list[str] = []
    informed = DocumentsSource().recall(_query(store, memory_lead=lead), _tools(store, embedded))
    assert _details(informed)["memory_informed"] == "mem-0001"
    assert lead.text in embedded  # the memory's vector joins the question's
    steered = next(c for c in informed.items if c.section_id == section_id)
    assert steered.vector_rank == 1  # the vector search now puts what the memory says first
    before = next((c for c in plain.items if c.section_id == section_id), None)
    assert before is None or (before.vector_rank or 99) > 1


def test_with_a_model_that_embeds_queries_and_documents_alike_the_memory_s_stored_vector_is_read_not_made(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    (memory,) = store.get_memories(["mem-0001"], org="northwind")
    lead = MemoryLead(id=memory.id, record_id=memory.record, text=memory.text)
    embedded: list[str] = []
    again = DocumentsSource().recall(_query(store, memory_lead=lead), _tools(store, embedded))
    assert memory.text in embedded  # a model that may embed a query otherwise: the memory's text is embedded
    read: list[list[str]] = []
    stored_vectors = store.stored_vectors
    monkeypatch.setattr(store, "stored_vectors", lambda kind, keys, **kw: read.append(list(keys)) or stored_vectors(kind, keys, **kw))
    embedded.clear()
    stored = DocumentsSource().recall(_query(store, memory_lead=lead), _tools(store, embedded, _Symmetric()))
    assert read == [[memory.id]] and memory.text not in embedded  # the stored vector, no model run for it
    assert _details(stored)["memory_informed"] == memory.id
    assert [(c.section_id, c.score) for c in stored.items] == [(c.section_id, c.score) for c in again.items]
    # a lead the store holds no vector for (never written, or deleted since): its text is embedded
    embedded.clear()
    unknown = replace(lead, id="mem-none")
    DocumentsSource().recall(_query(store, memory_lead=unknown), _tools(store, embedded, _Symmetric()))
    assert memory.text in embedded


@pytest.mark.parametrize(
    "fields",
    [
        {"parts": 1},  # a one-part question is searched as it is
        {"depth": "fast"},  # fast calls make no second embedding
        {"settings": Settings(memory_informed_weight=0.0)},  # switched off
        {"record_ids": ()},  # no record, no memory of its own
    ],
)
def test_without_a_second_part_a_record_or_the_weight_the_question_alone_searches(store: Store, fields: dict) -> None:
    plain = DocumentsSource().recall(_query(store, **fields), _tools(store, []))
    _, lead = _lead_for(store, plain)
    embedded: list[str] = []
    found = DocumentsSource().recall(_query(store, memory_lead=lead, **fields), _tools(store, embedded))
    assert "memory_informed" not in _details(found) and lead.text not in embedded
    assert [(c.section_id, c.score) for c in found.items] == [(c.section_id, c.score) for c in plain.items]


def test_the_memories_source_names_its_best_memory_as_the_lead(store: Store) -> None:
    found = MemoriesSource().recall(_query(store), _tools(store, []))
    assert found.lead is not None
    first = found.items[0]
    assert isinstance(first, MemoryItem)
    assert (found.lead.id, found.lead.record_id, found.lead.text) == (first.id, first.record_id, first.text)


class _Memories:
    """A memories source whose best memory belongs to a record the call is not about."""

    name = "memories"

    def prefetch(self, query: SourceQuery, tools: SourceTools) -> dict:
        return {}

    def recall(self, query: SourceQuery, tools: SourceTools) -> Found:
        found = Found(items=[])
        found.lead = MemoryLead(id="b-mem", record_id="b-jane", text="another org's memory")
        return found


class _Documents(DocumentsSource):
    def __init__(self) -> None:
        self.queries: list[SourceQuery] = []

    def recall(self, query: SourceQuery, tools: SourceTools) -> Found:
        self.queries.append(query)
        return super().recall(query, tools)


def test_a_lead_of_a_record_the_call_is_not_about_never_reaches_the_document_search(tmp_path: Path) -> None:
    with dossier.open(f"sqlite:///{tmp_path}/s.db", embedder=HashEmbedder()) as engine:
        engine.load_bundle(SAMPLE)
        documents = _Documents()
        engine.sources = (_Memories(), documents)  # type: ignore[assignment]
        response = engine.retrieve({"record": {"email": "jane@acme.com"}, "message": TWO_PARTS}, org="northwind", caller="ana")
    assert documents.queries and documents.queries[0].memory_lead is None
    assert "memory_informed" not in response.route["documents"].detail


TOMAS = {
    "orgs": [{"id": "haul", "name": "Haul"}],
    "callers": [{"id": "ops", "org": "haul", "roles": ["ops"]}],
    "records": [{"id": "rec-tomas", "org": "haul", "kind": "contact", "identifiers": {"email": "tomas@haul.example"},
                 "properties": {"name": "Tomas Weber"}}],
    "memories": [
        {"id": "m1", "org": "haul", "record": "rec-tomas", "created_at": "2026-09-02T08:00:00Z",
         "text": "Tomas was fined 400 euros by the German police for driving beyond his daily driving-time limit."},
        {"id": "m2", "org": "haul", "record": "rec-tomas", "created_at": "2026-09-10T08:00:00Z",
         "text": "Tomas asked to swap his Friday shift with a colleague."},
        {"id": "m3", "org": "haul", "record": "rec-tomas", "created_at": "2026-09-12T08:00:00Z",
         "text": "Tomas said the new lorry's seat is uncomfortable on long routes."},
    ],
    "documents": [
        {"id": "doc-hours", "org": "haul", "title": "Driving Hours", "sections": [
            {"id": "doc-hours-s1", "heading": "Daily limits", "text": "A driver may drive at most nine hours a day."},
            {"id": "doc-hours-s2", "heading": "Breaches of the driving-time limits",
             "text": "When a driver exceeds the daily driving time, the company pays the penalty, because planning "
                     "the route is the company's duty."},
        ]},
        {"id": "doc-parking", "org": "haul", "title": "Parking and Traffic Offences", "sections": [
            {"id": "doc-parking-s1", "heading": "Parking tickets and speeding",
             "text": "Parking tickets and speeding penalties are paid by the driver who received them."},
        ]},
        {"id": "doc-shifts", "org": "haul", "title": "Shift Swaps", "sections": [
            {"id": "doc-shifts-s1", "heading": "Swapping a shift", "text": "Shift swaps need the planner's approval."},
        ]},
    ],
}


def test_the_rule_the_memory_points_to_comes_first(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    request = {"record": {"email": "tomas@haul.example"}, "message": "Tomas got a fine in Germany. What was it for, and who pays it?",
               "trace": True}  # fmt: skip
    first, recalled = {}, {}
    for weight in (0.0, Settings().memory_informed_weight):
        with dossier.open(f"sqlite:///{tmp_path}/haul-{weight}.db", embedder=embedder,
                          settings=Settings(memory_informed_weight=weight)) as engine:  # fmt: skip
            engine.load_bundle(TOMAS)
            response = engine.retrieve(request, org="haul", caller="ops")
        assert response.sources["memories"].items[0].id == "m1"
        assert response.route["documents"].detail.get("memory_informed") == ("m1" if weight else None)
        items = response.sources["documents"].items  # the question alone may be too unsure to pick (abstain)
        first[weight] = items[0].section_id if items else None
        recalled[weight] = {t.id: t.score for t in response.trace if t.source == "documents" and t.layer == "recall"}
    # the question alone reads "fine ... who pays" as much as the traffic-offence rule as the driving-time one;
    # the memory says what the fine was for: the search moves towards that rule and away from the other
    informed = Settings().memory_informed_weight
    assert first[informed] == "doc-hours-s2"
    assert recalled[informed]["doc-hours-s2"] > recalled[0.0]["doc-hours-s2"] + 0.05
    assert recalled[informed]["doc-hours-s2"] - recalled[informed]["doc-parking-s1"] > (
        recalled[0.0]["doc-hours-s2"] - recalled[0.0]["doc-parking-s1"])
