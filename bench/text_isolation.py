"""Whether one org's full-text search takes longer when another org in the same SQLite file holds the word.

Reproduce (from the repository root):

    python bench/text_isolation.py                       # 5,000 documents of 8 sections in the other org
    python bench/text_isolation.py --other-documents 20000 --searches 400
    python bench/text_isolation.py --postgres DIR      # the same on PostgreSQL (a pgserver kept under DIR)
    python bench/text_isolation.py --postgres DIR --own-documents 1500 --own-memories 6000   # org a large too

Builds two SQLite files in a temporary directory (or two PostgreSQL databases), each with two orgs: ``a``
(``--own-documents`` documents of 5 sections, default 40, one of them holding the word "zanzibar", and one
record of ``--own-memories`` memories, default 40, one holding it) and ``b``
(``--other-documents`` documents of 8 sections and as many memories). In the first file every section and
memory of ``b`` holds the word; in the second none does (another word in its place, the same lengths).
Then times ``search_text`` of org ``a`` for the word: org-wide over sections, and among the record's
memories, ``--searches`` times each (each search in both files in turn, which file goes first
alternating), and prints one JSON line with the p50 of each search in each file,
their ratio (``with / without``) and the load average. The hits must be the same in both files.

A search that matches an FTS5 index holding every org's rows reads the word's postings across orgs before
keeping the org's own, so its cost grows with what the other org holds (a timing channel between orgs).
In SQLite an org of at most 5,000 rows of a kind reads its own rows alone, kept in the process, and a
larger one has full-text tables of its own (schema version 5); on PostgreSQL every org's full text is its
own partition with its own GIN index (docs/retrieve.md, "What one org can learn of another"): the ratio
should be near 1, for a small and a large org ``a``, on both stores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))  # bench/scale.py's pgserver, for --postgres

from dossier.bundle import Document, Memory, Org, Section  # noqa: E402
from dossier.stores.base import WriteBatch  # noqa: E402
from dossier.stores.sqlite import SQLiteStore  # noqa: E402

WORD, OTHER_WORD = "zanzibar", "quokka"
FILLER = "discount renewal contract pricing seats approval quote refund invoice escalation".split()
WHEN = datetime(2025, 1, 1, tzinfo=timezone.utc)


def build(store: Any, other_documents: int, other_holds_word: bool, own_documents: int = 40, own_memories: int = 40) -> Any:
    rng = random.Random(3)

    def text(extra: str = "") -> str:
        return " ".join(rng.choice(FILLER) for _ in range(12)) + extra

    batch = WriteBatch(orgs=[Org(id="a"), Org(id="b")])
    for d in range(own_documents):
        sections = tuple(Section(id=f"a-d{d}-s{s}", heading="Heading", text=text(f" {WORD}" if d == s == 0 else ""))
                         for s in range(5))  # fmt: skip
        batch.documents.append((Document(id=f"a-d{d}", org="a", title="Policy", sections=sections), f"a{d}"))
    for m in range(own_memories):
        memory = Memory(id=f"a-m{m}", org="a", record="a-r", text=text(f" {WORD}" if m == 0 else ""), created_at=WHEN)
        batch.memories.append((memory, f"am{m}"))
    extra = f" {WORD if other_holds_word else OTHER_WORD}"
    for d in range(other_documents):
        sections = tuple(Section(id=f"b-d{d}-s{s}", heading="Heading", text=text(extra)) for s in range(8))
        batch.documents.append((Document(id=f"b-d{d}", org="b", title="Policy", sections=sections), f"b{d}"))
        batch.memories.append((Memory(id=f"b-m{d}", org="b", record=f"b-r{d % 50}", text=text(extra), created_at=WHEN), f"bm{d}"))
    store.write(batch)
    return store


def open_store(postgres: str | None, tmp: str, name: str) -> Any:
    if postgres is None:
        return SQLiteStore(Path(tmp) / f"{name}.db")
    from dossier.stores.postgres import PostgresStore
    from scale import fresh_pg_database, pg_server

    return PostgresStore(fresh_pg_database(pg_server(Path(postgres)).get_uri(), f"isolation_{name}"))


def alternated(stores: dict[Any, Any], rounds: int, search: Callable[[Any, int], list[Any]]) -> tuple[dict[Any, float], dict[Any, list[str]]]:
    """``search(store, n)`` timed for each round ``n`` in every store in turn, which store goes first
    alternating (so that no store's figures carry the order they were measured in): each store's p50 in
    ms, and the ids of its last hits."""
    labels = list(stores)
    times: dict[Any, list[float]] = {label: [] for label in labels}
    found: dict[Any, list[str]] = {}
    for n in range(rounds):
        for label in labels if n % 2 else labels[::-1]:
            started = time.perf_counter()
            hits = search(stores[label], n)
            times[label].append((time.perf_counter() - started) * 1000)
            found[label] = [h.id for h in hits]
    return {label: round(statistics.median(t), 4) for label, t in times.items()}, found


def timed(stores: dict[bool, Any], searches: int) -> tuple[dict[bool, dict[str, float]], dict[bool, list[list[str]]]]:
    kinds = {"sections": ("section", None), "memories": ("memory", ["a-r"])}
    out: dict[bool, dict[str, float]] = {holds: {} for holds in stores}
    hits: dict[bool, list[list[str]]] = {holds: [] for holds in stores}
    for name, (kind, parents) in kinds.items():
        p50, found = alternated(stores, searches, lambda store, _: store.search_text(kind, WORD, org="a", limit=10, parents=parents))
        for holds in stores:
            out[holds][name] = p50[holds]
            hits[holds].append(found[holds])
    return out, hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other-documents", type=int, default=5000)
    parser.add_argument("--own-documents", type=int, default=40, help="org a's documents (5 sections each)")
    parser.add_argument("--own-memories", type=int, default=40, help="org a's memories (one record)")
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--postgres", metavar="DIR", help="measure PostgreSQL instead (a pgserver kept under DIR)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        stores = {}
        try:
            for holds in (True, False):
                stores[holds] = build(open_store(args.postgres, tmp, f"holds_{str(holds).lower()}"), args.other_documents,
                                      holds, args.own_documents, args.own_memories)  # fmt: skip
            results, answers = timed(stores, args.searches)
        finally:
            for store in stores.values():
                store.close()
    assert answers[True] == answers[False], answers
    report = {
        "store": "postgres" if args.postgres else "sqlite",
        "own_rows": {"sections": 5 * args.own_documents, "memories": args.own_memories},
        "other_org_rows_holding_the_word": {"sections": 8 * args.other_documents, "memories": args.other_documents},
        "p50_ms_with": results[True], "p50_ms_without": results[False],
        "with_over_without": {k: round(results[True][k] / results[False][k], 2) for k in results[True]},
        "hits": answers[True], "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }  # fmt: skip
    print(json.dumps(report))


if __name__ == "__main__":
    main()
