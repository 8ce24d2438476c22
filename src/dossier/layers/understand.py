"""Layer 3, understand: a keyword intent, inferred filters (only when trusted), and the document query.

Model-backed variants plug in through two interfaces: a :class:`FilterInferrer` and an
:class:`Augmenter`. The heuristics here never call a model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from ..schema import Filters, Route
from .context import Call

INTENTS: dict[str, tuple[str, ...]] = {
    "pricing": ("price", "pricing", "discount", "quote", "cost", "seat", "plan", "prepay", "list price", "vat"),
    "billing": ("invoice", "billing", "refund", "payment", "credit", "cancel", "charge"),
    "contract": ("contract", "redline", "clause", "liability", "msa", "dpa", "legal", "terms", "renewal"),
    "security": ("security", "soc 2", "soc2", "gdpr", "encryption", "questionnaire", "pen test", "sso", "retention"),
    "support": ("support", "incident", "outage", "escalat", "ticket", "bug", "error", "err-", "sla"),
    "relationship": ("who ", "reports to", "champion", "introduced", "works at", "manager", "decision maker"),
    "onboarding": ("onboard", "kickoff", "implementation", "training", "rollout"),
}


def classify_intent(message: str) -> str:
    """The intent whose keywords occur most often in ``message`` (``general`` when none do)."""
    text = f" {message.lower()} "
    scores = {intent: sum(text.count(k) for k in keys) for intent, keys in INTENTS.items()}
    best = max(scores, key=lambda k: scores[k])
    return best if scores[best] else "general"


@dataclass
class InferredFilters:
    filters: Filters
    confidence: float
    reason: str = ""
    backend: str = "rules"


class FilterInferrer(Protocol):
    """Guess doc types / tags from a question, with a confidence in [0, 1]."""

    name: str

    def infer(self, message: str) -> InferredFilters | None: ...


_EXPLICIT = re.compile(r"\b(doc_type|type|tag):([\w-]+)", re.IGNORECASE)


@dataclass
class RuleFilterInferrer:
    """Confident only when the question names a filter outright (``tag:pricing``, ``type:policy``).

    A wrong filter removes the right answer before ranking sees it, so vaguer cues (``the refund
    policy``) are reported with a confidence below the 0.7 bar and not applied.
    """

    name: str = "rules"
    doc_type_words: dict[str, str] = field(
        default_factory=lambda: {"policy": "policy", "policies": "policy", "playbook": "playbook",
                                 "guideline": "guideline", "guidelines": "guideline"}  # fmt: skip
    )

    def infer(self, message: str) -> InferredFilters | None:
        explicit = _EXPLICIT.findall(message)
        if explicit:
            doc_types = [v.lower() for k, v in explicit if k.lower() in ("doc_type", "type")]
            tags = [v.lower() for k, v in explicit if k.lower() == "tag"]
            return InferredFilters(Filters(doc_types=doc_types, tags=tags), 0.95, "named in the question")
        words = re.findall(r"[a-z]+", message.lower())
        types = sorted({self.doc_type_words[w] for w in words if w in self.doc_type_words})
        if types:
            return InferredFilters(Filters(doc_types=types), 0.5, "document type word in the question")
        return None


class Augmenter(Protocol):
    """Rephrase a question from other angles to widen the document query."""

    name: str

    def rephrase(self, message: str) -> list[str]: ...


@dataclass
class NoAugmenter:
    """Without a model there are no rephrasings; the caller may still bring its own."""

    name: str = "none"

    def rephrase(self, message: str) -> list[str]:
        return []


def understand(call: Call) -> None:
    request, settings, u = call.request, call.settings, call.understanding
    route = Route(ran=True, backend="rules")
    call.route["understand"] = route
    u.intent = classify_intent(call.message)
    route.detail["intent"] = u.intent
    if request.filters is not None and not request.filters.empty:
        u.filters, u.filters_source = request.filters, "caller"
    elif not request.infer_filters:
        u.filters_source = "off"
    elif call.message:
        inferred = call.engine.filter_inferrer.infer(call.message)
        if inferred is not None:
            applied = inferred.confidence >= settings.filter_confidence
            u.inferred = {"filters": inferred.filters.model_dump(), "confidence": inferred.confidence,
                          "applied": applied, "reason": inferred.reason, "backend": inferred.backend}  # fmt: skip
            if applied:
                u.filters, u.filters_source = inferred.filters, "inferred"
    route.detail["filters"] = u.filters.model_dump() if u.filters else None
    route.detail["filters_source"] = u.filters_source
    if u.inferred:
        route.detail["inferred_filters"] = u.inferred
    if request.augmentation:
        u.rephrasings, route.detail["augmentation"] = list(request.augmentation), "caller"
    elif call.message and call.plan and call.plan.effective_depth == "deep":
        u.rephrasings = call.engine.augmenter.rephrase(call.message)
        route.detail["augmentation"] = call.engine.augmenter.name
    query = _EXPLICIT.sub(" ", call.message).strip()
    u.document_query = " ".join([query, *u.rephrasings]).strip()
