"""LoCoMo as memory retrieval: BM25 vs vector vs dossier's full retrieve call, side by side.

Reproduce (from the repository root, after `pip install -e .`; the data is read-only in ../shared/data):

    python bench/locomo.py                          # all questions with evidence, conversations 1-5
    python bench/locomo.py --limit 50               # a quick run on the first 50 questions
    python bench/locomo.py --data /path/to/data     # or DOSSIER_SHARED_DATA=/path/to/data

Each conversation is one record, each dialog turn one memory (created_at = its session's date), loaded
into a fresh temporary SQLite file with the default local ONNX MiniLM model. Every question is asked
about its conversation's record three ways:

* bm25     -- the store's full-text search over that record's memories (FTS5 BM25), top 10;
* vector   -- the store's exact cosine search over that record's memories, top 10;
* dossier  -- `engine.retrieve` (mode scout, memories only, budget 50,000 bytes), memories in the order
              returned: the memory ranker's best (tier 2, at most 10, and recent memories it ranks among
              its first 10) first, then the rest of the record's 25 most recent memories.

any@k: at least one evidence turn among the first k memories; all@k: every evidence turn among them.
Categories are LoCoMo's official ids (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial).
Prints "skipped: data not found at ..." and exits 0 when the data is absent.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import dossier
from dossier.evaluation import external as ext

REPO = Path(__file__).resolve().parents[1]
K = 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help=f"directory holding {ext.LOCOMO_FILE} (default: ${ext.DATA_ENV} or ../shared/data)")
    parser.add_argument("--limit", type=int, default=None, help="ask only the first N questions")
    parser.add_argument("--split", choices=ext.SPLITS, default="all",
                        help="the rankers' training or held-out split (bench/train_ranker.py), or all")
    args = parser.parse_args()
    path = ext.data_dir(args.data, repo_root=REPO) / ext.LOCOMO_FILE
    if not path.is_file():
        print(f"skipped: data not found at {path}")
        return 0
    samples = ext.read_json(path)
    yardstick = ext.load_locomo(samples)
    questions = ext.on_side(yardstick.questions, args.split, "record_id")
    questions = questions[: args.limit] if args.limit else questions
    # load only the conversations the asked questions need
    wanted = {q.record_id for q in questions}
    bundle = ext.locomo_bundle([s for s in samples if s["sample_id"] in wanted])

    with tempfile.TemporaryDirectory() as tmp, dossier.open(f"sqlite:///{tmp}/locomo.db") as engine:
        started = time.perf_counter()
        engine.load_bundle(bundle)
        load_seconds = time.perf_counter() - started
        engine.embed_query("warm up")
        rankings: dict[str, dict[str, list[str]]] = {"bm25": {}, "vector": {}, "dossier": {}}
        latency: dict[str, list[float]] = {"embed": [], **{name: [] for name in rankings}}
        semantic_counts: list[int] = []
        returned_counts: list[int] = []
        for q in questions:
            t = time.perf_counter()
            engine.embed_query(q.question)
            latency["embed"].append((time.perf_counter() - t) * 1000)
            for name, run in (("bm25", lambda: ext.memories_bm25(engine, q, K)),
                              ("vector", lambda: ext.memories_vector(engine, q, K))):  # fmt: skip
                t = time.perf_counter()
                rankings[name][q.id] = run()
                latency[name].append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            ids, tiers = ext.memories_pipeline(engine, q)
            latency["dossier"].append((time.perf_counter() - t) * 1000)
            rankings["dossier"][q.id] = ids
            semantic_counts.append(tiers.count("semantic"))
            returned_counts.append(len(ids))

    scores = {name: ext.score_memories(questions, ranking, ks=(5, 10)) for name, ranking in rankings.items()}
    methods = list(rankings)
    tables = []
    for measure, meaning in (("any", "at least one evidence turn"), ("all", "every evidence turn")):
        header = ["category", "n"] + [f"{name}@{k}" for k in (5, 10) for name in methods]
        rows = [
            [category, int(row["n"])] + [scores[name][category][f"{measure}@{k}"] for k in (5, 10) for name in methods]
            for category, row in scores["bm25"].items()
        ]
        tables.append(f"{measure}@k: {meaning} among the first k memories\n" + ext.table(header, rows))

    turns = len(bundle["memories"])
    print(f"LoCoMo dev: {len(wanted)} conversations, {turns} turns, {len(questions)} questions "
          f"(of {len(yardstick.questions)} with usable evidence); loaded in {load_seconds:.1f} s")  # fmt: skip
    print("\n\n".join(tables))
    print()
    short5, short10 = (sum(1 for c in semantic_counts if c < k) for k in (5, 10))
    print(f"dossier returned {statistics.mean(returned_counts):.1f} memories per question on average, "
          f"of which {statistics.mean(semantic_counts):.2f} semantic (tier 2); {short5} questions had "
          f"fewer than 5 semantic hits and {short10} fewer than 10. The ranker lists tier 2 and the recent "
          f"turns it ranks among its first 10 first, then the rest of the 25 most recent turns.")  # fmt: skip
    print("latency per question, ms (p50 / p95): " + ", ".join(
        f"{name} {_pct(v, 0.5):.1f} / {_pct(v, 0.95):.1f}" for name, v in latency.items())
          + " (the question is embedded once, first, and cached for all three)")  # fmt: skip
    if yardstick.notes:
        print(f"data notes ({len(yardstick.notes)}): " + "; ".join(yardstick.notes))
    return 0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else 0.0


if __name__ == "__main__":
    sys.exit(main())
