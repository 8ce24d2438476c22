"""The :class:`~dossier.stores.base.StoreWriter` part of the Store contract: writes are atomic upserts, the
hashes a load compares are those written, and org settings and call results round-trip per org."""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

import dossier
from dossier.bundle import Document, Record, Section
from dossier.loading import content_hash, property_text, section_text, text_hash
from dossier.stores.base import Store, StoreWriter, VectorWrite, WriteBatch, property_key
from tests.stores.contract import _contact, _ids, _memory, make_batch, org_scoped, refuses_a_missing_org, world, write_world

def _failing_batches(embedder: Any) -> list[tuple[str, WriteBatch]]:
    extra = world("acme")
    doc = extra["documents"][1]
    twin = doc.model_copy(update={"id": "d-twin"})  # reuses doc's section ids: they are unique per org
    no_org = make_batch(embedder, memories=[_memory("acme", "m-new", "r-bob", "A brand new memory.", "2024-04-01T00:00:00")])
    no_org.vectors.append(VectorWrite("", "memory", "m-orphan", "r-bob", "h", no_org.vectors[0].vector))
    return [("vector without an org", no_org), ("section id used by two documents", make_batch(embedder, documents=[doc, twin]))]

#: every org-scoped method of StoreWriter, called well formed
WRITER_SCOPED: dict[str, Callable[[Store, Any], Any]] = {
    "content_hashes": lambda s, org: s.content_hashes("record", ["r-jane"], org=org),
    "vector_hashes": lambda s, org: s.vector_hashes("memory", ["m-jane-1"], org=org),
    "put_settings": lambda s, org: s.put_settings({"thresholds": {"memory_semantic": 0.4}}, org=org) or {},
    "put_result": lambda s, org: s.put_result("call-1", {"answer": "yes"}, org=org) or {},
    "update_settings": lambda s, org: s.update_settings(lambda row: {"thresholds": {"memory_semantic": 0.4}}, org=org),
}

def _race(first: Store, held: WriteBatch, second: Store, other: WriteBatch) -> list[str]:
    """``first`` writes ``held`` and keeps its transaction open (a load embedding the rest, say) while ``second``
    writes ``other``, given a second to land before ``first`` commits; each outcome, in the order they ended:
    "landed", or the message of the dossier error that refused the write."""
    wrote, release = threading.Event(), threading.Event()

    def slow_load() -> Any:
        yield held
        wrote.set()
        release.wait(20)

    outcomes: list[str] = []

    def run(store: Store, batches: Any) -> None:
        try:
            store.write_many(batches)
            outcomes.append("landed")
        except dossier.DossierError as exc:
            outcomes.append(str(exc))

    slow = threading.Thread(target=run, args=(first, slow_load()))
    slow.start()
    assert wrote.wait(20)
    racing = threading.Thread(target=run, args=(second, [other]))
    racing.start()
    racing.join(1.0)  # without a lock held by the first write, the second has landed by now
    release.set()
    slow.join(20)
    racing.join(20)
    return outcomes


class WriterContract:
    """What every backend's writes and hashes do."""


    # -- writes and hashes -----------------------------------------------------------------------------
    def test_write_then_read_back_every_kind(self, store: Store, embedder: Any) -> None:
        items = write_world(store, embedder)
        assert store.get_org(org="acme") == items["orgs"][0]
        assert store.get_caller("c-admin", org="acme") == items["callers"][1]
        assert store.get_records(_ids(items["records"]), org="acme") == items["records"]
        assert store.get_memories(_ids(items["memories"]), org="acme") == items["memories"]
        assert store.get_documents(_ids(items["documents"]), org="acme") == items["documents"]

    @pytest.mark.parametrize("kind", ["org", "caller", "record", "memory", "document", "edge"])
    def test_content_hashes_are_those_written_and_skip_missing_ids(self, store: Store, embedder: Any, kind: str) -> None:
        items = write_world(store, embedder)
        written = items[{"memory": "memories"}.get(kind, kind + "s")]
        expected = {item.id: content_hash(item) for item in written}
        assert store.content_hashes(kind, [*expected, "no-such-id"], org="acme") == expected  # type: ignore[arg-type]
        assert store.content_hashes(kind, [], org="acme") == {}  # type: ignore[arg-type]

    def test_content_hash_follows_an_upsert(self, store: Store, embedder: Any) -> None:
        items = write_world(store, embedder)
        jane = items["records"][0].model_copy(update={"properties": {"plan": "Starter"}})
        store.write(make_batch(embedder, records=[jane]))
        assert store.content_hashes("record", ["r-jane"], org="acme") == {"r-jane": content_hash(jane)}
        assert store.get_records(["r-jane"], org="acme")[0].properties == {"plan": "Starter"}

    def test_vector_hashes_are_the_hashes_of_the_embedded_texts(self, store: Store, embedder: Any) -> None:
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

    @pytest.mark.parametrize("case", range(2), ids=["vector-without-org", "duplicate-section-id"])
    def test_a_failing_batch_writes_nothing(self, store: Store, embedder: Any, case: int) -> None:
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

    def test_a_failing_batch_on_an_empty_store_leaves_it_empty(self, store: Store, embedder: Any) -> None:
        batch = make_batch(embedder, **world("acme"))
        batch.vectors.append(VectorWrite("", "memory", "m-orphan", "r-bob", "h", batch.vectors[0].vector))
        with pytest.raises(dossier.DossierError):
            store.write(batch)
        assert store.get_org(org="acme") is None
        assert set(store.counts(org="acme").values()) == {0}

    def test_upserting_a_record_drops_vectors_of_properties_it_no_longer_has(self, store: Store, embedder: Any) -> None:
        items = write_world(store, embedder)
        keys = [property_key("r-jane", name) for name in ("plan", "renewal_month", "seats")]
        assert set(store.vector_hashes("property", keys, org="acme")) == set(keys)
        jane = items["records"][0].model_copy(update={"properties": {"plan": "Enterprise", "renewal_month": None}})
        store.write(make_batch(embedder, records=[jane], vectors=False))  # plan's text did not change
        assert set(store.vector_hashes("property", keys, org="acme")) == {property_key("r-jane", "plan")}
        query = embedder.embed_query("seats: 40")
        found = store.search_vectors("property", query, org="acme", limit=50, parents=["r-jane"])
        assert [hit.id for hit in found] == [property_key("r-jane", "plan")]

    def test_upserting_a_document_replaces_its_sections_everywhere(self, store: Store, embedder: Any) -> None:
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

    def test_another_handle_on_the_same_store_sees_writes(self, open_store: Callable[[], Store], embedder: Any) -> None:
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

    def test_org_settings_round_trip_per_org(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder, "acme")
        assert store.get_settings(org="acme") is None
        store.put_settings({"thresholds": {"memory_semantic": 0.35}}, org="acme")
        store.put_settings({"thresholds": {"memory_semantic": 0.6}}, org="acme")  # replaces
        assert store.get_settings(org="acme") == {"thresholds": {"memory_semantic": 0.6}}
        assert store.get_settings(org="beta") is None

    def test_a_write_that_would_close_a_merge_cycle_is_refused_whole(self, store: Store, embedder: Any) -> None:
        """The loader checks merges before it writes; two loads merging the other way at once both pass that
        check. The store checks again inside its write, and refuses the one that would close the cycle."""
        write_world(store, embedder, "acme")
        store.write(make_batch(embedder, records=[_contact("acme", "r-a", merged_into="r-b"), _contact("acme", "r-b")]))
        with pytest.raises(dossier.StoreError, match="merged_into makes a cycle in org 'acme' .*'r-b' -> 'r-a' -> 'r-b'"):
            store.write(make_batch(embedder, records=[_contact("acme", "r-b", merged_into="r-a"), _contact("acme", "r-new")]))
        assert [r.merged_into for r in store.get_records(["r-b"], org="acme")] == [None]
        assert store.get_records(["r-new"], org="acme") == []  # nothing of that write
        store.write(make_batch(embedder, records=[_contact("acme", "r-c", merged_into="r-b")]))  # a chain is fine

    def test_of_two_loads_merging_the_other_way_at_once_one_lands(self, open_store: Callable[[], Store], embedder: Any) -> None:
        first, second = open_store(), open_store()
        write_world(first, embedder, "acme")
        first.write(make_batch(embedder, records=[_contact("acme", "r-a"), _contact("acme", "r-b")]))
        outcomes = _race(first, make_batch(embedder, records=[_contact("acme", "r-a", merged_into="r-b")]),
                         second, make_batch(embedder, records=[_contact("acme", "r-b", merged_into="r-a")]))  # fmt: skip
        assert sorted(o == "landed" for o in outcomes) == [False, True]
        assert any("merged_into makes a cycle" in o for o in outcomes)
        rows = {r.id: r.merged_into for r in first.get_records(["r-a", "r-b"], org="acme")}
        assert list(rows.values()).count(None) == 1  # one merge stored, not both

    def test_a_section_of_the_longest_text_a_bundle_allows_is_stored_and_searched(self, store: Store, embedder: Any) -> None:
        """Both stores take what a bundle allows: a section of SECTION_TEXT_MAX characters of distinct words
        (the worst case for PostgreSQL's full-text vector, which holds at most 1 MiB)."""
        from dossier.bundle import SECTION_TEXT_MAX

        write_world(store, embedder, "acme")
        words, size, n = [], 0, 0
        while size + 9 < SECTION_TEXT_MAX:
            word = f"q{n:07x}"
            words.append(word)
            size += len(word) + 1
            n += 1
        text = " ".join(words)
        assert len(text) <= SECTION_TEXT_MAX
        doc = Document(id="d-long", org="acme", title="Long", doc_type="policy", sections=[Section(id="s-long", heading="All", text=text)])
        store.write(make_batch(embedder, documents=[doc]))
        assert _ids(store.search_text("section", words[-1], org="acme", limit=5)) == ["s-long"]

    def test_a_guarded_write_never_reaches_a_record_hidden_by_a_deletion(self, store: Store, embedder: Any) -> None:
        """A write of a caller without the admin role (``guard``) is checked inside the store's write: refused
        whole when it rewrites, merges into or adds a memory to a record pending deletion or merged into one,
        or moves a stored memory off such a record; the same write unguarded (the admin's) goes through."""
        write_world(store, embedder, "acme")
        store.write(make_batch(embedder, records=[_contact("acme", "r-gone", pending_deletion=True),
                                                  _contact("acme", "r-under", merged_into="r-gone")],
                               memories=[_memory("acme", "m-gone", "r-under", "A memory of a hidden record.", "2024-05-01T00:00:00")]))  # fmt: skip
        refused = [
            (make_batch(embedder, records=[_contact("acme", "r-gone", properties={"name": "back"})]), "'r-gone' is pending deletion"),
            (make_batch(embedder, records=[_contact("acme", "r-new", merged_into="r-under")]), "'r-under' is merged into a record pending deletion"),
            (make_batch(embedder, memories=[_memory("acme", "m-new", "r-under", "Added.", "2024-05-02T00:00:00")]), "merged into a record pending"),
            (make_batch(embedder, memories=[_memory("acme", "m-gone", "r-bob", "Moved.", "2024-05-02T00:00:00")]), "'m-gone' exists and this caller may not"),
        ]
        for batch, message in refused:
            batch.guard = True
            with pytest.raises(dossier.UsageError, match=message):
                store.write(batch)
        assert store.get_records(["r-gone"], org="acme")[0].pending_deletion
        assert store.get_records(["r-new"], org="acme") == [] and store.get_memories(["m-new"], org="acme") == []
        assert store.get_memories(["m-gone"], org="acme")[0].record == "r-under"
        allowed = make_batch(embedder, records=[_contact("acme", "r-bob", properties={"role": "CFO"})])
        allowed.guard = True
        store.write(allowed)  # a live record: written
        store.write(refused[0][0].__class__(records=refused[0][0].records))  # unguarded (the admin's): written
        assert not store.get_records(["r-gone"], org="acme")[0].pending_deletion

    def test_a_guarded_write_never_gives_a_live_records_identifier_to_another(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder, "acme")

        def guarded(*records: Record) -> WriteBatch:
            batch = make_batch(embedder, records=list(records))
            batch.guard = True
            return batch

        with pytest.raises(dossier.Forbidden, match="email 'jane.doe@acme.com' already names record 'r-jane'"):
            store.write(guarded(_contact("acme", "r-dup", identifiers={"email": "JANE.DOE@acme.com"})))
        assert store.get_records(["r-dup"], org="acme") == []
        store.write(guarded(_contact("acme", "r-jane", identifiers={"email": "jane.doe@acme.com"}, properties={"plan": "Pro"})))
        store.write(guarded(_contact("acme", "r-jane-old", merged_into="r-jane", identifiers={"email": "jane.doe@acme.com"})))
        store.write(make_batch(embedder, records=[_contact("acme", "r-dup", identifiers={"email": "jane.doe@acme.com"})]))  # the admin's
        store.write(guarded(_contact("acme", "r-dup", identifiers={"email": "jane.doe@acme.com"}, properties={"x": 1})))  # holds it
        with pytest.raises(dossier.Forbidden, match="given to two records in one request"):
            store.write(guarded(_contact("acme", "r-n1", identifiers={"email": "n@acme.com"}),
                                _contact("acme", "r-n2", identifiers={"email": "n@acme.com"})))  # fmt: skip

    def test_of_two_guarded_writes_giving_out_one_new_email_at_once_one_lands(self, open_store: Callable[[], Store], embedder: Any) -> None:
        first, second = open_store(), open_store()
        write_world(first, embedder, "acme")

        def guarded(rid: str) -> WriteBatch:
            batch = make_batch(embedder, records=[_contact("acme", rid, identifiers={"email": "new.person@acme.com"})])
            batch.guard = True
            return batch

        outcomes = _race(first, guarded("r-first"), second, guarded("r-second"))
        assert outcomes[0] == "landed" and "already names record 'r-first'" in outcomes[1]
        assert first.get_records(["r-second"], org="acme") == []

    def test_settings_update_reads_and_writes_in_one_transaction(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder, "acme")
        seen: list[dict | None] = []
        assert store.update_settings(lambda row: seen.append(row) or {"max_picks": 2}, org="acme") == {"max_picks": 2}
        assert store.update_settings(lambda row: seen.append(row) or {**(row or {}), "x": 1}, org="acme") == {"max_picks": 2, "x": 1}
        assert seen == [None, {"max_picks": 2}]
        with pytest.raises(ValueError):  # a change that raises stores nothing
            store.update_settings(lambda row: (_ for _ in ()).throw(ValueError("no")), org="acme")
        assert store.get_settings(org="acme") == {"max_picks": 2, "x": 1}
        assert store.get_settings(org="beta") is None

    def test_settings_updates_from_two_handles_never_lose_one(self, open_store: Callable[[], Store], embedder: Any) -> None:
        # the first update holds the org's settings between its read and its write; the second, from another
        # handle (another process), must wait for it and then read what it wrote, not the row before it
        first, second = open_store(), open_store()
        write_world(first, embedder, "acme")
        first.put_settings({"max_picks": 2}, org="acme")
        has_read, release = threading.Event(), threading.Event()

        def slow(row: dict | None) -> dict:
            has_read.set()
            release.wait(20)
            return {**(row or {}), "a": 1}

        done: list[dict] = []
        slow_update = threading.Thread(target=lambda: first.update_settings(slow, org="acme"))
        slow_update.start()
        assert has_read.wait(20)
        other = threading.Thread(target=lambda: done.append(second.update_settings(lambda row: {**(row or {}), "b": 2}, org="acme")))
        other.start()
        other.join(1.0)  # without the hold, the second update is written by now
        release.set()
        slow_update.join(20)
        other.join(20)
        assert done == [{"max_picks": 2, "a": 1, "b": 2}]
        assert first.get_settings(org="acme") == {"max_picks": 2, "a": 1, "b": 2}

    def test_results_round_trip_per_org(self, store: Store, embedder: Any) -> None:
        write_world(store, embedder, "acme")
        assert store.get_result("call-1", org="acme") is None
        store.put_result("call-1", {"synthesis": {"pending": True}}, org="acme")
        store.put_result("call-1", {"synthesis": {"answer": "Yes [D1]", "confidence": 0.8}}, org="acme")  # replaces
        assert store.get_result("call-1", org="acme") == {"synthesis": {"answer": "Yes [D1]", "confidence": 0.8}}
        assert store.get_result("call-1", org="beta") is None

    # -- org required ------------------------------------------------------------------------------
    def test_it_is_a_writer(self, store: Store) -> None:
        assert isinstance(store, StoreWriter)

    def test_every_org_scoped_method_is_checked(self) -> None:
        assert org_scoped(StoreWriter) == set(WRITER_SCOPED)

    @pytest.mark.parametrize("org", ["", None], ids=["empty", "none"])
    @pytest.mark.parametrize("method", sorted(WRITER_SCOPED))
    def test_every_org_scoped_method_refuses_a_missing_org(self, store: Store, embedder: Any, method: str, org: str | None) -> None:
        refuses_a_missing_org(store, embedder, WRITER_SCOPED[method], method, org)
