"""Full-text search over a large scope of the SQLite store: the store's search against FTS5's complete ranking.

Reproduce (from the repository root; the stores are those built by bench/retrieve.py and bench/scale.py):

    python bench/fulltext.py DIR/one-record-100000.db --org northwind --scope record:rec-jane
    python bench/fulltext.py DIR/scale-1000000.db --org scale --scope sections
    python bench/fulltext.py DIR/scale-1000000.db --org scale --scope records:21
    python bench/fulltext.py DIR/scale-1000000.db --org scale --scope documents:20

``--scope`` is what is searched: ``record:ID[,ID...]`` (records' memories), ``records:N`` (the memories of
the org's N records holding most memories after the first, as a contact with its aliases), ``sections``
(the org's sections) or ``documents:N`` (the sections of N documents). For each of ``--questions``
distinct questions from bench/corpus.py, in turn: the store's ``search_text`` (pruned above its size
line, ``--line``) and FTS5's complete ``bm25()`` ranking of the same scope with the store's SQL from
before pruning (``complete``), timed alternately, ``--limit`` hits each (100 for memories, 30 for
sections, as the retrieve pipeline asks). Prints one JSON line: p50 / p95 of each, and how the top 10
agree: ``overlap_ids`` (the share of the complete ranking's top 10 ids the store returned in its top
10), ``overlap_tied`` (the share of the store's top 10 scoring at least the complete ranking's 10th:
rows with equal scores are interchangeable, and the bench's texts repeat, so many tie),
``best_equal`` (questions whose best score is the complete ranking's best) and ``scores_exact``
(store hits whose score is bm25()'s for that row, checked over the complete ranking's top 2,000), with
the load average before and after. The first ``--warmup`` questions (each term's first document
frequency is counted then) are not counted. An org of more than 5,000 memories or sections has
full-text tables of its own (``own_tables``), where bm25() counts its rows alone. Where other orgs' rows
share the table (``other_orgs_in_table``: an org of at most 5,000 rows of a kind, in a file holding
others), FTS5's bm25() counts them in its statistics and the store does not (its statistics are each
org's own, docs/scaling.md): the scores then differ by design (``scores_exact`` and ``best_equal`` near
0), and the times and the overlap of ids are what to read; or compare with the store's own complete
ranking over the org's statistics (``--reference store``: the store unpruned):

    python bench/fulltext.py DIR/one-record-20000.db --org northwind --scope record:rec-jane --reference store
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import corpus  # noqa: E402

from dossier.stores.base import TextKind  # noqa: E402
from dossier.stores.fulltext import fts5_query  # noqa: E402
from dossier.stores.sqlite import SQLiteStore  # noqa: E402
from dossier.stores.sqlite_schema import SLOT_BITS  # noqa: E402

def own_number(db: sqlite3.Connection, org: str) -> int | None:
    """The org's number in ``text_tables`` where it has full-text tables of its own."""
    found = db.execute("SELECT number FROM text_tables WHERE org = ?", [org]).fetchone()
    return None if found is None else int(found[0])


def complete(db: sqlite3.Connection, kind: str, query: str, org: str, limit: int, slots: list[int] | None) -> list[tuple]:
    """FTS5's complete ranking, with the SQL the store ran before pruning (slot ranges, bm25(), ties by id),
    over the table holding the org's rows (its own, or the shared one)."""
    number = own_number(db, org)
    suffix = "" if number is None else f"_{number}"
    if kind == "memory":
        fts, table, parent = f"memories_fts{suffix}", "memories", "record"
        rank = f"bm25({fts})"
    else:
        fts, table, parent = f"sections_fts{suffix}", "sections", "document"
        rank = f"bm25({fts}, 0.0, 2.0, 2.0, 1.0)"
    match = fts5_query(query)
    if match is None:
        return []
    if slots is None:
        sql = (f"SELECT c.id, c.{parent}, {rank} AS rank FROM {fts} CROSS JOIN {table} c ON c.rowid = {fts}.rowid "
               f"WHERE {fts} MATCH ? AND c.org = ? ORDER BY rank, 1 LIMIT ?")  # fmt: skip
        return [(i, p, -r) for i, p, r in db.execute(sql, [match, org, limit])]
    if len(slots) == 1:
        scope, params = f"{fts}.rowid BETWEEN ? AND ?", [slots[0] << SLOT_BITS, ((slots[0] + 1) << SLOT_BITS) - 1]
    else:
        scope, params = f"({fts}.rowid >> {SLOT_BITS}) IN ({','.join('?' * len(slots))})", list(slots)
    matched = f"SELECT {fts}.rowid AS rowid, {rank} AS rank FROM {fts} WHERE {fts} MATCH ? AND {scope}"
    joined = f"CROSS JOIN {table} c ON c.rowid = r.rowid WHERE c.org = ?"
    fetch = limit + 32
    rows = db.execute(f"SELECT c.id, c.{parent}, r.rank FROM ({matched} ORDER BY rank LIMIT ?) r {joined} ORDER BY r.rank, 1",
                      [match, *params, fetch, org]).fetchall()  # fmt: skip
    if len(rows) == fetch and rows[limit - 1][2] == rows[-1][2]:
        rows = db.execute(f"SELECT c.id, c.{parent}, r.rank FROM ({matched}) r {joined} AND r.rank <= ? ORDER BY r.rank, 1 LIMIT ?",
                          [match, *params, org, rows[-1][2], limit]).fetchall()  # fmt: skip
    return [(i, p, -r) for i, p, r in rows[:limit]]


def parents(db: sqlite3.Connection, org: str, scope: str) -> tuple[TextKind, list[str] | None]:
    if scope == "sections":
        return "section", None
    name, _, value = scope.partition(":")
    if name == "record":
        return "memory", value.split(",")
    if name == "records":
        rows = db.execute("SELECT record FROM memories WHERE org = ? GROUP BY record ORDER BY count(*) DESC, record LIMIT ?",
                          [org, int(value) + 1]).fetchall()  # fmt: skip
        return "memory", [r[0] for r in rows[1:]]
    if name == "documents":
        rows = db.execute("SELECT id FROM documents WHERE org = ? ORDER BY id LIMIT ?", [org, int(value)]).fetchall()
        return "section", [r[0] for r in rows]
    raise SystemExit(f"unknown --scope {scope!r}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", help="a SQLite store file (opened as the engine opens it; its content is not changed)")
    parser.add_argument("--org", required=True)
    parser.add_argument("--scope", required=True)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--limit", type=int, help="hits per search (default: 100 for memories, 30 for sections)")
    parser.add_argument("--line", type=int, default=30_000, help="the store's text_prune_rows")
    parser.add_argument("--reference", choices=("fts5", "store"), default="fts5",
                        help="the complete ranking to compare with: FTS5's bm25() (default), or the store's own, "
                             "unpruned (the right one where other orgs share the table)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    store = SQLiteStore(args.store, text_prune_rows=args.line)  # opens (and migrates) the file first
    unpruned = SQLiteStore(args.store, text_prune_rows=10**9)
    db = sqlite3.connect(f"file:{args.store}?mode=ro", uri=True, isolation_level=None)
    kind, within = parents(db, args.org, args.scope)
    slots = None if within is None else store._slots(kind, args.org, within)
    limit = args.limit or (100 if kind == "memory" else 30)
    rng = random.Random(7)
    questions: dict[str, None] = {}
    while len(questions) < args.questions + args.warmup:
        questions.setdefault(corpus.question(rng), None)
    times: dict[str, list[float]] = {"store": [], "complete": []}
    ids, tied, best, exact, checked = [], [], 0, 0, 0
    for n, question in enumerate(questions):
        order = ("store", "complete") if n % 2 else ("complete", "store")
        got: dict[str, Any] = {}
        for way in order:
            started = time.perf_counter()
            if way == "store":
                got[way] = [(h.id, h.parent, h.score) for h in store.search_text(kind, question, org=args.org, limit=limit, parents=within)]
            elif args.reference == "store":
                got[way] = [(h.id, h.parent, h.score) for h in unpruned.search_text(kind, question, org=args.org, limit=limit, parents=within)]
            else:
                got[way] = complete(db, kind, question, args.org, limit, slots)
            if n >= args.warmup:
                times[way].append((time.perf_counter() - started) * 1000)
        if n < args.warmup:
            continue
        mine, reference = got["store"][:10], got["complete"][:10]
        if not reference:
            continue
        ids.append(len({h[0] for h in mine} & {h[0] for h in reference}) / len(reference))
        tied.append(sum(1 for h in mine if h[2] >= reference[-1][2]) / len(reference))
        best += bool(mine) and mine[0][2] == reference[0][2]
        scores = {h[0]: h[2] for h in (
            complete(db, kind, question, args.org, 2000, slots) if args.reference == "fts5" else
            [(h.id, h.parent, h.score) for h in unpruned.search_text(kind, question, org=args.org, limit=2000, parents=within)]
        )}  # fmt: skip
        for h in mine:
            if h[0] in scores:
                checked += 1
                exact += h[2] == scores[h[0]]
    out = {
        "store": args.store, "org": args.org, "scope": args.scope, "kind": kind, "parents": len(within or []),
        "scope_rows": store._text.scope_rows(kind, 10**9, org=args.org, slots=slots), "line": args.line, "reference": args.reference, "limit": limit,
        "questions": len(times["store"]),
        **{f"{way}_p50_ms": round(statistics.median(v), 2) for way, v in times.items()},
        **{f"{way}_p95_ms": round(percentile(v, 0.95), 2) for way, v in times.items()},
        "overlap_ids": round(statistics.mean(ids), 3) if ids else None,
        "overlap_tied": round(statistics.mean(tied), 3) if tied else None,
        "best_equal": f"{best}/{len(ids)}", "scores_exact": f"{exact}/{checked}",
        "own_tables": own_number(db, args.org) is not None,
        "other_orgs_in_table": own_number(db, args.org) is None and bool(db.execute(
            f"SELECT EXISTS (SELECT 1 FROM {'memories' if kind == 'memory' else 'sections'} WHERE org != ?)", [args.org]).fetchone()[0]),
        "load_average_before": [round(x, 2) for x in load_before], "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip
    print(json.dumps(out))
    store.close()
    unpruned.close()


if __name__ == "__main__":
    main()
