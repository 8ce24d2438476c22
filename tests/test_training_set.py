"""Integrity of the training sets (examples/training/*-questions.json): each loads through the project's own dataset
loader, its labels name real items in the right org, and it has the categories and shape its part of the README
promises. Nothing here runs retrieval, and no model is loaded (the bundles go into a store with the hashing test
embedder)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import dossier
from dossier.evaluation.dataset import Dataset, load_dataset
from tests.fake_embedder import HashEmbedder
from tests.labelled_sets import label_problems

TRAINING = Path(__file__).resolve().parents[1] / "examples" / "training"
DOCUMENT_CATEGORIES = {"paraphrase", "direct", "discovery", "sibling", "brief"}


@dataclass(frozen=True)
class Spec:
    """What examples/training/README.md promises about one set."""

    org: str
    other_org: str
    readme_start: str  # the set's part of the README runs from this line to readme_end (or the end)
    readme_end: str | None
    categories: dict[str, int]
    siblings: tuple[tuple[str, str], ...]  # (sibling title, the general document's title)
    tombstone: str
    merged: tuple[str, str]  # (duplicate, survivor)
    shared_email: str
    shared_website: str
    shared_title: str


SPECS = {
    "harbor": Spec(
        org="harbor", other_org="keel", readme_start="# Harbor Line: a training set", readme_end="## Cedar & Stone",
        categories={
            "paraphrase": 25, "direct": 15, "discovery": 15, "sibling": 16, "brief": 15, "unanswerable": 10,
            "memory": 8, "role_restricted": 6, "cross_org": 4, "property": 3, "graph": 3, "tombstone": 2, "merge": 2,
        },
        siblings=(
            ("EU Customs Clearance Procedure", "Customs Clearance Procedure"),
            ("UK Customs Clearance Procedure", "Customs Clearance Procedure"),
            ("APAC Cargo Claims and Damage Procedure", "Cargo Claims and Damage Procedure"),
            ("EU Driver Safety Policy", "Driver Safety Policy"),
        ),
        tombstone="rec-gregor", merged=("rec-marcus-old", "rec-marcus"),
        shared_email="eva.jansen@brightwaterpharma.com", shared_website="brightwaterpharma.com",
        shared_title="Cargo Claims and Damage Procedure",
    ),
    "cedar": Spec(
        org="cedar", other_org="juniper", readme_start="## Cedar & Stone",
        readme_end="## Birchwood Lettings: a third training set",
        categories={
            "paraphrase": 25, "direct": 12, "discovery": 15, "sibling": 16, "brief": 15, "unanswerable": 10,
            "memory": 6, "role_restricted": 6, "cross_org": 4, "property": 3, "graph": 2, "tombstone": 2, "merge": 2,
        },
        siblings=(
            ("UK Hotel Cancellation Policy", "Hotel Cancellation Policy"),
            ("Middle East Hotel Cancellation Policy", "Hotel Cancellation Policy"),
            ("Serviced Apartments Cancellation Policy", "Hotel Cancellation Policy"),
            ("EU Guest Data Privacy Policy", "Guest Data Privacy Policy"),
            ("Serviced Apartments Housekeeping Standards", "Housekeeping Standards"),
        ),
        tombstone="rec-victor", merged=("rec-paul-old", "rec-paul"),
        shared_email="ingrid.halvorsen@haldenconsulting.com", shared_website="haldenconsulting.com",
        shared_title="Hotel Cancellation Policy",
    ),
    "birch": Spec(
        org="birch", other_org="rowan", readme_start="## Birchwood Lettings: a third training set",
        readme_end="## Quillfield Health: a fourth training set",
        categories={
            "paraphrase": 25, "direct": 13, "discovery": 15, "sibling": 16, "brief": 15, "unanswerable": 10,
            "memory": 7, "role_restricted": 6, "cross_org": 4, "property": 3, "graph": 3, "tombstone": 2, "merge": 2,
        },
        siblings=(
            ("Scotland Tenancy Deposit Procedure", "Tenancy Deposit Procedure"),
            ("Wales Tenancy Deposit Procedure", "Tenancy Deposit Procedure"),
            ("Scotland Repairs and Maintenance Procedure", "Repairs and Maintenance Procedure"),
            ("Student Tenant Referencing Procedure", "Tenant Referencing Procedure"),
            ("HMO Fire Safety Standards", "Fire Safety Standards"),
        ),
        tombstone="rec-dominic", merged=("rec-megan-old", "rec-megan"),
        shared_email="amara.osei@hollisproperty.co.uk", shared_website="hollisproperty.co.uk",
        shared_title="Rent Arrears Procedure",
    ),
    "quill": Spec(
        org="quill", other_org="sorrel", readme_start="## Quillfield Health: a fourth training set",
        readme_end="## Fernhill Kitchens: a fifth training set",
        categories={
            "paraphrase": 22, "direct": 12, "discovery": 14, "sibling": 14, "brief": 14, "unanswerable": 9,
            "memory": 7, "role_restricted": 6, "cross_org": 4, "property": 3, "graph": 3, "tombstone": 2, "merge": 2,
        },
        siblings=(
            ("Ontario Patient Cancellation Policy", "Patient Cancellation Policy"),
            ("California Patient Cancellation Policy", "Patient Cancellation Policy"),
            ("California Workers' Compensation Claims Procedure", "Workers' Compensation Claims Procedure"),
            ("Telehealth Session Procedure", "In-Clinic Session Procedure"),
        ),
        tombstone="rec-wesley", merged=("rec-marc-old", "rec-marc"),
        shared_email="dana.whitfield@ridgelinefreight.com", shared_website="ridgelinefreight.com",
        shared_title="Patient Billing and Self-Pay Policy",
    ),
    "fern": Spec(
        org="fern", other_org="bramble", readme_start="## Fernhill Kitchens: a fifth training set",
        readme_end="## Meridian Water & Power: a sixth training set",
        categories={
            "paraphrase": 25, "direct": 15, "discovery": 15, "sibling": 16, "brief": 15, "unanswerable": 10,
            "memory": 8, "role_restricted": 6, "cross_org": 4, "property": 3, "graph": 3, "tombstone": 2, "merge": 2,
        },
        siblings=(
            ("Scotland Allergen Procedure", "Allergen Procedure"),
            ("Ireland Health Inspection Procedure", "Health Inspection Procedure"),
            ("Delivery Refund Policy", "Dine-in Refund Policy"),
            ("Private Dining Booking and Cancellation Policy", "Catering Booking and Cancellation Policy"),
        ),
        tombstone="rec-gavin", merged=("rec-fiona-old", "rec-fiona"),
        shared_email="priya.nair@oakmereevents.co.uk", shared_website="oakmereevents.co.uk",
        shared_title="Catering Booking and Cancellation Policy",
    ),
    "meridian": Spec(
        org="meridian", other_org="tidewater", readme_start="## Meridian Water & Power: a sixth training set",
        readme_end=None,
        categories={
            "paraphrase": 25, "direct": 15, "discovery": 15, "sibling": 16, "brief": 15, "unanswerable": 10,
            "memory": 8, "role_restricted": 6, "cross_org": 4, "property": 3, "graph": 3, "tombstone": 2, "merge": 2,
        },
        siblings=(
            ("Northern District Outage Compensation Policy", "Outage Compensation Policy"),
            ("Coastal District Vegetation Clearance Procedure", "Vegetation Clearance Procedure"),
            ("Business Customer Payment Plan Policy", "Residential Payment Plan Policy"),
            ("Water Meter Reading and Estimated Billing Procedure", "Meter Reading and Estimated Billing Procedure"),
        ),
        tombstone="rec-bernard", merged=("rec-ruth-old", "rec-ruth"),
        shared_email="fiona.marsh@harlowcreamery.com", shared_website="harlowcreamery.com",
        shared_title="Outage Compensation Policy",
    ),
}  # fmt: skip
SETS = sorted(path.name.removesuffix("-questions.json") for path in TRAINING.glob("*-questions.json"))


def test_every_training_set_is_described() -> None:
    assert SETS, "no training sets found"
    assert set(SETS) == set(SPECS), "every examples/training/*-questions.json needs a Spec here and a README part"


_loaded: dict[str, Dataset] = {}


@pytest.fixture(params=SETS)
def training_set(request: pytest.FixtureRequest) -> tuple[Spec, Dataset]:
    name = request.param
    if name not in _loaded:
        _loaded[name] = load_dataset(TRAINING / f"{name}-questions.json")
    return SPECS[name], _loaded[name]


def _documents(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["id"]: d for d in raw["documents"]}


def _readme_part(spec: Spec) -> str:
    readme = (TRAINING / "README.md").read_text(encoding="utf-8")
    start = readme.index(spec.readme_start)
    end = readme.index(spec.readme_end, start) if spec.readme_end else len(readme)
    return readme[start:end]


def test_the_bundle_loads_whole_into_a_fresh_store(tmp_path: Path, training_set: tuple[Spec, Dataset]) -> None:
    spec, dataset = training_set
    raw = dataset.raw_bundle
    with dossier.open(f"sqlite:///{tmp_path}/training.db", embedder=HashEmbedder()) as engine:
        report = engine.load_bundle(dataset.bundle)
        counts = engine.store.counts(org=spec.org)
    assert report.inserted["documents"] == len(raw["documents"])
    assert report.inserted["memories"] == len(raw["memories"])
    assert report.inserted["records"] == len(raw["records"])
    assert counts["sections"] == sum(len(d["sections"]) for d in raw["documents"] if d["org"] == spec.org)


def test_every_labelled_id_exists_in_the_questions_org(training_set: tuple[Spec, Dataset]) -> None:
    _, dataset = training_set
    assert label_problems(dataset) == []


def test_question_ids_are_unique_across_the_sets() -> None:
    seen: Counter[str] = Counter()
    for name in SETS:
        seen.update(q.id for q in load_dataset(TRAINING / f"{name}-questions.json").questions)
    assert [qid for qid, n in seen.items() if n > 1] == []


def test_category_counts_are_as_the_readme_says(training_set: tuple[Spec, Dataset]) -> None:
    spec, dataset = training_set
    counts = Counter(q.category for q in dataset.questions)
    assert dict(counts) == spec.categories
    part = _readme_part(spec)
    for category, n in spec.categories.items():
        assert re.search(rf"^\| {category} \| {n} \|", part, re.MULTILINE), category
    assert f"{len(dataset.questions)} labelled questions" in part


def test_answerable_document_questions_have_gold_sections_in_their_gold_documents(
    training_set: tuple[Spec, Dataset],
) -> None:
    _, dataset = training_set
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


def test_gold_sections_are_visible_to_the_caller_and_never_system_or_attached(
    training_set: tuple[Spec, Dataset],
) -> None:
    _, dataset = training_set
    docs = _documents(dataset.raw_bundle)
    roles = {c["id"]: set(c["roles"]) for c in dataset.raw_bundle["callers"]}
    for q in dataset.questions:
        for doc_id in q.gold.documents:
            doc = docs[doc_id]
            assert not doc["is_system"], q.id
            assert doc["attached_record"] is None, q.id
            if doc["visible_to_roles"] is not None:
                assert roles[q.caller] & set(doc["visible_to_roles"]), q.id


def test_unanswerable_questions_have_no_gold_content(training_set: tuple[Spec, Dataset]) -> None:
    _, dataset = training_set
    for q in dataset.questions:
        if not q.answerable:
            content = ("documents", "sections", "memories", "properties", "edges")
            assert not any(getattr(q.gold, kind) for kind in content), q.id


def test_the_bundle_has_the_shape_the_readme_promises(training_set: tuple[Spec, Dataset]) -> None:
    spec, dataset = training_set
    raw = dataset.raw_bundle
    own = [d for d in raw["documents"] if d["org"] == spec.org]
    general = [d for d in own if not d["is_system"] and d["attached_record"] is None]
    assert len(general) >= 22
    for doc in general:
        assert 4 <= len(doc["sections"]) <= 10, doc["id"]
        for section in doc["sections"]:
            assert 50 <= len(section["text"].split()) <= 140, section["id"]
    titled = {d["title"]: d for d in general}
    for sibling, base in spec.siblings:
        assert sibling in titled and base in titled, sibling
        # siblings share their section headings and differ in the text
        assert [s["heading"] for s in titled[sibling]["sections"]] == [s["heading"] for s in titled[base]["sections"]]
        assert {s["text"] for s in titled[sibling]["sections"]}.isdisjoint(s["text"] for s in titled[base]["sections"])
    assert sum(1 for d in general if d["visible_to_roles"]) == 2
    assert sum(1 for d in own if d["is_system"]) == 1
    assert sum(1 for d in own if d["attached_record"]) >= 1
    records = {r["id"]: r for r in raw["records"] if r["org"] == spec.org}
    assert records[spec.tombstone]["pending_deletion"] is True
    assert records[spec.merged[0]]["merged_into"] == spec.merged[1]
    memories = [m for m in raw["memories"] if m["org"] == spec.org]
    assert 40 <= len(memories) <= 80
    # the second org collides on one contact email, one company website and one document title
    emails = Counter(r["identifiers"]["email"] for r in raw["records"] if r["identifiers"]["email"])
    assert emails[spec.shared_email] == 2
    websites = {r["org"] for r in raw["records"] if spec.shared_website in (r["identifiers"]["website"] or "")}
    assert websites == {spec.org, spec.other_org}
    other_titles = {d["title"]: d for d in raw["documents"] if d["org"] == spec.other_org}
    assert spec.shared_title in other_titles and spec.shared_title in titled
    ours = {s["text"] for s in titled[spec.shared_title]["sections"]}
    assert ours.isdisjoint(s["text"] for s in other_titles[spec.shared_title]["sections"])
