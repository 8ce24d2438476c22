"""Scale: one org of up to 1,000,000 memories and 100,000 sections, in SQLite and in PostgreSQL.

Reproduce (from the repository root, after `pip install -e ".[postgres]"`):

    python bench/scale.py                                   # 100k and 1M memories, both stores
    python bench/scale.py --levels 100000 --stores postgres # one level, one store
    python bench/scale.py --pg-url postgresql://...         # an existing server (default: a pgserver)
    python bench/scale.py --report bench-scale.json         # where the numbers go (appended per run)
    python bench/scale.py --load-only; python bench/scale.py --measure-only   # load now, measure when quiet
    python bench/scale.py --levels 1000000 --memory-pool 20000 --titles 100 --jitter 0.05   # synthetic vectors

With ``--jitter J`` the vectors are synthetic: every memory text gets a unique suffix ("(note 123)"),
every section body one too, and a text's vector is its pool text's real vector moved by a small random
step (J / sqrt(dims) per dimension, seeded by the text; J = 0.05 keeps cosine ~0.999 to the original).
No two memories then share a vector (a pool of 20,000 texts at 1M memories would otherwise make clusters
of 50 identical vectors), and only the pools need the model: minutes instead of hours on 2 cores.

What it does, per level (memories; sections are a tenth of them, capped at 100,000):

1. Builds the org from bench/corpus.py's vocabulary and templates: contacts with properties and
   identifiers, companies, ``works_at`` / ``knows`` edges, memories (about 50 per contact) and documents
   of 8 sections. Text is realistic and embedded with the real model (all-MiniLM-L6-v2, ONNX): no
   random vectors. Embedding 1.1M texts at ~400/s (short) and ~75/s (sections) would take hours, so the
   texts come from finite pools of distinct texts, each embedded once (and cached on disk under
   ``--cache``): 150,000 distinct memory texts and 20,000 distinct section texts (500 document titles x
   40 sections). At 1M memories each memory text occurs ~7 times, each section text ~5 times; identical
   texts get identical vectors, exactly as the model would give them.
2. Loads it with ``engine.load_bundle`` into a fresh store of each kind and reports the load time
   (validation, hashing and the store's write; vectors come from the pool). On PostgreSQL that includes
   building the HNSW indexes; SQLite builds its in-memory HNSW index (usearch) on the first search,
   reported as ``first_search_s``.
3. Times ``brief`` calls (a contact's email, a question from corpus.question; query embedding
   included; each question distinct, so the query cache never hits): p50 and p95 over ``--calls``
   after ``--warmup`` calls that are not counted (the server's buffers and the store's caches fill),
   with the time spent in the store's vector and full-text searches and in reading the candidates' documents,
   and the CPU the timed calls cost per call: this process's (``engine_cpu_per_call_ms``: the engine and
   its model) and, with a PostgreSQL server on this machine, the server's (``server_cpu_per_call_ms``, its
   processes' times from /proc). Then a new process opens the store and answers one call: ``new_process_first_answer_s`` (imports,
   model, the SQLite store mapping its saved ANN index files) is what a restart costs.
4. Measures recall@10 of the vector step (``search_vectors`` without parents, memories and sections)
   against exact search (numpy over every vector of that kind), over ``--queries`` questions. A hit
   counts when its exact similarity reaches the 10th best exact similarity (duplicate texts tie).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import corpus  # noqa: E402

from dossier.engine import Engine  # noqa: E402
from dossier.loading import section_text  # noqa: E402
from dossier.settings import HNSW_MIN_ROWS  # noqa: E402
from dossier.providers.embeddings import Embedder, OnnxMiniLM  # noqa: E402

ORG = "scale"
_SUFFIX = re.compile(r" \((?:note \d+|ref d\d+-s\d+)\)$")
MEMORY_POOL = 150_000
TITLES, SECTIONS_PER_TITLE = 500, 40
PER_CONTACT = 50


# -- the corpus -------------------------------------------------------------------------------------
def memory_pool(n: int, seed: int = 11) -> list[str]:
    rng, seen = random.Random(seed), dict[str, None]()
    while len(seen) < n:
        seen.setdefault(corpus.memory_text(rng), None)
    return list(seen)


def section_pool(titles: int = TITLES, seed: int = 12) -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, [(heading, body), ...]) for each document title; every (title, heading, body) distinct."""
    rng = random.Random(seed)
    pool = []
    for t in range(titles):
        topic = list(corpus.TOPICS)[t % len(corpus.TOPICS)]
        title = f"{topic.title()} policy {t // len(corpus.TOPICS)}"
        sections: dict[tuple[str, str], None] = {}
        while len(sections) < SECTIONS_PER_TITLE:
            sections.setdefault(corpus.section_text(rng), None)
        pool.append((title, list(sections)))
    return pool


def bundle(memories: int, sections: int, mem_texts: list[str], sec_pool: list, seed: int = 7, unique: bool = False) -> dict[str, Any]:
    rng = random.Random(seed)
    contacts = max(1, memories // PER_CONTACT)
    companies = [c.lower() for c in corpus.COMPANIES]
    records, edges = [], []
    for c in companies:
        records.append({"id": f"co-{c}", "org": ORG, "kind": "company", "identifiers": {"website": f"{c}.com"},
                        "properties": {"industry": rng.choice(["software", "logistics", "retail", "finance"])}})  # fmt: skip
    for i in range(contacts):
        company = rng.choice(companies)
        records.append({
            "id": f"r{i}", "org": ORG, "kind": "contact",
            "identifiers": {"email": f"{rng.choice(corpus.PEOPLE).lower()}{i}@{company}.com"},
            "properties": {"deal_stage": rng.choice(["discovery", "negotiation", "closed won"]), "seats": rng.randint(5, 500)},
        })  # fmt: skip
        edges.append({"id": f"w{i}", "org": ORG, "src": f"r{i}", "dst": f"co-{company}", "type": "works_at",
                      "confidence": round(rng.uniform(0.5, 1.0), 2)})  # fmt: skip
        if i:
            edges.append({"id": f"k{i}", "org": ORG, "src": f"r{i}", "dst": f"r{rng.randrange(i)}", "type": "knows",
                          "confidence": round(rng.uniform(0.3, 1.0), 2)})  # fmt: skip
    start = datetime(2023, 1, 1, tzinfo=timezone.utc)
    mems = [
        {"id": f"m{i}", "org": ORG, "record": f"r{rng.randrange(contacts)}",
         "text": rng.choice(mem_texts) + (f" (note {i})" if unique else ""),
         "created_at": (start + timedelta(seconds=61 * i)).isoformat()}
        for i in range(memories)
    ]  # fmt: skip
    docs = []
    for d in range((sections + 7) // 8):
        title, pairs = sec_pool[rng.randrange(len(sec_pool))]
        count = min(8, sections - 8 * d)
        secs = [{"id": f"d{d}-s{s}", "heading": h, "text": t + (f" (ref d{d}-s{s})" if unique else "")}
                for s, (h, t) in enumerate(rng.sample(pairs, count))]
        docs.append({"id": f"d{d}", "org": ORG, "title": title, "doc_type": "policy", "sections": secs})
    return {"orgs": [{"id": ORG}], "callers": [{"id": "bench", "org": ORG, "roles": ["sales"]}],
            "records": records, "memories": mems, "documents": docs, "edges": edges}  # fmt: skip


def pool_texts(mem_texts: list[str], sec_pool: list) -> list[str]:
    """The distinct memory and section texts (property texts, a few hundred, are embedded on the way)."""
    texts = dict.fromkeys(mem_texts)
    from dossier.bundle import Document, Section

    for title, pairs in sec_pool:
        doc = Document(id="x", org=ORG, title=title, sections=(Section(id="x"),))
        texts.update(dict.fromkeys(section_text(doc, Section(id="x", heading=h, text=t)) for h, t in pairs))
    return list(texts)


class PoolEmbedder(Embedder):
    """The real model, with every text of the corpus embedded once beforehand (cached on disk)."""

    def __init__(self, model: OnnxMiniLM, texts: Sequence[str], cache: Path) -> None:
        self.model, self.model_id, self.dimensions = model, model.model_id, model.dimensions
        self.batch_size = 4096
        digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12]
        key = f"{model.model_id}-{len(texts)}-{digest}".replace("/", "_")
        path = cache / f"pool-{key}.npy"
        if path.exists():
            matrix = np.load(path)
        else:
            started = time.perf_counter()
            print(f"embedding {len(texts):,} distinct texts once (cached in {path}) ...", flush=True)
            matrix = model.embed_documents(list(texts), progress=_progress(len(texts)))
            cache.mkdir(parents=True, exist_ok=True)
            np.save(path, matrix)
            print(f"  embedded in {time.perf_counter() - started:.0f} s", flush=True)
        self.matrix = matrix
        self.row = {t: i for i, t in enumerate(texts)}
        self.extra: dict[str, np.ndarray] = {}  # texts outside the pools (property values), embedded on the way
        self.jitter = 0.0

    def _jittered(self, text: str) -> np.ndarray:
        """A pool text with a unique suffix: its real vector moved by a small, fixed (seeded by the text)
        random step, so that no two memories share a vector yet each sits where its text's meaning is."""
        base = _SUFFIX.sub("", text)
        if base not in self.row:
            if base not in self.extra:
                self.extra[base] = self.model.embed_batch([base])[0]
            vector = self.extra[base]
        else:
            vector = self.matrix[self.row[base]]
        if base == text:
            return vector
        rng = np.random.default_rng(zlib.crc32(text.encode()))
        moved = vector + self.jitter * rng.standard_normal(len(vector)).astype(np.float32) / np.sqrt(len(vector))
        return (moved / np.linalg.norm(moved)).astype(np.float32)

    def embed_batch(self, texts: Sequence[str], *, kind: str = "document") -> np.ndarray:  # type: ignore[override]
        if kind == "query":
            return self.model.embed_batch(texts, kind="query")
        if self.jitter:
            return np.stack([self._jittered(t) for t in texts])
        missing = [t for t in dict.fromkeys(texts) if t not in self.row and t not in self.extra]
        if missing:
            self.extra.update(zip(missing, self.model.embed_batch(missing)))
        return np.stack([self.matrix[self.row[t]] if t in self.row else self.extra[t] for t in texts])


def _progress(total: int):  # type: ignore[no-untyped-def]
    done, last = [0], [time.perf_counter()]

    def step(n: int) -> None:
        done[0] += n
        if time.perf_counter() - last[0] > 30:
            last[0] = time.perf_counter()
            print(f"  {done[0]:,}/{total:,}", flush=True)

    return step


# -- stores ------------------------------------------------------------------------------------------
def pg_server(workdir: Path):  # type: ignore[no-untyped-def]
    """A pgserver for the bench (kept between runs), with memory for 1M vectors and their HNSW index."""
    import warnings

    import psycopg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
        from pgserver._commands import pg_ctl

    workdir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(workdir / "pgdata", cleanup_mode="stop")
    wanted = {"shared_buffers": "4GB", "maintenance_work_mem": "4GB", "max_parallel_maintenance_workers": "2",
              "synchronous_commit": "off", "max_wal_size": "8GB", "checkpoint_timeout": "30min"}  # fmt: skip
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        current = {k: conn.execute(f"SHOW {k}").fetchone()[0] for k in wanted}  # type: ignore[index]
        for k, v in wanted.items():
            conn.execute(f"ALTER SYSTEM SET {k} = '{v}'")
        conn.execute("SELECT pg_reload_conf()")
    if current["shared_buffers"] != wanted["shared_buffers"]:
        pg_ctl(["-w", "restart"], pgdata=server.pgdata, user=server.system_user)
        server = pgserver.get_server(workdir / "pgdata", cleanup_mode="stop")
    return server


def fresh_pg_database(admin_url: str, name: str) -> str:
    """A new database owned by an ordinary role (row-level security binds it, as in production)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'dossier_bench'").fetchone():
            conn.execute("CREATE ROLE dossier_bench LOGIN PASSWORD 'dossier-bench'")
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name} OWNER dossier_bench")
    params = conninfo_to_dict(admin_url)
    with psycopg.connect(make_conninfo(**{**params, "dbname": name}), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")
    return pg_database_url(admin_url, name)


def vacuum(admin_url: str, name: str) -> None:
    """VACUUM (ANALYZE) one bench database as its owner would (a migration may just have rewritten rows)."""
    import psycopg

    with psycopg.connect(pg_database_url(admin_url, name), autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")


def pg_database_url(admin_url: str, name: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(admin_url)
    return make_conninfo(**{**params, "dbname": name, "user": "dossier_bench", "password": "dossier-bench"})


def open_store(kind: str, level: int, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    if kind == "sqlite":
        from dossier.stores.sqlite import SQLiteStore

        path = Path(args.workdir) / f"scale-{level}.db"
        for suffix in ("", "-wal", "-shm"):
            if not args.measure_only:
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        return SQLiteStore(path, hnsw_min_rows=args.hnsw_min_rows)
    from dossier.stores.postgres import PostgresStore

    if args.measure_only:
        url = pg_database_url(args.pg_admin_url, f"scale_{level}")
    else:
        url = fresh_pg_database(args.pg_admin_url, f"scale_{level}")
    tuned = {} if args.pg_ef_search is None else {"ef_search": args.pg_ef_search}
    return PostgresStore(url, index_build_memory="4GB", **tuned)


# -- measuring -----------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class StepTimer:
    """Sums the time a call spends in the store's searches (and reading its candidates' documents)."""

    def __init__(self, store: Any) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        local = threading.local()  # whether this thread is inside a timed method (counted there)
        for name in ("search_vectors", "search_vectors_many", "search_text", "recent_memories", "edges_around", "get_documents"):
            inner = getattr(store, name)
            step = "search_vectors" if name == "search_vectors_many" else name

            def wrapped(*a: Any, _inner=inner, _name=step, **k: Any) -> Any:  # type: ignore[no-untyped-def]
                if getattr(local, "inside", False):  # PostgreSQL's search_vectors_many calls search_vectors
                    return _inner(*a, **k)
                local.inside = True
                t = time.perf_counter()
                try:
                    return _inner(*a, **k)
                finally:
                    local.inside = False
                    self.spent[_name] += (time.perf_counter() - t) * 1000

            setattr(store, name, wrapped)


def server_cpu_s() -> float:
    """CPU seconds used so far by this machine's PostgreSQL processes (0 where there are none, or no /proc):
    with a local server, what the bench's calls cost it."""
    total = 0
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as comm:
                if comm.read().strip() not in ("postgres", "postmaster"):
                    continue
            with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
        except (OSError, IndexError, ValueError):
            continue  # a process that ended meanwhile
    return total / os.sysconf("SC_CLK_TCK")


def brief_latency(engine: Engine, emails: list[str], calls: int, warmup: int, seed: int = 5) -> dict[str, Any]:
    rng = random.Random(seed)
    questions: dict[str, None] = {}
    while len(questions) < calls + warmup:
        questions.setdefault(corpus.question(rng), None)
    timer = StepTimer(engine.store)
    totals, steps = [], defaultdict(list)
    errors: dict[str, int] = defaultdict(int)
    cpu: dict[str, float] = {}
    for n, question in enumerate(questions):
        if n == warmup:  # CPU spent by the timed calls: this process's (engine, model) and the server's
            cpu = {"engine": time.process_time(), "server": server_cpu_s()}
        timer.spent.clear()
        started = time.perf_counter()
        response = engine.retrieve(
            {"mode": "brief", "record": {"email": rng.choice(emails)}, "message": question, "budget": {"totalTokens": 8000}},
            org=ORG, caller="bench",
        )  # fmt: skip
        elapsed = (time.perf_counter() - started) * 1000
        for name, source in response.sources.items():
            if source.error:
                errors[f"{name}: {source.error}"] += 1
        if n >= warmup:  # warm-up calls are not counted
            totals.append(elapsed)
            for name in ("search_vectors", "search_text", "recent_memories", "edges_around", "get_documents"):
                steps[name].append(timer.spent.get(name, 0.0))
    out: dict[str, Any] = {"calls": len(totals), "p50_ms": round(statistics.median(totals), 2),
                           "p95_ms": round(percentile(totals, 0.95), 2), "errors": dict(errors)}  # fmt: skip
    if cpu and totals:
        out["engine_cpu_per_call_ms"] = round((time.process_time() - cpu["engine"]) * 1000 / len(totals), 2)
        out["server_cpu_per_call_ms"] = round((server_cpu_s() - cpu["server"]) * 1000 / len(totals), 2)
    for name, values in steps.items():
        out[f"{name}_p50_ms"] = round(statistics.median(values), 2)
        out[f"{name}_p95_ms"] = round(percentile(values, 0.95), 2)
    return out


def corpus_rows(embedder: PoolEmbedder, data: dict[str, Any]) -> dict[str, tuple[list[str], np.ndarray]]:
    """Per kind, the ids of its vectors and the row of each in ``embedder.matrix`` (no 1M x 384 copy), or,
    with ``--jitter``, the vectors themselves (each memory's is its own)."""
    from dossier.bundle import Document, Section

    out = {"memory": ([m["id"] for m in data["memories"]], [m["text"] for m in data["memories"]])}
    ids, texts = [], []
    for d in data["documents"]:
        doc = Document(id=d["id"], org=ORG, title=d["title"], sections=(Section(id="x"),))
        for s in d["sections"]:
            ids.append(s["id"])
            texts.append(section_text(doc, Section(id=s["id"], heading=s["heading"], text=s["text"])))
    out["section"] = (ids, texts)
    if embedder.jitter:
        return {kind: (keys, embedder.embed_batch(texts)) for kind, (keys, texts) in out.items()}
    return {kind: (keys, np.array([embedder.row[t] for t in texts], dtype=np.int64)) for kind, (keys, texts) in out.items()}


def vector_recall(engine: Engine, embedder: PoolEmbedder, rows: dict[str, tuple[list[str], np.ndarray]], queries: int,
                  seed: int = 9) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(seed)
    questions = [embedder.model.embed_query(f"{corpus.question(rng)} {rng.choice(corpus.PEOPLE)}") for _ in range(queries)]
    out: dict[str, Any] = {}
    for kind, (keys, pool_rows) in rows.items():
        position = {key: i for i, key in enumerate(keys)}
        recalls, latencies, short = [], [], 0
        for q in questions:
            # exact similarity of every vector of this kind
            sims = pool_rows @ q if pool_rows.ndim == 2 else (embedder.matrix @ q)[pool_rows]
            tenth = -np.partition(-sims, 9)[9]  # the 10th best exact similarity
            started = time.perf_counter()
            hits = engine.store.search_vectors(kind, q, org=ORG, limit=10)  # type: ignore[arg-type]
            latencies.append((time.perf_counter() - started) * 1000)
            short += len(hits) < 10
            recalls.append(sum(1 for h in hits[:10] if sims[position[h.id]] >= tenth - 1e-5) / 10)
        out[kind] = {"vectors": len(keys), "recall_at_10": round(float(np.mean(recalls)), 4),
                     "min_recall": round(float(min(recalls)), 2), "queries_with_fewer_than_10_hits": short,
                     "search_p50_ms": round(statistics.median(latencies), 2),
                     "search_p95_ms": round(percentile(latencies, 0.95), 2)}  # fmt: skip
    return out


def run_level(kind: str, level: int, args: argparse.Namespace, model: OnnxMiniLM, mem_texts: list[str], sec_pool: list) -> dict[str, Any]:
    sections = min(100_000, level // 10)
    started = time.perf_counter()
    data = bundle(level, sections, mem_texts, sec_pool, unique=bool(args.jitter))
    built = time.perf_counter() - started
    embedder = PoolEmbedder(model, pool_texts(mem_texts, sec_pool), Path(args.cache))
    embedder.jitter = args.jitter
    store = open_store(kind, level, args)
    engine = Engine(store, embedder=embedder)
    result: dict[str, Any] = {
        "store": kind, "memories": level, "sections": sections, "records": len(data["records"]),
        "edges": len(data["edges"]), "bundle_build_s": round(built, 1),
        "distinct_memory_texts": len({m["text"] for m in data["memories"]}),
        "distinct_section_texts": len({(d["title"], s["heading"], s["text"]) for d in data["documents"] for s in d["sections"]}),
    }  # fmt: skip
    if args.measure_only:
        assert store.counts(org=ORG)["memories"] == level, "--measure-only needs a store loaded by an earlier run"
        print(f"[{kind} {level:,}] measuring the store loaded by an earlier run", flush=True)
        if kind == "postgres":  # the steady state autovacuum reaches: visibility map set, statistics current
            started = time.perf_counter()
            vacuum(args.pg_admin_url, f"scale_{level}")
            result["vacuum_s"] = round(time.perf_counter() - started, 1)
    else:
        print(f"[{kind} {level:,}] loading {len(data['memories']):,} memories, {sections:,} sections, "
              f"{len(data['records']):,} records, {len(data['edges']):,} edges ...", flush=True)  # fmt: skip
        started = time.perf_counter()
        report = engine.load_bundle(data)
        result.update(load_s=round(time.perf_counter() - started, 1), embedded_during_load=report.embedded)
        print(f"[{kind} {level:,}] loaded in {result['load_s']:.0f} s", flush=True)
    if args.load_only:
        engine.close()
        return result
    emails = [r["identifiers"]["email"] for r in data["records"] if r["kind"] == "contact"]
    rows = corpus_rows(embedder, data)
    del data  # the bundle is large; what follows needs only the emails and the vectors' rows
    started = time.perf_counter()
    engine.store.search_vectors("memory", model.embed_query("warm up"), org=ORG, limit=10)
    engine.store.search_vectors("section", model.embed_query("warm up"), org=ORG, limit=10)
    result["first_search_s"] = round(time.perf_counter() - started, 2)
    if kind == "postgres":
        result["hnsw"] = {"m": store.hnsw_m, "ef_construction": store.hnsw_ef_construction, "ef_search": store.ef_search,
                          "exact_below": store.exact_below}  # fmt: skip
    # The bench's own corpus (millions of Python objects: ids, texts, pools) would make every full garbage
    # collection in a timed call scan it, which a server holding only the engine does not pay: freeze it.
    gc.collect()
    gc.freeze()
    result["brief"] = brief_latency(engine, emails, args.calls, args.warmup)
    print(f"[{kind} {level:,}] brief {result['brief']}", flush=True)
    result["vector_recall"] = vector_recall(engine, embedder, rows, args.queries)
    print(f"[{kind} {level:,}] recall {result['vector_recall']}", flush=True)
    result["load_average"] = os.getloadavg()
    engine.close()
    gc.unfreeze()
    result["new_process_first_answer_s"] = first_answer(kind, store.url if kind == "sqlite" else engine_url(args, level), emails[0])
    print(f"[{kind} {level:,}] a new process answered its first call in {result['new_process_first_answer_s']} s", flush=True)
    return result


def engine_url(args: argparse.Namespace, level: int) -> str:
    """The bench database as a ``postgresql://`` URL (what dossier.open takes)."""
    from urllib.parse import quote, urlencode

    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(pg_database_url(args.pg_admin_url, f"scale_{level}")).items()}
    user, password, dbname = params.pop("user", ""), params.pop("password", ""), params.pop("dbname", "")
    query = urlencode(params)  # host (a socket directory or a name), port: libpq reads them from the query too
    return f"postgresql://{quote(user)}:{quote(password)}@/{quote(dbname)}" + (f"?{query}" if query else "")


def first_answer(kind: str, url: str, email: str) -> float:
    """Seconds from starting a new Python process to its first brief answer (imports, opening the store,
    loading the model, mapping the SQLite store's ANN index files: what a restart costs)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--first-answer", url, email], capture_output=True, text=True, check=True)
    assert done.stdout.strip().endswith("answered"), done.stdout + done.stderr
    return round(time.perf_counter() - started, 2)


def answer_once(url: str, email: str) -> None:
    import dossier

    engine = dossier.open(url)
    engine.retrieve({"mode": "brief", "record": {"email": email}, "message": "What did we agree about annual prepay?"},
                    org=ORG, caller="bench")  # fmt: skip
    engine.close()
    print("answered")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="100000,1000000", help="memory counts, comma-separated")
    parser.add_argument("--stores", default="postgres,sqlite")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=100, help="calls before the timed ones (caches, buffers), not counted")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--pg-url", default=os.environ.get("DOSSIER_BENCH_PG_URL"),
                        help="admin URL of a PostgreSQL server with pgvector (default: a pgserver under --workdir)")  # fmt: skip
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "dossier-scale"))
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "dossier-bench"))
    parser.add_argument("--report", default="bench-scale.json")
    parser.add_argument("--measure-only", action="store_true", help="measure stores loaded by an earlier run (no load)")
    parser.add_argument("--load-only", action="store_true", help="load the stores and stop (measure later with --measure-only)")
    parser.add_argument("--hnsw-min-rows", type=int, default=HNSW_MIN_ROWS,
                        help="SQLite: org-wide searches of a kind with this many vectors ask the ANN index (exact "
                             "below; default: the store's own line)")  # fmt: skip
    parser.add_argument("--pg-ef-search", type=int, default=None,
                        help="PostgreSQL: hnsw.ef_search of its searches (default: the store's own, 200)")
    parser.add_argument("--memory-pool", type=int, default=MEMORY_POOL, help="distinct memory texts")
    parser.add_argument("--titles", type=int, default=TITLES, help=f"document titles ({SECTIONS_PER_TITLE} distinct sections each)")
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="synthetic vectors: every memory and section text made unique, its vector its pool text's "
                             "moved by this much noise (0.05: cosine ~0.999), so fewer texts need the model")  # fmt: skip
    parser.add_argument("--first-answer", nargs=2, metavar=("URL", "EMAIL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_answer:
        answer_once(*args.first_answer)
        return
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    if "postgres" in args.stores and not args.pg_url:
        args.pg_admin_url = pg_server(Path(args.workdir) / "pg").get_uri()
    else:
        args.pg_admin_url = args.pg_url
    model = OnnxMiniLM()
    mem_texts, sec_pool = memory_pool(args.memory_pool), section_pool(args.titles)
    results = []
    for level in (int(x) for x in args.levels.split(",")):
        for kind in args.stores.split(","):
            results.append(run_level(kind, level, args, model, mem_texts, sec_pool))
            with open(args.report, "a", encoding="utf-8") as out:
                out.write(json.dumps(results[-1]) + "\n")
    for r in results:
        if "brief" not in r:
            print(f"{r['store']:>8} {r['memories']:>9,} memories {r['sections']:>7,} sections | load {r['load_s']:>6.0f} s")
            continue
        b, v = r["brief"], r["vector_recall"]
        load = f"{r['load_s']:>6.0f} s" if "load_s" in r else "  (earlier run)"
        print(f"{r['store']:>8} {r['memories']:>9,} memories {r['sections']:>7,} sections | load {load} | "
              f"brief p50 {b['p50_ms']:6.1f} ms p95 {b['p95_ms']:6.1f} ms | recall@10 memory {v['memory']['recall_at_10']:.3f} "
              f"section {v['section']['recall_at_10']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
