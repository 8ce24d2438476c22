"""Hybrid retrieval on PostgreSQL: fuse vector and full-text hits in Python (as dossier does) or in SQL?

Reproduce (after `python bench/scale.py --levels 1000000 --stores postgres`, whose database it reads):

    python bench/fusion.py                                  # the scale bench's 1M database (pgserver)
    python bench/fusion.py --url postgresql://... --org scale

For each of ``--queries`` questions (bench/corpus.py) it runs the two hybrid searches of a brief call,
sections over the whole org and a record's memories, two ways, alternating so both see the same caches:

* **python**: ``store.search_vectors`` and ``store.search_text`` (two round trips), then reciprocal rank
  fusion in Python (``dossier.sources.documents.rrf``), which is what the engine does on both stores;
* **sql**: the very same two statements as common table expressions of one statement that ranks each
  list with ``row_number()`` and fuses them with ``sum(weight / (k + rank))``: one round trip.

It checks that both give the same fused order and prints the median and p95 of each, and their ratio.
Query embedding is done once per question beforehand and not timed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import corpus  # noqa: E402

from dossier.providers.embeddings import OnnxMiniLM  # noqa: E402
from dossier.sources.documents import rrf  # noqa: E402
from dossier.stores.postgres import PostgresStore  # noqa: E402

K, TEXT_WEIGHT, LIMIT = 60, 1.0, 40


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Captured:
    """The statements a store method runs (so that the SQL variant runs exactly the same ones)."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.statements: list[tuple[str, list, int | None]] = []
        self._query = store._query  # the full-text search runs its statements through it too

    def __enter__(self) -> "Captured":
        def query(org: str, sql: Any, params: Any = (), *, ef_search: int | None = None) -> list[tuple]:
            self.statements.append((str(sql), list(params), ef_search))
            return self._query(org, sql, params, ef_search=ef_search)

        self.store._query = query  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        del self.store._query  # back to the class's method


def python_fusion(store: PostgresStore, kind: str, vector: Any, question: str, org: str, parents: list[str] | None) -> list[str]:
    by_vector = store.search_vectors(kind, vector, org=org, limit=LIMIT, parents=parents)  # type: ignore[arg-type]
    by_text = store.search_text(kind, question, org=org, limit=LIMIT, parents=parents)  # type: ignore[arg-type]
    fused = rrf([by_vector, by_text], K, [1.0, TEXT_WEIGHT])
    return sorted(fused, key=lambda i: (-fused[i], i))


def sql_statement(store: PostgresStore, kind: str, vector: Any, question: str, org: str,
                  parents: list[str] | None) -> tuple[str, list, int | None] | None:  # fmt: skip
    """The one fused statement, or None when the text search needed more than one statement (statistics)."""
    with Captured(store) as captured:
        store.search_vectors(kind, vector, org=org, limit=LIMIT, parents=parents)  # type: ignore[arg-type]
        store.search_text(kind, question, org=org, limit=LIMIT, parents=parents)  # type: ignore[arg-type]
    if len(captured.statements) != 2:
        return None
    (v_sql, v_params, ef), (t_sql, t_params, _) = captured.statements
    statement = (
        f"WITH v AS ({v_sql}), t AS ({t_sql}) "
        "SELECT id, sum(w / (%b + r)) AS s FROM ("
        "  SELECT key AS id, row_number() OVER (ORDER BY d, key) AS r, 1.0::float8 AS w FROM v"
        "  UNION ALL SELECT id, row_number() OVER (ORDER BY score DESC, id), %b::float8 FROM t"
        ") x GROUP BY id ORDER BY s DESC, id"
    )
    return statement, [*v_params, *t_params, float(K), TEXT_WEIGHT], ef


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="postgresql://dossier_bench:dossier-bench@/scale_1000000?host=/tmp/dossier-scale/pg/pgdata",
                        help="the store (default: the scale bench's 1M database under its default --workdir)")  # fmt: skip
    parser.add_argument("--org", default="scale")
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    store = PostgresStore(args.url)
    model = OnnxMiniLM()
    rng = random.Random(21)
    records = [r[0] for r in store._query(args.org, "SELECT id FROM records WHERE org = %b AND kind = 'contact' LIMIT 2000", [args.org])]
    questions = [corpus.question(rng) for _ in range(args.queries + 20)]
    vectors = model.embed_batch(questions, kind="query")
    timings: dict[str, list[float]] = {f"{k} {w}": [] for k in ("section", "memory") for w in ("python", "sql")}
    mismatches = 0
    for n, (question, vector) in enumerate(zip(questions, vectors)):
        for kind in ("section", "memory"):
            parents = None if kind == "section" else [rng.choice(records)]
            python_fusion(store, kind, vector, question, args.org, parents)  # warms the text statistics
            fused = sql_statement(store, kind, vector, question, args.org, parents)
            if fused is None:
                continue
            statement, params, ef = fused
            order = ("python", "sql") if n % 2 else ("sql", "python")
            for way in order:
                started = time.perf_counter()
                if way == "python":
                    ids = python_fusion(store, kind, vector, question, args.org, parents)
                else:
                    rows = store._query(args.org, statement, params, ef_search=ef)
                elapsed = (time.perf_counter() - started) * 1000
                if n >= 20:
                    timings[f"{kind} {way}"].append(elapsed)
            mismatches += [r[0] for r in rows] != ids
    print(f"{args.queries} questions on {args.url.split('@')[-1]}; fused orders that differ: {mismatches}")
    for kind in ("section", "memory"):
        py, sq = timings[f"{kind} python"], timings[f"{kind} sql"]
        print(f"{kind:8s} python fusion p50 {statistics.median(py):6.2f} ms p95 {percentile(py, 0.95):6.2f} | "
              f"sql fusion p50 {statistics.median(sq):6.2f} ms p95 {percentile(sq, 0.95):6.2f} | "
              f"sql / python {statistics.median(sq) / statistics.median(py):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
