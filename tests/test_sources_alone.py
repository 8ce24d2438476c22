"""A source runs without a call: given a hand-made query and tools over a real SQLite store, it returns its
items and the events it wants recorded (dossier.pipeline.source_io), and writes nowhere else."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any, Iterator, cast

import numpy as np
import pytest

import dossier
from dossier.pipeline.call import SectionCandidate
from dossier.pipeline.events import Decision, Degraded
from dossier.pipeline.source_io import SourceQuery, SourceTools
from dossier.schema import MemoryItem, TraceEntry
from dossier.settings import Settings
from dossier.sources.documents import DocumentsSource, rrf
from dossier.sources.graph import GraphSource
from dossier.sources.memories import MemoriesSource
from dossier.sources.properties import PropertiesSource
from dossier.stores.base import Store
from tests.fake_embedder import HashEmbedder
from tests.retrieve.faults import FaultyStore, always

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample-org.json"
QUESTION = "What pricing did we discuss, and what discount rules apply?"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    path = tmp_path_factory.mktemp("alone") / "sample.db"
    with dossier.open(f"sqlite:///{path}", embedder=HashEmbedder()) as engine:
        engine.load_bundle(SAMPLE)
        yield engine.store


def tools_over(store: Store, embedded: list[str]) -> SourceTools:
    """Tools of the test's own: every text embedded is listed in ``embedded``; the question's vector is
    computed once however often a source asks for it."""
    model = HashEmbedder()

    def embed_query(text: str) -> np.ndarray:
        embedded.append(text)
        return model.embed_batch([text], kind="query")[0]

    return SourceTools(store=store, embed_query=embed_query, query_vector=cache(lambda: embed_query(QUESTION)),
                       embedder=lambda: model, fuse=rrf)  # fmt: skip


def about_jane(store: Store, **fields: Any) -> SourceQuery:
    (jane,) = store.get_records(["rec-jane"], org="northwind")
    query = SourceQuery(org="northwind", roles=("sales",), message=QUESTION, record_named=True, record=jane,
                        record_ids=("rec-jane",), settings=Settings())  # fmt: skip
    return replace(query, **fields)


def failing(store: Store, *operations: str) -> Store:
    """``store`` whose ``operations`` raise (tests/retrieve/faults.py), everything else the real thing."""
    return cast(Store, FaultyStore(store, {name: always for name in operations}))


def test_memories_come_back_with_the_events_that_tell_how(store: Store) -> None:
    embedded: list[str] = []
    found = MemoriesSource().recall(about_jane(store), tools_over(store, embedded))
    assert found.skipped is None and not found.failed and found.error is None
    assert found.items and all(isinstance(m, MemoryItem) and m.record_id == "rec-jane" for m in found.items)
    assert {m.tier for m in found.items} == {"recent", "semantic"}
    decisions = [e for e in found.events if isinstance(e, Decision)]
    assert all(d.route == "memories" for d in decisions)
    recent = sum(m.tier == "recent" for m in found.items)
    assert decisions[0].detail == {"recent": recent}
    assert decisions[-1].detail == {"semantic": len(found.items) - recent}
    assert not [e for e in found.events if isinstance(e, Degraded)]
    assert embedded == [QUESTION]  # the question's one vector, shared


def test_a_failure_the_source_survives_comes_back_as_an_event_with_the_items(store: Store) -> None:
    found = MemoriesSource().recall(about_jane(store), tools_over(failing(store, "search_text"), []))
    assert found.error is None and any(m.tier == "semantic" for m in found.items)
    failures = [e for e in found.events if isinstance(e, Degraded)]
    assert failures == [Degraded(where="memories", error="full-text memory search failed: InjectedFault")]


def test_a_failure_the_source_cannot_survive_keeps_the_events_before_it(store: Store) -> None:
    faulty = failing(store, "search_vectors", "search_text")
    found = DocumentsSource().recall(about_jane(store), tools_over(faulty, []))
    assert isinstance(found.error, RuntimeError) and found.items == []
    assert [e.error for e in found.events if isinstance(e, Degraded)] == [
        "vector search failed: InjectedFault", "full-text search failed: InjectedFault"
    ]  # fmt: skip


def test_document_candidates_and_their_trace_notes(store: Store) -> None:
    found = DocumentsSource().recall(about_jane(store), tools_over(store, []))
    assert found.items and all(isinstance(c, SectionCandidate) for c in found.items)
    assert Decision(route="documents", fields={"backend": "hybrid"}) in found.events
    notes = [e for e in found.events if isinstance(e, TraceEntry)]
    assert [n.id for n in notes] == [c.section_id for c in found.items]  # one recall note per candidate, in order


def test_a_fetch_shows_only_what_the_callers_roles_may_see(store: Store) -> None:
    fetch = {"mode": "fetch", "message": "", "fetch": ("doc-commission", "doc-pricing")}
    sales = DocumentsSource().recall(about_jane(store, **fetch), tools_over(store, []))
    finance = DocumentsSource().recall(about_jane(store, roles=("finance",), **fetch), tools_over(store, []))
    assert {c.document_id for c in sales.items} == {"doc-pricing"}
    assert {c.document_id for c in finance.items} == {"doc-commission", "doc-pricing"}
    assert Decision(route="documents", detail={"not_found": ["doc-commission"]}) in sales.events


def test_a_source_with_nothing_to_do_says_why(store: Store) -> None:
    tombstone = about_jane(store, tombstone=True, record_ids=())
    nobody = SourceQuery(org="northwind", message=QUESTION, record_named=True)
    assert PropertiesSource().recall(tombstone, tools_over(store, [])).skipped == "record is pending deletion"
    assert GraphSource().recall(nobody, tools_over(store, [])).skipped == "record not found"
    assert MemoriesSource().recall(SourceQuery(org="northwind"), tools_over(store, [])).skipped == "no record"
