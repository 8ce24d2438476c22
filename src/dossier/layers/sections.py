"""Layer 5, select sections: cut out the part of a document that answers, not the whole document.

1. A clear winner (top score >= 0.55, ahead of the second by >= 0.12) is taken without a selector,
   unless lexical-only candidates are present (their cosine score undersells an exact match).
2. Otherwise a :class:`Selector` picks at most three sections (first relevance >= 3/5, others >= 4/5).
   The model-backed selector (:mod:`dossier.layers.model_steps`) runs only in ``deep`` calls with a
   model; a pick that names no section of a candidate document is ignored and reported
   (``unknown_picks``). If it fails, or none of its picks exists, the heuristic picks and the documents
   route says ``deep_timeout`` / ``deep_error`` (``selector_fallback: selector_error``).
3. A more specific sibling document replaces a pick (its title ends with the pick's title and is
   longer, and it scores >= 80% of the pick), keeping the same section where it has one. What makes
   it more specific (the title's extra words, "EMEA") must be named by the question or the resolved
   record's properties: with MiniLM a regional sibling scores within 80% of the general document on
   nearly every question, so the score alone cannot tell (docs/thresholds.md).
4. Fallbacks: no pick -> the best candidate >= 0.30 (low confidence); unpicked candidates >= 0.65 come
   as supplementary (up to three); still nothing -> the best candidate >= 0.40.

Fetch mode, and filter mode without a question, return their documents' sections as ranked, with no
selection. System documents never get here (govern removed them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from ..bundle import Document, Section
from ..schema import SectionItem
from ..stores.fulltext import terms
from .context import Call, SectionCandidate


@dataclass(frozen=True)
class Pick:
    section_id: str
    relevance: int  # 1-5


class Selector(Protocol):
    """Picks the sections that answer ``question`` among governed candidates (best first)."""

    name: str

    def select(self, question: str, candidates: list[SectionCandidate], documents: dict[str, Document]) -> list[Pick]: ...


@dataclass
class HeuristicSelector:
    """Relevance from the cosine score in steps above a floor; an exact code in the text is a 5."""

    floor: float = 0.45
    lexical_weight: float = 0.0
    name: str = "heuristic"

    def relevance(self, candidate: SectionCandidate, codes: list[str], section: Section | None) -> int:
        if codes and section is not None and any(code in section.text.lower() for code in codes):
            return 5
        score = candidate.score + self.lexical_weight * candidate.text_score
        steps = (self.floor + 0.15, self.floor + 0.07, self.floor, self.floor - 0.10)
        return next((5 - i for i, step in enumerate(steps) if score >= step), 1)

    def select(self, question: str, candidates: list[SectionCandidate], documents: dict[str, Document]) -> list[Pick]:
        codes = [t for t in terms(question) if any(ch.isdigit() for ch in t) and len(t) >= 4]
        rated = [(self.relevance(c, codes, _section(documents, c)), c) for c in candidates]
        rated.sort(key=lambda rc: (-rc[0], -rc[1].score, rc[1].section_id))
        return [Pick(c.section_id, r) for r, c in rated]


def _section(documents: dict[str, Document], c: SectionCandidate) -> Section | None:
    document = documents.get(c.document_id)
    return next((s for s in document.sections if s.id == c.section_id), None) if document else None


def select_sections(call: Call) -> None:
    candidates = call.sections
    if not candidates:
        return
    route = call.route["documents"]
    if call.plan and (call.plan.mode == "fetch" or (call.plan.mode == "filter" and not call.message)):
        call.candidates["documents"] = [_item(call, c, "high") for c in candidates]
        return
    t, settings = call.settings.thresholds, call.settings
    ranked = sorted(candidates, key=rank_key)
    lexical_only = [c for c in candidates if c.lexical_only]
    gap = ranked[0].score - (ranked[1].score if len(ranked) > 1 else 0.0)
    route.detail["lexical_only"] = len(lexical_only)
    chosen: list[tuple[SectionCandidate, str]] = []
    if not lexical_only and ranked[0].score >= t.clear_winner and gap >= t.clear_winner_margin:
        route.detail["selector"] = "clear_winner"
        chosen = _prefer_siblings(call, [(ranked[0], "high")], candidates)
    else:
        picks, by_id = _run_selector(call, candidates)
        for pick in picks:
            need = settings.first_pick_relevance if not chosen else settings.other_pick_relevance
            if len(chosen) < settings.max_picks and pick.relevance >= need and pick.section_id in by_id:
                chosen.append((by_id[pick.section_id], "high"))
        chosen = _prefer_siblings(call, chosen, candidates)
        if not chosen:
            best = ranked[0]
            if best.score >= t.fallback_low:
                chosen.append((best, "low"))
                route.detail["fallback"] = "best_candidate_low"
    picked = {c.section_id for c, _ in chosen}
    extra = [c for c in ranked if c.section_id not in picked and c.score >= t.supplementary][: settings.max_supplementary]
    chosen.extend((c, "supplementary") for c in extra)
    if not chosen and ranked[0].score >= t.fallback_last:
        chosen.append((ranked[0], "low"))
        route.detail["fallback"] = "best_candidate_last"
    picked = {c.section_id for c, _ in chosen}
    for c in candidates:
        if c.section_id not in picked:
            call.note("documents", c.section_id, "select", "dropped", "not_selected", c.score)
    call.candidates["documents"] = [_item(call, c, confidence) for c, confidence in chosen]


def rank_key(c: SectionCandidate) -> tuple:
    """Best first: by reranker score when a reranker ran (layers/rerank.py), else by cosine score."""
    return (c.rerank is None, -(c.rerank or 0.0), -c.score, c.section_id)


def _run_selector(call: Call, candidates: list[SectionCandidate]) -> tuple[list[Pick], dict[str, SectionCandidate]]:
    """The selector's picks and the candidates they may name. A model-backed selector runs only when the
    plan allows model steps; it sees the masked question; if it fails, or names only sections that do
    not exist, the heuristic picks instead and the route says why."""
    route = call.route["documents"]
    selector: Selector = call.engine.selector
    t = call.settings.thresholds
    heuristic = HeuristicSelector(floor=t.selector_floor, lexical_weight=t.lexical_weight)
    model = bool(getattr(selector, "uses_model", False))
    if call.plan and not call.plan.model_steps:
        selector, model = heuristic, False
    route.detail["selector"] = selector.name
    by_id = {c.section_id: c for c in candidates}
    ordered = sorted(candidates, key=rank_key)
    try:
        if not model:
            return selector.select(call.message, ordered, call.documents), by_id
        # documents first, in id order, then the question: the same candidates give the same prompt prefix
        masker = call.masker(fresh=True)
        documents = {i: _masked(call.documents[i], masker) for i in sorted(call.documents)}
        picks = selector.select(masker.mask(call.message), ordered, documents)
        picks = _known_picks(call, picks, by_id)
        if not picks and route.detail.get("unknown_picks"):
            raise ValueError(f"picked only sections that do not exist: {', '.join(route.detail['unknown_picks'])}")
        return picks, by_id
    except Exception as exc:  # noqa: BLE001 - selector failure falls back to the heuristic
        route.detail["selector"] = heuristic.name
        if model:
            call.step_failed("select", exc, fallback=heuristic.name)
            route.detail["selector_fallback"] = "selector_error"
        else:
            call.fail("documents", f"selector {selector.name} failed: {type(exc).__name__}: {exc}", keep_items=True)
            route.fallback_reason = "selector_error"
        return heuristic.select(call.message, ordered, call.documents), by_id


def _masked(document: Document, masker) -> Document:  # type: ignore[no-untyped-def]
    """``document`` with personal data masked in its title, headings and texts (ids stay)."""
    sections = tuple(s.model_copy(update={"heading": masker.mask(s.heading), "text": masker.mask(s.text)})
                     for s in document.sections)  # fmt: skip
    return document.model_copy(update={"title": masker.mask(document.title), "sections": sections})


def _known_picks(call: Call, picks: list[Pick], by_id: dict[str, SectionCandidate]) -> list[Pick]:
    """Picks that name a section of a candidate document (the catalogue the selector saw). A section the
    search did not return joins the candidates with its cosine score; ids that exist nowhere are
    ignored and reported in ``route.detail["unknown_picks"]``."""
    route = call.route["documents"]
    owner = {s.id: d.id for d in call.documents.values() for s in d.sections}
    candidate_docs = {c.document_id for c in by_id.values()}
    known: list[Pick] = []
    unknown: list[str] = []
    for pick in picks:
        if pick.section_id in by_id:
            known.append(pick)
        elif owner.get(pick.section_id) in candidate_docs:
            by_id[pick.section_id] = _scored(call, pick.section_id, owner[pick.section_id])
            call.note("documents", pick.section_id, "select", "kept", "picked_from_catalogue", by_id[pick.section_id].score)
            known.append(pick)
        else:
            unknown.append(pick.section_id)
    if unknown:
        route.detail["unknown_picks"] = unknown
    return known


def _scored(call: Call, section_id: str, document_id: str) -> SectionCandidate:
    hits = call.guarded(
        "documents",
        lambda: call.store.search_vectors("section", call.query_vector(), org=call.org, limit=500, parents=[document_id]),
        what="scoring a picked section",
    )
    score = next((h.score for h in hits or [] if h.id == section_id), 0.0)
    return SectionCandidate(section_id=section_id, document_id=document_id, score=score)


def _prefer_siblings(
    call: Call, chosen: list[tuple[SectionCandidate, str]], candidates: list[SectionCandidate]
) -> list[tuple[SectionCandidate, str]]:
    ratio = call.settings.thresholds.sibling_ratio
    best_of: dict[str, SectionCandidate] = {}
    for c in candidates:
        if c.document_id not in best_of or c.score > best_of[c.document_id].score:
            best_of[c.document_id] = c
    out: list[tuple[SectionCandidate, str]] = []
    for pick, confidence in chosen:
        document = call.documents.get(pick.document_id)
        replacement = pick
        for doc_id, best in best_of.items():
            sibling = call.documents.get(doc_id)
            if document is None or sibling is None or doc_id == pick.document_id:
                continue
            if sibling.title.lower().endswith(document.title.lower()) and len(sibling.title) > len(document.title):
                if best.score >= ratio * pick.score and _qualifier_applies(call, sibling.title[: -len(document.title)]):
                    replacement = _same_section(pick, document, sibling, candidates, best.score) or best
                    call.note("documents", pick.section_id, "select", "dropped", f"replaced_by_sibling:{doc_id}", pick.score)
                    call.route["documents"].detail.setdefault("siblings", []).append([pick.section_id, replacement.section_id])
                    break
        if all(replacement.section_id != c.section_id for c, _ in out):
            out.append((replacement, confidence))
    return out


def _qualifier_applies(call: Call, qualifier: str) -> bool:
    """Whether what makes the sibling more specific ("EMEA" in "EMEA Pricing Guidelines") is named by the
    question or by the resolved record (or its aliases), e.g. a ``region: EMEA`` property."""
    words = {w for w in re.findall(r"\w+", qualifier.lower()) if len(w) > 1}
    if not words:
        return True
    context = [call.message]
    res = call.resolution
    for record in ([res.record] if res.record is not None and not res.tombstone else []) + list(res.aliases):
        context.extend(str(v) for v in record.properties.values())
    found = set(re.findall(r"\w+", " ".join(context).lower()))
    return bool(words & found)


def _same_section(
    pick: SectionCandidate, document: Document, sibling: Document, candidates: list[SectionCandidate], score: float
) -> SectionCandidate | None:
    heading = next((s.heading.lower() for s in document.sections if s.id == pick.section_id), None)
    match = next((s for s in sibling.sections if s.heading.lower() == heading), None)
    if match is None:
        return None
    known = next((c for c in candidates if c.section_id == match.id), None)
    return known or SectionCandidate(section_id=match.id, document_id=sibling.id, score=score)


def _item(call: Call, c: SectionCandidate, confidence: str) -> SectionItem:
    document = call.documents[c.document_id]
    section = next(s for s in document.sections if s.id == c.section_id)
    return SectionItem(
        document_id=document.id, section_id=section.id, title=document.title, heading=section.heading,
        text=section.text, score=round(c.score, 4) if c.score else None, confidence=confidence,  # type: ignore[arg-type]
    )  # fmt: skip
