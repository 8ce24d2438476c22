"""The Store contract: what every backend must do, as test classes over the ``store`` fixture, one per part of
the protocol (:mod:`dossier.stores.base`), and this module's :class:`StoreContract` for what holds across them:

* ``contract_reader.py``, :class:`ReaderContract`: :class:`~dossier.stores.base.StoreReader`;
* ``contract_searcher.py``, :class:`SearcherContract`: :class:`~dossier.stores.base.StoreSearcher`;
* ``contract_writer.py``, :class:`WriterContract`: :class:`~dossier.stores.base.StoreWriter`;
* :class:`StoreContract`: one org never reads another's data, and the parts make up the whole ``Store``.

``tests/stores/test_contract.py`` runs each class; a new backend passes them by adding one branch to the
store fixture in ``tests/conftest.py``. Data is written straight through ``Store.write`` (not the loader),
with real content hashes and real MiniLM vectors; the data and the helpers the parts share live here.
"""

from __future__ import annotations

import inspect
from datetime import datetime
from typing import Any, Callable, Iterable

import numpy as np
import pytest

import dossier
from dossier.bundle import Caller, Document, Edge, Memory, Org, Record, Section
from dossier.loading import content_hash, property_text, section_text, text_hash
from dossier.stores.base import Store, StoreReader, StoreSearcher, StoreWriter, VectorWrite, WriteBatch, property_key

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
            id="d-refunds", org=org, title="Refund terms for Jane", doc_type="contract", visible_to_roles=("legal",),
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


# -- org required ----------------------------------------------------------------------------------
def org_scoped(protocol: type) -> set[str]:
    """The methods of ``protocol`` that take an ``org``."""
    return {name for name, member in inspect.getmembers(protocol, inspect.isfunction)
            if "org" in inspect.signature(member).parameters}  # fmt: skip


def refuses_a_missing_org(store: Store, embedder: Any, call: Callable[[Store, Any], Any], method: str, org: str | None) -> None:
    """``call`` (one org-scoped method, well formed) answers for ``acme`` and refuses ``org``, naming the method."""
    write_world(store, embedder)
    assert call(store, "acme") is not None  # the call itself is well formed
    with pytest.raises(dossier.OrgRequired) as caught:
        call(store, org)
    assert method in str(caught.value)


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
        "stored_vectors": {k: v.tolist() for k, v in store.stored_vectors("memory", ["m-jane-1", "m-zebra"], org=org).items()},
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


class StoreContract:
    """What holds across the parts of every backend."""


    def test_org_isolation_nothing_of_another_org_is_read(self, store: Store, embedder: Any) -> None:
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

    # -- the parts make the whole ------------------------------------------------------------------
    def test_the_parts_make_up_the_whole_store(self, store: Store) -> None:
        from tests.stores.contract_reader import READER_SCOPED
        from tests.stores.contract_searcher import SEARCHER_SCOPED
        from tests.stores.contract_writer import WRITER_SCOPED

        assert isinstance(store, Store)
        parts = (StoreReader, StoreSearcher, StoreWriter)
        assert all(not (org_scoped(a) & org_scoped(b)) for a in parts for b in parts if a is not b)  # no method twice
        assert org_scoped(Store) == set(READER_SCOPED) | set(SEARCHER_SCOPED) | set(WRITER_SCOPED)
