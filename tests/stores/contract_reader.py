"""The :class:`~dossier.stores.base.StoreReader` part of the Store contract: reads by id keep the order asked,
records are found by identifier, domain and merge, and a record's own memories and edges come back in order."""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any, Callable

import pytest

from dossier.bundle import Document, Edge, Org, Section
from dossier.stores.base import Store, StoreReader
from tests.stores.contract import _contact, _ids, make_batch, org_scoped, refuses_a_missing_org, write_world

# -- graph -----------------------------------------------------------------------------------------
def _hops(found: list[Any]) -> list[tuple[str, int]]:
    return [(h.edge.id, h.hops) for h in found]


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

#: every org-scoped method of StoreReader, called well formed
READER_SCOPED: dict[str, Callable[[Store, Any], Any]] = {
    "get_org": lambda s, org: s.get_org(org=org),
    "get_caller": lambda s, org: s.get_caller("c-sales", org=org),
    "get_records": lambda s, org: s.get_records(["r-jane"], org=org),
    "get_memories": lambda s, org: s.get_memories(["m-jane-1"], org=org),
    "get_documents": lambda s, org: s.get_documents(["d-discounts"], org=org),
    "find_documents": lambda s, org: s.find_documents(org=org, limit=5),
    "restricted_documents": lambda s, org: s.restricted_documents(org=org),
    "document_ids": lambda s, org: s.document_ids(org=org),
    "find_records": lambda s, org: s.find_records("email", "jane.doe@acme.com", org=org),
    "records_by_domain": lambda s, org: s.records_by_domain("acme.com", org=org, limit=5),
    "merged_from": lambda s, org: s.merged_from("r-jane", org=org),
    "recent_memories": lambda s, org: s.recent_memories(["r-jane"], org=org, limit=5),
    "edges_around": lambda s, org: s.edges_around(["r-jane"], org=org, max_hops=1, limit=5),
    "counts": lambda s, org: s.counts(org=org),
    "get_settings": lambda s, org: s.get_settings(org=org) or {},
    "get_result": lambda s, org: s.get_result("call-1", org=org) or {},
}

class ReaderContract:
    """What every backend's reads by id, identifier and relation do."""


    # -- reads by id -----------------------------------------------------------------------------------
    def test_get_org_and_caller(self, store: Store, embedder: Any) -> None:
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
    def test_reads_by_id_keep_the_order_asked_and_skip_missing(self, store: Store, embedder: Any, method: str, ids: list[str]) -> None:
        write_world(store, embedder)
        found = getattr(store, method)(ids, org="acme")
        assert _ids(found) == [i for i in ids if "missing" not in i]
        assert getattr(store, method)([], org="acme") == []

    def test_documents_come_back_with_sections_in_order_and_visibility_intact(self, store: Store, embedder: Any) -> None:
        items = write_world(store, embedder)
        discounts, _, refunds, system = store.get_documents(_ids(items["documents"]), org="acme")
        assert _ids(discounts.sections) == ["s-disc-limits", "s-disc-prepay"]
        assert discounts.visible_to_roles == ("sales",) and discounts.tags == ("pricing", "sales")
        assert refunds.visible_to_roles == ("legal",) and refunds.attached_record == "r-jane"
        assert items["documents"][1].visible_to_roles is None  # whole org ...
        assert store.get_documents(["d-education"], org="acme")[0].visible_to_roles is None  # ... stays whole org
        assert system.is_system and not discounts.is_system

    def test_find_documents_by_type_and_tag(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        assert _ids(store.find_documents(org="acme", doc_types=["policy", "contract"], limit=10)) == ["d-discounts", "d-refunds"]
        assert _ids(store.find_documents(org="acme", tags=["training", "sales"], limit=10)) == ["d-discounts", "d-education"]
        assert _ids(store.find_documents(org="acme", doc_types=["guideline"], tags=["sales"], limit=10)) == []
        assert _ids(store.find_documents(org="acme", limit=2)) == ["d-discounts", "d-education"]
        assert store.find_documents(org="acme", doc_types=["policy"], limit=10)[0].sections[0].id == "s-disc-limits"

    def test_restricted_documents_are_those_not_every_caller_may_see(self, store: Store, embedder: Any) -> None:
        """Roles named (an empty list too), attached to a record, or system; a document of the whole org is not
        among them, nor another org's."""
        write_world(store, embedder)
        store.write(make_batch(embedder, documents=[Document(
            id="d-zebra", org="beta", title="Zebra", visible_to_roles=("sales",),
            sections=(Section(id="s-zebra", heading="Zebra", text="Zebra rules."),))]))  # fmt: skip
        found = store.restricted_documents(org="acme")
        assert [(d.id, d.org, d.visible_to_roles, d.attached_record, d.is_system) for d in found] == [
            ("d-discounts", "acme", ("sales",), None, False),
            ("d-refunds", "acme", ("legal",), "r-jane", False),
            ("d-system", "acme", None, None, True),
        ]
        assert [d.id for d in store.restricted_documents(org="beta")] == ["d-zebra"]
        assert store.restricted_documents(org="nobody") == []
        among = store.restricted_documents(org="acme", ids=["d-system", "d-education", "d-missing", "d-zebra"])
        assert [d.id for d in among] == ["d-system"] and store.restricted_documents(org="acme", ids=[]) == []
        assert store.document_ids(org="acme") == ["d-discounts", "d-education", "d-refunds", "d-system"]
        assert store.document_ids(org="beta") == ["d-zebra"] and store.document_ids(org="nobody") == []
        assert store.document_ids(org="acme", doc_types=["policy", "contract"]) == ["d-discounts", "d-refunds"]
        assert store.document_ids(org="acme", tags=["training", "sales"], limit=1) == ["d-discounts"]

    @pytest.mark.parametrize("roles", [(), ("sales",), ("support",), ("sales", "admin")])
    @pytest.mark.parametrize("record_ids", [(), ("r-jane",), ("r-joe", "r-jane")])
    def test_document_ids_for_a_caller_are_those_the_rule_lets_it_see(self, store: Store, embedder: Any,
                                                                      roles: tuple, record_ids: tuple) -> None:  # fmt: skip
        """The rule as a query lists exactly what :func:`verdict` lets a caller see, filtered or not."""
        from dossier.pipeline.visibility import verdict

        items = write_world(store, embedder)
        allowed = sorted(d.id for d in items["documents"] if d.org == "acme"
                         and verdict(d, org="acme", roles=roles, record_ids=record_ids) is None)  # fmt: skip
        assert store.document_ids(org="acme", roles=roles, record_ids=record_ids) == allowed
        policies = store.document_ids(org="acme", doc_types=["policy"], roles=roles, record_ids=record_ids)
        assert policies == [i for i in allowed if i == "d-discounts"]

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
    def test_find_records_by_each_identifier_kind(self, store: Store, embedder: Any, kind: str, value: str, expected: list[str]) -> None:
        write_world(store, embedder)
        assert _ids(store.find_records(kind, value, org="acme")) == expected  # type: ignore[arg-type]

    def test_records_by_domain_groups_websites_and_work_emails_but_not_freemail(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        # r-bob's email is at eu.acme.com: its registrable domain is acme.com
        assert _ids(store.records_by_domain("acme.com", org="acme", limit=20)) == ["r-acme", "r-bob", "r-jane"]
        assert _ids(store.records_by_domain("acme.com", org="acme", limit=2)) == ["r-acme", "r-bob"]
        assert _ids(store.records_by_domain("acme.co.uk", org="acme", limit=20)) == ["r-acme-uk"]
        assert store.records_by_domain("gmail.com", org="acme", limit=20) == []

    def test_merged_from_follows_merges_transitively(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        assert sorted(store.merged_from("r-jane", org="acme")) == ["r-old", "r-older"]
        assert store.merged_from("r-old", org="acme") == ["r-older"]
        assert store.merged_from("r-bob", org="acme") == []

    def test_merged_from_survives_a_merge_cycle(self, store: Store, embedder: Any) -> None:
        """A write that would close a cycle is refused (the writer contract); a file written before that check
        (two loads merging the other way at once) may hold one all the same, and reads must get through it."""
        a = _contact("acme", "r-a", merged_into="r-b")
        b = _contact("acme", "r-b")
        store.write(make_batch(embedder, orgs=[Org(id="acme")], records=[a, b]))
        _force_merge(store, "acme", "r-b", "r-a")  # as such a file holds it
        assert store.merged_from("r-a", org="acme") == ["r-b"]

    # -- recent memories -------------------------------------------------------------------------------
    def test_recent_memories_newest_first_across_records(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        newest = store.recent_memories(["r-jane", "r-bob"], org="acme", limit=10)
        # m-jane-3 (08:00Z) is newer than m-jane-2 (09:00+02:00 = 07:00Z); m-bob-2 ties m-jane-1 and wins by id
        assert _ids(newest) == ["m-jane-3", "m-jane-2", "m-bob-1", "m-bob-2", "m-jane-1"]
        assert _ids(store.recent_memories(["r-jane", "r-bob"], org="acme", limit=2)) == ["m-jane-3", "m-jane-2"]
        assert _ids(store.recent_memories(["r-bob"], org="acme", limit=10)) == ["m-bob-1", "m-bob-2"]
        assert store.recent_memories([], org="acme", limit=10) == []
        assert store.recent_memories(["r-jane"], org="acme", limit=0) == []

    def test_recent_memories_keep_the_instant(self, store: Store, embedder: Any) -> None:
        items = write_world(store, embedder)
        [memory] = store.recent_memories(["r-jane"], org="acme", limit=1)
        assert memory == items["memories"][2]
        assert memory.created_at.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
        [shifted] = store.get_memories(["m-jane-2"], org="acme")
        assert shifted.created_at == datetime.fromisoformat("2024-03-05T07:00:00+00:00")

    @pytest.mark.parametrize(
        "max_hops, expected",
        [
            (1, [("e2", 1), ("e1", 1), ("e3", 1)]),
            (2, [("e2", 1), ("e1", 1), ("e3", 1), ("e4", 2)]),
            (3, [("e2", 1), ("e1", 1), ("e3", 1), ("e4", 2), ("e5", 3)]),
        ],
    )
    def test_edges_around_by_hops_then_confidence_then_weight(self, store: Store, embedder: Any, max_hops: int, expected: list) -> None:
        write_world(store, embedder)
        # e1 and e2 share confidence 0.9: e2 weighs more
        assert _hops(store.edges_around(["r-jane"], org="acme", max_hops=max_hops, limit=50)) == expected

    def test_edges_around_limit_keeps_the_first_in_order(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        assert _hops(store.edges_around(["r-jane"], org="acme", max_hops=3, limit=2)) == [("e2", 1), ("e1", 1)]

    def test_edges_around_follow_edges_in_both_directions(self, store: Store, embedder: Any) -> None:
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
    def test_edges_around_inactive_and_stub_edges_only_when_asked(self, store: Store, embedder: Any, flags: dict, extra: set) -> None:
        write_world(store, embedder)
        found = set(_hops(store.edges_around(["r-jane"], org="acme", max_hops=2, limit=50, **flags)))
        assert found == {("e1", 1), ("e2", 1), ("e3", 1), ("e4", 2)} | extra
        assert not {"e9", "e10"} & {edge_id for edge_id, _ in found}  # pending deletion: never

    def test_edges_around_a_record_pending_deletion_is_empty(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        assert store.edges_around(["r-gone"], org="acme", max_hops=3, limit=50, include_inactive=True, include_stubs=True) == []
        assert store.edges_around(["r-hal"], org="acme", max_hops=3, limit=50) == []

    def test_edges_around_matches_a_full_walk_on_a_graph_with_hubs(self, store: Store, embedder: Any) -> None:
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

    def test_edges_around_reads_past_a_cut_full_of_dead_ends(self, store: Store, embedder: Any) -> None:
        """A hub whose best edges lead to records pending deletion, or to an id that is a record only in
        another org: a read cut to the best few finds none walkable, so the hop reads more, and returns the
        best live edges of this org."""
        records = [_contact("acme", "hub"), *[_contact("acme", f"gone{i}", pending_deletion=True) for i in range(12)],
                   *[_contact("acme", f"live{i}") for i in range(5)], _contact("globex", "elsewhere")]  # fmt: skip
        edges = [Edge(id=f"d{i:02d}", org="acme", src="hub", dst=f"gone{i}", type="knows", confidence=0.9) for i in range(12)]
        edges.append(Edge(id="x-org", org="acme", src="hub", dst="elsewhere", type="knows", confidence=0.9))
        edges += [Edge(id=f"l{i}", org="acme", src=f"live{i}", dst="hub", type="knows", confidence=0.5, weight=float(i))
                  for i in range(5)]  # fmt: skip
        store.write(make_batch(embedder, orgs=[Org(id="acme"), Org(id="globex")], records=records, edges=edges, vectors=False))
        assert _hops(store.edges_around(["hub"], org="acme", max_hops=1, limit=3)) == [("l4", 1), ("l3", 1), ("l2", 1)]
        assert _hops(store.edges_around(["hub"], org="acme", max_hops=2, limit=50)) == [(f"l{i}", 1) for i in range(4, -1, -1)]

    def test_edges_around_returns_whole_edges(self, store: Store, embedder: Any) -> None:
        items = write_world(store, embedder)
        [hop] = [h for h in store.edges_around(["r-jane"], org="acme", max_hops=1, limit=50) if h.edge.id == "e1"]
        assert hop.edge == items["edges"][0]

    # -- counts ----------------------------------------------------------------------------------------
    def test_counts(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        counts = store.counts(org="acme")
        # vectors: 5 non-empty properties + 6 memories + 6 sections
        expected = {"callers": 2, "records": 16, "memories": 6, "documents": 4, "sections": 6, "edges": 11, "vectors": 17}
        assert {k: counts[k] for k in expected} == expected
        assert set(store.counts(org="nobody").values()) == {0}

    # -- org required ------------------------------------------------------------------------------
    def test_it_is_a_reader(self, store: Store) -> None:
        assert isinstance(store, StoreReader)

    def test_every_org_scoped_method_is_checked(self) -> None:
        assert org_scoped(StoreReader) == set(READER_SCOPED)

    @pytest.mark.parametrize("org", ["", None], ids=["empty", "none"])
    @pytest.mark.parametrize("method", sorted(READER_SCOPED))
    def test_every_org_scoped_method_refuses_a_missing_org(self, store: Store, embedder: Any, method: str, org: str | None) -> None:
        refuses_a_missing_org(store, embedder, READER_SCOPED[method], method, org)


def _force_merge(store: Store, org: str, record: str, into: str) -> None:
    """Set a stored record's ``merged_into`` behind the store's writes (which refuse a cycle)."""
    from dossier.stores.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        with store._transaction() as db:
            db.execute("UPDATE records SET merged_into = ? WHERE org = ? AND id = ?", (into, org, record))
    else:
        store._query(org, "UPDATE records SET merged_into = %b WHERE org = %b AND id = %b RETURNING id", [into, org, record])  # type: ignore[attr-defined]
