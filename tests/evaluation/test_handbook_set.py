"""Integrity of the held-out handbook set (examples/handbook): it loads, its labels name real items, and it
has the documents, questions and categories it promises. Nothing here runs retrieval: the set is a test
set, and no threshold, weight or model may be chosen by looking at how it scores."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

import dossier
from dossier.evaluation.dataset import Dataset, load_dataset
from tests.labelled_sets import label_problems

DATASET = Path(__file__).resolve().parents[2] / "examples" / "handbook" / "handbook-questions.json"

MINIMUM_PER_CATEGORY = {
    "paraphrase": 25, "direct": 20, "discovery": 15, "brief": 12, "sibling": 12, "unanswerable": 10,
    "role_restricted": 3, "cross_org": 3, "tombstone": 2, "merge": 2, "property": 3, "memory": 3, "graph": 3,
    "exact_code": 3,
}  # fmt: skip


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return load_dataset(DATASET)


def test_the_bundle_loads_into_a_fresh_sqlite_store(tmp_path: Path, embedder, dataset: Dataset) -> None:  # type: ignore[no-untyped-def]
    raw = dataset.raw_bundle
    with dossier.open(f"sqlite:///{tmp_path}/handbook.db", embedder=embedder) as engine:
        report = engine.load_bundle(dataset.bundle)
        assert report.inserted["documents"] == len(raw["documents"])
        assert report.inserted["memories"] == len(raw["memories"])
        counts = engine.store.counts(org="lumen")
    lumen_sections = sum(len(d["sections"]) for d in raw["documents"] if d["org"] == "lumen")
    assert counts["sections"] == lumen_sections
    assert counts["records"] == sum(r["org"] == "lumen" for r in raw["records"])


def test_every_labelled_id_exists_in_the_questions_org(dataset: Dataset) -> None:
    problems = label_problems(dataset)
    for q in dataset.questions:
        for section in q.gold.sections:
            if section.rsplit("-s", 1)[0] not in q.gold.documents:
                problems.append(f"{q.id}: the document of {section} is not a gold document")
    assert not problems, "\n".join(problems)


def test_gold_sections_are_visible_to_the_caller(dataset: Dataset) -> None:
    raw = dataset.raw_bundle
    roles = {c["id"]: set(c["roles"]) for c in raw["callers"]}
    docs = {(d["org"], s["id"]): d for d in raw["documents"] for s in d["sections"]}
    for q in dataset.questions:
        for section in q.gold.sections:
            doc = docs[(q.org, section)]
            assert not doc["is_system"], q.id
            assert doc["visible_to_roles"] is None or set(doc["visible_to_roles"]) & roles[q.caller], q.id
            assert doc["attached_record"] is None or doc["attached_record"] in q.gold.records, q.id


def test_documents_have_four_to_twelve_sections_of_real_text(dataset: Dataset) -> None:
    lumen = [d for d in dataset.raw_bundle["documents"] if d["org"] == "lumen"]
    assert sum(4 <= len(d["sections"]) <= 12 for d in lumen) >= 20
    for doc in lumen:
        assert 4 <= len(doc["sections"]) <= 12, doc["id"]
        for section in doc["sections"]:
            assert 60 <= len(section["text"].split()) <= 250, section["id"]
    assert any(d["visible_to_roles"] for d in lumen)
    assert any(d["is_system"] for d in lumen)
    assert any(d["attached_record"] for d in lumen)
    # siblings: a longer title that ends with another document's title
    titles = {d["title"] for d in lumen}
    assert sum(any(t != u and t.endswith(u) for u in titles) for t in titles) >= 5


def test_questions_and_categories(dataset: Dataset) -> None:
    assert len(dataset.questions) >= 100
    counts = Counter(q.category for q in dataset.questions)
    short = {c: (counts[c], n) for c, n in MINIMUM_PER_CATEGORY.items() if counts[c] < n}
    assert not short, short
    for q in dataset.questions:
        if not q.answerable:
            assert not q.gold.sections and not q.gold.memories, q.id
        if q.category == "unanswerable":
            assert not q.answerable, q.id
        if q.category == "brief":
            assert q.record and q.gold.memories and q.gold.sections and q.gold.records, q.id


def test_discovery_questions_name_no_gold_title(dataset: Dataset) -> None:
    titles = {(d["org"], d["id"]): d["title"].lower() for d in dataset.raw_bundle["documents"]}
    for q in dataset.questions:
        if q.category == "discovery":
            assert all(titles[(q.org, doc)] not in q.message.lower() for doc in q.gold.documents), q.id


def test_each_exact_code_appears_in_its_gold_section_only(dataset: Dataset) -> None:
    sections = [(s["id"], s["text"]) for d in dataset.raw_bundle["documents"] for s in d["sections"]]
    for q in dataset.questions:
        if q.category != "exact_code":
            continue
        codes = re.findall(r"\b[A-Z]{2,}(?:-[A-Z0-9]+)+\b", q.message)
        assert codes, q.id
        for code in codes:
            assert [sid for sid, text in sections if code in text] == q.gold.sections, (q.id, code)
