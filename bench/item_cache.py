"""What the SQLite store's documents and memories kept between calls (``stores/sqlite_cache.py``) save a
brief call: calls about one record alternate, call by call in one process, between the store answering
``get_documents`` and ``get_memories`` from what it keeps (as it does) and reading every row again (as it
did before), so that the machine's load weighs on both alike. Every question is new (a numbered suffix):
what is kept between calls is what earlier, other questions read.

Reproduce (from the repository root, after `pip install -e .`; the store is the one ``bench/retrieve.py
--one-record`` builds and keeps under ``--cache``; ``--sample-only`` times the sample org's records instead):

    python bench/item_cache.py --memories 100000 --cache ~/.cache/dossier-bench --calls 600
    python bench/item_cache.py --memories 20000 --cache ~/.cache/dossier-bench
    python bench/item_cache.py --sample-only

Prints the p50 and p95 of each way, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from typing import Any

import corpus
from retrieve import ONE_RECORD, SAMPLE, SAMPLE_QUESTIONS, SAMPLE_RECORDS, one_record_store, percentile, unique_questions

import dossier
from dossier.providers.embeddings import OnnxMiniLM


def read_again(ids: Any, *, org: str, read: Any) -> Any:
    """A store cache's ``get`` that keeps nothing: every row read, as before the cache."""
    return read(list(dict.fromkeys(ids)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "dossier-bench"))
    parser.add_argument("--calls", type=int, default=600, help="timed calls, half each way")
    parser.add_argument("--sample-only", action="store_true", help="the sample org's records, in a fresh file")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    embedder = OnnxMiniLM()
    embedder.embed_query("warm up")
    evaluation = json.loads(SAMPLE_QUESTIONS.read_text(encoding="utf-8"))["questions"]
    pool = [q["message"] for q in evaluation if q["org"] == "northwind" and q.get("message")]
    pool += [corpus.question(random.Random(i)) for i in range(200)]
    questions = unique_questions(pool, random.Random(31), args.calls + 20, set())
    with tempfile.TemporaryDirectory() as scratch:
        if args.sample_only:
            url, records = f"sqlite:///{scratch}/sample.db", SAMPLE_RECORDS
        else:
            path, _ = one_record_store(args)
            url, records = f"sqlite:///{path}", [ONE_RECORD]
        with dossier.open(url, embedder=embedder) as engine:
            if args.sample_only:
                engine.load_bundle(json.loads(SAMPLE.read_text(encoding="utf-8")))
            store = engine.store
            kept = {"documents": store._documents.get, "memories": store._memories.get}
            timed: dict[bool, list[float]] = {True: [], False: []}
            for n, question in enumerate(questions):
                use = n % 2 == 0
                store._documents.get = kept["documents"] if use else read_again
                store._memories.get = kept["memories"] if use else read_again
                request = {"mode": "brief", "record": records[n % len(records)], "message": question,
                           "budget": {"totalTokens": 8000}}  # fmt: skip
                started = time.perf_counter()
                engine.retrieve(request, org="northwind", caller="ana")
                if n >= 20:  # the first calls warm up
                    timed[use].append((time.perf_counter() - started) * 1000)
            store._documents.get, store._memories.get = kept["documents"], kept["memories"]
    where = "the sample org" if args.sample_only else f"one record of {args.memories:,} memories"
    print(f"brief calls about {where}, {len(timed[True])} each way, load average {load_before:.2f} -> {os.getloadavg()[0]:.2f}")
    for use, label in ((True, "documents and memories kept"), (False, "every row read again")):
        values = timed[use]
        print(f"  {label:28s} p50 {statistics.median(values):6.2f} ms   p95 {percentile(values, 0.95):6.2f} ms")


if __name__ == "__main__":
    main()
