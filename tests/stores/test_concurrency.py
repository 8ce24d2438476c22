"""Several processes, each with its own engine on the same store (one SQLite file, one PostgreSQL
database), loading different items and retrieving at the same time: no row is lost or duplicated,
and each process reads its own writes."""

from __future__ import annotations

import multiprocessing
import traceback
from typing import Any

import dossier

WORKERS, ROUNDS, PER_ROUND = 4, 3, 5
ORG = "acme"


def _base() -> dict[str, Any]:
    records = [{"id": "r-shared", "org": ORG, "kind": "contact", "identifiers": {"email": "shared@acme.com"}}]
    records += [
        {"id": f"r-{w}", "org": ORG, "kind": "contact", "identifiers": {"email": f"worker{w}@corp{w}.com"},
         "properties": {"plan": "Enterprise", "seats": 10 + w}}
        for w in range(WORKERS)
    ]  # fmt: skip
    return {
        "orgs": [{"id": ORG}],
        "callers": [{"id": "ana", "org": ORG, "roles": ["sales"]}],
        "records": records,
        "memories": [{"id": "m-shared", "org": ORG, "record": "r-shared", "text": "Shared note.", "created_at": "2024-01-01T00:00:00Z"}],
        "documents": [{"id": "d-pricing", "org": ORG, "title": "Pricing", "sections": [
            {"id": "s-discounts", "heading": "Discounts", "text": "Discounts above 20% need approval from the VP of Sales."}]}],
    }  # fmt: skip


def _round(worker: int, n: int) -> dict[str, Any]:
    """Worker ``worker``'s ``n``-th load: memories of its own record, and its version of the shared memory."""
    topics = ["invoices", "the renewal", "a discount", "onboarding", "the security review"]
    memories = [
        {"id": f"m-{worker}-{n}-{i}", "org": ORG, "record": f"r-{worker}",
         "text": f"Worker {worker} call {n}.{i}: the customer asked about {topics[i % len(topics)]}.",
         "created_at": f"2024-02-{1 + n:02d}T{worker:02d}:{i:02d}:00Z"}
        for i in range(PER_ROUND)
    ]  # fmt: skip
    memories.append({"id": "m-shared", "org": ORG, "record": "r-shared", "text": f"Shared note, as worker {worker} last wrote it.",
                     "created_at": "2024-01-01T00:00:00Z"})  # fmt: skip
    return {"memories": memories}


def _worker(url: str, worker: int, barrier: Any, results: Any) -> None:
    try:
        from dossier.providers.embeddings import OnnxMiniLM

        with dossier.open(url, embedder=OnnxMiniLM()) as engine:
            engine.embed_query("warm up")
            barrier.wait(timeout=120)
            for n in range(ROUNDS):
                engine.load_bundle(_round(worker, n))
                response = engine.retrieve(
                    {"mode": "brief", "record": {"email": f"worker{worker}@corp{worker}.com"},
                     "message": "What did the customer ask about the renewal, and which discounts need approval?"},
                    org=ORG, caller="ana",
                )  # fmt: skip
                assert not response.partial, response.model_dump_json()
                recent = {m.id for m in response.sources["memories"].items if m.tier == "recent"}
                mine = {f"m-{worker}-{k}-{i}" for k in range(n + 1) for i in range(PER_ROUND)}
                assert mine <= recent, f"worker {worker} round {n} misses its own writes: {sorted(mine - recent)}"
                assert response.sources["documents"].status == "ok"
        results.put((worker, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((worker, traceback.format_exc()))


def test_processes_loading_and_retrieving_at_once_lose_and_duplicate_nothing(store_url: str, embedder: Any) -> None:
    with dossier.open(store_url, embedder=embedder) as engine:
        engine.load_bundle(_base())
    ctx = multiprocessing.get_context("spawn")  # no inherited connections or threads
    barrier, results = ctx.Barrier(WORKERS), ctx.Queue()
    processes = [ctx.Process(target=_worker, args=(store_url, w, barrier, results)) for w in range(WORKERS)]
    for p in processes:
        p.start()
    outcomes = dict(results.get(timeout=300) for _ in processes)
    for p in processes:
        p.join(timeout=60)
    assert outcomes == {w: None for w in range(WORKERS)}, "\n".join(filter(None, outcomes.values()))

    with dossier.open(store_url, embedder=embedder) as engine:
        store = engine.store
        expected = {"m-shared"} | {f"m-{w}-{n}-{i}" for w in range(WORKERS) for n in range(ROUNDS) for i in range(PER_ROUND)}
        counts = store.counts(org=ORG)
        assert counts["memories"] == len(expected)  # nothing lost, nothing twice
        assert {m.id for m in store.get_memories(sorted(expected), org=ORG)} == expected
        assert counts["vectors"] == len(expected) + 1 + 2 * WORKERS  # memories, the section, two properties each
        assert store.vector_hashes("memory", sorted(expected), org=ORG).keys() == expected
        assert counts["records"] == WORKERS + 1 and counts["sections"] == 1
        [shared] = store.get_memories(["m-shared"], org=ORG)
        assert shared.text in {f"Shared note, as worker {w} last wrote it." for w in range(WORKERS)}
        # the shared memory's text, full-text row and vector agree: whichever worker wrote last wrote all three
        assert [h.id for h in store.search_text("memory", shared.text, org=ORG, limit=1, parents=["r-shared"])] == ["m-shared"]
        vector = store.search_vectors("memory", embedder.embed_query(shared.text), org=ORG, limit=1, parents=["r-shared"])
        assert vector[0].score > 0.99
        for w in range(WORKERS):
            found = store.search_text("memory", f"worker {w}", org=ORG, limit=50, parents=[f"r-{w}"])
            assert len(found) == ROUNDS * PER_ROUND
