"""The Store contract: what every backend must do, as tests over the ``store`` fixture.

``tests/stores/test_contract.py`` collects these; a new backend passes them by adding one branch to the
store fixture in ``tests/conftest.py``. Data is written straight through ``Store.write`` (not the
loader), with real content hashes and real MiniLM vectors.
"""

from __future__ import annotations

import inspect
import random
from datetime import datetime
from typing import Any, Callable, Iterable

import numpy as np
import pytest

import dossier
from dossier.bundle import Caller, Document, Edge, Memory, Org, Record, Section
from dossier.loading import content_hash, property_text, section_text, text_hash
from dossier.stores.base import Store, VectorWrite, WriteBatch, property_key

# -- building batches ------------------------------------------------------------------------------
_VECTORS: dict[str, np.ndarray] = {}  # text -> vector; the embedder is deterministic


def _embed(embedder: Any, texts: list[str]) -> list[np.ndarray]:
    missing = [t for t in dict.fromkeys(texts) if t not in _VECTORS]
    if missing:
        _VECTORS.update(zip(missing, embedder.embed_documents(missing)))
    return [_VECTORS[t] for t in texts]


def make_batch(
    embedder: Any,
    *,
    orgs: Iterable[Org] = (),
    callers: Iterable[Caller] = (),
    records: Iterable[Record] = (),
    memories: Iterable[Memory] = (),
    documents: Iterable[Document] = (),
    edges: Iterable[Edge] = (),
    vectors: bool = True,
) -> WriteBatch:
    """A batch of items with their content hashes and (unless ``vectors=False``) their vectors."""
    batch = WriteBatch(
        orgs=list(orgs),
        callers=list(callers),
        records=[(r, content_hash(r)) for r in records],
        memories=[(m, content_hash(m)) for m in memories],
        documents=[(d, content_hash(d)) for d in documents],
        edges=[(e, content_hash(e)) for e in edges],
    )
    if vectors:
        slots: list[tuple[str, Any, str, str, str]] = []  # org, kind, key, parent, text
        for r, _ in batch.records:
            for name, value in r.properties.items():
                if value is not None and value != "":
                    slots.append((r.org, "property", property_key(r.id, name), r.id, property_text(name, value)))
        for m, _ in batch.memories:
            slots.append((m.org, "memory", m.id, m.record, m.text))
        for d, _ in batch.documents:
            for s in d.sections:
                slots.append((d.org, "section", s.id, d.id, section_text(d, s)))
        found = _embed(embedder, [slot[-1] for slot in slots])
        batch.vectors = [VectorWrite(o, k, key, p, text_hash(t), v) for (o, k, key, p, t), v in zip(slots, found)]
    return batch


def _contact(org: str, rid: str, **kw: Any) -> Record:
    return Record(id=rid, org=org, kind="contact", **kw)


def _memory(org: str, mid: str, record: str, text: str, at: str) -> Memory:
    return Memory(id=mid, org=org, record=record, text=text, created_at=datetime.fromisoformat(at))


def world(org: str) -> dict[str, list[Any]]:
    """One small org: people and companies, memories, documents and a graph, all ids org-local."""
    records = [
        _contact(
            org, "r-jane",
            identifiers={"email": "Jane.Doe@Acme.com", "phone": "+1 (555) 010-2000",
                         "profile_url": "https://www.linkedin.com/in/jane-doe/"},
            properties={"plan": "Enterprise", "renewal_month": "March", "seats": 40},
        ),
        _contact(org, "r-bob", identifiers={"email": "bob@eu.acme.com"}, properties={"role": "Chief Financial Officer"}),
        _contact(org, "r-joe", identifiers={"email": "joe@gmail.com"}),
        Record(id="r-acme", org=org, kind="company", identifiers={"website": "https://www.acme.com/pricing"},
               properties={"industry": "Industrial adhesives"}),
        Record(id="r-acme-uk", org=org, kind="company", identifiers={"website": "shop.acme.co.uk"}),
        _contact(org, "r-old", merged_into="r-jane", identifiers={"email": "jane@oldmail.org"}),
        _contact(org, "r-older", merged_into="r-old"),
        _contact(org, "r-gone", pending_deletion=True, identifiers={"email": "gone@example.org"}),
        *(_contact(org, rid) for rid in ("r-carl", "r-dan", "r-eve", "r-fay", "r-gus", "r-ivy", "r-stub", "r-hal")),
    ]  # fmt: skip
    memories = [
        _memory(org, "m-jane-1", "r-jane", "Jane asked whether annual prepay gets a discount.", "2024-03-01T10:00:00+00:00"),
        # 09:00 at +02:00 is 07:00 UTC: older than m-jane-3 although its local hour is later
        _memory(org, "m-jane-2", "r-jane", "Jane said the renewal waits for legal to review the data processing terms.",
                "2024-03-05T09:00:00+02:00"),
        _memory(org, "m-jane-3", "r-jane", "Onboarding call with Jane for the new warehouse team.", "2024-03-05T08:00:00+00:00"),
        _memory(org, "m-bob-1", "r-bob", "Bob wants quarterly invoices instead of monthly ones.", "2024-03-04T12:00:00+00:00"),
        _memory(org, "m-bob-2", "r-bob", "Bob confirmed the purchase order number for the annual renewal.",
                "2024-03-01T10:00:00+00:00"),  # same instant as m-jane-1: ties break by id
        _memory(org, "m-gone-1", "r-gone", "Asked us to delete everything we hold about them.", "2024-03-06T10:00:00+00:00"),
    ]  # fmt: skip
    documents = [
        Document(
            id="d-discounts", org=org, title="Discount policy", doc_type="policy", tags=("pricing", "sales"),
            visible_to_roles=("sales",),
            sections=(
                Section(id="s-disc-limits", heading="Approval limits",
                        text="Discounts above 20% need written approval from the VP of Sales."),
                Section(id="s-disc-prepay", heading="Annual prepay",
                        text="Customers who prepay annually receive an extra 5% discount."),
            ),
        ),
        Document(
            id="d-education", org=org, title="Education programme", tags=("training",),
            sections=(
                Section(id="s-edu-40", heading="NW-EDU-40",
                        text="Course NW-EDU-40 covers safe handling of industrial adhesives."),
                Section(id="s-edu-41", heading="NW-EDU-41",
                        text="Course NW-EDU-41 covers forklift certification for warehouse staff."),
            ),
        ),
        Document(
            id="d-refunds", org=org, title="Refund terms for Jane", doc_type="contract", visible_to_roles=(),
            attached_record="r-jane",
            sections=(Section(id="s-refund-window", heading="Window",
                              text="Refunds are issued within 30 days of cancellation."),),
        ),
        Document(
            id="d-system", org=org, title="Assistant rules", doc_type="system", is_system=True,
            sections=(Section(id="s-system", heading="", text="Always answer politely and cite sources."),),
        ),
    ]  # fmt: skip
    edge = lambda eid, src, dst, **kw: Edge(id=eid, org=org, src=src, dst=dst, type=kw.pop("type", "knows"), **kw)  # noqa: E731
    edges = [
        edge("e1", "r-jane", "r-acme", type="works_at", confidence=0.9, weight=1.0),
        edge("e2", "r-jane", "r-bob", confidence=0.9, weight=2.0),
        edge("e3", "r-jane", "r-carl", confidence=0.5),
        edge("e4", "r-acme", "r-dan", confidence=0.6),  # hop 2
        edge("e5", "r-dan", "r-eve", confidence=0.7),  # hop 3
        edge("e6", "r-eve", "r-fay", confidence=1.0),  # hop 4
        edge("e7", "r-jane", "r-gus", active=False),  # inactive
        edge("e11", "r-gus", "r-ivy"),  # reachable only through the inactive edge
        edge("e8", "r-jane", "r-stub", dst_is_stub=True),
        edge("e9", "r-jane", "r-gone"),  # touches a record pending deletion
        edge("e10", "r-gone", "r-hal"),  # ... and beyond it
    ]
    return {
        "orgs": [Org(id=org, name=f"{org} corp")],
        "callers": [Caller(id="c-sales", org=org, roles=("sales",)), Caller(id="c-admin", org=org, roles=("admin", "sales"))],
        "records": records,
        "memories": memories,
        "documents": documents,
        "edges": edges,
    }


def write_world(store: Store, embedder: Any, org: str = "acme") -> dict[str, list[Any]]:
    items = world(org)
    store.write(make_batch(embedder, **items))
    return items


def _ids(items: Iterable[Any]) -> list[str]:
    return [item.id for item in items]


# -- writes and hashes -----------------------------------------------------------------------------
def test_write_then_read_back_every_kind(store: Store, embedder: Any) -> None:
    items = write_world(store, embedder)
    assert store.get_org(org="acme") == items["orgs"][0]
    assert store.get_caller("c-admin", org="acme") == items["callers"][1]
    assert store.get_records(_ids(items["records"]), org="acme") == items["records"]
    assert store.get_memories(_ids(items["memories"]), org="acme") == items["memories"]
    assert store.get_documents(_ids(items["documents"]), org="acme") == items["documents"]


@pytest.mark.parametrize("kind", ["org", "caller", "record", "memory", "document", "edge"])
def test_content_hashes_are_those_written_and_skip_missing_ids(store: Store, embedder: Any, kind: str) -> None:
    items = write_world(store, embedder)
    written = items[{"memory": "memories"}.get(kind, kind + "s")]
    expected = {item.id: content_hash(item) for item in written}
    assert store.content_hashes(kind, [*expected, "no-such-id"], org="acme") == expected  # type: ignore[arg-type]
    assert store.content_hashes(kind, [], org="acme") == {}  # type: ignore[arg-type]


def test_content_hash_follows_an_upsert(store: Store, embedder: Any) -> None:
    items = write_world(store, embedder)
    jane = items["records"][0].model_copy(update={"properties": {"plan": "Starter"}})
    store.write(make_batch(embedder, records=[jane]))
    assert store.content_hashes("record", ["r-jane"], org="acme") == {"r-jane": content_hash(jane)}
    assert store.get_records(["r-jane"], org="acme")[0].properties == {"plan": "Starter"}


def test_vector_hashes_are_the_hashes_of_the_embedded_texts(store: Store, embedder: Any) -> None:
    items = write_world(store, embedder)
    jane, discounts = items["records"][0], items["documents"][0]
    assert store.vector_hashes("property", [property_key("r-jane", "plan"), "r-jane/unknown"], org="acme") == {
        property_key("r-jane", "plan"): text_hash(property_text("plan", jane.properties["plan"]))
    }
    assert store.vector_hashes("memory", ["m-bob-1"], org="acme") == {"m-bob-1": text_hash(items["memories"][3].text)}
    section = discounts.sections[1]
    assert store.vector_hashes("section", [section.id], org="acme") == {section.id: text_hash(section_text(discounts, section))}
    # a key of one kind is not found under another
    assert store.vector_hashes("memory", [section.id], org="acme") == {}


def _failing_batches(embedder: Any) -> list[tuple[str, WriteBatch]]:
    extra = world("acme")
    doc = extra["documents"][1]
    twin = doc.model_copy(update={"id": "d-twin"})  # reuses doc's section ids: they are unique per org
    no_org = make_batch(embedder, memories=[_memory("acme", "m-new", "r-bob", "A brand new memory.", "2024-04-01T00:00:00")])
    no_org.vectors.append(VectorWrite("", "memory", "m-orphan", "r-bob", "h", no_org.vectors[0].vector))
    return [("vector without an org", no_org), ("section id used by two documents", make_batch(embedder, documents=[doc, twin]))]


@pytest.mark.parametrize("case", range(2), ids=["vector-without-org", "duplicate-section-id"])
def test_a_failing_batch_writes_nothing(store: Store, embedder: Any, case: int) -> None:
    items = write_world(store, embedder)
    before = store.counts(org="acme")
    _, failing = _failing_batches(embedder)[case]
    # the failing batch also changes an existing memory and adds a record first: none of it may stick
    changed = items["memories"][0].model_copy(update={"text": "Rewritten memory text about zebras."})
    newcomer = _contact("acme", "r-newcomer", identifiers={"email": "new@acme.com"})
    head = make_batch(embedder, records=[newcomer], memories=[changed])
    failing.records[:0] = head.records
    failing.memories[:0] = head.memories
    failing.vectors[:0] = head.vectors
    with pytest.raises(dossier.DossierError):
        store.write(failing)
    assert store.counts(org="acme") == before
    assert store.get_records(["r-newcomer"], org="acme") == []
    assert store.get_memories(["m-jane-1"], org="acme") == [items["memories"][0]]
    assert store.search_text("memory", "zebras", org="acme", limit=5) == []
    assert store.get_documents(["d-twin"], org="acme") == []


def test_a_failing_batch_on_an_empty_store_leaves_it_empty(store: Store, embedder: Any) -> None:
    batch = make_batch(embedder, **world("acme"))
    batch.vectors.append(VectorWrite("", "memory", "m-orphan", "r-bob", "h", batch.vectors[0].vector))
    with pytest.raises(dossier.DossierError):
        store.write(batch)
    assert store.get_org(org="acme") is None
    assert set(store.counts(org="acme").values()) == {0}


def test_upserting_a_record_drops_vectors_of_properties_it_no_longer_has(store: Store, embedder: Any) -> None:
    items = write_world(store, embedder)
    keys = [property_key("r-jane", name) for name in ("plan", "renewal_month", "seats")]
    assert set(store.vector_hashes("property", keys, org="acme")) == set(keys)
    jane = items["records"][0].model_copy(update={"properties": {"plan": "Enterprise", "renewal_month": None}})
    store.write(make_batch(embedder, records=[jane], vectors=False))  # plan's text did not change
    assert set(store.vector_hashes("property", keys, org="acme")) == {property_key("r-jane", "plan")}
    query = embedder.embed_query("seats: 40")
    found = store.search_vectors("property", query, org="acme", limit=50, parents=["r-jane"])
    assert [hit.id for hit in found] == [property_key("r-jane", "plan")]


def test_upserting_a_document_replaces_its_sections_everywhere(store: Store, embedder: Any) -> None:
    items = write_world(store, embedder)
    education = items["documents"][1]
    assert _ids(store.search_text("section", "forklift", org="acme", limit=5)) == ["s-edu-41"]
    replaced = education.model_copy(
        update={"sections": (education.sections[0], Section(id="s-edu-50", heading="NW-EDU-50", text="Course NW-EDU-50 covers first aid."))}
    )
    store.write(make_batch(embedder, documents=[replaced]))
    assert store.get_documents(["d-education"], org="acme") == [replaced]
    assert store.search_text("section", "forklift", org="acme", limit=5) == []
    assert _ids(store.search_text("section", "first aid", org="acme", limit=5)) == ["s-edu-50"]
    query = embedder.embed_query("forklift certification for warehouse staff")
    assert "s-edu-41" not in _ids(store.search_vectors("section", query, org="acme", limit=50))
    assert store.vector_hashes("section", ["s-edu-41"], org="acme") == {}
    assert store.counts(org="acme")["sections"] == 6


# -- reads by id -----------------------------------------------------------------------------------
def test_get_org_and_caller(store: Store, embedder: Any) -> None:
    items = write_world(store, embedder)
    assert store.get_org(org="acme") == Org(id="acme", name="acme corp")
    assert store.get_org(org="nobody") is None
    assert store.get_caller("c-sales", org="acme") == items["callers"][0]
    assert store.get_caller("c-sales", org="acme").roles == ("sales",)  # type: ignore[union-attr]
    assert store.get_caller("c-nobody", org="acme") is None


@pytest.mark.parametrize(
    "method, ids",
    [
        ("get_records", ["r-joe", "r-missing", "r-acme", "r-jane"]),
        ("get_memories", ["m-bob-2", "m-missing", "m-jane-1"]),
        ("get_documents", ["d-system", "d-missing", "d-discounts"]),
    ],
)
def test_reads_by_id_keep_the_order_asked_and_skip_missing(store: Store, embedder: Any, method: str, ids: list[str]) -> None:
    write_world(store, embedder)
    found = getattr(store, method)(ids, org="acme")
    assert _ids(found) == [i for i in ids if "missing" not in i]
    assert getattr(store, method)([], org="acme") == []


def test_documents_come_back_with_sections_in_order_and_visibility_intact(store: Store, embedder: Any) -> None:
    items = write_world(store, embedder)
    discounts, _, refunds, system = store.get_documents(_ids(items["documents"]), org="acme")
    assert _ids(discounts.sections) == ["s-disc-limits", "s-disc-prepay"]
    assert discounts.visible_to_roles == ("sales",) and discounts.tags == ("pricing", "sales")
    assert refunds.visible_to_roles == () and refunds.attached_record == "r-jane"  # nobody but the record's view
    assert items["documents"][1].visible_to_roles is None  # whole org ...
    assert store.get_documents(["d-education"], org="acme")[0].visible_to_roles is None  # ... stays whole org
    assert system.is_system and not discounts.is_system


def test_find_documents_by_type_and_tag(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    assert _ids(store.find_documents(org="acme", doc_types=["policy", "contract"], limit=10)) == ["d-discounts", "d-refunds"]
    assert _ids(store.find_documents(org="acme", tags=["training", "sales"], limit=10)) == ["d-discounts", "d-education"]
    assert _ids(store.find_documents(org="acme", doc_types=["guideline"], tags=["sales"], limit=10)) == []
    assert _ids(store.find_documents(org="acme", limit=2)) == ["d-discounts", "d-education"]
    assert store.find_documents(org="acme", doc_types=["policy"], limit=10)[0].sections[0].id == "s-disc-limits"


# -- records ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind, value, expected",
    [
        ("email", "jane.doe@acme.com", ["r-jane"]),
        ("email", "  JANE.DOE@ACME.COM ", ["r-jane"]),
        ("email", "doe@acme.com", []),
        ("phone", "15550102000", ["r-jane"]),
        ("phone", "+1 555-010-2000", ["r-jane"]),
        ("website", "acme.com", ["r-acme"]),
        ("website", "https://WWW.acme.com/about?x=1", ["r-acme"]),
        ("website", "acme.co.uk", ["r-acme-uk"]),
        ("website", "www.shop.acme.co.uk", ["r-acme-uk"]),
        ("profile_url", "linkedin.com/in/jane-doe", ["r-jane"]),
        ("profile_url", "https://www.linkedin.com/in/jane-doe/?trk=public", ["r-jane"]),
        ("profile_url", "linkedin.com/in/john-doe", []),
        ("email", "not an email", []),
    ],
)
def test_find_records_by_each_identifier_kind(store: Store, embedder: Any, kind: str, value: str, expected: list[str]) -> None:
    write_world(store, embedder)
    assert _ids(store.find_records(kind, value, org="acme")) == expected  # type: ignore[arg-type]


def test_records_by_domain_groups_websites_and_work_emails_but_not_freemail(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    # r-bob's email is at eu.acme.com: its registrable domain is acme.com
    assert _ids(store.records_by_domain("acme.com", org="acme", limit=20)) == ["r-acme", "r-bob", "r-jane"]
    assert _ids(store.records_by_domain("acme.com", org="acme", limit=2)) == ["r-acme", "r-bob"]
    assert _ids(store.records_by_domain("acme.co.uk", org="acme", limit=20)) == ["r-acme-uk"]
    assert store.records_by_domain("gmail.com", org="acme", limit=20) == []


def test_merged_from_follows_merges_transitively(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    assert sorted(store.merged_from("r-jane", org="acme")) == ["r-old", "r-older"]
    assert store.merged_from("r-old", org="acme") == ["r-older"]
    assert store.merged_from("r-bob", org="acme") == []


def test_merged_from_survives_a_merge_cycle(store: Store, embedder: Any) -> None:
    a = _contact("acme", "r-a", merged_into="r-b")
    b = _contact("acme", "r-b", merged_into="r-a")
    store.write(make_batch(embedder, orgs=[Org(id="acme")], records=[a, b]))
    assert store.merged_from("r-a", org="acme") == ["r-b"]


# -- full text -------------------------------------------------------------------------------------
def test_search_text_finds_an_exact_code_as_a_phrase(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    # both courses share 'nw' and 'edu'; only the exact code may match
    assert _ids(store.search_text("section", "What is NW-EDU-40 about?", org="acme", limit=10)) == ["s-edu-40"]
    assert _ids(store.search_text("section", "nw-edu-41", org="acme", limit=10)) == ["s-edu-41"]
    assert store.search_text("section", "NW-EDU-42", org="acme", limit=10) == []


def test_search_text_ranks_hits_best_first_and_names_their_parent(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    hits = store.search_text("section", "discount approval", org="acme", limit=10)
    assert hits[0].id == "s-disc-limits" and hits[0].parent == "d-discounts"
    assert {h.id for h in hits} == {"s-disc-limits", "s-disc-prepay"}
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert len(store.search_text("section", "discount approval", org="acme", limit=1)) == 1


def test_search_text_over_memories_and_parents_restriction(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    hits = store.search_text("memory", "annual renewal prepay", org="acme", limit=10)
    assert {(h.id, h.parent) for h in hits} == {("m-jane-1", "r-jane"), ("m-jane-2", "r-jane"), ("m-bob-2", "r-bob")}
    only_bob = store.search_text("memory", "annual renewal prepay", org="acme", limit=10, parents=["r-bob"])
    assert _ids(only_bob) == ["m-bob-2"]
    assert store.search_text("memory", "annual renewal prepay", org="acme", limit=10, parents=[]) == []
    sections = store.search_text("section", "discount", org="acme", limit=10, parents=["d-education", "d-refunds"])
    assert sections == []


def test_search_text_among_a_records_many_tied_memories_keeps_the_first_ids(store: Store, embedder: Any) -> None:
    """Identical texts tie on score: the hits past the limit are those whose ids sort later, also when the
    tie runs past whatever a store shortlists (here 80 ties for a limit of 7), and among several records."""
    org = "acme"
    ties = [_memory(org, f"m-tie-{n:03d}", "r-jane" if n % 4 else "r-bob", "Renewal quote sent for the forklift fleet.",
                    "2024-04-01T00:00:00+00:00") for n in range(80, 0, -1)]  # fmt: skip
    other = [_memory(org, f"m-x-{n}", "r-jane", f"Forklift fleet note number {n} about the renewal quote and more words.",
                     "2024-04-02T00:00:00+00:00") for n in range(5)]  # fmt: skip
    store.write(make_batch(embedder, orgs=[Org(id=org)], records=[_contact(org, "r-jane"), _contact(org, "r-bob")],
                           memories=ties + other, vectors=False))  # fmt: skip
    for parents, owners in ((["r-jane"], {"r-jane"}), (["r-jane", "r-bob"], {"r-jane", "r-bob"})):
        everything = store.search_text("memory", "renewal quote forklift fleet", org=org, limit=200, parents=parents)
        assert {h.parent for h in everything} == owners
        assert len(everything) == sum(1 for m in ties + other if m.record in owners)
        for limit in (1, 7, 60):
            hits = store.search_text("memory", "renewal quote forklift fleet", org=org, limit=limit, parents=parents)
            assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in everything[:limit]]
        assert [(-h.score, h.id) for h in everything] == sorted((-h.score, h.id) for h in everything)


@pytest.mark.parametrize("query", ["what is the", "", "   ", "?!", "and or not near"])
def test_search_text_with_no_search_terms_returns_nothing(store: Store, embedder: Any, query: str) -> None:
    write_world(store, embedder)
    assert store.search_text("section", query, org="acme", limit=10) == []
    assert store.search_text("memory", query, org="acme", limit=10) == []


def test_search_text_treats_query_syntax_as_plain_words(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    for query in ['"forklift', "forklift*", "forklift OR", "NEAR(forklift)", "text:forklift", "(forklift"]:
        assert _ids(store.search_text("section", query, org="acme", limit=10)) == ["s-edu-41"], query


# -- vectors ---------------------------------------------------------------------------------------
def test_search_vectors_returns_the_most_similar_first_with_cosine_scores(store: Store, embedder: Any) -> None:
    items = write_world(store, embedder)
    query = embedder.embed_query("Who has to approve a large discount?")
    hits = store.search_vectors("section", query, org="acme", limit=10)
    assert hits[0].id == "s-disc-limits" and hits[0].parent == "d-discounts"
    assert len(hits) == 6  # every section, no more
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    texts = {s.id: section_text(d, s) for d in items["documents"] for s in d.sections}
    for hit in hits:
        assert -1.0 <= hit.score <= 1.0
        assert hit.score == pytest.approx(float(_embed(embedder, [texts[hit.id]])[0] @ query), abs=1e-4)


def test_search_vectors_over_memories_and_properties(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    memory = store.search_vectors("memory", embedder.embed_query("invoice schedule"), org="acme", limit=1)
    assert [(h.id, h.parent) for h in memory] == [("m-bob-1", "r-bob")]
    prop = store.search_vectors("property", embedder.embed_query("what month does the contract renew"), org="acme", limit=1)
    assert [(h.id, h.parent) for h in prop] == [(property_key("r-jane", "renewal_month"), "r-jane")]


def test_search_vectors_limit_and_parents(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    query = embedder.embed_query("discount")
    assert len(store.search_vectors("section", query, org="acme", limit=3)) == 3
    assert store.search_vectors("section", query, org="acme", limit=0) == []
    restricted = store.search_vectors("section", query, org="acme", limit=10, parents=["d-education"])
    assert sorted(_ids(restricted)) == ["s-edu-40", "s-edu-41"]
    assert len(store.search_vectors("section", query, org="acme", limit=1, parents=["d-education", "d-refunds"])) == 1
    assert store.search_vectors("section", query, org="acme", limit=10, parents=[]) == []
    assert store.search_vectors("memory", query, org="acme", limit=10, parents=["r-nobody"]) == []


def test_search_vectors_on_an_empty_org(store: Store, embedder: Any) -> None:
    assert store.search_vectors("section", embedder.embed_query("anything"), org="acme", limit=5) == []


@pytest.mark.parametrize("org_row", [True, False], ids=["org-row", "no-org-row"])
def test_a_search_sees_the_write_that_followed_it(store: Store, embedder: Any, org_row: bool) -> None:
    items = write_world(store, embedder)
    query = embedder.embed_query("how do I calibrate the glue dispenser nozzle")
    store.search_vectors("section", query, org="acme", limit=3)  # warm any cache
    new = Document(id="d-nozzle", org="acme", title="Dispenser manual",
                   sections=(Section(id="s-nozzle", heading="Calibrating the nozzle",
                                     text="To calibrate the glue dispenser nozzle, turn the dial until the bead is 2 mm."),))  # fmt: skip
    store.write(make_batch(embedder, documents=[new]))
    assert store.search_vectors("section", query, org="acme", limit=3)[0].id == "s-nozzle"
    if not org_row:  # the same for an org whose org row was never written
        store.write(make_batch(embedder, **{k: [i.model_copy(update={"org": "loose"}) for i in v]
                                            for k, v in items.items() if k in ("records", "documents")}))  # fmt: skip
        assert store.search_vectors("section", query, org="loose", limit=1)[0].id != "s-nozzle"
        store.write(make_batch(embedder, documents=[new.model_copy(update={"org": "loose"})]))
        assert store.search_vectors("section", query, org="loose", limit=1)[0].id == "s-nozzle"


def test_a_batch_of_vectors_alone_is_seen_by_the_next_search(store: Store, embedder: Any) -> None:
    items = write_world(store, embedder)
    education = items["documents"][1]
    forklift = section_text(education, education.sections[1])  # what s-edu-41's vector was made from
    query = embedder.embed_query("forklift certification")
    assert store.search_vectors("section", query, org="acme", limit=1)[0].id == "s-edu-41"  # index now cached
    # give s-edu-40 the very vector of s-edu-41 (a recomputed vector, no item changed)
    [vector] = _embed(embedder, [forklift])
    store.write(WriteBatch(vectors=[VectorWrite("acme", "section", "s-edu-40", "d-education", "h", vector)]))
    top = {hit.id: hit.score for hit in store.search_vectors("section", query, org="acme", limit=2)}
    assert set(top) == {"s-edu-40", "s-edu-41"}
    assert top["s-edu-40"] == pytest.approx(top["s-edu-41"], abs=1e-5)  # the new vector, not the cached one
    assert store.vector_hashes("section", ["s-edu-40"], org="acme") == {"s-edu-40": "h"}


def test_another_handle_on_the_same_store_sees_writes(open_store: Callable[[], Store], embedder: Any) -> None:
    first, second = open_store(), open_store()
    write_world(first, embedder)
    query = embedder.embed_query("how do I calibrate the glue dispenser nozzle")
    assert second.search_vectors("section", query, org="acme", limit=1)[0].id != "s-nozzle"  # second caches now
    new = Document(id="d-nozzle", org="acme", title="Dispenser manual",
                   sections=(Section(id="s-nozzle", heading="Calibrating the nozzle",
                                     text="To calibrate the glue dispenser nozzle, turn the dial until the bead is 2 mm."),))  # fmt: skip
    first.write(make_batch(embedder, documents=[new]))
    assert second.search_vectors("section", query, org="acme", limit=1)[0].id == "s-nozzle"
    assert _ids(second.search_text("section", "nozzle", org="acme", limit=5)) == ["s-nozzle"]
    assert second.get_documents(["d-nozzle"], org="acme") == [new]
    # and back the other way
    second.write(make_batch(embedder, memories=[_memory("acme", "m-nozzle", "r-bob", "Bob broke the dispenser nozzle.", "2024-05-01T00:00:00")]))
    assert first.search_vectors("memory", query, org="acme", limit=1)[0].id == "m-nozzle"
    assert first.recent_memories(["r-bob"], org="acme", limit=1)[0].id == "m-nozzle"


# -- recent memories -------------------------------------------------------------------------------
def test_recent_memories_newest_first_across_records(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    newest = store.recent_memories(["r-jane", "r-bob"], org="acme", limit=10)
    # m-jane-3 (08:00Z) is newer than m-jane-2 (09:00+02:00 = 07:00Z); m-bob-2 ties m-jane-1 and wins by id
    assert _ids(newest) == ["m-jane-3", "m-jane-2", "m-bob-1", "m-bob-2", "m-jane-1"]
    assert _ids(store.recent_memories(["r-jane", "r-bob"], org="acme", limit=2)) == ["m-jane-3", "m-jane-2"]
    assert _ids(store.recent_memories(["r-bob"], org="acme", limit=10)) == ["m-bob-1", "m-bob-2"]
    assert store.recent_memories([], org="acme", limit=10) == []
    assert store.recent_memories(["r-jane"], org="acme", limit=0) == []


def test_recent_memories_keep_the_instant(store: Store, embedder: Any) -> None:
    items = write_world(store, embedder)
    [memory] = store.recent_memories(["r-jane"], org="acme", limit=1)
    assert memory == items["memories"][2]
    assert memory.created_at.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    [shifted] = store.get_memories(["m-jane-2"], org="acme")
    assert shifted.created_at == datetime.fromisoformat("2024-03-05T07:00:00+00:00")


# -- graph -----------------------------------------------------------------------------------------
def _hops(found: list[Any]) -> list[tuple[str, int]]:
    return [(h.edge.id, h.hops) for h in found]


@pytest.mark.parametrize(
    "max_hops, expected",
    [
        (1, [("e2", 1), ("e1", 1), ("e3", 1)]),
        (2, [("e2", 1), ("e1", 1), ("e3", 1), ("e4", 2)]),
        (3, [("e2", 1), ("e1", 1), ("e3", 1), ("e4", 2), ("e5", 3)]),
    ],
)
def test_edges_around_by_hops_then_confidence_then_weight(store: Store, embedder: Any, max_hops: int, expected: list) -> None:
    write_world(store, embedder)
    # e1 and e2 share confidence 0.9: e2 weighs more
    assert _hops(store.edges_around(["r-jane"], org="acme", max_hops=max_hops, limit=50)) == expected


def test_edges_around_limit_keeps_the_first_in_order(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    assert _hops(store.edges_around(["r-jane"], org="acme", max_hops=3, limit=2)) == [("e2", 1), ("e1", 1)]


def test_edges_around_follow_edges_in_both_directions(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    assert sorted(_hops(store.edges_around(["r-acme"], org="acme", max_hops=1, limit=50))) == [("e1", 1), ("e4", 1)]
    # from two seeds, each edge once, with its smallest hop count
    both = store.edges_around(["r-jane", "r-dan"], org="acme", max_hops=1, limit=50)
    assert sorted(_hops(both)) == [("e1", 1), ("e2", 1), ("e3", 1), ("e4", 1), ("e5", 1)]


@pytest.mark.parametrize(
    "flags, extra",
    [
        ({}, set()),
        ({"include_inactive": True}, {("e7", 1), ("e11", 2)}),
        ({"include_stubs": True}, {("e8", 1)}),
        ({"include_inactive": True, "include_stubs": True}, {("e7", 1), ("e11", 2), ("e8", 1)}),
    ],
)
def test_edges_around_inactive_and_stub_edges_only_when_asked(store: Store, embedder: Any, flags: dict, extra: set) -> None:
    write_world(store, embedder)
    found = set(_hops(store.edges_around(["r-jane"], org="acme", max_hops=2, limit=50, **flags)))
    assert found == {("e1", 1), ("e2", 1), ("e3", 1), ("e4", 2)} | extra
    assert not {"e9", "e10"} & {edge_id for edge_id, _ in found}  # pending deletion: never


def test_edges_around_a_record_pending_deletion_is_empty(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    assert store.edges_around(["r-gone"], org="acme", max_hops=3, limit=50, include_inactive=True, include_stubs=True) == []
    assert store.edges_around(["r-hal"], org="acme", max_hops=3, limit=50) == []


def _walk(edges: list[Edge], live: set[str], seeds: list[str], max_hops: int, limit: int) -> list[tuple[str, int]]:
    """The reference walk: every hop in full (no early stop), then ordered and cut."""
    walkable = [e for e in edges if e.active and not e.dst_is_stub and e.src in live and e.dst in live]
    hops: dict[str, int] = {}
    visited, frontier = set(seeds), set(seeds)
    for hop in range(1, max_hops + 1):
        reached = [e for e in walkable if e.id not in hops and (e.src in frontier or e.dst in frontier)]
        hops.update((e.id, hop) for e in reached)
        frontier = {end for e in reached for end in (e.src, e.dst)} - visited
        visited |= frontier
    by_id = {e.id: e for e in walkable}
    ordered = sorted(hops, key=lambda i: (hops[i], -by_id[i].confidence, -by_id[i].weight, i))
    return [(i, hops[i]) for i in ordered[:limit]]


def test_edges_around_matches_a_full_walk_on_a_graph_with_hubs(store: Store, embedder: Any) -> None:
    """A walk that stops once ``limit`` edges are certain gives what walking every hop would: graphs with
    hub records (a company with hundreds of contacts), ties in confidence and weight, dead and inactive edges."""
    rng = random.Random(4)
    records = [_contact("acme", f"r{i:03d}", pending_deletion=(i % 17 == 5)) for i in range(120)]
    hubs = ["r000", "r001", "r002"]
    edges = []
    for n in range(600):
        src = f"r{rng.randrange(120):03d}"
        dst = rng.choice(hubs) if n % 3 else f"r{rng.randrange(120):03d}"
        edges.append(Edge(id=f"x{n:03d}", org="acme", src=src, dst=dst, type="knows", active=rng.random() > 0.1,
                          confidence=rng.choice([0.5, 0.7, 0.9]), weight=rng.choice([1.0, 2.0])))  # fmt: skip
    store.write(make_batch(embedder, orgs=[Org(id="acme")], records=records, edges=edges, vectors=False))
    live = {r.id for r in records if not r.pending_deletion}
    for seeds in (["r003"], ["r000"], ["r010", "r011"], ["r005"]):
        for max_hops in (1, 2, 3):
            for limit in (1, 7, 50, 1000):
                found = _hops(store.edges_around(seeds, org="acme", max_hops=max_hops, limit=limit))
                assert found == _walk(edges, live, seeds, max_hops, limit), (seeds, max_hops, limit)


def test_edges_around_returns_whole_edges(store: Store, embedder: Any) -> None:
    items = write_world(store, embedder)
    [hop] = [h for h in store.edges_around(["r-jane"], org="acme", max_hops=1, limit=50) if h.edge.id == "e1"]
    assert hop.edge == items["edges"][0]


# -- counts ----------------------------------------------------------------------------------------
def test_counts(store: Store, embedder: Any) -> None:
    write_world(store, embedder)
    counts = store.counts(org="acme")
    # vectors: 5 non-empty properties + 6 memories + 6 sections
    expected = {"callers": 2, "records": 16, "memories": 6, "documents": 4, "sections": 6, "edges": 11, "vectors": 17}
    assert {k: counts[k] for k in expected} == expected
    assert set(store.counts(org="nobody").values()) == {0}


# -- org isolation ---------------------------------------------------------------------------------
def _everything(store: Store, embedder: Any, org: str) -> dict[str, Any]:
    """Every read of the protocol, for ``org``, over the ids and words both orgs use."""
    q = {t: embedder.embed_query(t) for t in ("discount approval", "zebra crossing", "renewal", "plan")}
    records = ["r-jane", "r-bob", "r-zed", "r-acme", "r-old"]
    return {
        "org": store.get_org(org=org),
        "caller": [store.get_caller(c, org=org) for c in ("c-sales", "c-admin", "c-zed")],
        "records": store.get_records(records, org=org),
        "memories": store.get_memories(["m-jane-1", "m-bob-1", "m-zebra"], org=org),
        "documents": store.get_documents(["d-discounts", "d-education", "d-zebra"], org=org),
        "find_documents": store.find_documents(org=org, doc_types=["policy", "guideline"], limit=50),
        "find": [store.find_records(k, v, org=org) for k, v in (("email", "jane.doe@acme.com"), ("email", "zed@acme.com"),
                                                                 ("website", "acme.com"), ("phone", "15550102000"))],
        "domain": store.records_by_domain("acme.com", org=org, limit=50),
        "merged": sorted(store.merged_from("r-jane", org=org)),
        # full-text scores may use corpus-wide statistics (BM25 idf): compare what was found, not scores
        "text": [sorted((h.id, h.parent) for h in store.search_text(k, w, org=org, limit=50))  # type: ignore[arg-type]
                 for k in ("section", "memory") for w in ("discount", "zebra", "renewal annual", "NW-EDU-40")],
        "vectors": [store.search_vectors(k, v, org=org, limit=50) for k in ("section", "memory", "property")  # type: ignore[arg-type]
                    for v in q.values()],
        "vectors_of": [store.search_vectors(k, q["renewal"], org=org, limit=50, parents=p)  # type: ignore[arg-type]
                       for k, p in (("memory", ["r-jane"]), ("section", ["d-discounts"]), ("property", ["r-jane"]))],
        "text_of": [sorted((h.id, h.parent) for h in store.search_text(k, w, org=org, limit=50, parents=p))  # type: ignore[arg-type]
                    for k, w, p in (("memory", "zebra renewal", ["r-jane"]), ("section", "zebra discount", ["d-zebra"]))],
        "recent": store.recent_memories(records, org=org, limit=50),
        "edges": store.edges_around(records, org=org, max_hops=3, limit=50, include_inactive=True, include_stubs=True),
        "hashes": [store.content_hashes(k, ["acme", "beta", "c-sales", "r-jane", "m-jane-1", "d-discounts", "e1"], org=org)  # type: ignore[arg-type]
                   for k in ("org", "caller", "record", "memory", "document", "edge")],
        "vector_hashes": [store.vector_hashes("property", ["r-jane/plan"], org=org),
                          store.vector_hashes("memory", ["m-jane-1"], org=org)],
        "counts": store.counts(org=org),
    }  # fmt: skip


def _beta() -> dict[str, list[Any]]:
    """A second org with the same ids, emails and titles as ``world('acme')``, some values changed, and more."""
    items = world("beta")
    jane = items["records"][0]
    items["records"][0] = jane.model_copy(update={"properties": {"plan": "Starter", "renewal_month": "June"}})
    items["records"] += [_contact("beta", "r-zed", identifiers={"email": "zed@acme.com"}, merged_into="r-jane")]
    items["memories"][0] = items["memories"][0].model_copy(update={"text": "Jane asked for a zebra crossing at the dock."})
    items["memories"] += [_memory("beta", "m-zebra", "r-jane", "Zebra crossing permit for the loading dock.", "2030-01-01T00:00:00")]
    items["documents"] += [Document(id="d-zebra", org="beta", title="Discount policy", doc_type="policy",
                                    sections=(Section(id="s-zebra", heading="Zebra", text="Zebra discount renewal NW-EDU-40."),))]  # fmt: skip
    items["callers"] += [Caller(id="c-zed", org="beta")]
    items["edges"] += [Edge(id="e-zed", org="beta", src="r-jane", dst="r-zed", type="knows")]
    return items


def test_org_isolation_nothing_of_another_org_is_read(store: Store, embedder: Any) -> None:
    write_world(store, embedder, "acme")
    alone = _everything(store, embedder, "acme")
    store.write(make_batch(embedder, **_beta()))
    assert _everything(store, embedder, "acme") == alone  # writing beta changed nothing acme reads
    # and the reads really cover the other org's data (so the comparison above means something)
    beta = _everything(store, embedder, "beta")
    assert beta != alone
    assert _ids(beta["records"]) == ["r-jane", "r-bob", "r-zed", "r-acme", "r-old"]
    assert beta["records"][0].properties["plan"] == "Starter" and alone["records"][0].properties["plan"] == "Enterprise"
    assert _ids(alone["records"]) == ["r-jane", "r-bob", "r-acme", "r-old"]
    assert alone["find"][1] == [] and _ids(beta["find"][1]) == ["r-zed"]
    assert all(r.org == "acme" for group in alone["find"] for r in group)
    assert alone["text"][1] == [] and alone["text"][5] == []  # 'zebra' in sections and memories
    assert ("s-zebra", "d-zebra") in beta["text"][0]
    assert "m-zebra" not in _ids(alone["recent"]) and _ids(beta["recent"])[0] == "m-zebra"
    assert "e-zed" not in {h.edge.id for h in alone["edges"]}
    assert alone["merged"] == ["r-old", "r-older"] and beta["merged"] == ["r-old", "r-older", "r-zed"]
    for group in alone["vectors"]:
        assert len(_ids(group)) == len(set(_ids(group)))  # the twin ids of beta never come back too
    # vector reads of each org see that org's own vectors, whichever org was searched last
    zebra = embedder.embed_query("zebra crossing permit")
    for _ in range(2):
        assert store.search_vectors("memory", zebra, org="beta", limit=1)[0].id == "m-zebra"
        assert "m-zebra" not in _ids(store.search_vectors("memory", zebra, org="acme", limit=50))
        assert "s-zebra" in _ids(store.search_vectors("section", zebra, org="beta", limit=50))
        assert "s-zebra" not in _ids(store.search_vectors("section", zebra, org="acme", limit=50))
    assert alone["counts"]["memories"] == 6 and beta["counts"]["memories"] == 7


# -- org required ----------------------------------------------------------------------------------
_VECTOR = np.zeros(384, dtype=np.float32)
READS: dict[str, Callable[[Store, Any], Any]] = {
    "content_hashes": lambda s, org: s.content_hashes("record", ["r-jane"], org=org),
    "vector_hashes": lambda s, org: s.vector_hashes("memory", ["m-jane-1"], org=org),
    "get_org": lambda s, org: s.get_org(org=org),
    "get_caller": lambda s, org: s.get_caller("c-sales", org=org),
    "get_records": lambda s, org: s.get_records(["r-jane"], org=org),
    "get_memories": lambda s, org: s.get_memories(["m-jane-1"], org=org),
    "get_documents": lambda s, org: s.get_documents(["d-discounts"], org=org),
    "find_documents": lambda s, org: s.find_documents(org=org, limit=5),
    "find_records": lambda s, org: s.find_records("email", "jane.doe@acme.com", org=org),
    "records_by_domain": lambda s, org: s.records_by_domain("acme.com", org=org, limit=5),
    "merged_from": lambda s, org: s.merged_from("r-jane", org=org),
    "search_text": lambda s, org: s.search_text("section", "discount", org=org, limit=5),
    "search_vectors": lambda s, org: s.search_vectors("section", _VECTOR, org=org, limit=5),
    "recent_memories": lambda s, org: s.recent_memories(["r-jane"], org=org, limit=5),
    "edges_around": lambda s, org: s.edges_around(["r-jane"], org=org, max_hops=1, limit=5),
    "counts": lambda s, org: s.counts(org=org),
    "get_settings": lambda s, org: s.get_settings(org=org) or {},
    "put_settings": lambda s, org: s.put_settings({"thresholds": {"memory_semantic": 0.4}}, org=org) or {},
    "put_result": lambda s, org: s.put_result("call-1", {"answer": "yes"}, org=org) or {},
    "get_result": lambda s, org: s.get_result("call-1", org=org) or {},
}


def test_org_settings_round_trip_per_org(store: Store, embedder: Any) -> None:
    write_world(store, embedder, "acme")
    assert store.get_settings(org="acme") is None
    store.put_settings({"thresholds": {"memory_semantic": 0.35}}, org="acme")
    store.put_settings({"thresholds": {"memory_semantic": 0.6}}, org="acme")  # replaces
    assert store.get_settings(org="acme") == {"thresholds": {"memory_semantic": 0.6}}
    assert store.get_settings(org="beta") is None


def test_results_round_trip_per_org(store: Store, embedder: Any) -> None:
    write_world(store, embedder, "acme")
    assert store.get_result("call-1", org="acme") is None
    store.put_result("call-1", {"synthesis": {"pending": True}}, org="acme")
    store.put_result("call-1", {"synthesis": {"answer": "Yes [D1]", "confidence": 0.8}}, org="acme")  # replaces
    assert store.get_result("call-1", org="acme") == {"synthesis": {"answer": "Yes [D1]", "confidence": 0.8}}
    assert store.get_result("call-1", org="beta") is None


def test_every_org_scoped_method_of_the_protocol_is_checked() -> None:
    scoped = {
        name
        for name, member in inspect.getmembers(Store, inspect.isfunction)
        if "org" in inspect.signature(member).parameters
    }
    assert scoped == set(READS)


@pytest.mark.parametrize("org", ["", None], ids=["empty", "none"])
@pytest.mark.parametrize("method", sorted(READS))
def test_every_read_refuses_a_missing_org(store: Store, embedder: Any, method: str, org: str | None) -> None:
    write_world(store, embedder)
    assert READS[method](store, "acme") is not None  # the call itself is well formed
    with pytest.raises(dossier.OrgRequired) as caught:
        READS[method](store, org)
    assert method in str(caught.value)
