"""Two-part brief questions about one record ("What pricing did we discuss, and which discount rules
apply?"): the memory the memories source rates best informs the document search (its vector joins the
question's). This bench times that call with the memory's vector read from the store (what the engine does
with a model that embeds queries and documents alike, ``Embedder.symmetric``) against the memory's text
embedded again (what it did before, and still does for other models), alternating call by call in one
process so that the machine's load weighs on both alike. Every question is new (a numbered suffix), so the
query cache never answers the question itself; the lead memories vary with the questions.

Reproduce (from the repository root, after `pip install -e .`; the store is the one ``bench/retrieve.py
--one-record`` builds and keeps under ``--cache``):

    python bench/two_part.py --memories 100000 --cache ~/.cache/dossier-bench --calls 400
    python bench/two_part.py --memories 20000 --cache ~/.cache/dossier-bench

Prints the p50 and p95 of each way, how many calls the memory informed, and the query embedding timed alone
in the same run.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

import corpus
from retrieve import ONE_RECORD, one_record_store, percentile

import dossier
from dossier.providers.embeddings import OnnxMiniLM

FIRST = ["What did we discuss with her last time", "What pricing did we discuss", "What did she ask about the renewal",
         "What did Jane say about the onboarding", "What was agreed on the invoice"]  # fmt: skip
SECOND = ["and which discount rules apply?", "and what does the refund policy say?", "and who approves it?",
          "and what is the process?", "and which policy covers it?"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "dossier-bench"))
    parser.add_argument("--calls", type=int, default=400, help="calls in all, half each way")
    args = parser.parse_args()
    path, _ = one_record_store(args)
    embedder = OnnxMiniLM()
    rng = random.Random(3)

    def question(i: int) -> str:
        return f"{rng.choice(FIRST)} {corpus.question(random.Random(i))[:40]} ({rng.randint(0, 10**6)}), {rng.choice(SECOND)}"

    timings: dict[bool, list[float]] = {True: [], False: []}
    informed = {True: 0, False: 0}
    try:
        with dossier.open(f"sqlite:///{path}", embedder=embedder) as engine:
            for i in range(10):  # warm up
                engine.retrieve({"mode": "brief", "record": ONE_RECORD, "message": question(-i - 1)}, org="northwind", caller="ana")
            for i in range(args.calls):
                stored = i % 2 == 0
                OnnxMiniLM.symmetric = stored  # False: the memory's text is embedded again, as before
                started = time.perf_counter()
                response = engine.retrieve({"mode": "brief", "record": ONE_RECORD, "message": question(i),
                                            "budget": {"totalTokens": 8000}}, org="northwind", caller="ana")  # fmt: skip
                timings[stored].append((time.perf_counter() - started) * 1000)
                informed[stored] += bool(response.route["documents"].detail.get("memory_informed"))
    finally:
        OnnxMiniLM.symmetric = True
    alone = []
    for i in range(200):
        started = time.perf_counter()
        embedder.embed_query(f"a question about prices, number {i}")
        alone.append((time.perf_counter() - started) * 1000)
    for stored, label in ((True, "memory's vector read from the store"), (False, "memory's text embedded again")):
        values = timings[stored]
        print(f"{label:38s} p50 {statistics.median(values):6.2f} ms  p95 {percentile(values, 0.95):6.2f} ms  "
              f"memory-informed {informed[stored]} of {len(values)} calls")  # fmt: skip
    print(f"query embedding alone                  p50 {statistics.median(alone):6.2f} ms")


if __name__ == "__main__":
    main()
