"""The :class:`~dossier.stores.base.StoreSearcher` part of the Store contract: full-text and vector search rank
best first, name each hit's parent, keep to the parents asked, and see the write that came before them."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from dossier.bundle import Document, Org, Section
from dossier.loading import section_text
from dossier.stores.base import Store, StoreSearcher, VectorWrite, Viewer, WriteBatch, property_key
from tests.stores.contract import _contact, _embed, _ids, _memory, make_batch, org_scoped, refuses_a_missing_org, write_world
_VECTOR = np.zeros(384, dtype=np.float32)
#: every org-scoped method of StoreSearcher, called well formed
SEARCHER_SCOPED: dict[str, Callable[[Store, Any], Any]] = {
    "search_text": lambda s, org: s.search_text("section", "discount", org=org, limit=5),
    "text_scope_rows": lambda s, org: s.text_scope_rows("memory", org=org, most=10),
    "search_vectors": lambda s, org: s.search_vectors("section", _VECTOR, org=org, limit=5),
    "search_vectors_many": lambda s, org: s.search_vectors_many("section", [_VECTOR, _VECTOR], org=org, limit=5),
    "stored_vectors": lambda s, org: s.stored_vectors("memory", ["m-jane-1"], org=org),
}

class SearcherContract:
    """What every backend's searches do."""


    def test_stored_vectors_are_the_vectors_written_of_that_kind_and_org_only(self, store: Store, embedder: Any) -> None:
        items = write_world(store, embedder)
        memory, other = items["memories"][0], items["memories"][3]
        got = store.stored_vectors("memory", [memory.id, other.id, memory.id, "no-such-id"], org="acme")
        assert sorted(got) == sorted({memory.id, other.id})
        for m in (memory, other):  # the very vector the model made of the text, bit for bit
            assert got[m.id].dtype == np.float32 and np.array_equal(got[m.id], _embed(embedder, [m.text])[0])
        assert store.stored_vectors("section", [memory.id], org="acme") == {}  # a key of another kind
        assert store.stored_vectors("memory", [], org="acme") == {}
        store.write(WriteBatch(orgs=[Org(id="beta")]))
        assert store.stored_vectors("memory", [memory.id], org="beta") == {}  # the same id in another org

    # -- full text -------------------------------------------------------------------------------------
    def test_search_text_finds_an_exact_code_as_a_phrase(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        # both courses share 'nw' and 'edu'; only the exact code may match
        assert _ids(store.search_text("section", "What is NW-EDU-40 about?", org="acme", limit=10)) == ["s-edu-40"]
        assert _ids(store.search_text("section", "nw-edu-41", org="acme", limit=10)) == ["s-edu-41"]
        assert store.search_text("section", "NW-EDU-42", org="acme", limit=10) == []

    def test_search_text_ranks_hits_best_first_and_names_their_parent(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        hits = store.search_text("section", "discount approval", org="acme", limit=10)
        assert hits[0].id == "s-disc-limits" and hits[0].parent == "d-discounts"
        assert {h.id for h in hits} == {"s-disc-limits", "s-disc-prepay"}
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert len(store.search_text("section", "discount approval", org="acme", limit=1)) == 1

    def test_another_orgs_rows_never_move_this_orgs_full_text_hits_or_scores(self, store: Store, embedder: Any) -> None:
        """BM25 weighs a term by how many rows hold it: counted over the whole table, another org's rows
        would move this org's scores and order, and the order would tell something of the other's texts."""
        write_world(store, embedder)
        searches = [("section", "discount approval prepay", None), ("section", "refund education", None),
                    ("memory", "annual renewal prepay", None), ("memory", "renewal forklift", ["r-jane"]),
                    ("memory", "annual renewal prepay", ["r-jane", "r-bob"])]  # fmt: skip

        def answers() -> list[list[tuple[str, str, float]]]:
            return [[(h.id, h.parent, round(h.score, 9)) for h in store.search_text(kind, query, org="acme", limit=10, parents=parents)]  # type: ignore[arg-type]
                    for kind, query, parents in searches]  # fmt: skip

        before = answers()
        assert all(before[:3]), before
        # another org, many rows holding some of the same words (and not others), longer than acme's
        other = "globex"
        filler = "discount approval renewal annual " * 6
        documents = [Document(id=f"g-d{n}", org=other, title=f"Globex {n}", sections=(
            Section(id=f"g-s{n}-{k}", heading="Discount approval", text=f"{filler} section {k}"),
            Section(id=f"g-t{n}-{k}", heading="Renewal", text="annual renewal prepay terms " * 3))) for n in range(20) for k in range(1)]
        memories = [_memory(other, f"g-m{n}", "g-r", f"{filler} prepay note {n}", "2024-05-01T00:00:00+00:00") for n in range(60)]
        store.write(make_batch(embedder, orgs=[Org(id=other)], records=[_contact(other, "g-r")], memories=memories, documents=documents))
        assert store.search_text("memory", "annual renewal prepay", org=other, limit=5)  # the other org's rows are there
        assert answers() == before

    def test_what_a_viewer_may_not_see_takes_no_place_in_an_exact_vector_search(self, store: Store, embedder: Any) -> None:
        """Below the size where a store asks an approximate index, a section search by meaning for a viewer
        passes over the sections it may not see: other roles' documents, another record's notes and system
        documents, nearer the question than anything it may see, take none of the places, org-wide and among
        parents; the hits are those of the same search in a copy of the org holding only what it may see."""
        viewer = Viewer(roles=frozenset({"sales"}), record_ids=frozenset({"r-jane"}))
        near = "Does a discount above ten percent need approval? It does."

        def documents(org: str, flooded: bool) -> list[Document]:
            return _viewer_org(org, flooded, (
                "Discounts above ten percent need approval.", "Annual prepay earns a renewal discount.",
                "The discount desk answers approval questions.", "Jane asked whether her discount needs approval.",
                "A refund is due within thirty days."), legal=lambda n: f"{near} Clause {n}.", bob=near, system=near)  # fmt: skip

        for org, flooded in (("acme", True), ("acme-copy", False)):
            records = [_contact(org, "r-jane"), _contact(org, "r-bob")]
            store.write(make_batch(embedder, orgs=[Org(id=org)], records=records, documents=documents(org, flooded)))
        vector = embedder.embed_query("Does a discount above ten percent need approval?")
        hidden = {"d-bob-note", "d-system", *(f"d-legal-{n}" for n in range(12))}
        everyone = ["d-pricing", "d-sales", "d-jane-note", "d-refunds", "d-legal-3", "d-bob-note"]

        def hits(org: str, who: Viewer | None, limit: int, parents: list[str] | None = None) -> list[tuple[str, str, float]]:
            return [(h.id, h.parent, round(h.score, 5)) for h in store.search_vectors(
                "section", vector, org=org, limit=limit, parents=parents, viewer=who)]  # fmt: skip

        for limit in (2, 5, 50):
            copy = hits("acme-copy", viewer, limit)
            assert copy and hits("acme", viewer, limit) == copy, limit
            assert hits("acme", viewer, limit, everyone) == hits("acme-copy", viewer, limit, everyone), limit
        assert [p for _, p, _ in hits("acme", None, 2)] and all(p in hidden for _, p, _ in hits("acme", None, 2))  # the premise
        assert [h for h in store.search_vectors_many("section", [vector, vector], org="acme", limit=5, parents=everyone,
                                                     viewer=viewer)[1]] == store.search_vectors(
            "section", vector, org="acme-copy", limit=5, parents=everyone, viewer=viewer)  # fmt: skip

    def test_what_a_viewer_may_not_see_never_moves_its_full_text_scores(self, store: Store, embedder: Any) -> None:
        """With a viewer, a section search's word statistics (how many sections, their length, how many hold
        each word) count only what it may see: sections only other roles, another record's notes or the system
        may see, full of the question's words, leave the scores of the sections it may see as a copy of the org
        holding only those gives them; first with the org alone in the store, then beside the copy."""
        viewer = Viewer(roles=frozenset({"sales"}), record_ids=frozenset({"r-jane"}))
        hidden = {"d-bob-note", "d-system", *(f"d-legal-{n}" for n in range(12))}
        searches = [("discount approval", None), ("renewal discount prepay", None), ("refund cancellation", None),
                    ("discount approval renewal", ["d-pricing", "d-sales", "d-jane-note"])]  # fmt: skip

        def documents(org: str, flooded: bool) -> list[Document]:
            return _viewer_org(org, flooded, (
                "A discount above ten percent needs the regional director's approval.",
                "Annual prepay earns a renewal discount of five percent.",
                "The discount desk answers approval questions within a day.",
                "Jane asked about the renewal discount and its approval.",
                "A refund is due within thirty days of cancellation."),
                legal=lambda n: "discount approval renewal refund " * (n + 1),
                bob="Bob wants a discount approval on the renewal.", system="Never promise a discount without approval.")  # fmt: skip

        def write(org: str, flooded: bool) -> None:
            records = [_contact(org, "r-jane"), _contact(org, "r-bob")]
            store.write(make_batch(embedder, orgs=[Org(id=org)], records=records, documents=documents(org, flooded)))

        def answers(org: str, who: Viewer | None, limit: int = 50) -> list[list[tuple[str, str, float]]]:
            return [[(h.id, h.parent, round(h.score, 9)) for h in store.search_text("section", query, org=org, limit=limit, parents=parents, viewer=who)]
                    for query, parents in searches]  # fmt: skip

        write("acme", flooded=True)
        alone = answers("acme", viewer)
        write("acme-copy", flooded=False)
        copy = answers("acme-copy", viewer)
        assert all(copy), copy
        assert alone == copy  # the org alone in the store: the same hits, none it may not see, the same scores
        assert answers("acme", viewer) == copy  # and beside another org
        assert answers("acme", viewer, limit=2) == answers("acme-copy", viewer, limit=2)  # no hidden hit takes a place
        assert answers("acme-copy", None) == copy  # the copy's viewer may see all of it
        # the premise: without the viewer the hidden sections, full of the question's words, come back first and
        # move the others' scores
        everything = answers("acme", None)
        assert everything[0][0][1] in hidden
        assert [[h for h in found if h[1] not in hidden] for found in everything] != copy
        # a memory written, then a hidden document made visible to everyone (and written to the copy too): the
        # statistics follow the document, not the write before it
        store.write(make_batch(embedder, memories=[_memory("acme", "m-new", "r-jane", "A discount was asked for.",
                                                           "2024-06-01T00:00:00+00:00")]))  # fmt: skip
        assert answers("acme", viewer) == copy
        opened = [d for d in documents("acme", flooded=True) if d.id == "d-legal-3"][0].model_copy(update={"visible_to_roles": None})
        store.write(make_batch(embedder, documents=[opened]))
        store.write(make_batch(embedder, documents=[opened.model_copy(update={"org": "acme-copy"})]))
        reopened = answers("acme-copy", viewer)
        assert reopened != copy and any(h[1] == "d-legal-3" for found in reopened for h in found)
        assert answers("acme", viewer) == reopened  # its section is a hit now, the other legal ones still none

    def test_search_text_over_memories_and_parents_restriction(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        hits = store.search_text("memory", "annual renewal prepay", org="acme", limit=10)
        assert {(h.id, h.parent) for h in hits} == {("m-jane-1", "r-jane"), ("m-jane-2", "r-jane"), ("m-bob-2", "r-bob")}
        only_bob = store.search_text("memory", "annual renewal prepay", org="acme", limit=10, parents=["r-bob"])
        assert _ids(only_bob) == ["m-bob-2"]
        assert store.search_text("memory", "annual renewal prepay", org="acme", limit=10, parents=[]) == []
        sections = store.search_text("section", "discount", org="acme", limit=10, parents=["d-education", "d-refunds"])
        assert sections == []

    def test_search_text_among_a_records_many_tied_memories_keeps_the_first_ids(self, store: Store, embedder: Any) -> None:
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

    def test_text_scope_rows_counts_the_scope_of_a_search_up_to_the_most_asked(self, store: Store, embedder: Any) -> None:
        items = write_world(store, embedder)
        memories = [m for m in items["memories"] if m.org == "acme"]
        sections = [s for d in items["documents"] if d.org == "acme" for s in d.sections]
        assert store.text_scope_rows("memory", org="acme", most=1_000) == len(memories)
        assert store.text_scope_rows("section", org="acme", most=1_000) == len(sections)
        assert store.text_scope_rows("memory", org="acme", most=2) == 2  # counted no further than asked
        jane = sum(1 for m in memories if m.record == "r-jane")
        assert store.text_scope_rows("memory", org="acme", most=1_000, parents=["r-jane"]) == jane
        assert store.text_scope_rows("memory", org="acme", most=1_000, parents=["r-jane", "r-bob", "r-nobody"]) == jane + 2
        assert store.text_scope_rows("section", org="acme", most=1_000, parents=["d-discounts"]) == 2
        assert store.text_scope_rows("memory", org="acme", most=1_000, parents=[]) == 0
        # another org's rows are not counted, and a write is (the count is not kept past it)
        store.write(make_batch(embedder, orgs=[Org(id="globex")], records=[_contact("globex", "r-jane")],
                               memories=[_memory("globex", f"g-m{n}", "r-jane", "Renewal note.", "2024-05-01T00:00:00+00:00")
                                         for n in range(7)]))  # fmt: skip
        assert store.text_scope_rows("memory", org="acme", most=1_000, parents=["r-jane"]) == jane
        assert store.text_scope_rows("memory", org="globex", most=1_000, parents=["r-jane"]) == 7
        store.write(make_batch(embedder, orgs=[Org(id="acme")], records=[_contact("acme", "r-jane")],
                               memories=[_memory("acme", "m-jane-9", "r-jane", "One more.", "2024-05-02T00:00:00+00:00")]))  # fmt: skip
        assert store.text_scope_rows("memory", org="acme", most=1_000, parents=["r-jane"]) == jane + 1
        with pytest.raises(ValueError):
            store.text_scope_rows("record", org="acme", most=10)  # type: ignore[arg-type]

    @pytest.mark.parametrize("query", ["what is the", "", "   ", "?!", "and or not near"])
    def test_search_text_with_no_search_terms_returns_nothing(self, store: Store, embedder: Any, query: str) -> None:
        write_world(store, embedder)
        assert store.search_text("section", query, org="acme", limit=10) == []
        assert store.search_text("memory", query, org="acme", limit=10) == []

    def test_search_text_treats_query_syntax_as_plain_words(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        for query in ['"forklift', "forklift*", "forklift OR", "NEAR(forklift)", "text:forklift", "(forklift"]:
            assert _ids(store.search_text("section", query, org="acme", limit=10)) == ["s-edu-41"], query

    # -- vectors ---------------------------------------------------------------------------------------
    def test_search_vectors_returns_the_most_similar_first_with_cosine_scores(self, store: Store, embedder: Any) -> None:
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

    def test_search_vectors_over_memories_and_properties(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        memory = store.search_vectors("memory", embedder.embed_query("invoice schedule"), org="acme", limit=1)
        assert [(h.id, h.parent) for h in memory] == [("m-bob-1", "r-bob")]
        prop = store.search_vectors("property", embedder.embed_query("what month does the contract renew"), org="acme", limit=1)
        assert [(h.id, h.parent) for h in prop] == [(property_key("r-jane", "renewal_month"), "r-jane")]

    def test_search_vectors_limit_and_parents(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        query = embedder.embed_query("discount")
        assert len(store.search_vectors("section", query, org="acme", limit=3)) == 3
        assert store.search_vectors("section", query, org="acme", limit=0) == []
        restricted = store.search_vectors("section", query, org="acme", limit=10, parents=["d-education"])
        assert sorted(_ids(restricted)) == ["s-edu-40", "s-edu-41"]
        assert len(store.search_vectors("section", query, org="acme", limit=1, parents=["d-education", "d-refunds"])) == 1
        assert store.search_vectors("section", query, org="acme", limit=10, parents=[]) == []
        assert store.search_vectors("memory", query, org="acme", limit=10, parents=["r-nobody"]) == []

    def test_search_vectors_many_answers_what_search_vectors_answers_for_each(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder)
        queries = [embedder.embed_query(q) for q in ("discount", "invoice schedule", "education course")]
        for kind, parents in (("section", None), ("section", ["d-education", "d-refunds"]), ("memory", ["r-jane"]),
                              ("memory", None), ("property", None)):  # fmt: skip
            many = store.search_vectors_many(kind, queries, org="acme", limit=3, parents=parents)
            assert many == [store.search_vectors(kind, q, org="acme", limit=3, parents=parents) for q in queries]
            assert all(many)  # the world has rows of each kind there
        assert store.search_vectors_many("section", queries, org="acme", limit=0) == [[], [], []]
        assert store.search_vectors_many("section", queries, org="acme", limit=5, parents=[]) == [[], [], []]
        assert store.search_vectors_many("section", [], org="acme", limit=5) == []
        assert store.search_vectors_many("section", queries[:2], org="other", limit=5) == [[], []]  # another org's rows: none

    def test_search_vectors_many_breaks_ties_as_search_vectors_does(self, store: Store, embedder: Any) -> None:
        """Memories with one text share one vector: each query's hits are those search_vectors gives, in its order."""
        org = "acme"
        ties = [_memory(org, f"m-tie-{n:02d}", "r-jane" if n % 3 else "r-bob", "Renewal quote sent for the forklift fleet.",
                        "2024-04-01T00:00:00+00:00") for n in range(30, 0, -1)]  # fmt: skip
        store.write(make_batch(embedder, orgs=[Org(id=org)], records=[_contact(org, "r-jane"), _contact(org, "r-bob")],
                               memories=ties))  # fmt: skip
        queries = [embedder.embed_query(q) for q in ("forklift renewal", "quote for the fleet")]
        for parents in (["r-jane"], ["r-jane", "r-bob"]):
            for limit in (1, 7, 40):
                many = store.search_vectors_many("memory", queries, org=org, limit=limit, parents=parents)
                alone = [store.search_vectors("memory", q, org=org, limit=limit, parents=parents) for q in queries]
                assert many == alone
                held = {m.id for m in ties if m.record in parents}
                for hits in many:  # best first, equal scores by id; each of the parents' rows, up to the limit
                    assert [(-h.score, h.id) for h in hits] == sorted((-h.score, h.id) for h in hits)
                    assert len(hits) == min(limit, len(held)) and {h.id for h in hits} <= held

    def test_search_vectors_on_an_empty_org(self, store: Store, embedder: Any) -> None:
        assert store.search_vectors("section", embedder.embed_query("anything"), org="acme", limit=5) == []

    @pytest.mark.parametrize("org_row", [True, False], ids=["org-row", "no-org-row"])
    def test_a_search_sees_the_write_that_followed_it(self, store: Store, embedder: Any, org_row: bool) -> None:
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

    def test_a_batch_of_vectors_alone_is_seen_by_the_next_search(self, store: Store, embedder: Any) -> None:
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

    # -- org required ------------------------------------------------------------------------------
    def test_it_is_a_searcher(self, store: Store) -> None:
        assert isinstance(store, StoreSearcher)

    def test_every_org_scoped_method_is_checked(self) -> None:
        assert org_scoped(StoreSearcher) == set(SEARCHER_SCOPED)

    @pytest.mark.parametrize("org", ["", None], ids=["empty", "none"])
    @pytest.mark.parametrize("method", sorted(SEARCHER_SCOPED))
    def test_every_org_scoped_method_refuses_a_missing_org(self, store: Store, embedder: Any, method: str, org: str | None) -> None:
        refuses_a_missing_org(store, embedder, SEARCHER_SCOPED[method], method, org)


def _viewer_org(org: str, flooded: bool, visible: tuple[str, str, str, str, str], *, legal: Callable[[int], str],
                bob: str, system: str) -> list[Document]:
    """The viewer tests' org: what a sales caller about r-jane may see (a pricing policy of two sections, the
    sales desk's document, Jane's call note, a refunds policy; ``visible`` their texts in that order) and, when
    ``flooded``, what it may not: twelve legal-only documents (``legal(n)`` their texts), Bob's call note and a
    system document."""
    pricing, prepay, desk, jane, refund = visible
    out = [
        Document(id="d-pricing", org=org, title="Pricing", sections=(
            Section(id="s-price-1", heading="Discount approval", text=pricing),
            Section(id="s-price-2", heading="Prepay", text=prepay))),
        Document(id="d-sales", org=org, title="Sales desk", visible_to_roles=("sales",), sections=(
            Section(id="s-sales-1", heading="Discount desk", text=desk),)),
        Document(id="d-jane-note", org=org, title="Call with Jane", attached_record="r-jane", sections=(
            Section(id="s-jane-1", heading="Call", text=jane),)),
        Document(id="d-refunds", org=org, title="Refunds", sections=(Section(id="s-refund-1", heading="Window", text=refund),)),
    ]  # fmt: skip
    if flooded:
        out += [Document(id=f"d-legal-{n}", org=org, title="Discount approval", visible_to_roles=("legal",),
                         sections=(Section(id=f"s-legal-{n}", heading="Approval", text=legal(n)),)) for n in range(12)]  # fmt: skip
        out += [Document(id="d-bob-note", org=org, title="Call with Bob", attached_record="r-bob", sections=(
                    Section(id="s-bob-1", heading="Call", text=bob),)),
                Document(id="d-system", org=org, title="System", is_system=True, sections=(
                    Section(id="s-system-1", heading="Rules", text=system),))]  # fmt: skip
    return out
