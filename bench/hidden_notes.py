"""What an org's hidden documents cost a caller: the sample org plus N call notes attached to other records.

Reproduce (from the repository root, after `pip install -e .`):

    python bench/hidden_notes.py --notes 20000 --cache ~/.cache/dossier-bench
    PYTHONPATH=OTHER_CHECKOUT/src python bench/hidden_notes.py --notes 20000 --cache DIR   # the same on other code
    python bench/hidden_notes.py --notes 20000 --cache DIR --store postgresql://...   # on PostgreSQL

The store is the sample org (examples/sample-org.json) plus ``--notes`` documents of type ``note``, one
section each (texts from bench/corpus.py), attached to 2,000 contacts other than the caller's record: a
caller may see none of them in a call about jane@acme.com. They are visibility's worst case for the
documents source: their sections match the questions' words (so the searches read past them, docs/retrieve.md)
and every full-text search counts its word statistics without them. The texts are embedded once with the
real model and kept under ``--cache`` with the built store (``hidden-notes-N.db``; a store built by other
code is rebuilt by that code if its file is missing). Brief calls about jane@acme.com by caller ``ana``,
each with a new question, alternate with the query embedding timed alone; prints one JSON line:
``brief_p50_ms``, ``brief_p95_ms``, ``embed_p50_ms``, ``brief_p50_over_embed_p50`` (the call against its
physical floor, one query embedding), ``section_text_p50_ms`` (the section full-text
searches of a call), ``cold_first_call_ms`` (a new process opens the store and makes one call),
``after_write_p50_ms`` (a call right after a memory of jane@acme.com was written, in a copy of the store: a
write moves the org's generation, and what is kept per generation is read again) and the load average before
and after. With ``--store`` (a PostgreSQL URL) the same bundle is loaded there once (the vectors from the
cache) and timed there; ``after_write_p50_ms`` is then not measured (it would write into that database).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import corpus  # noqa: E402
from retrieve import SAMPLE, CachedTexts, alternate, percentile, question_pool, unique_questions  # noqa: E402

import dossier  # noqa: E402
from dossier.providers.embeddings import OnnxMiniLM  # noqa: E402

RECORD = {"email": "jane@acme.com"}
OWNERS = 2_000  # contacts the notes are attached to


def notes_bundle(n: int) -> tuple[dict, list[str]]:
    """The sample org with ``n`` notes attached to other contacts, and the notes' texts."""
    rng = random.Random(31)
    data = json.loads(SAMPLE.read_text(encoding="utf-8"))
    texts = [f"{corpus.memory_text(rng)} (call {i})" for i in range(n)]
    data["records"] += [{"id": f"rec-owner-{i}", "org": "northwind", "kind": "contact", "email": f"owner{i}@example.com"}
                        for i in range(min(n, OWNERS))]  # fmt: skip
    data["documents"] += [
        {"id": f"note-{i:06d}", "org": "northwind", "title": f"Call note {i}", "doc_type": "note",
         "attached_record": f"rec-owner-{i % OWNERS}", "sections": [{"id": f"note-{i:06d}-s", "heading": "Call", "text": text}]}
        for i, text in enumerate(texts)
    ]  # fmt: skip
    return data, texts


def embedded(args: argparse.Namespace) -> tuple[dict, CachedTexts]:
    """The bundle, and the model answering from the notes' vectors (embedded once, cached)."""
    cache = Path(args.cache).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    data, texts = notes_bundle(args.notes)
    vectors_file = cache / f"hidden-notes-{args.notes}-texts.npy"
    if vectors_file.exists():
        vectors = np.load(vectors_file)
    else:
        print(f"embedding {len(texts)} note texts once (cached in {vectors_file}) ...", file=sys.stderr, flush=True)
        vectors = OnnxMiniLM().embed_documents(texts)
        np.save(vectors_file, vectors)
    return data, CachedTexts(texts, vectors)


def postgres(args: argparse.Namespace) -> str:
    """``args.store`` holding the bundle (loaded once)."""
    with dossier.open(args.store) as engine:
        loaded = engine.store.counts(org="northwind").get("documents", 0) >= args.notes
    if not loaded:
        data, model = embedded(args)
        print(f"loading into {args.store} ...", file=sys.stderr, flush=True)
        with dossier.open(args.store, embedder=model) as engine:
            engine.load_bundle(data)
    return str(args.store)


def store(args: argparse.Namespace) -> Path:
    cache = Path(args.cache).expanduser()
    path = cache / f"hidden-notes-{args.notes}.db"
    if path.exists():
        return path
    data, model = embedded(args)
    partial = cache / f"{path.name}.partial"
    for leftover in cache.glob(f"{path.name}.partial*"):
        leftover.unlink()
    print(f"building {path} ...", file=sys.stderr, flush=True)
    with dossier.open(f"sqlite:///{partial}", embedder=model) as engine:
        engine.load_bundle(data)
    for suffix in ("-wal", "-shm"):
        Path(f"{partial}{suffix}").unlink(missing_ok=True)
    if Path(f"{partial}-ann").exists():
        Path(f"{partial}-ann").rename(f"{path}-ann")
    partial.rename(path)
    return path


def cold_call(url: str) -> None:
    """In a new process: open the store, make one call, print its time as JSON (--cold-call)."""
    started = time.perf_counter()
    with dossier.open(url) as engine:
        engine.retrieve({"mode": "brief", "record": RECORD, "message": "What pricing did we discuss?"}, org="northwind",
                        caller="ana")  # fmt: skip
        print(json.dumps({"first_call_ms": round((time.perf_counter() - started) * 1000, 1)}))


def after_write(path: Path, embedder: OnnxMiniLM, pool: list[str], rng: random.Random, seen: set[str],
                calls: int = 40) -> list[float]:  # fmt: skip
    """Calls each made right after a memory of jane@acme.com is written, in a copy of the store."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / path.name
        shutil.copy(path, copy)
        if Path(f"{path}-ann").exists():
            shutil.copytree(f"{path}-ann", f"{copy}-ann")
        with dossier.open(f"sqlite:///{copy}", embedder=embedder) as engine:
            questions = unique_questions(pool, rng, calls + 5, seen)
            for q in questions[:5]:  # warm up
                engine.retrieve({"mode": "brief", "record": RECORD, "message": q}, org="northwind", caller="ana")
            for i, q in enumerate(questions[5:]):
                engine.load_bundle({"memories": [{"id": f"bench-written-{i}", "org": "northwind", "record": "rec-jane",
                                                  "text": f"Jane asked again about the renewal ({i}).",
                                                  "created_at": "2026-01-01T00:00:00Z"}]})  # fmt: skip
                started = time.perf_counter()
                engine.retrieve({"mode": "brief", "record": RECORD, "message": q}, org="northwind", caller="ana")
                out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notes", type=int, default=20_000, help="notes attached to other contacts (default 20,000)")
    parser.add_argument("--calls", type=int, default=200, help="timed calls (default 200)")
    parser.add_argument("--cache", default="~/.cache/dossier-bench", help="where the built store is kept")
    parser.add_argument("--store", help="a PostgreSQL URL to load the bundle into and time (default: SQLite, under --cache)")
    parser.add_argument("--cold-call", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold_call:
        cold_call(args.cold_call)
        return
    load_before = os.getloadavg()[0]
    path = store(args) if args.store is None else None
    url = f"sqlite:///{path}" if path is not None else postgres(args)
    cold = json.loads(subprocess.run([sys.executable, __file__, "--cold-call", url], check=True,
                                     capture_output=True, text=True).stdout.strip().splitlines()[-1])  # fmt: skip
    embedder = OnnxMiniLM()
    embedder.embed_query("warm up")
    rng, seen = random.Random(23), set[str]()
    pool = question_pool()
    with dossier.open(url, embedder=embedder) as engine:
        questions = unique_questions(pool, rng, args.calls + 10, seen)
        alone = unique_questions(pool, rng, args.calls, seen)
        for q in questions[:10]:  # warm up
            engine.retrieve({"mode": "brief", "record": RECORD, "message": q}, org="northwind", caller="ana")
        timed = alternate(engine, embedder, list(zip(questions[10:], alone)),
                          lambda q: {"mode": "brief", "record": RECORD, "message": q})
    embeds, totals = [t[0] for t in timed], [t[1] for t in timed]
    texts = [t[3].get("fulltext:section", 0.0) for t in timed]
    written = after_write(path, embedder, pool, rng, seen) if path is not None else None
    print(json.dumps({
        "notes": args.notes, "calls": len(totals), "brief_p50_ms": round(statistics.median(totals), 2),
        "brief_p95_ms": round(percentile(totals, 0.95), 2), "embed_p50_ms": round(statistics.median(embeds), 2),
        "brief_p50_over_embed_p50": round(statistics.median(totals) / statistics.median(embeds), 2),
        "section_text_p50_ms": round(statistics.median(texts), 2), "cold_first_call_ms": cold["first_call_ms"],
        "after_write_p50_ms": round(statistics.median(written), 2) if written else None,
        "store": "sqlite" if path is not None else "postgresql",
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)], "cores": len(os.sched_getaffinity(0)),
        "dossier": str(Path(dossier.__file__).parent),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
