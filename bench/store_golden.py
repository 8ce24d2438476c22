"""Every store search, dumped exactly: to show a change to a store leaves its answers as they were.

Reproduce (from the repository root; run ``dump`` before and after a change, then ``compare``):

    python bench/store_golden.py dump /tmp/before.json                       # a fresh SQLite file
    python bench/store_golden.py dump /tmp/before-pg.json --store postgresql://...   # a fresh database
    python bench/store_golden.py compare /tmp/before.json /tmp/after.json

Loads the sample org, three LoCoMo conversations (when the data is found: ``--data`` or
``$DOSSIER_SHARED_DATA``) and a synthetic org of 3,000 memories over 30 records and 480 sections (bench/
corpus.py) into a fresh store, with vectors computed once per text by the real model and cached under
``--cache`` (so both runs store the very same vectors), then runs full-text and vector searches: org-wide
and among records (one, several, all) or documents, at limits 10, 50 and 1,000, for 163 questions, plus
each record set's recent memories, and writes every hit as (id, parent, repr(score)).

``compare`` prints how many results differ, how many of those differ in ids or order (not only in a
score's last bits: PostgreSQL's BM25 sums in an order that can change between two runs of the same code),
and the largest relative score difference; exit status 1 when any ids or order differ.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import corpus  # noqa: E402

import dossier  # noqa: E402
from dossier.evaluation import external as ext  # noqa: E402
from dossier.providers.embeddings import Embedder, InputKind, OnnxMiniLM  # noqa: E402
from dossier.stores.base import VECTOR_KINDS, TextKind  # noqa: E402

TEXT_KINDS: tuple[TextKind, ...] = ("memory", "section")

ROOT = Path(__file__).resolve().parent.parent


class Frozen(Embedder):
    """The real model, one text at a time, each text's vector kept in ``path`` for every later run."""

    model_id, dimensions, batch_size = "all-MiniLM-L6-v2", 384, 64

    def __init__(self, path: Path) -> None:
        self.path, self.table, self.dirty = path, {}, False
        self.model: OnnxMiniLM | None = None
        if path.exists():
            saved = np.load(path, allow_pickle=True)
            self.table = dict(zip(saved["texts"].tolist(), saved["vectors"]))

    def embed_batch(self, texts: Sequence[str], *, kind: InputKind = "document") -> np.ndarray:
        for text in dict.fromkeys(texts):
            if text not in self.table:
                if self.model is None:
                    self.model = OnnxMiniLM()
                self.table[text] = self.model.embed_batch([text])[0]
                self.dirty = True
        return np.stack([self.table[t] for t in texts])

    def save(self) -> None:
        if self.dirty:
            np.savez(self.path, texts=np.array(list(self.table), dtype=object), vectors=np.stack(list(self.table.values())))


def dump(out: Path, store: str | None, cache: Path, data: str | None) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    embedder = Frozen(cache / "store-golden-vectors.npz")
    sample = json.loads((ROOT / "examples" / "sample-org.json").read_text(encoding="utf-8"))
    bundles = [sample, corpus.bundle("syn", memories=3000, sections=480, records=30)]
    locomo_file = ext.data_dir(data, repo_root=ROOT) / ext.LOCOMO_FILE
    conversations = ext.read_json(locomo_file)[:3] if locomo_file.is_file() else []
    if conversations:
        bundles.append(ext.locomo_bundle(conversations))
    evaluation = json.loads((ROOT / "examples" / "eval" / "sample-questions.json").read_text(encoding="utf-8"))
    rng = random.Random(1)
    questions = [q["message"] for q in evaluation["questions"] if q.get("message")][:60]
    questions += [q.question for q in ext.load_locomo(conversations).questions[:60]] if conversations else []
    questions += [corpus.question(rng) for _ in range(40)] + ["NW-EDU-40 discount", "ERR-SYNC-409", ""]
    nw_records = [r["id"] for r in sample["records"] if r["org"] == "northwind"]
    nw_documents = [d["id"] for d in sample["documents"] if d["org"] == "northwind"]
    records = {"northwind": [[nw_records[0]], [nw_records[1]], nw_records[:4], nw_records, ["nobody"]],
               "syn": [["r0"], ["r1", "r2"], [f"r{i}" for i in range(30)]],
               "locomo": [[c["sample_id"]] for c in conversations] + [[c["sample_id"] for c in conversations]]}  # fmt: skip
    documents = {"northwind": [[nw_documents[0]], nw_documents[:3], nw_documents],
                 "syn": [["d0"], ["d1", "d2", "d3"], [f"d{i}" for i in range(0, 60, 2)]]}  # fmt: skip
    out_rows: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp, dossier.open(store or f"sqlite:///{tmp}/golden.db", embedder=embedder) as engine:
        for bundle in bundles:
            engine.load_bundle(bundle)
        s = engine.store
        vectors = {q: embedder.embed_batch([q])[0] for q in questions if q}

        def hits(found: list) -> list:
            return [[h.id, h.parent, repr(h.score)] for h in found]

        for org in [o for o in records if s.get_org(org=o) is not None]:
            for q in questions:
                for limit in (10, 50, 1000):
                    for text_kind in TEXT_KINDS:
                        out_rows.append([org, q, limit, f"text-{text_kind}-org", hits(s.search_text(text_kind, q, org=org, limit=limit))])
                    for parents in records[org]:
                        out_rows.append([org, q, limit, "text-mem", parents, hits(s.search_text("memory", q, org=org, limit=limit, parents=parents))])
                        if q:
                            out_rows.append([org, q, limit, "vec-mem", parents,
                                             hits(s.search_vectors("memory", vectors[q], org=org, limit=limit, parents=parents))])  # fmt: skip
                    for parents in documents.get(org, []):
                        out_rows.append([org, q, limit, "text-sec", parents, hits(s.search_text("section", q, org=org, limit=limit, parents=parents))])
                        if q:
                            out_rows.append([org, q, limit, "vec-sec", parents,
                                             hits(s.search_vectors("section", vectors[q], org=org, limit=limit, parents=parents))])  # fmt: skip
                    if q:
                        for kind in VECTOR_KINDS:
                            out_rows.append([org, q, limit, f"vec-{kind}-org", hits(s.search_vectors(kind, vectors[q], org=org, limit=limit))])
            for parents in records[org]:
                recent = s.recent_memories(parents, org=org, limit=25)
                out_rows.append([org, "recent", parents, [[m.id, m.record, m.created_at.isoformat()] for m in recent]])
    embedder.save()
    out.write_text(json.dumps(out_rows))
    print(f"{len(out_rows)} results written to {out}")


def compare(a_path: Path, b_path: Path) -> int:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    if len(a) != len(b):
        print(f"different runs: {len(a)} and {len(b)} results")
        return 1

    def ranked(row: list) -> Any:
        found = row[-1]
        return [h[:2] for h in found] if found and isinstance(found[0], list) and len(found[0]) == 3 else found

    differ = [(x, y) for x, y in zip(a, b) if x != y]
    order = [(x, y) for x, y in differ if ranked(x) != ranked(y)]
    worst = 0.0
    for x, y in differ:
        for h1, h2 in zip(x[-1], y[-1]):
            if isinstance(h1, list) and len(h1) == 3 and h1[0] == h2[0]:
                worst = max(worst, abs(float(h1[2]) - float(h2[2])) / max(abs(float(h1[2])), 1e-12))
    print(f"{len(a)} results: {len(differ)} differ, {len(order)} of them in ids or order; "
          f"largest relative score difference {worst:.1e}")  # fmt: skip
    for x, y in order[:5]:
        print("  ", x[:5], "\n     before", x[-1][:5], "\n     after ", y[-1][:5])
    return 1 if order else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out", type=Path)
    d.add_argument("--store", help="a fresh, empty store URL (default: a temporary SQLite file)")
    d.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dossier-bench")
    d.add_argument("--data", help=f"directory holding {ext.LOCOMO_FILE} (default: ${ext.DATA_ENV} or ../shared/data)")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "dump":
        dump(args.out, args.store, args.cache, args.data)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
