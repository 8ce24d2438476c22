"""Integrity of the training set (examples/training): it loads through the project's own dataset loader, its
labels name real items in the right org, and it has the categories and shape its README promises. Nothing
here runs retrieval, and no model is loaded (the bundle goes into a store with the hashing test embedder)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import dossier
from dossier.evaluation.dataset import Dataset, load_dataset
from tests.fake_embedder import HashEmbedder

TRAINING = Path(__file__).resolve().parents[1] / "examples" / "training"
DATASET = TRAINING / "harbor-questions.json"

# the counts in examples/training/README.md
CATEGORY_COUNTS = {
    "paraphrase": 25, "direct": 15, "discovery": 15, "sibling": 16, "brief": 15, "unanswerable": 10,
    "memory": 8, "role_restricted": 6, "cross_org": 4, "property": 3, "graph": 3, "tombstone": 2, "merge": 2,
}  # fmt: skip
DOCUMENT_CATEGORIES = {"paraphrase", "direct", "discovery", "sibling", "brief"}
GOLD_KINDS = ("documents", "sections", "memories", "properties", "edges", "records")


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return load_dataset(DATASET)


def _index(raw: dict[str, Any]) -> dict[str, set[tuple[str, str]]]:
    """Every id in the bundle -> the (kind, org) pairs it names (ids are unique per org and kind)."""
    index: dict[str, set[tuple[str, str]]] = {}

    def add(item_id: str, kind: str, org: str) -> None:
        index.setdefault(item_id, set()).add((kind, org))

    for kind in ("records", "memories", "documents", "edges"):
        for item in raw[kind]:
            add(item["id"], kind, item["org"])
    for doc in raw["documents"]:
        for section in doc["sections"]:
            add(section["id"], "sections", doc["org"])
    for record in raw["records"]:
        for name in record["properties"]:
            add(f"{record['id']}/{name}", "properties", record["org"])
    return index


def _documents(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["id"]: d for d in raw["documents"]}


def test_the_bundle_loads_whole_into_a_fresh_store(tmp_path: Path, dataset: Dataset) -> None:
    raw = dataset.raw_bundle
    with dossier.open(f"sqlite:///{tmp_path}/training.db", embedder=HashEmbedder()) as engine:
        report = engine.load_bundle(dataset.bundle)
        counts = engine.store.counts(org="harbor")
    assert report.inserted["documents"] == len(raw["documents"])
    assert report.inserted["memories"] == len(raw["memories"])
    assert report.inserted["records"] == len(raw["records"])
    assert counts["sections"] == sum(len(d["sections"]) for d in raw["documents"] if d["org"] == "harbor")


def test_every_labelled_id_exists_in_the_questions_org(dataset: Dataset) -> None:
    index = _index(dataset.raw_bundle)
    callers = {c["id"]: c["org"] for c in dataset.raw_bundle["callers"]}
    problems = []
    for q in dataset.questions:
        if callers.get(q.caller) != q.org:
            problems.append(f"{q.id}: caller {q.caller} is not in org {q.org}")
        for kind in GOLD_KINDS:
            for item in getattr(q.gold, kind):
                if (kind, q.org) not in index.get(item, set()):
                    problems.append(f"{q.id}: gold {kind} {item} not in org {q.org}")
        for item in q.forbidden:
            if item not in index:
                problems.append(f"{q.id}: forbidden {item} does not exist")
        gold = {item for kind in GOLD_KINDS for item in getattr(q.gold, kind)}
        if gold & set(q.forbidden):
            problems.append(f"{q.id}: gold and forbidden share {sorted(gold & set(q.forbidden))}")
    assert problems == []


def test_category_counts_are_as_the_readme_says(dataset: Dataset) -> None:
    counts = Counter(q.category for q in dataset.questions)
    assert dict(counts) == CATEGORY_COUNTS
    readme = (TRAINING / "README.md").read_text(encoding="utf-8")
    for category, n in CATEGORY_COUNTS.items():
        assert re.search(rf"^\| {category} \| {n} \|", readme, re.MULTILINE), category
    assert f"{len(dataset.questions)} labelled questions" in readme


def test_answerable_document_questions_have_gold_sections_in_their_gold_documents(dataset: Dataset) -> None:
    docs = _documents(dataset.raw_bundle)
    section_doc = {s["id"]: d["id"] for d in docs.values() for s in d["sections"]}
    problems = []
    for q in dataset.questions:
        if q.gold.documents and not q.gold.sections:
            problems.append(f"{q.id}: gold documents without gold sections")
        if q.category in DOCUMENT_CATEGORIES and q.answerable and not q.gold.sections:
            problems.append(f"{q.id}: an answerable {q.category} question without gold sections")
        if {section_doc[s] for s in q.gold.sections} != set(q.gold.documents):
            problems.append(f"{q.id}: gold documents do not match the gold sections' documents")
        if q.category == "brief" and not (q.gold.memories and q.record):
            problems.append(f"{q.id}: a brief question needs a record and gold memories")
    assert problems == []


def test_gold_sections_are_visible_to_the_caller_and_never_system_or_attached(dataset: Dataset) -> None:
    docs = _documents(dataset.raw_bundle)
    roles = {c["id"]: set(c["roles"]) for c in dataset.raw_bundle["callers"]}
    for q in dataset.questions:
        for doc_id in q.gold.documents:
            doc = docs[doc_id]
            assert not doc["is_system"], q.id
            assert doc["attached_record"] is None, q.id
            if doc["visible_to_roles"] is not None:
                assert roles[q.caller] & set(doc["visible_to_roles"]), q.id


def test_unanswerable_questions_have_no_gold_content(dataset: Dataset) -> None:
    for q in dataset.questions:
        if not q.answerable:
            content = ("documents", "sections", "memories", "properties", "edges")
            assert not any(getattr(q.gold, kind) for kind in content), q.id


def test_the_bundle_has_the_shape_the_readme_promises(dataset: Dataset) -> None:
    raw = dataset.raw_bundle
    harbor = [
        d for d in raw["documents"] if d["org"] == "harbor" and not d["is_system"] and d["attached_record"] is None
    ]
    assert len(harbor) >= 22
    for doc in harbor:
        assert 4 <= len(doc["sections"]) <= 10, doc["id"]
        for section in doc["sections"]:
            assert 50 <= len(section["text"].split()) <= 140, section["id"]
    titles = {d["title"] for d in harbor}
    for sibling in ("EU Customs Clearance Procedure", "UK Customs Clearance Procedure",
                    "APAC Cargo Claims and Damage Procedure", "EU Driver Safety Policy"):
        assert sibling in titles and sibling.split(" ", 1)[1] in titles, sibling
    assert sum(1 for d in harbor if d["visible_to_roles"]) == 2
    records = {r["id"]: r for r in raw["records"]}
    assert records["rec-gregor"]["pending_deletion"] is True
    assert records["rec-marcus-old"]["merged_into"] == "rec-marcus"
    harbor_memories = [m for m in raw["memories"] if m["org"] == "harbor"]
    assert 40 <= len(harbor_memories) <= 80
    # the second org collides on one contact email and one document title
    emails = Counter(r["identifiers"]["email"] for r in raw["records"] if r["identifiers"]["email"])
    assert emails["eva.jansen@brightwaterpharma.com"] == 2
    keel_titles = {d["title"] for d in raw["documents"] if d["org"] == "keel"}
    assert "Cargo Claims and Damage Procedure" in keel_titles & titles
