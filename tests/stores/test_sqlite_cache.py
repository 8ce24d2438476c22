"""Documents and memories kept by a SQLite store handle while their org's generation stays
(stores/sqlite_cache.py): what a read returns is what the file holds, whoever wrote it."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from dossier.bundle import Document, Memory, Org, Record, Section
from dossier.stores.base import WriteBatch
from dossier.stores.sqlite import SQLiteStore
from dossier.stores.sqlite_cache import GenerationCache, memory_chars

WHEN = datetime(2026, 1, 2, tzinfo=timezone.utc)


def _document(org: str, doc_id: str, title: str, *texts: str) -> Document:
    sections = tuple(Section(id=f"{doc_id}-s{i}", heading=f"part {i}", text=t) for i, t in enumerate(texts, start=1))
    return Document(id=doc_id, org=org, title=title, sections=sections)


def _memory(org: str, memory_id: str, text: str, record: str = "rec-1") -> Memory:
    return Memory(id=memory_id, org=org, record=record, text=text, created_at=WHEN)


def _write(store: SQLiteStore, *items: Document | Memory, orgs: tuple[str, ...] = ("acme",)) -> None:
    batch = WriteBatch(orgs=[Org(id=o, name=o) for o in orgs])
    for org in orgs:
        batch.records.append((Record(id="rec-1", org=org, kind="contact", name="Jane"), f"r-{org}"))
    for item in items:
        target = batch.documents if isinstance(item, Document) else batch.memories
        target.append((item, item.content_hash))  # type: ignore[arg-type]
    store.write(batch)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "s.db"


def test_reads_answer_as_the_file_does_in_the_order_asked_each_once(path: Path) -> None:
    store = SQLiteStore(path)
    try:
        _write(store, _document("acme", "d1", "Pricing", "Annual prepay earns 10%."), _document("acme", "d2", "Travel", "Economy."),
               _memory("acme", "m1", "Jane asked about prepay."), _memory("acme", "m2", "Jane renewed."))  # fmt: skip
        for _ in range(2):  # the first read fills the cache, the second answers from it
            assert [d.id for d in store.get_documents(["d2", "missing", "d1", "d2"], org="acme")] == ["d2", "d1"]
            assert [m.id for m in store.get_memories(["m2", "m1", "nope", "m2"], org="acme")] == ["m2", "m1"]
        fresh = SQLiteStore(path)  # another handle: nothing kept
        try:
            assert store.get_documents(["d1", "d2"], org="acme") == fresh.get_documents(["d1", "d2"], org="acme")
            assert store.get_memories(["m1", "m2"], org="acme") == fresh.get_memories(["m1", "m2"], org="acme")
        finally:
            fresh.close()
    finally:
        store.close()


def test_a_write_by_another_handle_is_seen_by_the_next_read(path: Path) -> None:
    store, writer = SQLiteStore(path), SQLiteStore(path)  # two handles on one file, as two processes have
    try:
        _write(writer, _document("acme", "d1", "Pricing", "Annual prepay earns 10%."), _memory("acme", "m1", "Jane asked."))
        assert store.get_documents(["d1"], org="acme")[0].sections[0].text == "Annual prepay earns 10%."
        assert store.get_memories(["m1"], org="acme")[0].text == "Jane asked."
        _write(writer, _document("acme", "d1", "Pricing, revised", "Annual prepay earns 12%.", "Quarterly: none."),
               _memory("acme", "m1", "Jane asked twice."))  # fmt: skip
        revised = store.get_documents(["d1"], org="acme")[0]
        assert revised.title == "Pricing, revised"
        assert [s.text for s in revised.sections] == ["Annual prepay earns 12%.", "Quarterly: none."]
        assert store.get_memories(["m1"], org="acme")[0].text == "Jane asked twice."
    finally:
        store.close()
        writer.close()


def test_one_org_never_gets_another_org_s_item_of_the_same_id(path: Path) -> None:
    store = SQLiteStore(path)
    try:
        _write(store, _document("acme", "d1", "Acme pricing", "Acme's rules."), _document("globex", "d1", "Globex pricing", "Globex's rules."),
               _memory("acme", "m1", "Acme's note."), _memory("globex", "m1", "Globex's note."), orgs=("acme", "globex"))  # fmt: skip
        for _ in range(2):
            for org in ("acme", "globex"):
                (document,) = store.get_documents(["d1"], org=org)
                (memory,) = store.get_memories(["m1"], org=org)
                assert (document.org, memory.org) == (org, org)
                assert document.sections[0].text.startswith(org.capitalize())
                assert memory.text.startswith(org.capitalize())
        assert store.get_documents(["d1"], org="initech") == [] and store.get_memories(["m1"], org="initech") == []
    finally:
        store.close()


def test_a_read_inside_a_write_not_committed_keeps_nothing(path: Path) -> None:
    store = SQLiteStore(path)
    try:
        _write(store, _document("acme", "d1", "Pricing", "Annual prepay earns 10%."))
        with pytest.raises(RuntimeError), store._transaction() as db:
            db.execute("UPDATE documents SET title = 'Rolled back' WHERE org = 'acme' AND id = 'd1'")
            assert store.get_documents(["d1"], org="acme")[0].title == "Rolled back"  # the write's own view
            raise RuntimeError("the write fails")
        assert store.get_documents(["d1"], org="acme")[0].title == "Pricing"
    finally:
        store.close()


def test_the_cache_keeps_at_most_its_bounds_of_text_and_items_least_recently_used_first() -> None:
    generation = {"acme": 1}
    reads: list[list[str]] = []
    texts = {f"m{i}": "x" * 40 for i in range(5)}

    def read(ids: list[str]) -> list[Memory]:
        reads.append(ids)
        return [_memory("acme", i, texts[i]) for i in sorted(ids) if i in texts]  # as SQL would: in no order asked

    cache: GenerationCache[Memory] = GenerationCache(generation.get, memory_chars, limit=100)  # two texts fit
    assert [m.id for m in cache.get(["m0", "m1"], org="acme", read=read)] == ["m0", "m1"]
    cache.get(["m0"], org="acme", read=read)  # m0 used last: m1 goes first
    cache.get(["m2"], org="acme", read=read)
    reads.clear()
    assert [m.id for m in cache.get(["m0", "m1", "m2"], org="acme", read=read)] == ["m0", "m1", "m2"]
    assert reads == [["m1"]]
    generation["acme"] = 2  # a write: nothing kept is trusted
    reads.clear()
    cache.get(["m0", "m2"], org="acme", read=read)
    assert reads == [["m0", "m2"]]
    for _ in range(2):  # an org without a generation: read every time, answered in the order asked
        assert [m.id for m in cache.get(["m2", "m0", "m2"], org="nowhere", read=read)] == ["m2", "m0"]
    assert reads[-2:] == [["m2", "m0"], ["m2", "m0"]]

    by_count: GenerationCache[Memory] = GenerationCache(generation.get, memory_chars, limit=10_000, items=2)
    by_count.get(["m0", "m1", "m2"], org="acme", read=read)  # three read, two kept: m0 went first
    reads.clear()
    by_count.get(["m0", "m1", "m2"], org="acme", read=read)
    assert reads == [["m0"]]
