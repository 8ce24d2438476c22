"""Per-question quality metrics and where each lost gold item was lost (the evidence trace)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..schema import RetrieveResponse, SectionItem, SourceName, item_key
from .dataset import Question

METRICS = (
    "document_accuracy", "section_accuracy", "section_recall@3", "discovery", "memory_recall", "property_recall",
    "edge_recall", "record_accuracy", "abstention",
)  # fmt: skip
LAYERS = ("recall", "filter", "govern", "select", "budget")
GOLD_SOURCES: dict[str, SourceName] = {"sections": "documents", "memories": "memories", "properties": "properties", "edges": "graph"}


@dataclass
class Loss:
    """A gold item that did not reach the response: the last layer that had it, and why it went."""

    kind: str
    id: str
    layer: str
    reason: str


@dataclass
class QuestionResult:
    id: str
    category: str
    answerable: bool
    latency_ms: float
    metrics: dict[str, float | None]
    leaks: list[str] = field(default_factory=list)
    losses: list[Loss] = field(default_factory=list)
    returned: dict[str, list[str]] = field(default_factory=dict)
    gold: dict[str, set[str]] = field(default_factory=dict)  # memory | property | section -> gold ids
    candidate_scores: dict[str, list[tuple[str, float, bool]]] = field(default_factory=dict)
    model: dict[str, dict[str, int]] = field(default_factory=dict)  # layer -> calls, tokens (model_cost)
    rankers: dict[str, str] = field(default_factory=dict)  # source -> the ranker that ran (route detail)
    deadline: dict[str, dict[str, Any]] = field(default_factory=dict)  # model step -> its timing (deadline_steps)


#: The layer each model step belongs to (``route["model"].detail["steps"]`` is keyed by step).
STEP_LAYERS = {"filters": "understand", "rephrase": "understand", "rerank": "rerank", "select": "select",
               "synthesize": "synthesize"}  # fmt: skip
COST_FIELDS = ("calls", "errors", "prompt_tokens", "cached_tokens", "completion_tokens")


def model_cost(response: RetrieveResponse) -> dict[str, dict[str, int]]:
    """Model calls and tokens of one response, per layer (from the model route; empty without a model)."""
    route = response.route.get("model")
    out: dict[str, dict[str, int]] = {}
    for step, used in (route.detail.get("steps", {}) if route else {}).items():
        layer = out.setdefault(STEP_LAYERS.get(step, step), dict.fromkeys(COST_FIELDS, 0))
        for name in COST_FIELDS:
            layer[name] += int(used.get(name, 0))
    return out


def deadline_steps(response: RetrieveResponse) -> dict[str, dict[str, Any]]:
    """Each model step's timing against the call's deadline (``route.deadline.detail.steps``): ``outcome``
    (``ok | error | timeout | no_time | circuit_open``) and ``ms``; empty when no model step ran."""
    route = response.route.get("deadline")
    return {step: dict(timing) for step, timing in (route.detail.get("steps", {}) if route else {}).items()}


def _recall(gold: list[str], got: list[str]) -> float | None:
    return None if not gold else len(set(gold) & set(got)) / len(set(gold))


def answer_sections(response: RetrieveResponse) -> list[SectionItem]:
    items = [i for i in response.sources["documents"].items if isinstance(i, SectionItem)]
    return [i for i in items if i.confidence != "supplementary"] + [i for i in items if i.confidence == "supplementary"]


def score(question: Question, response: RetrieveResponse, titles: dict[str, str]) -> dict[str, float | None]:
    gold = question.gold
    sections = answer_sections(response)
    section_ids = [s.section_id for s in sections]
    returned = {name: [item_key(i) for i in r.items] for name, r in response.sources.items()}
    metrics: dict[str, float | None] = dict.fromkeys(METRICS)
    if gold.documents:
        top_doc = sections[0].document_id if sections else None
        metrics["document_accuracy"] = float(top_doc in gold.documents)
        named = any(titles.get(d, "\0").lower() in question.message.lower() for d in gold.documents)
        if not named:
            metrics["discovery"] = metrics["document_accuracy"]
    if gold.sections:
        metrics["section_accuracy"] = float(bool(section_ids) and section_ids[0] in gold.sections)
        metrics["section_recall@3"] = _recall(gold.sections, section_ids[:3])
    metrics["memory_recall"] = _recall(gold.memories, returned["memories"])
    metrics["property_recall"] = _recall(gold.properties, returned["properties"])
    metrics["edge_recall"] = _recall(gold.edges, returned["graph"])
    if question.record is not None:
        expected = gold.records[0] if gold.records else None
        metrics["record_accuracy"] = float((response.record.id if response.record else None) == expected)
    if not question.answerable:
        metrics["abstention"] = float(not any(s.confidence == "high" for s in sections))
    return metrics


def losses(question: Question, response: RetrieveResponse) -> list[Loss]:
    """For every gold item missing from the response, the last layer that still had it and why."""
    returned = {name: {item_key(i) for i in r.items} for name, r in response.sources.items()}
    decisions: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for entry in response.trace or []:
        decisions[(entry.source, entry.id)].append(entry)
    out: list[Loss] = []
    for kind, source in GOLD_SOURCES.items():
        for gold_id in getattr(question.gold, kind):
            if gold_id in returned[source]:
                continue
            if response.sources[source].status == "skipped":
                out.append(Loss(kind, gold_id, "plan", "source_skipped"))
                continue
            if response.sources[source].status == "error":
                out.append(Loss(kind, gold_id, "recall", "source_error"))
                continue
            seen = decisions.get((source, gold_id), [])
            dropped = [e for e in seen if e.decision == "dropped"]
            if dropped:
                last = dropped[-1]
                out.append(Loss(kind, gold_id, last.layer, last.reason or "dropped"))
            else:
                out.append(Loss(kind, gold_id, "recall", "never_recalled"))
    return out


def candidate_scores(question: Question, response: RetrieveResponse) -> dict[str, list[tuple[str, float, bool]]]:
    """(id, score, is_gold) of every scored candidate at recall, per source, for calibration."""
    gold = {"documents": set(question.gold.sections), "memories": set(question.gold.memories),
            "properties": set(question.gold.properties)}  # fmt: skip
    out: dict[str, list[tuple[str, float, bool]]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for entry in response.trace or []:
        if entry.layer == "recall" and entry.score is not None and entry.source in gold and (entry.source, entry.id) not in seen:
            seen.add((entry.source, entry.id))
            out[entry.source].append((entry.id, entry.score, entry.id in gold[entry.source]))
    return dict(out)
