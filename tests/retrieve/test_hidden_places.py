"""Sections a caller may not see take no places from those it may, on both stores.

Governance drops what the caller may not see after recall; if the searches took their best hits over
every section of the org, hidden sections would fill places visible ones should have had and shift the
ranks the ranker reads, so the caller's answer would depend on what it may not see. Here an org is
flooded with sections only another role may see, written to match the questions, and the documents
source is asked the same questions in it and in a copy of the org holding only what the caller may see:
the candidates by meaning (ids, vector ranks, cosines) and by words (ids, full-text ranks, scores) must be
the same. The full-text scores' word statistics (how many sections, their length, how many hold each word)
count only what the caller may see: the flood's words move no score.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import dossier
from dossier.pipeline.call import SectionCandidate
from dossier.pipeline.source_io import SourceQuery, SourceTools
from dossier.schema import Filters
from dossier.settings import Settings
from dossier.sources.documents import DocumentsSource, rrf
from dossier.stores.base import Store
from tests.fake_embedder import HashEmbedder

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-org.json"
ROLES = ("sales",)
RECORD = "rec-jane"
QUESTIONS = [
    "What pricing did we discuss, and what discount rules apply?",
    "What discount rules apply to pricing quotes?",
    "What is the refund window after cancellation?",
    "How do we beat Contoso?",
]
#: more than the searches' places (document_candidates 30) and than a filter's documents (20): 45 are read past
#: (a search reads further), 250 make a search hold to the visible documents (past eight times its places)
FLOODS = (45, 250)


def _may_see(document: dict) -> bool:
    """The rule, from the bundle itself: not system, the caller's role where roles are named, attached to
    no other record."""
    roles = document.get("visible_to_roles")
    if document.get("is_system") or (roles is not None and not set(roles) & set(ROLES)):
        return False
    return document.get("attached_record") in (None, RECORD)


def _bundles(flood: int = FLOODS[0]) -> tuple[dict, dict]:
    """The sample org with a flood of sections only the legal role may see (``northwind``), and a copy
    of the org with the documents this test's caller may see alone (``eastwind``)."""
    sample = json.loads(SAMPLE.read_text())
    flooded = copy.deepcopy(sample)
    for i in range(flood):
        flooded["documents"].append({
            "id": f"doc-aa-flood-{i:03d}", "org": "northwind", "title": f"Pricing discount rules {i}",
            "doc_type": "guideline", "tags": ["pricing"], "visible_to_roles": ["legal"],
            "sections": [{"id": f"flood-{i:03d}", "heading": "What discount rules apply to pricing",
                          "text": f"What pricing did we discuss, and what discount rules apply? Refund window after "
                                  f"cancellation; how we beat Contoso on quotes, case {i}."}],
        })  # fmt: skip
    mine = {"orgs": [{"id": "eastwind", "name": "Eastwind"}], "callers": [], "memories": [], "edges": []}
    mine["records"] = [{**r, "org": "eastwind"} for r in sample["records"] if r["org"] == "northwind"]
    mine["documents"] = [
        {**d, "org": "eastwind"} for d in sample["documents"] if d["org"] == "northwind" and _may_see(d)
    ]
    return flooded, mine


@pytest.fixture(params=FLOODS)
def store(store_url: str, request: pytest.FixtureRequest) -> Iterator[Store]:
    flooded, mine = _bundles(request.param)
    with dossier.open(store_url, embedder=HashEmbedder()) as engine:
        engine.load_bundle(flooded)
        engine.load_bundle(mine)
        yield engine.store


def _tools(store: Store) -> SourceTools:
    model = HashEmbedder()

    def embed_query(text: str) -> np.ndarray:
        return model.embed_batch([text], kind="query")[0]

    return SourceTools(store=store, embed_query=embed_query, query_vector=cache(lambda: embed_query("")),
                       embedder=lambda: model, fuse=rrf)  # fmt: skip


def _query(org: str, message: str, **fields: Any) -> SourceQuery:
    return SourceQuery(org=org, roles=ROLES, message=message, record_named=True, record_ids=(RECORD,),
                       settings=Settings(), **fields)  # fmt: skip


def _found(store: Store, query: SourceQuery) -> list[SectionCandidate]:
    found = DocumentsSource().recall(query, _tools(store))
    assert found.error is None and not found.failed and found.skipped is None
    return found.items


def _candidates(store: Store, query: SourceQuery) -> list[tuple]:
    """What each candidate was found with by meaning, in the source's order of them. Sections sharing no
    word with the question (a cosine of exactly 0 under the test's hashing embedder) tie, and a search
    orders ties as it finds them: they are left out."""
    found = [c for c in _found(store, query) if c.vector_rank is not None and c.score != 0.0]
    return sorted((c.vector_rank, c.section_id, c.document_id, round(c.score, 6), round(c.adapted or 0.0, 6))
                  for c in found)  # fmt: skip


def _by_words(store: Store, query: SourceQuery) -> list[tuple]:
    """What each candidate was found with by words: its full-text rank, its id, its score as a share of the
    best full-text hit's."""
    found = sorted(_found(store, query), key=lambda c: c.text_rank or 0)
    return [(c.text_rank, c.section_id, round(c.text_score, 9)) for c in found if c.text_rank]


def test_the_flood_would_take_every_place_of_an_org_wide_search(store: Store) -> None:
    """The premise: searched over every section, the hidden flood holds the best places."""
    vector = HashEmbedder().embed_batch([QUESTIONS[0]], kind="query")[0]
    hits = store.search_vectors("section", vector, org="northwind", limit=30)
    assert sum(h.parent.startswith("doc-aa-flood") for h in hits) >= 25
    words = store.search_text("section", QUESTIONS[0], org="northwind", limit=30)
    assert sum(h.parent.startswith("doc-aa-flood") for h in words) >= 25


@pytest.mark.parametrize("question", QUESTIONS)
def test_a_question_gets_the_candidates_it_would_get_without_what_it_may_not_see(store: Store, question: str) -> None:
    flooded = _candidates(store, _query("northwind", question))
    alone = _candidates(store, _query("eastwind", question))
    assert flooded and not any(c[2].startswith("doc-aa-flood") for c in flooded)
    assert flooded == alone
    words = _by_words(store, _query("northwind", question))
    assert words and words == _by_words(store, _query("eastwind", question))


@pytest.mark.parametrize("depth", ["fast", "deep"])
def test_every_depth_searches_only_what_the_caller_may_see(store: Store, depth: str) -> None:
    question = QUESTIONS[1]
    flooded = _candidates(store, _query("northwind", question, depth=depth))
    assert flooded == _candidates(store, _query("eastwind", question, depth=depth))


def test_a_filtered_question_and_a_filter_alone_keep_the_visible_documents(store: Store) -> None:
    tags = Filters(tags=["pricing"])
    flooded = _candidates(store, _query("northwind", QUESTIONS[1], filters=tags))
    assert flooded and flooded == _candidates(store, _query("eastwind", QUESTIONS[1], filters=tags))
    listed = [(c.section_id, c.vector_rank) for c in _found(store, _query("northwind", "", mode="filter", filters=tags))]
    alone = [(c.section_id, c.vector_rank) for c in _found(store, _query("eastwind", "", mode="filter", filters=tags))]
    assert listed and listed == alone


def test_the_caller_who_may_see_the_flood_is_given_it(store: Store) -> None:
    """The same searches for a caller with the role: nothing of the flood is left out for everyone."""
    found = DocumentsSource().recall(
        SourceQuery(org="northwind", roles=("legal",), message=QUESTIONS[0], record_ids=(RECORD,), settings=Settings()),
        _tools(store),
    )
    assert sum(c.document_id.startswith("doc-aa-flood") for c in found.items) >= 25


def test_an_engine_call_answers_from_what_the_caller_may_see(store_url: str) -> None:
    flooded, _ = _bundles()
    with dossier.open(store_url, embedder=HashEmbedder()) as engine:
        engine.load_bundle(flooded)
        answer = engine.retrieve({"message": QUESTIONS[1], "record": {"email": "jane@acme.com"}},
                                 org="northwind", caller="ana")  # fmt: skip
    sections = answer.items("documents")
    assert sections and not any(s.document_id.startswith("doc-aa-flood") for s in sections)


def test_when_what_the_caller_may_not_see_cannot_be_read_the_documents_source_fails_closed(store_url: str) -> None:
    """No list of restricted documents, no search: the source fails (the route says so), nothing is returned
    from the documents, and the rest of the call stands."""
    from tests.retrieve.faults import FaultyStore, always

    flooded, _ = _bundles()
    with dossier.open(store_url, embedder=HashEmbedder()) as engine:
        engine.load_bundle(flooded)
        engine.store = FaultyStore(engine.store, {"restricted_documents": always})  # type: ignore[assignment]
        answer = engine.retrieve({"message": QUESTIONS[1], "record": {"email": "jane@acme.com"}, "trace": True},
                                 org="northwind", caller="ana")  # fmt: skip
    assert answer.sources["documents"].status == "error" and answer.items("documents") == []
    assert answer.partial and answer.items("memories")
    assert not any(t.source == "documents" for t in answer.trace or [])


class _Spy:
    """The real store, with every section search's ``parents`` noted."""

    def __init__(self, store: Store) -> None:
        self._store, self.parents = store, []  # type: list[tuple[str, frozenset[str] | None]]

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._store, name)
        if name not in ("search_vectors", "search_text"):
            return target

        def noted(*args: Any, **kwargs: Any) -> Any:
            parents = kwargs.get("parents")
            self.parents.append((name, None if parents is None else frozenset(parents)))
            return target(*args, **kwargs)

        return noted


def test_a_crowded_search_is_asked_once_and_never_reads_past_the_hidden_sections(store: Store) -> None:
    """Both searches are the store's searches of what the caller may see (the viewer's; the vector search is
    exact at this size on either store): no hidden hit comes back to read past, so each is asked once and never
    held to the visible documents, however many hidden sections crowd the question."""
    flood = len([i for i in store.document_ids(org="northwind") if i.startswith("doc-aa-flood")])
    spy = _Spy(store)
    found = DocumentsSource().recall(_query("northwind", QUESTIONS[0]), _tools(spy))  # type: ignore[arg-type]
    assert found.items and found.error is None
    visible = frozenset(d["id"] for d in _bundles(flood)[0]["documents"] if d["org"] == "northwind" and _may_see(d))
    assert [name for name, p in spy.parents if p == visible] == []
    org_wide = sorted(name for name, p in spy.parents if p is None)
    assert org_wide == ["search_text", "search_vectors"]  # one read each over the org: nothing hidden to read past


def test_a_filtered_question_searches_among_the_documents_its_filters_match(store_url: str) -> None:
    """Sections every caller may see but the filters exclude take no places either: the searches are held
    to the documents the filters match (here a hundred sections of another tag fill the org's best places)."""
    flooded, mine = _bundles(0)
    for i in range(100):
        flooded["documents"].append({
            "id": f"doc-ab-open-{i:03d}", "org": "northwind", "title": f"Refund window rules {i}", "tags": ["open"],
            "sections": [{"id": f"open-{i:03d}", "heading": "Refund window after cancellation",
                          "text": f"What is the refund window after cancellation? Case {i}."}],
        })  # fmt: skip
    refunds = Filters(tags=["refunds"])
    with dossier.open(store_url, embedder=HashEmbedder()) as engine:
        engine.load_bundle(flooded)
        engine.load_bundle(mine)
        store = engine.store
        question = QUESTIONS[2]
        crowded = store.search_vectors("section", HashEmbedder().embed_batch([question], kind="query")[0],
                                       org="northwind", limit=90)  # fmt: skip
        assert all(h.parent.startswith("doc-ab-open") for h in crowded), "the premise: the open flood holds 90 places"
        found = _found(store, _query("northwind", question, filters=refunds))
        tagged = {d["id"] for d in flooded["documents"] if "refunds" in d.get("tags", []) and _may_see(d)}
        assert found and {c.document_id for c in found} <= tagged
        assert _candidates(store, _query("northwind", question, filters=refunds)) == _candidates(
            store, _query("eastwind", question, filters=refunds))
