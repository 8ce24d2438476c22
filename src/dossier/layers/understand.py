"""Layer 4, understand: a keyword intent, inferred filters (only when trusted), and the document query.

Model-backed variants plug in through two interfaces: a :class:`FilterInferrer` and an
:class:`Augmenter` (see :mod:`dossier.layers.model_steps`). The heuristics here never call a model. A
step that uses a model runs only when the plan allows model steps (``deep`` with a model configured);
otherwise, or when it fails, the heuristic runs and the route says so. The question is masked
(:mod:`dossier.providers.pii`) before a model sees it, and the rephrasings are unmasked. Filter
inference and the rephrasings do not depend on each other: they ask the model at the same time, each
on a thread of its own (:func:`dossier.deadline.start_step`), while this thread reads the filter
vocabulary and embeds the question; the store and the embedder stay on this thread.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..deadline import start_step
from ..pipeline.visibility import document_verdict
from ..schema import Filters
from ..pipeline.call import Call
from ..pipeline.steps import Augmenter, FilterInferrer, InferredFilters, uses_model

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

    def infer(self, message: str, *, vocabulary: Filters | None = None) -> InferredFilters | None:
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


@dataclass
class NoAugmenter:
    """Without a model there are no rephrasings; the caller may still bring its own."""

    name: str = "none"

    def rephrase(self, message: str) -> list[str]:
        return []


def understand(call: Call) -> None:
    request, settings, u = call.request, call.settings, call.understanding
    u.intent = classify_intent(call.message)
    call.decide("understand", ran=True, backend="rules", detail={"intent": u.intent})
    ahead = _start_model_steps(call)
    if request.filters is not None and not request.filters.empty:
        u.filters, u.filters_source = request.filters, "caller"
    elif not request.infer_filters:
        u.filters_source = "off"
    elif call.message:
        inferred = _infer_filters(call, ahead.get("filters"))
        if inferred is not None:
            applied = inferred.confidence >= settings.filter_confidence
            u.inferred = {"filters": inferred.filters.model_dump(), "confidence": inferred.confidence,
                          "applied": applied, "reason": inferred.reason, "backend": inferred.backend}  # fmt: skip
            if applied:
                u.filters, u.filters_source = inferred.filters, "inferred"
    call.decide("understand", detail={"filters": u.filters.model_dump() if u.filters else None,
                                      "filters_source": u.filters_source})  # fmt: skip
    if u.inferred:
        call.decide("understand", detail={"inferred_filters": u.inferred})
    if request.augmentation:
        u.rephrasings = list(request.augmentation)
        call.decide("understand", detail={"augmentation": "caller"})
    elif call.message and call.plan and call.plan.model_steps:
        u.rephrasings = _rephrase(call, ahead.get("rephrase"))
    if any(uses_model(step) for step in (call.steps.filter_inferrer, call.steps.augmenter)) and call.plan:
        call.decide("understand", backend="model" if call.plan.model_steps else "rules")
    query = _EXPLICIT.sub(" ", call.message).strip()
    documents_part, memories_part = split_question(query)
    u.document_query = " ".join([documents_part, *u.rephrasings]).strip()
    u.memory_query = memories_part
    u.parts = max(1, len(question_parts(query)))
    if call.message:
        call.decide("understand", detail={"document_query": u.document_query, "memory_query": u.memory_query})


# A multi-part question ("What pricing did we discuss, and what discount rules apply?") asks two sources
# two things: the document query keeps the parts that ask for rules, policy or process, the memory
# query the parts about the customer. A question whose parts are not one of each is asked whole.
_PARTS = re.compile(
    r"\s*(?:[?;]\s+|,\s*(?:and|but|also|plus)\s+|\s+(?:and|but|also|plus)\s+(?=(?:what|which|how|when|where|who|whether|"
    r"does|do|is|are|can|should|must|may)\b))",
    re.IGNORECASE,
)
_RULES = re.compile(
    r"\b(rules?|polic(?:y|ies)|process(?:es)?|procedures?|guidelines?|playbooks?|handbook|allowed|permitted|"
    r"apply|applies|required?|requirements?|eligib\w*|entitled|limits?|standards?|must|allowed|how (?:do|does|long|many|much) (?:we|i|you|one)|"
    r"what (?:is|are) the|sla)\b",
    re.IGNORECASE,
)
_CUSTOMER = re.compile(
    r"\b(did (?:we|i|you|they|she|he)|we (?:discuss|discussed|told|tell|offer|offered|promise|promised|agree|agreed|talk|talked|send|sent|quote|quoted)|"
    r"(?:she|he|they) (?:said|asked|mentioned|wanted|told|complained|raised|reported)|"
    r"(?:her|his|their|him|them)\b|last (?:call|meeting|time|conversation|email)|know about|history with)",
    re.IGNORECASE,
)


def question_parts(message: str) -> list[str]:
    """The parts a question asks, split where :data:`_PARTS` joins them (parts of one word dropped)."""
    return [p.strip(" ,.?") for p in _PARTS.split(message) if p and len(p.split()) >= 2]


def split_question(message: str) -> tuple[str, str]:
    """(document query, memory query): the rules part and the customer part of a multi-part question,
    or the whole question twice when it is not one of each."""
    parts = question_parts(message)
    if len(parts) < 2:
        return message, message
    rules = [p for p in parts if _RULES.search(p) and not _CUSTOMER.search(p)]
    customer = [p for p in parts if _CUSTOMER.search(p) and not _RULES.search(p)]
    if not rules or not customer:  # then by which way each part leans: what happened, or what must be done
        lean = [len(_HAPPENED.findall(p)) - len(_ASKS_RULE.findall(p)) for p in parts]
        rules = [p for p, v in zip(parts, lean) if v < 0]
        customer = [p for p, v in zip(parts, lean) if v > 0]
    if not rules or not customer:
        return message, message
    return "; ".join(rules) + "?", "; ".join(customer) + "?"


# How a part leans when the words above do not decide: towards what happened with the customer (past
# tense, what they asked or wanted, "in June") or towards what the rules say (modal verbs, "how quickly",
# "who pays"). A part counts as one or the other by which it holds more of; a tie decides nothing.
_HAPPENED = re.compile(
    r"\b(did|was|were|had|has \w+ (?:raised|asked|said|mentioned)|happened|went wrong|recently|last (?:week|month|year)|"
    r"wants?|wanted|told|tell us|asks?|asked|complain(?:s|ed)?|reported|offered|approved|signed|cancell?ed|sent|"
    r"(?<=in )(?:january|february|march|april|may|june|july|august|september|october|november|december))\b",
    re.IGNORECASE,
)

_ASKS_RULE = re.compile(
    r"\b(must|(?<!in )may|can|could|should|shall|will|would|needs?|have to|has to|allowed|permitted|rules?|polic(?:y|ies)|"
    r"what (?:is|are) the|how (?:are|is|should|will|would|do|does)|"
    r"process|procedures?|required?|entitled|eligible|how (?:quickly|fast|soon|often|long|much|many)|"
    r"who (?:pays|approves)|what happens|penalty|options|does that (?:meet|match))\b",
    re.IGNORECASE,
)


def _start_model_steps(call: Call) -> dict[str, Callable[[], Any]]:
    """Start the model steps this call will ask for (filter inference, rephrasings) at the same time;
    step -> a function giving its result (or raising its error). Empty when no model step runs."""
    request, steps = call.request, call.steps
    if not (call.message and call.plan and call.plan.model_steps):
        return {}
    wants_filters = (request.filters is None or request.filters.empty) and request.infer_filters
    wants_filters = wants_filters and uses_model(steps.filter_inferrer)
    wants_rephrase = not request.augmentation and uses_model(steps.augmenter)
    masked = call.masker().mask(call.message)
    ahead: dict[str, Callable[[], Any]] = {}
    if wants_rephrase:
        augmenter = steps.augmenter
        ahead["rephrase"] = start_step("rephrase", lambda: augmenter.rephrase(masked)).result
    if wants_filters:
        inferrer = steps.filter_inferrer
        try:
            vocabulary = _vocabulary(call)  # a store read: on this thread, while the rephrasings are asked for
        except Exception as exc:  # noqa: BLE001 - reported as the filters step's failure
            ahead["filters"] = _raising(exc)
        else:
            ahead["filters"] = start_step("filters", lambda: inferrer.infer(masked, vocabulary=vocabulary)).result
    if ahead:
        with contextlib.suppress(Exception):  # the recall layer embeds it anyway, and reports a failure
            call.query_vector()
    return ahead


def _raising(error: Exception) -> Callable[[], Any]:
    def get() -> Any:
        raise error

    return get


def _infer_filters(call: Call, ahead: Callable[[], Any] | None = None) -> InferredFilters | None:
    inferrer = call.steps.filter_inferrer
    rules = RuleFilterInferrer()
    if not uses_model(inferrer):
        return inferrer.infer(call.message)
    if not (call.plan and call.plan.model_steps):
        return rules.infer(call.message)
    masker = call.masker()
    try:
        if ahead is not None:
            inferred = ahead()
        else:
            inferred = inferrer.infer(masker.mask(call.message), vocabulary=_vocabulary(call))
    except Exception as exc:  # noqa: BLE001 - the rule-based inferrer answers instead
        _fell_back(call, "filters", exc, rules.name)
        return rules.infer(call.message)
    if inferred is not None:
        inferred.reason = masker.unmask(inferred.reason)
    return inferred


def _vocabulary(call: Call) -> Filters:
    """Doc types and tags of the org-wide documents this caller may see (the model picks among them)."""
    # the first thousand the caller may see (by id), listed with the rule as a query: documents it may not see
    # take no places and are not read; those read are judged by the rule itself
    ids = call.store.document_ids(org=call.org, limit=1000, roles=call.caller.roles,
                                  record_ids=call.resolution.record_ids)  # fmt: skip
    visible = [d for d in call.store.get_documents(ids, org=call.org) if document_verdict(call, d) is None]
    return Filters(doc_types=sorted({d.doc_type for d in visible}), tags=sorted({t for d in visible for t in d.tags}))


def _rephrase(call: Call, ahead: Callable[[], Any] | None = None) -> list[str]:
    augmenter = call.steps.augmenter
    if not uses_model(augmenter):
        call.decide("understand", detail={"augmentation": augmenter.name})
        return augmenter.rephrase(call.message)
    if not (call.plan and call.plan.model_steps):
        return []
    masker = call.masker()
    try:
        asked = ahead() if ahead is not None else augmenter.rephrase(masker.mask(call.message))
        rephrasings = [masker.unmask(r) for r in asked]
    except Exception as exc:  # noqa: BLE001 - the question alone is searched
        _fell_back(call, "rephrase", exc, "no rephrasings")
        call.decide("understand", detail={"augmentation": "none"})
        return []
    call.decide("understand", detail={"augmentation": augmenter.name, "rephrasings": rephrasings})
    return rephrasings


def _fell_back(call: Call, step: str, error: Exception, fallback: str) -> None:
    """A model step of this layer failed: the call records it, and this layer's route says so too."""
    call.step_failed(step, error, fallback=fallback)
    mine = {f.step: f.text for f in call.fallbacks if f.step in ("filters", "rephrase")}
    call.decide("understand", detail={"deep_fallbacks": mine})
