"""Whether one org's vector search takes longer when another org in the same store holds many vectors.

Reproduce (from the repository root):

    python bench/vector_isolation.py                      # SQLite: one file, two orgs
    python bench/vector_isolation.py --postgres DIR       # PostgreSQL (a pgserver kept under DIR)

Builds two stores (SQLite files in a temporary directory, or two PostgreSQL databases), each with two
orgs: ``a`` (``--own`` memory vectors over 10 records, random unit vectors of 384 dimensions) and ``b``
(``--small`` of them in the first store, ``--large`` in the second). Then times ``search_vectors`` of org
``a`` for the same ``--searches`` query vectors, org-wide and among one record's memories (each query in
both stores in turn, which store goes first alternating), and prints one JSON line with the p50 of
each in each store, their ratio (``large / small``) and the load average. The
hits must be the same in both stores.

Each org's vectors are its own on both stores (an ANN index per org in SQLite, a partition per org with
its own HNSW index on PostgreSQL; docs/retrieve.md, "What one org can learn of another"): the ratio
should be near 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # bench/text_isolation.py's stores (and scale.py's pgserver)

from dossier.bundle import Memory, Org  # noqa: E402
from dossier.stores.base import VectorWrite, WriteBatch  # noqa: E402
from text_isolation import alternated, open_store  # noqa: E402

WHEN = datetime(2025, 1, 1, tzinfo=timezone.utc)


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, 384)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def build(store: Any, own: int, other: int) -> Any:
    rng = np.random.default_rng(5)  # org a's vectors are the same in both stores
    batch = WriteBatch(orgs=[Org(id="a"), Org(id="b")])
    for org, count, vectors in (("a", own, unit(rng, own)), ("b", other, unit(np.random.default_rng(6), other))):
        for i in range(count):
            record = f"{org}-r{i % 10}"
            batch.memories.append((Memory(id=f"{org}-m{i}", org=org, record=record, text=f"memory {i}", created_at=WHEN), f"{org}{i}"))
            batch.vectors.append(VectorWrite(org, "memory", f"{org}-m{i}", record, f"{org}{i}", vectors[i]))
    store.write(batch)
    return store


def timed(stores: dict[str, Any], queries: np.ndarray) -> tuple[dict[str, dict[str, float]], dict[str, list[list[str]]]]:
    kinds = {"org_wide": None, "record": ["a-r1"]}
    for store in stores.values():
        for q in queries[:20]:  # warm up: indexes loaded, statements prepared
            for parents in kinds.values():
                store.search_vectors("memory", q, org="a", limit=20, parents=parents)
    out: dict[str, dict[str, float]] = {label: {} for label in stores}
    hits: dict[str, list[list[str]]] = {label: [] for label in stores}
    for name, parents in kinds.items():
        p50, found = alternated(stores, len(queries), lambda store, n: store.search_vectors("memory", queries[n], org="a", limit=20, parents=parents))
        for label in stores:
            out[label][name] = p50[label]
            hits[label].append(found[label])
    return out, hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--own", type=int, default=3000, help="org a's memory vectors")
    parser.add_argument("--small", type=int, default=200, help="org b's memory vectors in the first store")
    parser.add_argument("--large", type=int, default=30000, help="org b's memory vectors in the second store")
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--postgres", metavar="DIR", help="measure PostgreSQL instead (a pgserver kept under DIR)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    queries = unit(np.random.default_rng(7), args.searches)
    with tempfile.TemporaryDirectory() as tmp:
        stores = {}
        try:
            for label, other in (("small", args.small), ("large", args.large)):
                stores[label] = build(open_store(args.postgres, tmp, f"vectors_{label}"), args.own, other)
            results, answers = timed(stores, queries)
        finally:
            for store in stores.values():
                store.close()
    assert answers["small"] == answers["large"], answers
    print(json.dumps({
        "store": "postgres" if args.postgres else "sqlite", "own_vectors": args.own,
        "other_org_vectors": {"small": args.small, "large": args.large},
        "p50_ms_small": results["small"], "p50_ms_large": results["large"],
        "large_over_small": {k: round(results["large"][k] / results["small"][k], 2) for k in results["small"]},
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
