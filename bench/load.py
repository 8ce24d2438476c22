"""Load throughput of the embedded store against the embedder's own, and a big bundle file's memory.

Reproduce (from the repository root, after `pip install -e .`):

    python bench/load.py                      # 3,000 memories + 600 sections, 200 query embeddings
    python bench/load.py --json               # one JSON line
    python bench/load.py --memories 20000 --sections 2000 --json
    python bench/load.py --bundle-mb 50       # also: a 50 MB bundle file through `dossier load`

Each load goes into a fresh SQLite file with the default local ONNX MiniLM model: a bundle of
``--memories`` memories (over 100 records without properties), then one of ``--sections`` sections. In
the same run the embedder alone embeds the very same texts (``embed_documents``, as the loader calls
it): ``memories_per_s`` against ``embed_texts_per_s`` says how much of a load is not embedding. The
embedder is timed right before each load, so machine load weighs on both alike; the load average is
printed. ``reload_*`` is the same bundle loaded again (nothing changed: nothing embedded or written).

``--bundle-mb N`` writes a bundle file of about N MB (memories of ~300 bytes), loads it with
``dossier load`` into a fresh store in a child process whose stderr is a pipe (not a terminal), and
reports its peak resident memory (``ru_maxrss``; ``small_load_rss_mb`` is the same command loading a
one-record bundle: the model and libraries), its wall time and the progress lines it printed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import corpus  # noqa: E402

import dossier  # noqa: E402
from dossier.bundle import Document, Section  # noqa: E402
from dossier.loading import section_text  # noqa: E402
from dossier.providers.embeddings import OnnxMiniLM  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def without_properties(data: dict) -> dict:
    data["records"] = [dict(r, properties={}) for r in data["records"]]
    return data


def section_texts(data: dict) -> list[str]:
    out = []
    for d in data["documents"]:
        doc = Document(id=d["id"], org=d["org"], title=d["title"], sections=(Section(id="x"),))
        out.extend(section_text(doc, Section(id=s["id"], heading=s["heading"], text=s["text"])) for s in d["sections"])
    return out


def embed_alone(embedder: OnnxMiniLM, texts: list[str]) -> float:
    started = time.perf_counter()
    embedder.embed_documents(texts)
    return len(texts) / (time.perf_counter() - started)


def load(embedder: OnnxMiniLM, path: Path, data: dict) -> tuple[float, dossier.LoadReport, dossier.LoadReport]:
    with dossier.open(f"sqlite:///{path}", embedder=embedder) as engine:
        started = time.perf_counter()
        report = engine.load_bundle(data)
        seconds = time.perf_counter() - started
        again = engine.load_bundle(data)
    return seconds, report, again


def big_file(args: argparse.Namespace, tmp: Path) -> dict:
    """A bundle file of about ``--bundle-mb`` MB through ``dossier load`` with stderr a pipe."""
    rng = random.Random(29)
    path = tmp / "big.json"
    memories, size, records = [], 0, 500
    while size < args.bundle_mb * 1_000_000:
        text = " ".join(corpus.memory_text(rng) for _ in range(2))
        memories.append({"id": f"m{len(memories)}", "org": "big", "record": f"r{len(memories) % records}", "text": text,
                         "created_at": "2025-01-01T00:00:00Z"})  # fmt: skip
        size += len(text) + 110
    data = {"orgs": [{"id": "big"}], "callers": [{"id": "ana", "org": "big"}],
            "records": [{"id": f"r{i}", "org": "big", "kind": "contact"} for i in range(records)], "memories": memories}  # fmt: skip
    path.write_text(json.dumps(data))
    del data, memories
    tiny = tmp / "tiny.json"  # what the command holds loading next to nothing (the model, the libraries)
    tiny.write_text(json.dumps({"orgs": [{"id": "tiny"}], "records": [{"id": "r", "org": "tiny", "kind": "contact"}]}))
    subprocess.run([sys.executable, "-m", "dossier.cli", "load", str(tiny), "--db", f"sqlite:///{tmp}/tiny.db"],
                   capture_output=True, check=True)  # fmt: skip
    baseline = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dossier.cli", "load", str(path), "--db", f"sqlite:///{tmp}/big.db"],
                          capture_output=True, text=True)  # fmt: skip
    seconds = time.perf_counter() - started
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return {"bundle_mb": round(path.stat().st_size / 1e6, 1), "exit_code": done.returncode, "wall_s": round(seconds, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
            "small_load_rss_mb": round(baseline, 1),
            "progress_lines": len(lines), "first_lines": lines[:3], "last_lines": lines[-2:],
            "stdout_tail": done.stdout.strip().splitlines()[-3:]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=3000)
    parser.add_argument("--sections", type=int, default=600)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--bundle-mb", type=float, default=0, help="also load a bundle file of this many MB (see above)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    embedder = OnnxMiniLM()
    embedder.embed_query("warm up")
    mem_data = without_properties(corpus.bundle("bench", memories=args.memories, sections=0, records=100))
    sec_data = without_properties(corpus.bundle("bench", memories=0, sections=args.sections, records=1))
    out: dict = {"memories": args.memories, "sections": args.sections}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        out["embed_texts_per_s"] = round(embed_alone(embedder, [m["text"] for m in mem_data["memories"]]), 1)
        seconds, report, again = load(embedder, tmp / "m.db", mem_data)
        out.update(memories_per_s=round(args.memories / seconds, 1), memories_load_s=round(seconds, 2),
                   memories_embedded=report.embedded, reload_inserted=again.total_inserted, reload_embedded=again.embedded)  # fmt: skip
        out["embed_section_texts_per_s"] = round(embed_alone(embedder, section_texts(sec_data)), 1)
        seconds, report, _ = load(embedder, tmp / "s.db", sec_data)
        out.update(sections_per_s=round(args.sections / seconds, 1), sections_load_s=round(seconds, 2))
        out["memories_vs_embedder"] = round(out["memories_per_s"] / out["embed_texts_per_s"], 3)
        out["sections_vs_embedder"] = round(out["sections_per_s"] / out["embed_section_texts_per_s"], 3)
        rng = random.Random(3)
        latencies = []
        for _ in range(args.queries):
            q = corpus.question(rng) + f" ({rng.randint(0, 10**6)})"  # no cache hits
            t = time.perf_counter()
            embedder.embed_query(q)
            latencies.append((time.perf_counter() - t) * 1000)
        out.update(query_embed_p50_ms=round(statistics.median(latencies), 2), query_embed_p95_ms=round(percentile(latencies, 0.95), 2))
        if args.bundle_mb:
            out["big_file"] = big_file(args, tmp)
    out.update(load_average=[round(load_before, 2), round(os.getloadavg()[0], 2)], cores=len(os.sched_getaffinity(0)))
    if args.json:
        print(json.dumps(out))
        return
    for key, value in out.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
