"""Loading streams: a bundle file is read item by item (never whole), embedded and written a chunk at a
time, in bounded memory, still all or nothing and idempotent, with progress from the first text to the
last. The stand-in embedder keeps these mechanics tests fast (retrieval quality is tested elsewhere with
the real model)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import dossier
from dossier import loading
from dossier.errors import BundleError, StoreError
from dossier.stores.base import VectorWrite, WriteBatch
from tests.fake_embedder import HashEmbedder

MEMORIES = 2_500  # more than one chunk (loading.CHUNK) of items and of texts


def big_bundle(memories: int = MEMORIES, text_bytes: int = 60) -> dict[str, Any]:
    records = [{"id": f"r{i}", "org": "acme", "kind": "contact", "properties": {"plan": "Enterprise", "seats": i}}
               for i in range(50)]  # fmt: skip
    pad = "x" * max(0, text_bytes - 50)
    return {
        "orgs": [{"id": "acme"}],
        "callers": [{"id": "ana", "org": "acme"}],
        "records": records,
        "memories": [{"id": f"m{i}", "org": "acme", "record": f"r{i % 50}", "created_at": "2024-01-01T00:00:00Z",
                      "text": f"Call {i}: the customer asked about renewal {i % 7} {pad}"} for i in range(memories)],  # fmt: skip
        "documents": [{"id": "d1", "org": "acme", "title": "Policy", "sections": [{"id": f"s{i}", "text": f"Rule {i}."} for i in range(30)]}],
        "edges": [{"id": f"e{i}", "org": "acme", "src": f"r{i}", "dst": f"r{i + 1}", "type": "knows"} for i in range(49)],
    }


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[dossier.Engine]:
    with dossier.open(f"sqlite:///{tmp_path}/s.db", embedder=HashEmbedder()) as opened:
        yield opened


def write_file(tmp_path: Path, data: dict[str, Any], name: str = "bundle.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_a_bundle_file_larger_than_a_chunk_loads_whole_and_reloads_as_unchanged(engine: dossier.Engine, tmp_path: Path) -> None:
    path = write_file(tmp_path, big_bundle())
    seen: list[tuple[int, int]] = []
    report = engine.load_bundle(path, progress=lambda done, total: seen.append((done, total)))
    texts = MEMORIES + 50 * 2 + 30
    assert report.inserted == {"orgs": 1, "callers": 1, "records": 50, "memories": MEMORIES, "documents": 1, "edges": 49}
    assert report.embedded == texts
    assert seen[0] == (0, texts) and seen[-1] == (texts, texts)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen) and len(seen) > 3
    counts = engine.store.counts(org="acme")
    assert (counts["memories"], counts["sections"], counts["vectors"], counts["edges"]) == (MEMORIES, 30, texts, 49)
    assert engine.store.get_memories(["m2499"], org="acme")[0].record == "r49"
    again = engine.load_bundle(path)
    assert (again.total_inserted, again.total_updated, again.embedded) == (0, 0, 0)
    assert again.unchanged["memories"] == MEMORIES


def test_a_change_late_in_the_file_reembeds_only_that_text(engine: dossier.Engine, tmp_path: Path) -> None:
    data = big_bundle()
    engine.load_bundle(write_file(tmp_path, data))
    data["memories"][-1]["text"] = "The customer signed the renewal."
    report = engine.load_bundle(write_file(tmp_path, data, "changed.json"))
    assert report.updated == {"memories": 1} and report.embedded == 1
    assert engine.store.search_text("memory", "signed", org="acme", limit=5)[0].id == f"m{MEMORIES - 1}"


def test_a_problem_at_the_end_of_a_file_writes_nothing(engine: dossier.Engine, tmp_path: Path) -> None:
    data = big_bundle()
    data["memories"][-1]["record"] = "r-ghost"
    with pytest.raises(BundleError) as caught:
        engine.load_bundle(write_file(tmp_path, data))
    assert [(p.kind, p.item_id) for p in caught.value.problems] == [("memory", f"m{MEMORIES - 1}")]
    assert engine.store.get_org(org="acme") is None
    assert set(engine.store.counts(org="acme").values()) == {0}


def test_a_store_failure_midway_through_the_write_writes_nothing(engine: dossier.Engine, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    engine.load_bundle({"orgs": [{"id": "acme"}]})
    real = loading._batches

    def failing(*args: Any) -> Iterator[WriteBatch]:
        for n, batch in enumerate(real(*args)):
            if n == 3:  # items of earlier batches are already in the (open) transaction
                raise StoreError("disk full")
            yield batch

    monkeypatch.setattr(loading, "_batches", failing)
    with pytest.raises(StoreError):
        engine.load_bundle(write_file(tmp_path, big_bundle()))
    assert engine.store.counts(org="acme")["records"] == 0 and engine.store.counts(org="acme")["memories"] == 0


def _peak_while_loading(engine: dossier.Engine, path: Path) -> int:
    tracemalloc.start()
    try:
        engine.load_bundle(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_stays_bounded_as_a_bundle_file_grows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three times the memories, about the same peak: a load holds chunks of items and a few hundred bytes
    of ids per item, not the file (json.load would hold every item of it at once). Vectors beyond 500 wait
    on disk here (20,000 by default)."""
    monkeypatch.setattr(loading, "STAGED_IN_MEMORY", 500)
    peaks, sizes = [], []
    for n, memories in enumerate((1_500, 4_500)):  # both below the ANN index's threshold
        path = write_file(tmp_path, big_bundle(memories=memories, text_bytes=2_000), f"b{n}.json")
        with dossier.open(f"sqlite:///{tmp_path}/s{n}.db", embedder=HashEmbedder()) as engine:
            engine.embed_query("warm up")
            peaks.append(_peak_while_loading(engine, path))
            assert engine.store.counts(org="acme")["memories"] == memories
        sizes.append(path.stat().st_size)
    assert sizes[1] > 2.5 * sizes[0]
    assert peaks[1] < 1.5 * peaks[0], f"peaks {peaks[0] / 1e6:.1f} and {peaks[1] / 1e6:.1f} MB"
    assert peaks[1] < sizes[1], f"peak {peaks[1] / 1e6:.1f} MB for a {sizes[1] / 1e6:.1f} MB bundle"


def test_malformed_json_anywhere_in_a_file_is_a_bundle_error(engine: dossier.Engine, tmp_path: Path) -> None:
    text = json.dumps(big_bundle(memories=1_200))
    for broken in (text[: len(text) // 2], text + " trailing", "[1, 2]", ""):
        path = tmp_path / "broken.json"
        path.write_text(broken)
        with pytest.raises(BundleError, match="not valid JSON|must be a JSON object"):
            engine.load_bundle(path)
    assert engine.store.get_org(org="acme") is None


@pytest.mark.parametrize(
    "content, says",
    [
        (b'{"orgs": [{"id": "acme"}], "records": [{"id": "r', "ends before the JSON does"),
        (b'{"orgs": [{"id": "\xff\xfe"}]}', "invalid bytes in UTF8 string"),
        (b'{"orgs": [{"id": acme}]}', "invalid char in json text"),
    ],
    ids=["truncated", "not-utf-8", "bad-token"],
)
def test_malformed_json_is_one_line_saying_what_is_wrong(
    engine: dossier.Engine, tmp_path: Path, content: bytes, says: str
) -> None:
    path = tmp_path / "broken.json"
    path.write_bytes(content)
    with pytest.raises(BundleError) as caught:
        engine.load_bundle(path)
    [problem] = caught.value.problems
    assert problem.message.startswith(f"{path} is not valid JSON: ")
    assert says in problem.message
    assert "\n" not in problem.message and "right here" not in problem.message and "b'" not in problem.message


def test_a_bundle_file_may_start_with_a_byte_order_mark(engine: dossier.Engine, tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(big_bundle(memories=10)).encode())
    assert engine.load_bundle(path).inserted["memories"] == 10
    assert len(loading.read_bundle(path).memories) == 10


def test_keys_that_are_not_item_lists_are_skipped_and_reported(engine: dossier.Engine, tmp_path: Path) -> None:
    data = {"meta": {"exported": "2024-01-01", "nested": [{"a": [1, 2, {"b": None}]}]}, **big_bundle(memories=10),
            "extra_list": [{"id": "x"}] * 3}  # fmt: skip
    report = engine.load_bundle(write_file(tmp_path, data))
    assert report.ignored_keys == ["meta", "extra_list"]
    assert report.inserted["memories"] == 10
    with pytest.raises(BundleError, match="'memories' must be a list"):
        engine.load_bundle(write_file(tmp_path, {"orgs": [{"id": "beta"}], "memories": {"id": "m1"}}, "shape.json"))


def test_staged_vectors_spill_to_disk_and_come_back_in_order() -> None:
    vectors = [VectorWrite("acme", "memory", f"m{i}", "r1", f"h{i}", np.full(4, i, dtype=np.float32)) for i in range(25)]
    with loading._Staged(in_memory=10) as staged:
        for v in vectors:
            staged.add(v)
        assert len(staged) == 25 and staged._db is not None  # past 10 rows, the rows went to a file
        back = [v for chunk in staged.chunks(7) for v in chunk]
    assert [(v.key, v.text_hash, float(v.vector[0])) for v in back] == [(v.key, v.text_hash, float(i)) for i, v in enumerate(vectors)]


def test_a_streamed_load_of_new_orgs_on_every_store(store_url: str) -> None:
    """Items come before the vectors in a streamed write, and the first batch already touches the vector
    table (a record's old property vectors are dropped): each new org's vector partition (PostgreSQL) must
    be one the write's own transaction can see. Two new orgs, several chunks, both stores."""
    data = big_bundle()
    other = big_bundle(memories=1_200)
    for list_name, items in other.items():
        data[list_name] = data[list_name] + [{**item, **({"id": "beta"} if list_name == "orgs" else {"org": "beta"})} for item in items]
    with dossier.open(store_url, embedder=HashEmbedder()) as engine:
        report = engine.load_bundle(data)
        assert report.inserted["memories"] == MEMORIES + 1_200
        for org, memories in (("acme", MEMORIES), ("beta", 1_200)):
            counts = engine.store.counts(org=org)
            assert (counts["memories"], counts["vectors"]) == (memories, memories + 50 * 2 + 30)
            text = next(m["text"] for m in data["memories"] if m["id"] == "m7" and m["org"] == org)
            hits = engine.store.search_vectors("memory", HashEmbedder().embed_query(text), org=org, limit=5)
            assert "m7" in {h.id for h in hits if h.score > 0.9999}
        assert engine.load_bundle(data).embedded == 0


def test_a_bundle_file_rewritten_while_it_loads_is_refused_and_nothing_is_written(engine: dossier.Engine, tmp_path: Path) -> None:
    """A load reads its file three times (check, embed, write). A file rewritten after the check would have
    items written that no check saw (a memory of an unknown record) or a text stored with the vector of the
    old one; the load is refused instead, and a load of the file as it now is works."""
    data = big_bundle(memories=40)
    path = write_file(tmp_path, data)
    changed = json.loads(json.dumps(data))
    changed["memories"][0]["record"] = "ghost-record"

    def rewrite() -> None:  # between the check and the embedding
        path.write_text(json.dumps(changed) + " ")

    with pytest.raises(BundleError, match="the file changed while it was being loaded"):
        loading.load_bundle(engine.store, engine.embedder, path, before_write=rewrite)
    assert engine.store.get_org(org="acme") is None  # nothing written
    with pytest.raises(BundleError, match="ghost-record"):  # checked as it is now
        engine.load_bundle(path)
