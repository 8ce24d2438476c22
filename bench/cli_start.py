"""How long the ``dossier`` command line takes to start and answer its light commands.

Reproduce (from the repository root):

    python bench/cli_start.py                     # 5 runs of each command, the sample org in a temporary store
    python bench/cli_start.py --runs 11 --json    # more runs; JSON on stdout
    python bench/cli_start.py --db sqlite:///dossier-demo.db   # an existing store (not changed, but for one key)

Each command runs ``--runs`` times as its own process (the ``dossier`` entry point beside this Python, else
``python -m dossier.cli``), output to /dev/null; the table shows the median wall time and the median CPU
time (user + sys) in seconds, and which heavy modules the command imported (read in a separate run with
``-X importtime``). The light commands are those that only talk (help, version) and those that open a store
without the engine or the model (stats, keys list, usage, result). ``keys create`` opens the engine and is
shown for comparison. Other processes skew the wall times: the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample-org.json"
#: modules a light command should not need (their import time is what this bench is about)
HEAVY = ("numpy", "pydantic", "dossier.bundle", "dossier.schema", "dossier.engine", "onnxruntime", "torch", "usearch",
         "fastapi", "uvicorn", "psycopg")  # fmt: skip


def entry_point() -> list[str]:
    script = Path(sys.executable).parent / "dossier"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "dossier.cli"]


def commands(org: str, caller: str) -> list[tuple[str, list[str], bool]]:
    """(label, arguments, light) of each command timed."""
    return [
        ("dossier --help", ["--help"], True),
        ("dossier --version", ["--version"], True),
        ("dossier retrieve --help", ["retrieve", "--help"], True),
        ("dossier stats", ["stats"], True),
        ("dossier keys list", ["keys", "list"], True),
        (f"dossier usage --org {org}", ["usage", "--org", org], True),
        ("dossier result ID (an unknown id)", ["result", "no-such-call", "--org", org, "--caller", caller], True),
        ("dossier keys create (opens the engine)", ["keys", "create", "--org", org, "--caller", caller], False),
    ]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + sys) seconds of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                   check=False, timeout=120)  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def heavy_imports(args: list[str], env: dict[str, str]) -> list[str]:
    """The HEAVY modules ``dossier ARGS`` imports (from ``python -X importtime``)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "dossier.cli", *args], env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, check=False, timeout=120)  # fmt: skip
    loaded = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return [m for m in HEAVY if m in loaded]


def import_cli_ms(env: dict[str, str], runs: int) -> float:
    """Median cumulative import time of ``dossier.cli`` (``-X importtime``), in milliseconds."""
    out = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import dossier.cli"], env=env,
                              capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
        lines = [line for line in done.stderr.splitlines() if line.rstrip().endswith("| dossier.cli")]
        out.append(int(lines[-1].split("|")[1]) / 1000 if lines else float("nan"))
    return statistics.median(out)


def prepare(tmp: Path) -> str:
    """A store holding the sample org (embedded once) and one API key."""
    import dossier
    from dossier.service import Service

    url = f"sqlite:///{tmp}/cli.db"
    with dossier.open(url) as engine:
        engine.load_bundle(SAMPLE)
        Service(engine).create_key("northwind", "ana", name="bench")
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command (the median is shown)")
    parser.add_argument("--db", help="an existing store URL (default: the sample org in a temporary SQLite file)")
    parser.add_argument("--org", default="northwind")
    parser.add_argument("--caller", default="ana")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dossier-cli-bench-"))
    try:
        url = args.db or prepare(tmp)
        env = {**os.environ, "DOSSIER_DATABASE_URL": url}
        env.pop("DOSSIER_LLM", None)
        load_before = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
        rows = []
        base = [timed([sys.executable, "-c", "pass"], env) for _ in range(args.runs)]
        rows.append({"command": "python -c pass (the interpreter alone)", "light": True,
                     "wall_s": statistics.median(w for w, _ in base), "cpu_s": statistics.median(c for _, c in base),
                     "heavy_imports": []})  # fmt: skip
        for label, argv, light in commands(args.org, args.caller):
            runs = [timed([*entry_point(), *argv], env) for _ in range(args.runs)]
            rows.append({"command": label, "light": light, "wall_s": statistics.median(w for w, _ in runs),
                         "cpu_s": statistics.median(c for _, c in runs), "heavy_imports": heavy_imports(argv, env)})  # fmt: skip
        cli_ms = import_cli_ms(env, args.runs)
        load_after = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = {"runs": args.runs, "store": "temporary sample org" if not args.db else args.db, "commands": rows,
              "import_dossier_cli_ms": cli_ms, "load_average_before": load_before, "load_average_after": load_after,
              "cores": os.cpu_count()}  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"median of {args.runs} runs, seconds (load average {' '.join(load_before)} before, "
          f"{' '.join(load_after)} after; {os.cpu_count()} cores)")  # fmt: skip
    width = max(len(r["command"]) for r in rows)
    print(f"{'command':<{width}}  {'wall':>5}  {'cpu':>5}  heavy imports")
    for r in rows:
        print(f"{r['command']:<{width}}  {r['wall_s']:5.2f}  {r['cpu_s']:5.2f}  {', '.join(r['heavy_imports']) or '-'}")
    print(f"import dossier.cli (-X importtime, cumulative): {cli_ms:.0f} ms")
    print("reproduce: python bench/cli_start.py --runs 5")


if __name__ == "__main__":
    main()
