"""Checks shared by the labelled sets' integrity tests (examples/handbook, examples/training): every id a
question labels exists in the question's org."""

from __future__ import annotations

from typing import Any

from dossier.evaluation.dataset import Dataset

GOLD_KINDS = ("documents", "sections", "memories", "properties", "edges", "records")


def bundle_ids(raw: dict[str, Any]) -> dict[str, set[tuple[str, str]]]:
    """Every id in the bundle -> the (kind, org) pairs it names (ids are unique per org and kind)."""
    index: dict[str, set[tuple[str, str]]] = {}

    def add(item_id: str, kind: str, org: str) -> None:
        index.setdefault(item_id, set()).add((kind, org))

    for kind in ("records", "memories", "documents", "edges"):
        for item in raw[kind]:
            add(item["id"], kind, item["org"])
    for doc in raw["documents"]:
        for section in doc["sections"]:
            add(section["id"], "sections", doc["org"])
    for record in raw["records"]:
        for name in record["properties"]:
            add(f"{record['id']}/{name}", "properties", record["org"])
    return index


def label_problems(dataset: Dataset) -> list[str]:
    """What is wrong with the set's labels: a caller outside the question's org, a gold id missing from that
    org, a forbidden id that does not exist, an id both gold and forbidden."""
    index = bundle_ids(dataset.raw_bundle)
    callers = {c["id"]: c["org"] for c in dataset.raw_bundle["callers"]}
    problems = []
    for q in dataset.questions:
        if callers.get(q.caller) != q.org:
            problems.append(f"{q.id}: caller {q.caller} is not in org {q.org}")
        for kind in GOLD_KINDS:
            for item in getattr(q.gold, kind):
                if (kind, q.org) not in index.get(item, set()):
                    problems.append(f"{q.id}: gold {kind} {item} not in org {q.org}")
        for item in q.forbidden:
            if item not in index:
                problems.append(f"{q.id}: forbidden {item} does not exist")
        gold = {item for kind in GOLD_KINDS for item in getattr(q.gold, kind)}
        if gold & set(q.forbidden):
            problems.append(f"{q.id}: gold and forbidden share {sorted(gold & set(q.forbidden))}")
    return problems
