"""Model-backed steps behind the interfaces the heuristics already implement.

* :class:`ModelFilterInferrer` (a :class:`~dossier.pipeline.steps.FilterInferrer`): doc types and
  tags with a confidence, chosen only from the org's own vocabulary;
* :class:`ModelAugmenter` (an :class:`~dossier.pipeline.steps.Augmenter`): three rephrasings;
* :class:`ModelSelector` (a :class:`~dossier.pipeline.steps.Selector`): at most three sections with
  a 1-5 relevance, from a catalogue of the candidate documents and their sections.

They run only in ``deep`` calls when a chat model is configured, and they only raise: the layers
that call them fall back to the heuristic and report it (``deep_timeout`` / ``deep_error``). Each
asks the model on a thread of its own and is waited for until its end time under the call's deadline
(:func:`dossier.deadline.run_step`), whatever the chat model does; a layer that runs two of them at
once starts them with :func:`~dossier.deadline.start_step` itself. Each
prompt puts what is stable first (instructions, then any catalogue) and the question last, so a
provider's prompt cache can reuse the prefix across questions. The layers mask personal data in the
question before it gets here (:mod:`dossier.providers.pii`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pydantic import BaseModel, Field

from ..bundle import Document
from ..deadline import run_step
from ..providers.llm import ChatModel, Message
from ..schema import Filters
from ..pipeline.call import SectionCandidate
from ..pipeline.steps import InferredFilters, Pick

#: First line of each step's system prompt (stable; servers and tests can tell the steps apart).
TITLES = {
    "filters": "# Filter inference",
    "rephrase": "# Query rephrasing",
    "select": "# Section selection",
    "synthesize": "# Grounded answer",
}


# -- filter inference ----------------------------------------------------------------------------------
class FilterOutput(BaseModel):
    doc_types: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    confidence: float = Field(ge=0.0, le=1.0)
    reason: str = ""


FILTER_INSTRUCTIONS = f"""{TITLES["filters"]}
You choose filters for a search over an organisation's documents (guidelines, policies, playbooks).
A filter hides every document that does not match it, so a wrong filter hides the right answer:
choose one only when the question clearly asks about one kind of document or one topic.
Use only the document types and tags listed; never invent one.
Reply with JSON only, in this shape:
{{"doc_types": ["..."], "tags": ["..."], "confidence": 0.0, "reason": "one short sentence"}}
confidence is how sure you are (0 to 1) that every document answering the question matches the filter.
When unsure, reply with empty lists and a confidence of 0."""


@dataclass
class ModelFilterInferrer:
    """Doc types and tags from the question; values outside the org's vocabulary are dropped."""

    llm: ChatModel
    name: str = "model"
    uses_model: bool = True

    def prompt(self, message: str, vocabulary: Filters | None) -> list[Message]:
        types = ", ".join(vocabulary.doc_types) if vocabulary and vocabulary.doc_types else "(any)"
        tags = ", ".join(vocabulary.tags) if vocabulary and vocabulary.tags else "(any)"
        user = f"Document types: {types}\nTags: {tags}\n\nQuestion: {message}"
        return [{"role": "system", "content": FILTER_INSTRUCTIONS}, {"role": "user", "content": user}]

    def infer(self, message: str, *, vocabulary: Filters | None = None) -> InferredFilters | None:
        messages = self.prompt(message, vocabulary)
        out = run_step("filters", lambda: self.llm.complete(messages, output=FilterOutput, step="filters"))
        doc_types, tags = _dedupe(out.doc_types), _dedupe(out.tags)
        dropped: list[str] = []
        if vocabulary is not None:
            dropped = [v for v in doc_types if v not in vocabulary.doc_types] + [v for v in tags if v not in vocabulary.tags]
            doc_types = [v for v in doc_types if v in vocabulary.doc_types]
            tags = [v for v in tags if v in vocabulary.tags]
        if not doc_types and not tags:
            return None
        reason = out.reason + (f" (unknown values dropped: {', '.join(dropped)})" if dropped else "")
        return InferredFilters(Filters(doc_types=doc_types, tags=tags), out.confidence, reason.strip(), backend="model")


def _dedupe(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(v.strip().lower() for v in values if v and v.strip()))


# -- rephrasings ---------------------------------------------------------------------------------------
class RephraseOutput(BaseModel):
    rephrasings: list[str] = Field(min_length=1)


REPHRASE_INSTRUCTIONS = f"""{TITLES["rephrase"]}
You widen a document search. Rewrite the question three times, each from a different angle:
1. the same question in other words, with the terms a policy or guideline would use;
2. the rule, section or document that would answer it, named as its heading might be;
3. a short keyword query (five to ten words).
Keep placeholders such as <EMAIL_1> exactly as written. Do not answer the question.
Reply with JSON only: {{"rephrasings": ["...", "...", "..."]}}"""


@dataclass
class ModelAugmenter:
    """Three rephrasings of the question from different angles."""

    llm: ChatModel
    count: int = 3
    name: str = "model"
    uses_model: bool = True

    def prompt(self, message: str) -> list[Message]:
        return [{"role": "system", "content": REPHRASE_INSTRUCTIONS}, {"role": "user", "content": f"Question: {message}"}]

    def rephrase(self, message: str) -> list[str]:
        messages = self.prompt(message)
        out = run_step("rephrase", lambda: self.llm.complete(messages, output=RephraseOutput, step="rephrase"))
        seen = {message.strip().lower()}
        kept: list[str] = []
        for text in out.rephrasings:
            text = " ".join(text.split())[:500]
            if text and text.lower() not in seen:
                seen.add(text.lower())
                kept.append(text)
        return kept[: self.count]


# -- section selection -------------------------------------------------------------------------------
class PickOutput(BaseModel):
    section_id: str = Field(min_length=1)
    relevance: int = Field(ge=1, le=5)


class SelectionOutput(BaseModel):
    picks: list[PickOutput] = Field(default_factory=list)


SELECT_INSTRUCTIONS = f"""{TITLES["select"]}
You pick the sections of an organisation's documents that answer a question, the way a person uses a
table of contents. The candidate documents follow, each with its sections (id: heading - opening words).
Pick at most three sections, best first, and rate each one's relevance to the question from 1 to 5:
5 answers it directly, 4 answers an important part, 3 is related and useful, 2 or 1 barely related.
Prefer the most specific document (a regional or departmental version over the general one) when the
question or its subject points to it. Use only section ids from the catalogue, copied exactly.
If no section helps, reply with no picks.
Reply with JSON only: {{"picks": [{{"section_id": "...", "relevance": 5}}]}}"""


@dataclass
class ModelSelector:
    """Sees the candidate documents with their section structure; returns at most three picks.

    The catalogue lists up to ``max_documents`` documents (those holding the best-ranked candidates),
    in id order with their sections in document order, so that two questions over the same
    candidates produce prompts that differ only in the question at the end.
    """

    llm: ChatModel
    max_documents: int = 12
    snippet_chars: int = 160
    max_picks: int = 3
    name: str = "model"
    uses_model: bool = True

    def catalogue(self, candidates: list[SectionCandidate], documents: dict[str, Document]) -> str:
        chosen: list[str] = []
        for c in candidates:  # best-ranked first (sections.rank_key)
            if c.document_id in documents and c.document_id not in chosen:
                chosen.append(c.document_id)
            if len(chosen) == self.max_documents:
                break
        blocks = []
        for doc_id in sorted(chosen):
            document = documents[doc_id]
            tags = f"; tags: {', '.join(document.tags)}" if document.tags else ""
            lines = [f"[{document.id}] {document.title} (type: {document.doc_type}{tags})"]
            for section in document.sections:
                snippet = " ".join(section.text.split())
                if len(snippet) > self.snippet_chars:
                    snippet = snippet[: self.snippet_chars].rsplit(" ", 1)[0] + " ..."
                lines.append(f"  - {section.id}: {section.heading or '(untitled)'} - {snippet}")
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)

    def prompt(self, question: str, candidates: list[SectionCandidate], documents: dict[str, Document]) -> list[Message]:
        user = f"Candidate documents:\n\n{self.catalogue(candidates, documents)}\n\nQuestion: {question}"
        return [{"role": "system", "content": SELECT_INSTRUCTIONS}, {"role": "user", "content": user}]

    def select(self, question: str, candidates: list[SectionCandidate], documents: dict[str, Document]) -> list[Pick]:
        messages = self.prompt(question, candidates, documents)
        out = run_step("select", lambda: self.llm.complete(messages, output=SelectionOutput, step="select"))
        picks: list[Pick] = []
        for p in out.picks:
            if all(p.section_id.strip() != q.section_id for q in picks):
                picks.append(Pick(p.section_id.strip(), p.relevance))
        return picks[: self.max_picks]
