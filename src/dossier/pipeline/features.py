"""The evidence each candidate was found with, as the learned rankers' feature rows.

Pure functions of a question, the candidates and what the store returned about them, so that the
same rows come out of both stores, of a live call and of the training script (``bench/train_ranker.py``).
Scores that mean different things on different corpora are given relative to the call's best (a
gap, a share of the best, a reciprocal rank); none of them is a word list chosen on a question set.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..bundle import Document, Section
from ..stores.fulltext import STOP_WORDS, codes
from .call import SectionCandidate

SECTION_FEATURES: tuple[str, ...] = (
    "cosine",  # cosine similarity of question and section
    "cosine_gap",  # ... minus the best candidate's
    "vector_rr",  # 1 / rank in the vector search (0 when not found by it)
    "text_score",  # BM25 as a share of the call's best full-text hit
    "text_rr",  # 1 / rank in the full-text search (0 when not found by it)
    "fused",  # reciprocal rank fusion score as a share of the best
    "lexical_only",  # found by full text only
    "text_coverage",  # share of the question's terms present in the section text
    "heading_coverage",  # share of the question's terms present in the title and heading
    "doc_best_gap",  # the document's best section cosine minus the call's best
    "doc_mean",  # mean cosine of the document's candidate sections
    "doc_matches",  # log(1 + number of the document's sections among the candidates)
    "title_in_question",  # share of the title's words the question names
    "title_in_record",  # share of the title's words found in the resolved record's property values
    "qualifier",  # +1 the more specific sibling whose qualifier is named, -1 one whose qualifier is not, else 0
    "length",  # log(1 + words in the section)
    "position",  # the section's place in its document, 0 (first) .. 1 (last)
    "code_match",  # a code of the question ("NW-EDU-40", "ERR-4411") appears in the section text
    "attached",  # the document is attached to the resolved record (its own notes)
    "adapted",  # cosine of the adapted query (providers/adapter.py); the plain cosine where no adapter ran
    "adapted_gap",  # ... minus the best candidate's
)

MEMORY_FEATURES: tuple[str, ...] = (
    "cosine",  # cosine similarity of question and memory (0 when not found by vector search)
    "cosine_gap",  # ... minus the best candidate's
    "vector_rr",
    "text_score",
    "text_rr",
    "found_by_both",
    "coverage",  # share of the question's terms present in the memory
    "speaker_named",  # the memory's speaker ("Jane: ...") is named in the question
    "day_best",  # best hybrid score of another candidate of the same day (the same conversation)
    "day_count",  # log(1 + other candidates of the same day)
    "length",  # log(1 + characters)
    "hybrid",  # mean of cosine and text_score
    "hybrid_gap",  # ... minus the best candidate's
    "hybrid_rr",  # 1 / rank by hybrid score among the candidates
    "is_question",  # the memory is itself a question (ends with "?")
    "next_best",  # best hybrid score of the candidates just before and after it in time, the same day
    "around_best",  # ... of the two before and the two after
    "adapted",  # cosine of the adapted query (providers/adapter.py; the plain cosine where no adapter ran)
    "adapted_gap",  # ... minus the best candidate's
    "adapted_rr",  # 1 / rank in the adapted vector search (0 when not found by it)
)

_WORD = re.compile(r"\w+(?:[-_./]\w+)*")


def stem(word: str) -> str:
    """Truncation stemming: enough to match "discounts" with "discount", "approvals" with "approved"."""
    return word[:6]


@lru_cache(maxsize=8192)
def words(text: str) -> frozenset[str]:
    """The stemmed content words of ``text``."""
    tokens = [w.strip("-_./") for w in _WORD.findall(text.lower())]  # findall: no match objects (per call, ~150 texts)
    return frozenset([stem(w) for w in tokens if w and w not in STOP_WORDS and (len(w) > 1 or w.isdigit())])


def _share(wanted: frozenset[str], present: frozenset[str]) -> float:
    return len(wanted & present) / len(wanted) if wanted else 0.0


def context_words(values: Iterable[object]) -> frozenset[str]:
    """The words of a record's property values (lists flattened), for the record-context features."""
    parts: list[str] = []
    for value in values:
        if isinstance(value, (list, tuple)):
            parts.extend(str(v) for v in value if v is not None)
        elif value is not None and not isinstance(value, bool):
            parts.append(str(value))
    return words(" ".join(parts))


def _rr(rank: int | None) -> float:
    return 1.0 / rank if rank else 0.0


def section_features(
    question: str, candidates: Sequence[SectionCandidate], documents: Mapping[str, Document], context: frozenset[str]
) -> np.ndarray:
    """One row of :data:`SECTION_FEATURES` per candidate (a candidate whose document is unknown gets zeros
    for what needs the document)."""
    if not candidates:
        return np.zeros((0, len(SECTION_FEATURES)))
    asked = words(question)
    asked_codes = codes(question)
    best = max(c.score for c in candidates)
    best_fused = max(c.fused for c in candidates) or 1.0
    adapted = [c.score if c.adapted is None else c.adapted for c in candidates]
    best_adapted = max(adapted)
    by_doc: dict[str, list[float]] = {}
    for c in candidates:
        by_doc.setdefault(c.document_id, []).append(c.score)
    qualifiers = _qualifiers(documents, by_doc, asked, context)
    rows = []
    for c, adapted_score in zip(candidates, adapted):
        document = documents.get(c.document_id)
        section, position, count = _locate(document, c.section_id)
        title = words(document.title) if document is not None else frozenset()
        heading = words(f"{document.title} {section.heading}") if document is not None and section is not None else title
        text = words(section.text) if section is not None else frozenset()
        scores = by_doc[c.document_id]
        rows.append((
            c.score, c.score - best, _rr(c.vector_rank), c.text_score, _rr(c.text_rank), c.fused / best_fused,
            float(c.lexical_only), _share(asked, text | heading), _share(asked, heading),
            max(scores) - best, sum(scores) / len(scores), math.log1p(len(scores)),
            _share(title, asked), _share(title, context), qualifiers.get(c.document_id, 0.0),
            math.log1p(len(section.text.split())) if section is not None else 0.0,
            position / (count - 1) if count > 1 else 0.0,
            float(bool(asked_codes) and section is not None and any(code in section.text.lower() for code in asked_codes)),
            float(document is not None and document.attached_record is not None),
            adapted_score, adapted_score - best_adapted,
        ))  # fmt: skip
    return np.asarray(rows, dtype=np.float64)


def _locate(document: Document | None, section_id: str) -> tuple[Section | None, int, int]:
    if document is None:
        return None, 0, 0
    for position, section in enumerate(document.sections):
        if section.id == section_id:
            return section, position, len(document.sections)
    return None, 0, len(document.sections)


def _qualifiers(documents: Mapping[str, Document], candidate_docs: Mapping[str, object], asked: frozenset[str],
                context: frozenset[str]) -> dict[str, float]:  # fmt: skip
    """For each candidate document that is a more specific sibling of another (its title ends with the
    other's and is longer): +1 when the extra words are named by the question or the record, else -1."""
    titles = {d: documents[d].title.lower().strip() for d in candidate_docs if d in documents}
    out: dict[str, float] = {}
    for doc_id, title in titles.items():
        for other_id, other in titles.items():
            if other_id != doc_id and other and title.endswith(other) and len(title) > len(other):
                extra = words(title[: -len(other)])
                out[doc_id] = 1.0 if not extra or extra & (asked | context) else -1.0
                break
    return out


@dataclass(frozen=True)
class MemoryEvidence:
    """What recall knows about one tier-2 memory candidate."""

    id: str
    text: str
    created_at: datetime
    cosine: float | None = None
    vector_rank: int | None = None
    text_score: float = 0.0  # share of the best full-text hit
    text_rank: int | None = None
    adapted: float | None = None  # cosine of the adapted query, when the adapted search found it
    adapted_rank: int | None = None


def memory_features(question: str, candidates: Sequence[MemoryEvidence]) -> np.ndarray:
    """One row of :data:`MEMORY_FEATURES` per candidate."""
    if not candidates:
        return np.zeros((0, len(MEMORY_FEATURES)))
    asked = words(question)
    best = max((c.cosine or 0.0) for c in candidates)
    best_adapted = max((c.adapted or 0.0) for c in candidates)
    hybrid = [0.5 * (c.cosine or 0.0) + 0.5 * c.text_score for c in candidates]
    best_hybrid = max(hybrid)
    hybrid_rank = {i: r for r, i in enumerate(sorted(range(len(candidates)), key=lambda i: -hybrid[i]), start=1)}
    days = [c.created_at.date() for c in candidates]
    order = sorted(range(len(candidates)), key=lambda i: (candidates[i].created_at, candidates[i].id))
    next_best, around_best = [0.0] * len(candidates), [0.0] * len(candidates)
    for a, i in enumerate(order):  # neighbours in time among the candidates, within the same day
        day = days[i]
        for b in range(max(0, a - 2), min(len(order), a + 3)):
            j = order[b]
            if j != i and days[j] == day:
                if b - a in (-1, 1):
                    next_best[i] = max(next_best[i], hybrid[j])
                around_best[i] = max(around_best[i], hybrid[j])
    by_day: dict[object, list[int]] = {}
    for i, day in enumerate(days):
        by_day.setdefault(day, []).append(i)
    top_two = {day: sorted(members, key=lambda j: -hybrid[j])[:2] for day, members in by_day.items()}
    rows = []
    for i, c in enumerate(candidates):
        others = [j for j in top_two[days[i]] if j != i]
        day_best = hybrid[others[0]] if others else 0.0
        speaker = words(c.text.split(":", 1)[0]) if ":" in c.text[:40] else frozenset()
        cosine, adapted = c.cosine or 0.0, c.adapted or 0.0
        rows.append((
            cosine, cosine - best, _rr(c.vector_rank), c.text_score, _rr(c.text_rank),
            float(c.vector_rank is not None and c.text_rank is not None), _share(asked, words(c.text)),
            float(bool(speaker) and speaker <= asked),
            day_best, math.log1p(len(by_day[days[i]]) - 1), math.log1p(len(c.text)),
            hybrid[i], hybrid[i] - best_hybrid, 1.0 / hybrid_rank[i], float(c.text.rstrip().endswith("?")),
            next_best[i], around_best[i], adapted, adapted - best_adapted, _rr(c.adapted_rank),
        ))  # fmt: skip
    return np.asarray(rows, dtype=np.float64)
