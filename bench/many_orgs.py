"""What a SQLite file holding many small orgs costs: each org's first write, a search, and opening the file.

Reproduce (from the repository root):

    python bench/many_orgs.py                  # 1,000 orgs of one memory each
    python bench/many_orgs.py --orgs 5000
    python bench/many_orgs.py --postgres DIR   # the same on PostgreSQL (a pgserver kept under DIR)

Builds a file in a temporary directory (or a PostgreSQL database), writes ``--orgs`` orgs one after the other (each its org row and
one memory, one write each), then times ``--searches`` full-text searches spread over the orgs, opening
the file again in this process, and that store's first search. Prints one JSON line: the mean time of a
new org's write, of the last tenth of those writes, of a search, the open, the first search, the file's
size (SQLite) and the load average.

The file's schema grows with the full-text tables it holds (each FTS5 table is five tables of the schema,
which SQLite reads when a connection opens and again after a table is made): small orgs share the file's
tables, and an org gets tables of its own past 5,000 memories or sections (docs/scaling.md). On
PostgreSQL every org's first write creates its partitions (full text and vectors).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # bench/text_isolation.py's stores (and scale.py's pgserver)

from dossier.bundle import Memory, Org  # noqa: E402
from dossier.stores.base import WriteBatch  # noqa: E402
from text_isolation import open_store  # noqa: E402

WHEN = datetime(2025, 1, 1, tzinfo=timezone.utc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orgs", type=int, default=1000)
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--postgres", metavar="DIR", help="measure PostgreSQL instead (a pgserver kept under DIR)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(args.postgres, tmp, "many_orgs")
        where = store.url if args.postgres else store.path
        writes = []
        for i in range(args.orgs):
            memory = Memory(id="m", org=f"o{i}", record="r", text=f"renewal discount agreed with org {i}", created_at=WHEN)
            started = time.perf_counter()
            store.write(WriteBatch(orgs=[Org(id=f"o{i}")], memories=[(memory, "h")]))
            writes.append((time.perf_counter() - started) * 1000)
        last = writes[-max(1, len(writes) // 10):]
        started = time.perf_counter()
        for i in range(args.searches):
            hits = store.search_text("memory", "renewal discount", org=f"o{i % args.orgs}", limit=10)
            assert [h.id for h in hits] == ["m"], hits
        search_ms = (time.perf_counter() - started) * 1000 / args.searches
        store.close()
        started = time.perf_counter()
        store = type(store)(where)  # a new store on the same file or database
        open_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        store.search_text("memory", "renewal", org="o1", limit=10)
        first_ms = (time.perf_counter() - started) * 1000
        store.close()
        size = sum(f.stat().st_size for f in Path(tmp).iterdir() if f.is_file())
    print(json.dumps({
        "store": "postgres" if args.postgres else "sqlite", "orgs": args.orgs,
        "new_org_write_ms": round(sum(writes) / len(writes), 2), "last_tenth_write_ms": round(sum(last) / len(last), 2),
        "search_ms": round(search_ms, 3), "open_ms": round(open_ms, 1), "first_search_ms": round(first_ms, 1),
        **({} if args.postgres else {"file_mb": round(size / 1e6, 1)}),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
