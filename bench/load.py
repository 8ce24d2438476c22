"""Load throughput and query-embedding latency of the embedded store, embeddings included.

Reproduce (from the repository root, after `pip install -e .`):

    python bench/load.py                      # 2,000 memories + 400 sections, 200 query embeddings
    python bench/load.py --memories 5000 --sections 1000 --queries 500

Prints memories/s and sections/s (each timed as its own load into a fresh SQLite file, embedding
with the default local ONNX MiniLM model) and the p50/p95 of embedding one short question.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import corpus  # noqa: E402

import dossier  # noqa: E402
from dossier.providers.embeddings import OnnxMiniLM  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=2000)
    parser.add_argument("--sections", type=int, default=400)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    embedder = OnnxMiniLM()
    embedder.embed_query("warm up")
    with tempfile.TemporaryDirectory() as tmp:
        mem_bundle = corpus.bundle("bench", memories=args.memories, sections=0, records=100)
        mem_bundle["records"] = [dict(r, properties={}) for r in mem_bundle["records"]]
        with dossier.open(f"sqlite:///{tmp}/m.db", embedder=embedder) as engine:
            started = time.perf_counter()
            report = engine.load_bundle(mem_bundle)
            mem_seconds = time.perf_counter() - started
            again = engine.load_bundle(mem_bundle)
        sec_bundle = corpus.bundle("bench", memories=0, sections=args.sections, records=1)
        sec_bundle["records"] = [dict(r, properties={}) for r in sec_bundle["records"]]
        with dossier.open(f"sqlite:///{tmp}/s.db", embedder=embedder) as engine:
            started = time.perf_counter()
            engine.load_bundle(sec_bundle)
            sec_seconds = time.perf_counter() - started
    rng = random.Random(3)
    latencies = []
    for _ in range(args.queries):
        q = corpus.question(rng) + f" ({rng.randint(0, 10**6)})"  # no cache hits
        t = time.perf_counter()
        embedder.embed_query(q)
        latencies.append((time.perf_counter() - t) * 1000)
    print(f"load: {args.memories} memories in {mem_seconds:.2f} s = {args.memories / mem_seconds:.0f} memories/s "
          f"(embedded {report.embedded}); reload: {again.total_inserted} inserted, {again.embedded} embedded")  # fmt: skip
    print(f"load: {args.sections} sections in {sec_seconds:.2f} s = {args.sections / sec_seconds:.0f} sections/s")
    print(f"query embedding over {args.queries} questions: p50 {statistics.median(latencies):.2f} ms, "
          f"p95 {percentile(latencies, 0.95):.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
