"""PolicyQA as section selection: BM25 vs vector vs dossier's fetch call, side by side.

Reproduce (from the repository root, after `pip install -e .`; the data is read-only in ../shared/data):

    python bench/policyqa.py                        # all 3,809 dev questions over 20 policies
    python bench/policyqa.py --limit 200            # a quick run on the first 200 questions
    python bench/policyqa.py --data /path/to/data   # or DOSSIER_SHARED_DATA=/path/to/data

Each policy is one document, each segment one section, loaded into a fresh temporary SQLite file with
the default local ONNX MiniLM model. Every question ranks the sections of its own policy three ways:

* bm25     -- the store's full-text search restricted to that document's sections (FTS5 BM25);
              sections sharing no term with the question are not ranked at all;
* vector   -- the store's exact cosine search over that document's sections;
* dossier  -- `engine.retrieve` in fetch mode ({"fetch": [doc], "message": question}, budget 50,000
              bytes), sections in the order returned.

acc@1: the gold segment (the one holding the answer span) is ranked first; r@k: it is among the first k.
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
K = 5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help=f"directory holding {ext.POLICYQA_FILE} (default: ${ext.DATA_ENV} or ../shared/data)")
    parser.add_argument("--limit", type=int, default=None, help="ask only the first N questions")
    parser.add_argument("--split", choices=ext.SPLITS, default="all",
                        help="the rankers' training or held-out split (bench/train_ranker.py), or all")
    args = parser.parse_args()
    path = ext.data_dir(args.data, repo_root=REPO) / ext.POLICYQA_FILE
    if not path.is_file():
        print(f"skipped: data not found at {path}")
        return 0
    squad = ext.read_json(path)
    yardstick = ext.load_policyqa(squad)
    questions = ext.on_side(yardstick.questions, args.split, "document_id")
    questions = questions[: args.limit] if args.limit else questions
    wanted = {q.document_id for q in questions}
    bundle = dict(yardstick.bundle, documents=[d for d in yardstick.bundle["documents"] if d["id"] in wanted])

    with tempfile.TemporaryDirectory() as tmp, dossier.open(f"sqlite:///{tmp}/policyqa.db") as engine:
        started = time.perf_counter()
        engine.load_bundle(bundle)
        load_seconds = time.perf_counter() - started
        engine.embed_query("warm up")
        runs = {
            "bm25": lambda q: ext.sections_bm25(engine, q, K),
            "vector": lambda q: ext.sections_vector(engine, q, K),
            "dossier": lambda q: ext.sections_pipeline(engine, q),
        }
        rankings: dict[str, dict[str, list[str]]] = {name: {} for name in runs}
        latency: dict[str, list[float]] = {"embed": [], **{name: [] for name in runs}}
        for q in questions:
            t = time.perf_counter()
            engine.embed_query(q.question)
            latency["embed"].append((time.perf_counter() - t) * 1000)
            for name, run in runs.items():
                t = time.perf_counter()
                rankings[name][q.id] = run(q)
                latency[name].append((time.perf_counter() - t) * 1000)

    scores = {name: ext.score_sections(questions, ranking) for name, ranking in rankings.items()}
    sections = sum(len(d["sections"]) for d in bundle["documents"])
    print(f"PolicyQA dev: {len(bundle['documents'])} policies, {sections} segments, {len(questions)} questions; "
          f"loaded in {load_seconds:.1f} s")  # fmt: skip
    header = ["method", "n", "acc@1", "r@3", "r@5"]
    print(ext.table(header, [[name, int(s["n"]), s["acc@1"], s["r@3"], s["r@5"]] for name, s in scores.items()]))
    print()
    size = {d["id"]: len(d["sections"]) for d in bundle["documents"]}
    chance = statistics.mean(1 / size[q.document_id] for q in questions)
    print(f"segments per policy: median {statistics.median(size.values()):g}, min {min(size.values())}, "
          f"max {max(size.values())}; a random ranking would score acc@1 {chance:.3f} on these questions")  # fmt: skip
    unranked = sum(1 for q in questions if not rankings["bm25"][q.id])
    print(f"bm25 ranked nothing for {unranked} of {len(questions)} questions (no shared term after stop words)")
    print("latency per question, ms (p50 / p95): " + ", ".join(
        f"{name} {_pct(v, 0.5):.1f} / {_pct(v, 0.95):.1f}" for name, v in latency.items())
          + " (the question is embedded once, first, and cached for all three)")  # fmt: skip
    if yardstick.notes:
        print(f"data notes ({len(yardstick.notes)}): " + "; ".join(yardstick.notes[:10]))
    return 0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else 0.0


if __name__ == "__main__":
    sys.exit(main())
