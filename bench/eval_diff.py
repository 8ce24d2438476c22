"""Compare two runs of a labelled dataset item for item, ignoring only timings.

Two kinds of files can be compared:

* ``dossier eval DATASET --json A.json`` reports (what each question returned, its metrics, losses,
  rankers, model use);
* full responses, written by this script's ``dump`` command: every question's whole response (items
  with their scores, sources, routes with their details, budget, trace), the trace unfiltered.

Timings (latencies, the deadline route's elapsed, per-layer and per-step times) and what is random by
design (call ids, continuation ids) are left out of the comparison; everything else must be equal.

Reproduce (a refactoring that must not change behaviour)::

    dossier eval examples/eval/sample-questions.json --json /tmp/before.json
    python bench/eval_diff.py dump examples/eval/sample-questions.json /tmp/before-responses.json
    # ... change the code ...
    dossier eval examples/eval/sample-questions.json --json /tmp/after.json
    python bench/eval_diff.py dump examples/eval/sample-questions.json /tmp/after-responses.json
    python bench/eval_diff.py /tmp/before.json /tmp/after.json
    python bench/eval_diff.py /tmp/before-responses.json /tmp/after-responses.json

``--store URL`` runs either on PostgreSQL (``dossier eval ... --store URL`` for the report); each run
needs a fresh, empty database. Exit status 0 when the files agree, 1 (with the differences) otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

#: Keys whose values are timings, random ids or the store's URL (a fresh database per run): never compared.
IGNORED = frozenset({"latency_ms", "elapsed_ms", "layers", "start_ms", "ms", "budget_ms", "call_id", "continuation",
                     "opened_by", "median_ms", "max_ms", "store"})  # fmt: skip


def differences(a: Any, b: Any, path: str = "") -> Iterator[str]:
    """Every place where ``a`` and ``b`` differ, as ``path: a != b`` (timings and random ids skipped)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key in IGNORED:
                continue
            where = f"{path}.{key}" if path else str(key)
            if key not in a:
                yield f"{where}: only in the second"
            elif key not in b:
                yield f"{where}: only in the first"
            else:
                yield from differences(a[key], b[key], where)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{path}: {len(a)} entries != {len(b)} entries"
        for n, (x, y) in enumerate(zip(a, b)):
            yield from differences(x, y, f"{path}[{n}]")
    elif a != b:
        yield f"{path}: {json.dumps(a)[:200]} != {json.dumps(b)[:200]}"


def dump(dataset_path: str, out: str, store_url: str | None = None) -> None:
    """Every question of the dataset through ``retrieve`` (as ``dossier eval`` asks it); the responses as JSON."""
    from dossier.engine import open_engine
    from dossier.evaluation.dataset import load_dataset
    from dossier.evaluation.runner import DEFAULT_REQUEST, ask

    dataset = load_dataset(dataset_path)
    with tempfile.TemporaryDirectory(prefix="dossier-diff-") as tmp:
        with open_engine(store_url or f"sqlite:///{tmp}/diff.db") as engine:
            engine.load_bundle(dataset.bundle)
            responses = {q.id: ask(engine, q, dict(DEFAULT_REQUEST)).model_dump(mode="json") for q in dataset.questions}
    Path(out).write_text(json.dumps({"responses": responses}, indent=1, sort_keys=True), encoding="utf-8")
    print(f"{len(responses)} responses written to {out}")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "dump":
        parser = argparse.ArgumentParser(prog="eval_diff.py dump", description="write every response of a dataset")
        parser.add_argument("dataset")
        parser.add_argument("out")
        parser.add_argument("--store", default=None, help="store URL (default: a fresh temporary SQLite file)")
        parsed = parser.parse_args(args[1:])
        dump(parsed.dataset, parsed.out, parsed.store)
        return 0
    parser = argparse.ArgumentParser(prog="eval_diff.py", description=__doc__.split("\n", 1)[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parsed = parser.parse_args(args)
    a = json.loads(Path(parsed.first).read_text(encoding="utf-8"))
    b = json.loads(Path(parsed.second).read_text(encoding="utf-8"))
    found = list(differences(a, b))
    for line in found[:200]:
        print(line)
    if len(found) > 200:
        print(f"... and {len(found) - 200} more")
    units = len(a.get("per_question", a.get("responses", {})))
    print(f"{'identical' if not found else f'{len(found)} differences'} ({units} questions compared, timings ignored)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
