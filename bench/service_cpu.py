"""CPU per retrieve call of one service worker, measured in-process (no HTTP, no other process to share with).

Reproduce (from the repository root):

    python bench/service_cpu.py                  # 5 rounds of 60 brief calls each way, the median round
    python bench/service_cpu.py --profile 30     # and the 30 functions with the most own time (cProfile)
    python bench/service_cpu.py --profile 30 --profile-out cpu.prof   # the profile kept, for pstats

It loads the sample organisation (examples/sample-org.json) into a fresh SQLite file and makes the calls
``bench/service.py`` makes over HTTP (a ``brief`` about one of its ten records, budget 8000 bytes, a question of
the labelled set) through ``Service.retrieve`` as caller ``ana`` of ``northwind``, serialising each response
to JSON as the HTTP front end does. The embedder runs on one inference thread, as in a ``dossier serve``
worker on this 2-core machine. Printed, in milliseconds of CPU time (user + sys) per call, median over the
rounds: with unique questions (each pays for its query embedding), with repeated questions (the
query-embedding cache answers: the rest of the call), and the query embedding alone. A server's throughput
on ``C`` free cores is at most ``1000 * C / (CPU ms per call)`` calls per second, before HTTP.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from service import QUESTIONS, RECORDS, SAMPLE  # noqa: E402 - the HTTP bench's calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=60, help="calls per round")
    parser.add_argument("--profile", type=int, default=0, help="also profile one round of repeated questions and "
                        "print this many functions by own time")  # fmt: skip
    parser.add_argument("--profile-out", help="with --profile, also write the profile here (pstats format)")
    args = parser.parse_args()

    import dossier
    from dossier.providers.embeddings import OnnxMiniLM
    from dossier.service import Principal, Service

    questions = json.loads(QUESTIONS.read_text(encoding="utf-8"))["questions"]
    pool = sorted({q["message"] for q in questions if q["org"] == "northwind" and q.get("message")})
    rng = random.Random(7)

    def body(repeat: bool) -> dict:
        message = rng.choice(pool) if repeat else f"{rng.choice(pool)} ({rng.randint(0, 10**9)})"
        return {"mode": "brief", "record": rng.choice(RECORDS), "message": message, "budget": {"totalTokens": 8000}}

    with tempfile.TemporaryDirectory(prefix="dossier-bench-cpu-") as tmp:
        with dossier.open(f"sqlite:///{tmp}/cpu.db", embedder=OnnxMiniLM(threads=1)) as engine:
            engine.load_bundle(SAMPLE)
            service, who = Service(engine), Principal(org="northwind", caller="ana")
            for _ in range(args.calls):  # warm up: the model and the caches
                service.retrieve(who, body(False)).model_dump_json()
            for message in pool:  # every question of the pool once, so that repeated ones hit the cache
                service.retrieve(who, {**body(True), "message": message}).model_dump_json()
            load_before = os.getloadavg()
            figures: dict[str, list[float]] = {"unique": [], "repeated": [], "embedding": []}
            for _ in range(args.rounds):
                for label, repeat in (("unique", False), ("repeated", True)):
                    bodies = [body(repeat) for _ in range(args.calls)]
                    started = time.process_time()
                    for b in bodies:
                        service.retrieve(who, b).model_dump_json()
                    figures[label].append((time.process_time() - started) * 1000 / args.calls)
                texts = [f"{rng.choice(pool)} ({rng.randint(0, 10**9)})" for _ in range(args.calls)]
                started = time.process_time()
                for text in texts:
                    engine.embed_query(text)
                figures["embedding"].append((time.process_time() - started) * 1000 / args.calls)
            load_after = os.getloadavg()
            profile = None
            if args.profile:
                bodies = [body(True) for _ in range(args.calls * 2)]
                profile = cProfile.Profile()
                profile.enable()
                for b in bodies:
                    service.retrieve(who, b).model_dump_json()
                profile.disable()
    unique, repeated, embedding = (statistics.median(figures[k]) for k in ("unique", "repeated", "embedding"))
    print(f"CPU per brief call, median of {args.rounds} rounds of {args.calls} (load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; {os.cpu_count()} cores):")  # fmt: skip
    print(f"  unique questions   {unique:6.2f} ms  (at most {2000 / unique:.0f} calls/s on 2 free cores)")
    print(f"  repeated questions {repeated:6.2f} ms  (the query embedding cached)")
    print(f"  query embedding    {embedding:6.2f} ms  (alone, one inference thread)")
    print("reproduce: python bench/service_cpu.py --rounds 5 --calls 60")
    if profile is not None:
        print(f"\nrepeated questions, {args.calls * 2} calls, by own time:")
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(args.profile)
        if args.profile_out:
            profile.dump_stats(args.profile_out)


if __name__ == "__main__":
    main()
