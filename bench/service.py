"""Load test of ``dossier serve``: concurrent clients making brief calls over HTTP, on loopback only.

Reproduce (from the repository root, after `pip install -e ".[server]"`):

    python bench/service.py                         # 50 clients, 60 s, paced at 250 calls/s in total, 2 workers
    python bench/service.py --rate 0                # closed loop: every client calls again at once (max throughput)
    python bench/service.py --repeat-questions      # questions repeat (the query-embedding cache hits)
    python bench/service.py --workers 1 --seconds 20 --clients 20

It loads the sample organisation (examples/sample-org.json) into a fresh SQLite file, creates an API key
for caller ``ana`` of ``northwind``, starts ``dossier serve`` on 127.0.0.1 on a free port, waits for
``/healthz``, and runs ``--clients`` clients, each on its own keep-alive connection, for ``--seconds``
(at most 600) or ``--max-calls`` calls (at most 1,000,000), whichever comes first. Each call is a
``brief`` about one of ten sample records with a question from the labelled set, made unique by a number
(so each call pays for one query embedding) unless ``--repeat-questions``.

Pacing: with ``--rate R`` each client sends on a fixed schedule (R / clients calls per second, start
times spread), and latency is measured from the *scheduled* send time, so a server that falls behind is
charged for the wait (no coordinated omission). With 50 clients in a closed loop the mean latency is
50 / throughput by Little's law, so p95 <= 50 ms at 50 concurrent clients needs either pacing or more
than 1,000 calls/s; both modes are printed so the two cannot be confused.

Prints: calls, errors (by status or exception), throughput, latency p50/p95/p99/max, the server's CPU
time, and the load average (other processes on the machine skew the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample-org.json"
QUESTIONS = ROOT / "examples" / "eval" / "sample-questions.json"
RECORDS = [
    {"email": "jane@acme.com"}, {"email": "raj@acme.com"}, {"website": "https://www.acme.com"},
    {"email": "li@acme.com"}, {"email": "marta@globex.com"}, {"website": "https://www.globex.com"},
    {"email": "samir@initech.com"}, {"phone": "+1 617 555 0148"}, {"email": "erin@hooli.com"},
    {"email": "lucas@pinnaclecloud.io"},
]  # fmt: skip
MAX_SECONDS, MAX_CALLS = 600.0, 1_000_000
LOOPBACK = "127.0.0.1"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def prepare(tmp: Path) -> tuple[str, str]:
    """A store with the sample org, and a key for ana of northwind."""
    import dossier
    from dossier.service import Service

    url = f"sqlite:///{tmp}/bench.db"
    with dossier.open(url) as engine:
        engine.load_bundle(SAMPLE)
        _, key = Service(engine).create_key("northwind", "ana", name="bench")
    return url, key


def start_server(url: str, port: int, workers: int) -> subprocess.Popen:
    env = {**os.environ, "DOSSIER_DATABASE_URL": url}
    command = [sys.executable, "-m", "dossier.cli", "serve", "--host", LOOPBACK, "--port", str(port),
               "--workers", str(workers), "--no-access-log"]  # fmt: skip
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited: {server.stderr.read().decode() if server.stderr else ''}")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
                if b"200 OK" in s.recv(1024):
                    return server
        except OSError:
            pass
        time.sleep(0.3)
    server.kill()
    raise SystemExit("the server did not answer /healthz within 120 s")


class Connection:
    """One keep-alive HTTP/1.1 connection; just enough of the protocol for JSON POSTs (low client overhead)."""

    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self.head = f"POST /v1/retrieve HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\nAuthorization: Bearer {key}\r\n" \
                    "Content-Type: application/json\r\n"  # fmt: skip
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(LOOPBACK, self.port)
        assert self.reader is not None
        self.writer.write(f"{self.head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        length, close = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and value.strip().lower() == "close":
                close = True
        payload = await self.reader.readexactly(length)
        if close:
            self.close()
        return status, payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def client(n: int, args: argparse.Namespace, port: int, key: str, pool: list[str], stop: float,
                 results: list[tuple[float, float]], errors: Counter, budget: list[int]) -> None:  # fmt: skip
    rng = random.Random(n)
    connection = Connection(port, key)
    interval = args.clients / args.rate if args.rate > 0 else 0.0
    scheduled = time.perf_counter() + (interval * n / args.clients if interval else 0.0)
    while True:
        if interval:
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        sent = time.perf_counter()
        if sent >= stop or budget[0] <= 0:
            break
        budget[0] -= 1
        question = rng.choice(pool) if args.repeat_questions else f"{rng.choice(pool)} ({n}-{rng.randint(0, 10**9)})"
        body = json.dumps({"mode": "brief", "record": rng.choice(RECORDS), "message": question,
                           "budget": {"totalTokens": 8000}}).encode()  # fmt: skip
        start = scheduled if interval else sent
        try:
            status, payload = await connection.post(body)
            if status != 200:
                errors[f"HTTP {status}"] += 1
            elif b'"call_id"' not in payload[:64]:
                errors["bad body"] += 1
            else:
                done = time.perf_counter()
                results.append((done, (done - start) * 1000))
        except Exception as exc:  # noqa: BLE001 - counted and reported
            errors[type(exc).__name__] += 1
            connection.close()
        scheduled = max(scheduled + interval, time.perf_counter() - interval) if interval else 0.0
    connection.close()


async def load(args: argparse.Namespace, port: int, key: str, pool: list[str]) -> tuple[list[tuple[float, float]], Counter, float]:
    results: list[tuple[float, float]] = []
    errors: Counter = Counter()
    budget = [args.max_calls]
    started = time.perf_counter()
    stop = started + args.seconds
    await asyncio.gather(*(client(n, args, port, key, pool, stop, results, errors, budget) for n in range(args.clients)))
    return results, errors, time.perf_counter() - started


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and its children (the uvicorn workers), from /proc."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    try:
        pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=250.0, help="total calls/s across clients; 0 = closed loop")
    parser.add_argument("--max-calls", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=100, help="calls before timing starts (not counted)")
    parser.add_argument("--repeat-questions", action="store_true", help="let the query-embedding cache hit")
    args = parser.parse_args()
    args.seconds = min(max(args.seconds, 1.0), MAX_SECONDS)
    args.max_calls = min(max(args.max_calls, 1), MAX_CALLS)
    args.clients = min(max(args.clients, 1), 1000)
    questions = json.loads(QUESTIONS.read_text(encoding="utf-8"))["questions"]
    pool = sorted({q["message"] for q in questions if q["org"] == "northwind" and q.get("message")})
    with tempfile.TemporaryDirectory(prefix="dossier-bench-service-") as tmp:
        url, key = prepare(Path(tmp))
        port = free_port()
        server = start_server(url, port, args.workers)
        try:
            if args.warmup:
                warm = argparse.Namespace(**{**vars(args), "rate": 0.0, "clients": min(args.clients, 10)})
                asyncio.run(_warm(warm, port, key, pool))
            cpu_before = cpu_seconds(server.pid)
            results, errors, elapsed = asyncio.run(load(args, port, key, pool))
            cpu = cpu_seconds(server.pid) - cpu_before
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
    latencies = [ms for _, ms in results]
    calls = len(latencies) + sum(errors.values())
    pacing = f"paced at {args.rate:g} calls/s" if args.rate > 0 else "closed loop"
    print(f"dossier serve, {args.workers} worker(s), {os.cpu_count()} cores; {args.clients} clients, {pacing}, "
          f"{elapsed:.1f} s; brief calls, budget 8000 bytes, "
          f"{'repeated' if args.repeat_questions else 'unique'} questions")  # fmt: skip
    print(f"  calls {calls}, ok {len(latencies)}, errors {sum(errors.values())} {dict(errors) if errors else ''}")
    print(f"  throughput {len(latencies) / elapsed:.1f} calls/s")
    if latencies:
        print(f"  latency p50 {statistics.median(latencies):.1f} ms, p95 {percentile(latencies, 0.95):.1f} ms, "
              f"p99 {percentile(latencies, 0.99):.1f} ms, max {max(latencies):.1f} ms"
              f"{' (from the scheduled send time)' if args.rate > 0 else ''}")  # fmt: skip
    print(f"  server CPU {cpu:.1f} s over {elapsed:.1f} s = {cpu / elapsed:.2f} cores, "
          f"{1000 * cpu / max(len(latencies), 1):.2f} ms CPU per call")  # fmt: skip
    print(f"  load average at the end {os.getloadavg()[0]:.2f} (other processes on the machine skew the figures)")


async def _warm(args: argparse.Namespace, port: int, key: str, pool: list[str]) -> None:
    args.max_calls, args.seconds = args.warmup, 60.0
    await load(args, port, key, pool)


if __name__ == "__main__":
    main()
