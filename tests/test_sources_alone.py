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
    details = {k: v for d in decisions for k, v in d.detail.items()}
    assert details["semantic"] == len(found.items) - recent
    # the ranker's order over both tiers: tier 2 and the recent memories it ranks among its best lead, the
    # rest of tier 1 follows, newest first
    lead = len(found.items) - recent + details.get("recent_ranked", 0)
    assert all(m.tier == "recent" for m in found.items[lead:])
    rest = [m.created_at for m in found.items[lead:]]
    assert rest == sorted(rest, reverse=True)
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


def test_a_recent_memory_the_ranker_rates_best_is_listed_first_not_at_its_recency_position(tmp_path: Path) -> None:
    """Tier 1 keeps its 25 newest; a recent memory that answers the question still leads the list when the
    memory ranker rates it best, instead of waiting behind tier 2's ten (the ranker rates every candidate)."""
    answer = "Jane confirmed the renewal discount for the harbour contract is twelve percent."
    memories = [{"id": f"m{i:03d}", "org": "t", "record": "rec-x", "created_at": f"2025-01-{1 + i % 28:02d}T{i % 24:02d}:00:00Z",
                 "text": f"Jane asked about a discount on order {i} for the harbour contract."}
                for i in range(60)]  # fmt: skip
    memories += [{"id": f"n{i:03d}", "org": "t", "record": "rec-x", "created_at": f"2025-03-{1 + i:02d}T10:00:00Z",
                  "text": f"Weekly status call number {i}; nothing new on the roadmap."} for i in range(25)]  # fmt: skip
    memories.append({"id": "answer", "org": "t", "record": "rec-x", "created_at": "2025-03-10T12:00:00Z", "text": answer})
    bundle = {"orgs": [{"id": "t", "name": "T"}], "callers": [{"id": "c", "org": "t"}],
              "records": [{"id": "rec-x", "org": "t", "kind": "contact", "properties": {"name": "X"}}], "memories": memories}  # fmt: skip
    question = "What renewal discount did Jane confirm for the harbour contract?"
    with dossier.open(f"sqlite:///{tmp_path / 'recent.db'}", embedder=HashEmbedder()) as engine:
        engine.load_bundle(bundle)
        response = engine.retrieve({"mode": "scout", "record": {"id": "rec-x"}, "message": question,
                                    "sources": {"memories": True, "properties": False, "documents": False, "graph": False}},
                                   org="t", caller="c")  # fmt: skip
    items = [m for m in response.sources["memories"].items if isinstance(m, MemoryItem)]
    recent = [m for m in items if m.tier == "recent"]
    assert len(recent) == 25 and "answer" in {m.id for m in recent}  # it is a recent memory ...
    newest = sorted(recent, key=lambda m: m.created_at, reverse=True)
    assert [m.id for m in newest].index("answer") >= 10  # ... behind ten newer ones ...
    assert any(m.tier == "semantic" for m in items)  # ... tier 2 found older ones ...
    assert items[0].id == "answer"  # ... and it still comes first
    assert response.route["memories"].detail["recent_ranked"] >= 1


@pytest.mark.parametrize("source", [MemoriesSource(), DocumentsSource()], ids=["memories", "documents"])
def test_without_a_trace_no_trace_note_is_made_and_the_items_are_the_same(store: Store, source: Any) -> None:
    traced = source.recall(about_jane(store), tools_over(store, []))
    untraced = source.recall(about_jane(store, trace=False), tools_over(store, []))
    assert [e for e in traced.events if isinstance(e, TraceEntry)]  # with a trace: notes about candidates
    assert not [e for e in untraced.events if isinstance(e, TraceEntry)]
    assert untraced.items == traced.items
    assert [e for e in untraced.events if not isinstance(e, TraceEntry)] == [e for e in traced.events if not isinstance(e, TraceEntry)]
