"""Latency of one ``brief`` retrieve call (no model; query embedding included), with a breakdown.

Reproduce (from the repository root, after `pip install -e .`):

    python bench/retrieve.py                    # sample org + 100,000 memories / 20,000 sections, 300 calls each
    python bench/retrieve.py --sample-only      # the sample org only (seconds)
    python bench/retrieve.py --scale-only --memories 20000 --sections 4000 --calls 500
    python bench/retrieve.py --cache ~/.cache/dossier-bench   # where the synthetic store is kept
    OPENBLAS_NUM_THREADS=1 python bench/retrieve.py --scale-only  # single-threaded BLAS for the vector search
    python bench/retrieve.py --one-record --memories 20000 --json   # one contact holding 20,000 memories

(c) ``--one-record``: the sample org plus ``--memories`` memories of one contact (jane@acme.com), texts
from bench/corpus.py embedded once with the real model (in batches; the vectors are cached under
``--cache`` beside the built store, which later runs reuse). Brief calls about that contact, each with
a new question, alternate with the query embedding timed alone, so machine load weighs on both alike.
With ``--json`` it prints one line: ``brief_p50_ms``, ``brief_p95_ms``, ``embed_p50_ms`` (the query
embedding alone, same run), ``brief_cpu_p50_ms`` (the CPU time the process spent in a call, all its threads:
the model's idle threads included), ``cold_first_call_ms`` (a new process opens the store and makes one call:
the store's files are mapped, the model loaded and the call answered), the time spent per step (the
question's embedding, made ahead on another thread, overlaps the full-text searches: the steps add up to
more than the call), the recall@10 of the record's vector search against exact search, and the load
average before and after.

(a) The sample org (examples/sample-org.json), caller ``ana`` of ``northwind``, records such as
jane@acme.com, raj@acme.com and https://www.acme.com, questions from the labelled evaluation set and
from bench/corpus.py. (b) A synthetic org of ``--memories`` memories and ``--sections`` sections over
``--records`` contacts, built with bench/corpus.py (realistic text, real embeddings from the default
local ONNX MiniLM model). Building it embeds every text (~300-400 texts/s on an idle 2-core machine, a
few minutes at 120k; far slower when the machine is busy), so the store file is cached under ``--cache``
(default: dossier-bench under the system temp dir) and reused by later runs; the load time is printed
when it loads. Delete the file to rebuild it.

Every timed question is unique (a numbered suffix), so the engine's query-embedding LRU cache never
hits and each call pays for one embedding. Prints, per org and depth (``standard`` then ``fast``),
the p50/p95 of the whole call and, measured inside the same calls, of the query embedding, the
store's vector searches (split by kind), its full-text searches, its recent-memories read and the
rest (layers, pydantic models, other store reads), and the CPU time the process spent in a call (all its
threads, idle threads that spin included). It also prints the query embedding timed alone
and the first (cold) call, which builds the in-memory vector index of the org's sections. Five untimed
calls warm up first; calls that are the first for a record group still read its vectors from SQLite
(they show in p95 and max). The load average is printed at the start and end: other processes on the
machine inflate every figure, so compare runs made under similar load.
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
import threading
import time
from collections import defaultdict
from typing import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import corpus  # noqa: E402

import dossier  # noqa: E402
from dossier.providers.embeddings import OnnxMiniLM  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample-org.json"
SAMPLE_QUESTIONS = ROOT / "examples" / "eval" / "sample-questions.json"
SAMPLE_RECORDS = [
    {"email": "jane@acme.com"}, {"email": "raj@acme.com"}, {"website": "https://www.acme.com"},
    {"email": "li@acme.com"}, {"email": "marta@globex.com"}, {"website": "https://www.globex.com"},
    {"email": "samir@initech.com"}, {"phone": "+1 617 555 0148"}, {"email": "erin@hooli.com"},
    {"email": "lucas@pinnaclecloud.io"},
]  # fmt: skip
STEPS = ("embed", "vector", "vector:section", "vector:memory", "vector:property", "fulltext", "fulltext:section",
         "fulltext:memory", "recent")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def line(label: str, values: list[float]) -> str:
    return (f"  {label:<34} p50 {statistics.median(values):7.2f} ms   p95 {percentile(values, 0.95):7.2f} ms   "
            f"max {max(values):7.2f} ms")  # fmt: skip


class Timers:
    """Wraps the embedder's and the store's methods to sum, per call, the time spent in each step."""

    def __init__(self, engine: dossier.Engine) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self._saved: list[tuple[object, str]] = []
        self._local = threading.local()  # whether this thread is inside a timed method
        embedder, store = engine.embedder, engine.store
        self._wrap(embedder, "embed_query", lambda *a, **k: ["embed"])
        # the question embedded ahead, on a background thread while the full-text searches run: its time
        # overlaps theirs (docs/scaling.md, "the question embedded ahead")
        if hasattr(embedder, "embed_query_beside"):  # (code before it, run through PYTHONPATH, has none)
            self._wrap(embedder, "embed_query_beside", lambda *a, **k: ["embed"])
        self._wrap(store, "search_vectors", lambda kind, *a, **k: ["vector", f"vector:{kind}"])
        self._wrap(store, "search_vectors_many", lambda kind, *a, **k: ["vector", f"vector:{kind}"])
        self._wrap(store, "search_text", lambda kind, *a, **k: ["fulltext", f"fulltext:{kind}"])
        self._wrap(store, "recent_memories", lambda *a, **k: ["recent"])

    def _wrap(self, obj, name, keys) -> None:  # type: ignore[no-untyped-def]
        inner = getattr(obj, name)
        current, local = self.current, self._local

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            if getattr(local, "inside", False):  # called by another timed method (a store's search_vectors_many): counted there
                return inner(*args, **kwargs)
            local.inside = True
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                took = (time.perf_counter() - started) * 1000
                local.inside = False
                for key in keys(*args, **kwargs):
                    current[key] += took
                    current[f"{key}#"] += 1  # calls

        self._saved.append((obj, name))
        setattr(obj, name, timed)

    def restore(self) -> None:
        for obj, name in self._saved:
            delattr(obj, name)  # the instance attribute; the class's method shows through again

    def take(self) -> dict[str, float]:
        out = dict(self.current)
        self.current.clear()
        return out


def alternate(engine: dossier.Engine, embedder: OnnxMiniLM, calls: list[tuple[str, str]],
              request: Callable[[str], dict], *, org: str = "northwind", caller: str = "ana",
              ) -> list[tuple[float, float, float, dict[str, float]]]:  # fmt: skip
    """For each (question, other) pair, ``other`` embedded alone, then the call ``request(question)``, so that
    machine load weighs on both alike: (the embedding's ms, the call's ms, the call's CPU ms over all the
    process's threads, the call's steps as :class:`Timers` took them)."""
    timers = Timers(engine)
    out = []
    try:
        for question, other in calls:
            started = time.perf_counter()
            embedder.embed_query(other)
            embed = (time.perf_counter() - started) * 1000
            timers.take()
            started, cpu = time.perf_counter(), time.process_time()
            engine.retrieve(request(question), org=org, caller=caller)
            out.append((embed, (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000, timers.take()))
    finally:
        timers.restore()
    return out


def unique_questions(pool: list[str], rng: random.Random, count: int, seen: set[str]) -> list[str]:
    """``count`` questions drawn from ``pool``, each made unique (never seen before) by a number."""
    out = []
    while len(out) < count:
        q = f"{rng.choice(pool)} ({rng.randint(0, 10**6)})"
        if q not in seen:
            seen.add(q)
            out.append(q)
    return out


def run(engine: dossier.Engine, timers: Timers, org: str, caller: str, records: list[dict], pool: list[str],
        calls: int, depth: str, seen: set[str], rng: random.Random) -> None:  # fmt: skip
    questions = unique_questions(pool, rng, calls + 5, seen)
    requests = [
        {"mode": "brief", "record": rng.choice(records), "message": q, "depth": depth, "budget": {"totalTokens": 8000}}
        for q in questions
    ]
    for request in requests[:5]:  # warm up (the first call per org loads the section index)
        engine.retrieve(request, org=org, caller=caller)
    timers.take()
    totals: list[float] = []
    steps: dict[str, list[float]] = {s: [] for s in STEPS}
    items, embedded = 0, []
    cpus: list[float] = []
    for request in requests[5:]:
        started, cpu = time.perf_counter(), time.process_time()
        response = engine.retrieve(request, org=org, caller=caller)
        totals.append((time.perf_counter() - started) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
        took = timers.take()
        for s in STEPS:
            steps[s].append(took.get(s, 0.0))
        steps.setdefault("rest", []).append(totals[-1] - sum(took.get(s, 0.0) for s in ("embed", "vector", "fulltext", "recent")))
        items += sum(len(r.items) for r in response.sources.values())
        embedded.append(int(took.get("embed#", 0)))
    # every call embeds its question (no cache hit): the model ran at least once in each
    assert min(embedded) >= 1, "a timed call hit the query-embedding cache"
    print(f" depth {depth}: {calls} calls, {items / calls:.1f} items per response, "
          f"{sum(embedded) / calls:.2f} query embeddings per call (min {min(embedded)})")
    print(line("brief call", totals))
    print(line("  query embedding (in call)", steps["embed"]))
    print(line("  vector searches (all)", steps["vector"]))
    for kind in ("section", "memory", "property"):
        print(line(f"    {kind} vectors", steps[f"vector:{kind}"]))
    print(line("  full-text searches (all)", steps["fulltext"]))
    for kind in ("section", "memory"):
        print(line(f"    {kind} full text", steps[f"fulltext:{kind}"]))
    print(line("  recent memories", steps["recent"]))
    print(line("  rest (layers, models, reads)", steps["rest"]))
    print(line("CPU per call (all threads)", cpus))


def embed_alone(embedder: OnnxMiniLM, pool: list[str], calls: int, seen: set[str], rng: random.Random) -> None:
    latencies = []
    for q in unique_questions(pool, rng, calls, seen):
        started = time.perf_counter()
        embedder.embed_query(q)
        latencies.append((time.perf_counter() - started) * 1000)
    print(line("query embedding alone", latencies))


def cold_call(engine: dossier.Engine, org: str, caller: str, record: dict, seen: set[str], rng: random.Random) -> None:
    q = unique_questions(["What did we agree about annual prepay?"], rng, 1, seen)[0]
    started = time.perf_counter()
    engine.retrieve({"mode": "brief", "record": record, "message": q}, org=org, caller=caller)
    print(f"  first call (cold: builds the section index) {(time.perf_counter() - started) * 1000:.1f} ms")


def sample(embedder: OnnxMiniLM, calls: int, seen: set[str]) -> None:
    rng = random.Random(11)
    evaluation = json.loads(SAMPLE_QUESTIONS.read_text(encoding="utf-8"))["questions"]
    pool = [q["message"] for q in evaluation if q["org"] == "northwind" and q.get("message")]
    pool += [corpus.question(random.Random(i)) for i in range(40)]
    with tempfile.TemporaryDirectory() as tmp, dossier.open(f"sqlite:///{tmp}/sample.db", embedder=embedder) as engine:
        report = engine.load_bundle(SAMPLE)
        counts = engine.store.counts(org="northwind")
        print(f"(a) sample org northwind, caller ana: {counts['memories']} memories, {counts['sections']} sections, "
              f"{counts['records']} records ({report.embedded} texts embedded); {len(set(pool))} base questions")  # fmt: skip
        cold_call(engine, "northwind", "ana", SAMPLE_RECORDS[0], seen, rng)
        timers = Timers(engine)
        try:
            for depth in ("standard", "fast"):
                run(engine, timers, "northwind", "ana", SAMPLE_RECORDS, pool, calls, depth, seen, rng)
        finally:
            timers.restore()


def synthetic_store(embedder: OnnxMiniLM, args: argparse.Namespace) -> Path:
    """The cached synthetic store file, built (and timed) when it is not there yet."""
    cache = Path(args.cache).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    name = f"synthetic-m{args.memories}-s{args.sections}-r{args.records}-seed7-{embedder.model_id}.db"
    path = cache / name
    if path.exists():
        print(f"(b) synthetic store from cache: {path}")
        return path
    partial = cache / f"{name}.partial"
    for leftover in cache.glob(f"{name}.partial*"):
        leftover.unlink()
    bundle = corpus.bundle("bench", memories=args.memories, sections=args.sections, records=args.records)
    texts = args.memories + args.sections + 2 * args.records
    print(f"(b) building the synthetic store ({texts} texts to embed) at {path} ...", flush=True)
    last = [time.perf_counter()]

    def progress(done: int, total: int) -> None:
        if time.perf_counter() - last[0] > 30 or done == total:
            last[0] = time.perf_counter()
            print(f"    embedded {done}/{total}", file=sys.stderr, flush=True)

    with dossier.open(f"sqlite:///{partial}", embedder=embedder) as engine:
        started = time.perf_counter()
        report = engine.load_bundle(bundle, progress=progress)
        seconds = time.perf_counter() - started
    for suffix in ("-wal", "-shm"):  # closing the last connection checkpoints the WAL
        Path(f"{partial}{suffix}").unlink(missing_ok=True)
    partial.rename(path)
    print(f"    load: {args.memories} memories + {args.sections} sections + {args.records} records in {seconds:.1f} s "
          f"= {report.embedded / seconds:.0f} texts/s ({report.embedded} embedded); {path.stat().st_size / 1e6:.0f} MB")  # fmt: skip
    return path


def scale(embedder: OnnxMiniLM, args: argparse.Namespace, seen: set[str]) -> None:
    path = synthetic_store(embedder, args)
    rng = random.Random(13)
    pool = sorted({corpus.question(random.Random(i)) for i in range(2000)})
    with dossier.open(f"sqlite:///{path}", embedder=embedder) as engine:
        counts = engine.store.counts(org="bench")
        emails = [r.identifiers.email for r in engine.store.get_records([f"r{i}" for i in range(args.records)], org="bench")]
        records = [{"email": e} for e in emails if e]
        print(f"    org bench, caller bench: {counts['memories']} memories, {counts['sections']} sections, "
              f"{counts['records']} records, {counts['vectors']} vectors; {len(pool)} base questions")  # fmt: skip
        cold_call(engine, "bench", "bench", records[0], seen, rng)
        timers = Timers(engine)
        try:
            for depth in ("standard", "fast"):
                run(engine, timers, "bench", "bench", records, pool, args.calls, depth, seen, rng)
        finally:
            timers.restore()


ONE_RECORD = {"email": "jane@acme.com"}
ONE_RECORD_ID = "rec-jane"


class CachedTexts(OnnxMiniLM):
    """The real model, answering from ``vectors`` for the texts it was given (embedded once, cached)."""

    def __init__(self, texts: list[str], vectors: np.ndarray) -> None:
        super().__init__()
        self._known = dict(zip(texts, vectors))

    def embed_documents(self, texts, progress=None):  # type: ignore[no-untyped-def]
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        missing = [i for i, t in enumerate(texts) if t not in self._known]
        if missing:
            out[missing] = super().embed_documents([texts[i] for i in missing])
        for i, t in enumerate(texts):
            if t in self._known:
                out[i] = self._known[t]
        if progress:
            progress(len(texts))
        return out


def one_record_texts(n: int, seed: int = 17) -> list[str]:
    rng = random.Random(seed)
    return [f"{corpus.memory_text(rng)} (note {i})" for i in range(n)]


def one_record_store(args: argparse.Namespace) -> tuple[Path, dict]:
    """The cached store of the sample org plus ``args.memories`` memories of jane@acme.com."""
    cache = Path(args.cache).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"one-record-{args.memories}.db"
    built: dict = {}
    if path.exists():
        return path, built
    texts = one_record_texts(args.memories)
    vectors_file = cache / f"one-record-{args.memories}-texts.npy"
    if vectors_file.exists():
        vectors = np.load(vectors_file)
    else:
        model = OnnxMiniLM()
        started, last = time.perf_counter(), [time.perf_counter(), 0]

        def progress(done: int) -> None:
            last[1] += done
            if time.perf_counter() - last[0] > 30:
                last[0] = time.perf_counter()
                print(f"    embedded {last[1]}/{len(texts)}", file=sys.stderr, flush=True)

        print(f"embedding {len(texts)} memory texts once (cached in {vectors_file}) ...", file=sys.stderr, flush=True)
        vectors = model.embed_documents(texts, progress=progress)
        built["embed_s"] = round(time.perf_counter() - started, 1)
        built["embed_texts_per_s"] = round(len(texts) / built["embed_s"], 1)
        np.save(vectors_file, vectors)
    data = json.loads(SAMPLE.read_text(encoding="utf-8"))
    start = 1_600_000_000
    extra = [{"id": f"one-{i}", "org": "northwind", "record": ONE_RECORD_ID, "text": text,
              "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + 60 * i))}
             for i, text in enumerate(texts)]  # fmt: skip
    partial = cache / f"{path.name}.partial"
    for leftover in cache.glob(f"{path.name}.partial*"):
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    embedder = CachedTexts(texts, vectors)
    print(f"building {path} ...", file=sys.stderr, flush=True)
    with dossier.open(f"sqlite:///{partial}", embedder=embedder) as engine:
        started = time.perf_counter()
        engine.load_bundle(data)
        engine.load_bundle({"memories": extra})  # the ANN index of the org's memories is built here
        built["load_s"] = round(time.perf_counter() - started, 1)
    for suffix in ("-wal", "-shm"):
        Path(f"{partial}{suffix}").unlink(missing_ok=True)
    if Path(f"{partial}-ann").exists():  # none below the store's ANN line (5,000 memories)
        Path(f"{partial}-ann").rename(f"{path}-ann")
    partial.rename(path)
    return path, built


def cold_process_call(path: str) -> None:
    """In a new process: open the store, make one call, print the times as JSON (--cold-call)."""
    started = time.perf_counter()
    engine = dossier.open(f"sqlite:///{path}")
    opened = time.perf_counter()
    engine.retrieve({"mode": "brief", "record": ONE_RECORD, "message": "What did we agree about annual prepay?"},
                    org="northwind", caller="ana")  # fmt: skip
    done = time.perf_counter()
    engine.close()
    print(json.dumps({"open_ms": round((opened - started) * 1000, 1), "first_call_ms": round((done - opened) * 1000, 1)}))


def question_pool() -> list[str]:
    """The sample org's labelled questions and 200 from bench/corpus.py: what the one-record calls draw from."""
    evaluation = json.loads(SAMPLE_QUESTIONS.read_text(encoding="utf-8"))["questions"]
    pool = [q["message"] for q in evaluation if q["org"] == "northwind" and q.get("message")]
    return pool + [corpus.question(random.Random(i)) for i in range(200)]


def one_record(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    path, built = one_record_store(args)
    cold = json.loads(subprocess.run([sys.executable, __file__, "--cold-call", str(path)], check=True,
                                     capture_output=True, text=True).stdout.strip().splitlines()[-1])  # fmt: skip
    embedder = OnnxMiniLM()
    embedder.embed_query("warm up")
    rng, seen = random.Random(23), set[str]()
    pool = question_pool()
    out: dict = {"mode": "one-record", "memories": args.memories, "store": str(path), **built,
                 "cold_open_ms": cold["open_ms"], "cold_first_call_ms": cold["first_call_ms"]}  # fmt: skip
    with dossier.open(f"sqlite:///{path}", embedder=embedder) as engine:
        counts = engine.store.counts(org="northwind")
        questions = unique_questions(pool, rng, args.calls + 10, seen)
        alone = unique_questions(pool, rng, args.calls, seen)
        for q in questions[:10]:  # warm up
            engine.retrieve({"mode": "brief", "record": ONE_RECORD, "message": q}, org="northwind", caller="ana")
        timed = alternate(engine, embedder, list(zip(questions[10:], alone)),
                          lambda q: {"mode": "brief", "record": ONE_RECORD, "message": q, "budget": {"totalTokens": 8000}})
        embeds, totals, cpus = [t[0] for t in timed], [t[1] for t in timed], [t[2] for t in timed]
        steps = {s: [t[3].get(s, 0.0) for t in timed] for s in STEPS}
        out["recall_at_10"] = record_recall(engine, path, embedder, rng, pool, seen)
        out["counts"] = counts
    out.update(
        calls=len(totals), brief_p50_ms=round(statistics.median(totals), 2), brief_p95_ms=round(percentile(totals, 0.95), 2),
        embed_p50_ms=round(statistics.median(embeds), 2), embed_p95_ms=round(percentile(embeds, 0.95), 2),
        brief_cpu_p50_ms=round(statistics.median(cpus), 2),
        steps_p50_ms={s: round(statistics.median(v), 2) for s, v in steps.items()},
        steps_p95_ms={s: round(percentile(v, 0.95), 2) for s, v in steps.items()},
        load_average=[round(load_before, 2), round(os.getloadavg()[0], 2)], cores=len(os.sched_getaffinity(0)),
    )  # fmt: skip
    return out


def record_recall(engine: dossier.Engine, path: Path, embedder: OnnxMiniLM, rng: random.Random, pool: list[str],
                  seen: set[str]) -> float:  # fmt: skip
    """recall@10 of the record's vector search (what the memories source asks) against exact search."""
    import sqlite3

    from dossier.stores.sqlite_vectors import matrix_of
    from dossier.stores.vector_index import exact_search

    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT key, parent, embedding FROM vectors WHERE org = 'northwind' AND kind = 'memory' "
                          "AND parent = ?", [ONE_RECORD_ID]).fetchall()  # fmt: skip
    keys, parents, matrix = matrix_of(rows)
    store = engine.store
    recalls = []
    for q in unique_questions(pool, rng, 50, seen):
        vector = embedder.embed_query(q)
        want = {k for k, _, _ in exact_search(keys, parents, matrix, vector, 10)}
        got = {h.id for h in store.search_vectors("memory", vector, org="northwind", limit=10, parents=[ONE_RECORD_ID])}
        recalls.append(len(want & got) / 10)
    return round(statistics.mean(recalls), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--sections", type=int, default=20_000)
    parser.add_argument("--records", type=int, default=200, help="contacts the memories are spread over")
    parser.add_argument("--calls", type=int, default=300, help="timed calls per org and depth")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "dossier-bench"))
    parser.add_argument("--json", action="store_true", help="--one-record: print one JSON line")
    parser.add_argument("--cold-call", help=argparse.SUPPRESS)
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--scale-only", action="store_true", help="skip the sample org")
    only.add_argument("--sample-only", action="store_true", help="skip the synthetic org")
    only.add_argument("--one-record", action="store_true", help="one contact holding --memories memories (c)")
    args = parser.parse_args()
    if args.cold_call:
        cold_process_call(args.cold_call)
        return
    if args.one_record:
        result = one_record(args)
        if args.json:
            print(json.dumps(result))
        else:
            for key, value in result.items():
                print(f"{key}: {value}")
        return
    embedder = OnnxMiniLM()
    embedder.embed_query("warm up")
    seen: set[str] = set()
    print(f"{len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.2f}; embedder {embedder.model_id} "
          f"(ONNX int8); p50/p95 over {args.calls} calls; dossier from {Path(dossier.__file__).parent}")  # fmt: skip
    embed_alone(embedder, [corpus.question(random.Random(i)) for i in range(200)], args.calls, seen, random.Random(5))
    if not args.scale_only:
        sample(embedder, args.calls, seen)
    if not args.sample_only:
        scale(embedder, args, seen)
    print(f"load average at the end {os.getloadavg()[0]:.2f} (other processes on the machine skew the figures)")


if __name__ == "__main__":
    main()
