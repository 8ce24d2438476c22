"""Layer 8, select sections: cut out the part of a document that answers, not the whole document.

With the learned section ranker (:mod:`dossier.providers.ranker`, the default) every governed candidate
gets a probability of answering from the evidence it was found with (:mod:`dossier.pipeline.features`:
cosine, BM25 of text and headings, fused rank, its document's other sections, the record's context,
length and position), and :class:`Decision` chooses on that probability, with thresholds stored in
the model and measured on its training questions:

1. A clear winner (probability >= ``clear_winner``, ahead of the second by ``clear_margin``) is
   taken alone.
2. Otherwise up to three picks: the first needs ``first_pick`` (relevance 3 of 5), every later one
   ``other_pick`` (4 of 5); each item carries its relevance.
3. A more specific sibling document replaces a pick (its title ends with the pick's title and is
   longer, and what makes it more specific, "EMEA", is named by the question or the resolved record, or
   by a place in that region: "Doha" names "Middle East", :mod:`dossier.pipeline.places`): its section
   with the pick's heading (the regional version of the same rule), else its best section when that
   reaches ``sibling_ratio`` of the pick's probability or is good enough to be a first pick itself.
   The other way round, a pick in a more specific sibling whose qualifier nobody names gives way to the
   general document's section of the same heading (or to a named sibling's).
4. No pick: the best candidate at ``fallback_low`` or above comes as low confidence (or its sibling, as
   in 3); unpicked
   candidates at ``supplementary`` or above come as supplementary (up to three). Below that nothing
   comes back: the call abstains.

Without the ranker (a reranker or a model-backed selector ran in a deep call, or no usable model
file: the route says which) selection runs on cosine scores: a clear winner (top >= 0.55, ahead of
the second by >= 0.12, no lexical-only candidates), a :class:`Selector` (heuristic or model) picking
at most three sections, the sibling rule on scores, and the fallbacks best >= 0.30 (low), unpicked
>= 0.65 (supplementary), best >= 0.40 (last resort).

Fetch mode, and filter mode without a question, return their documents' sections: ranked by the
ranker when there is a question, else in order. System documents never get here (govern removed them).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from ..bundle import Document, Section
from ..providers import ranker as rankers
from ..providers.pii import Masker
from ..providers.ranker import LinearRanker, RankerUnavailable
from ..schema import SectionItem
from ..stores.fulltext import terms
from ..pipeline.call import Call, SectionCandidate, public_error
from ..pipeline.features import SECTION_FEATURES, context_words, section_features
from ..pipeline.places import region_words
from ..pipeline.steps import Pick, Selector, uses_model


Confidence = Literal["high", "low", "supplementary"]


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
    if not candidates or call.planned.mode == "expand":  # an expand page was selected by the call that opened it
        return
    whole = bool(call.plan and (call.plan.mode == "fetch" or (call.plan.mode == "filter" and not call.message)))
    ranker = _ranker(call, whole=whole)
    if whole:
        if ranker is not None and call.message:  # the document's sections, best first by the ranker
            probabilities = ranker.probabilities(section_rows(call, candidates))
            order = sorted(range(len(candidates)), key=lambda i: (-probabilities[i], candidates[i].section_id))
            call.candidates["documents"] = [_item(call, candidates[i], "high", probabilities[i]) for i in order]
        else:
            call.candidates["documents"] = [_item(call, c, "high") for c in candidates]
        return
    if all(c.lexical_only and c.score == 0.0 for c in candidates):
        # nothing could be read by meaning (the vector searches failed, the scoring of the full-text candidates
        # too): neither the ranker nor the thresholds can judge them, so the best full-text candidate comes, low
        best = min(candidates, key=lambda c: (c.text_rank if c.text_rank is not None else len(candidates), c.section_id))
        call.decide("documents", detail={"fallback": "best_full_text"})
        chosen: list[tuple[SectionCandidate, Confidence, float | None]] = [(best, "low", None)]
    elif ranker is not None:
        chosen = _select_ranked(call, candidates, ranker)
    else:
        chosen = [(c, confidence, None) for c, confidence in _select_heuristic(call, candidates)]
    picked = {c.section_id for c, _, _ in chosen}
    for c in candidates:
        if c.section_id not in picked:
            call.note("documents", c.section_id, "select", "dropped", "not_selected", c.score)
    call.candidates["documents"] = [_item(call, c, confidence, p) for c, confidence, p in chosen]


def _ranker(call: Call, *, whole: bool) -> LinearRanker | None:
    """The learned section ranker for this call, or None where the heuristic ranks: a reranker or a
    model-backed selector ran (deep), or no usable model (the route says why)."""
    if any(c.rerank is not None for c in call.sections):
        call.decide("documents", detail={"ranker": "reranker"})
        return None
    if not whole and call.plan and call.plan.model_steps and uses_model(call.steps.selector):
        call.decide("documents", detail={"ranker": "model selector"})
        return None
    try:
        ranker = rankers.for_settings(call.settings.rankers, "sections", SECTION_FEATURES)
    except RankerUnavailable as exc:
        call.decide("documents", detail={"ranker": "heuristic", "ranker_fallback": str(exc)})
        return None
    call.decide("documents", detail={"ranker": ranker.name})
    return ranker


def section_rows(call: Call, candidates: list[SectionCandidate]) -> np.ndarray:
    """The ranker's feature rows for ``candidates``: the question, the documents and the record's context."""
    res = call.resolution
    records = [res.record, *res.aliases] if res.record is not None and not res.tombstone else []
    context = context_words(v for record in records for v in record.properties.values())
    return section_features(call.message, candidates, call.documents, context)


def _context_texts(call: Call) -> list[str]:
    """The question and the property values of the resolved record (and its aliases), as text."""
    texts = [call.message]
    res = call.resolution
    for record in ([res.record] if res.record is not None and not res.tombstone else []) + list(res.aliases):
        texts.extend(str(v) for v in record.properties.values())
    return texts


def _regions(call: Call) -> frozenset[str]:
    """The region words of the places the question and the resolved record itself name ("Doha" names the
    Middle East); not its aliases': the colleagues sharing a company's domain work in other places."""
    texts = [call.message]
    res = call.resolution
    if res.record is not None and not res.tombstone:
        texts.extend(str(v) for v in res.record.properties.values())
    return region_words(" ".join(texts))


@dataclass(frozen=True)
class Decision:
    """What selection does with candidates ranked by probability, as a pure function (training uses it)."""

    first_pick: float = 0.4
    other_pick: float = 0.6
    clear_winner: float = 0.7
    clear_margin: float = 0.3
    fallback_low: float = 0.15
    supplementary: float = 0.6
    sibling_ratio: float = 0.8

    @classmethod
    def of(cls, ranker: LinearRanker) -> "Decision":
        defaults = cls()
        return cls(**{name: ranker.threshold(name, getattr(defaults, name)) for name in cls.__dataclass_fields__})

    def choose(
        self, ranked: list[tuple[SectionCandidate, float]], *, max_picks: int, max_supplementary: int,
        sibling: Callable[[SectionCandidate, float], tuple[SectionCandidate, float] | None] = lambda c, p: None,
    ) -> tuple[list[tuple[SectionCandidate, Confidence, float]], str]:  # fmt: skip
        """(chosen candidates with confidence and probability, how they were chosen)."""
        if not ranked:
            return [], "none"
        top = ranked[0][1]
        second = ranked[1][1] if len(ranked) > 1 else 0.0
        chosen: list[tuple[SectionCandidate, Confidence, float]] = []
        if top >= self.clear_winner and top - second >= self.clear_margin:
            how, picks = "clear_winner", [ranked[0]]
        else:
            how, picks = "ranked", []
            for c, p in ranked:
                if len(picks) < max_picks and p >= (self.first_pick if not picks else self.other_pick):
                    picks.append((c, p))
        for c, p in picks:
            c, p = sibling(c, p) or (c, p)
            if all(c.section_id != o.section_id for o, _, _ in chosen):
                chosen.append((c, "high", p))
        if not chosen and top >= self.fallback_low:
            c, p = sibling(ranked[0][0], top) or (ranked[0][0], top)  # a low pick has its sibling too
            chosen.append((c, "low", p))
            how = "best_candidate_low"
        picked = {c.section_id for c, _, _ in chosen}
        extra = [(c, p) for c, p in ranked if c.section_id not in picked and p >= self.supplementary]
        chosen.extend((c, "supplementary", p) for c, p in extra[:max_supplementary])
        return chosen, how


def _select_ranked(call: Call, candidates: list[SectionCandidate], ranker: LinearRanker) -> list[tuple[SectionCandidate, Confidence, float | None]]:
    settings = call.settings
    rows = section_rows(call, candidates)
    probabilities = ranker.probabilities(rows)
    decision = Decision.of(ranker)
    # An exact code of the question in a section is certain evidence (relevance 5, as for the heuristic);
    # a candidate only full text found makes no clear winner (its cosine undersells an exact match); the
    # org's sibling ratio applies on this path too.
    codes_found = rows[:, SECTION_FEATURES.index("code_match")] > 0
    # (lifted into [0.9, 1.0] keeping the ranker's order: several sections holding the code are not a tie)
    probabilities = np.where(codes_found, 0.9 + 0.1 * probabilities, probabilities)
    lexical_only = any(c.lexical_only for c in candidates)
    decision = dataclasses.replace(decision, sibling_ratio=settings.thresholds.sibling_ratio,
                                   clear_winner=1.01 if lexical_only else decision.clear_winner)  # fmt: skip
    p_of = {c.section_id: float(p) for c, p in zip(candidates, probabilities)}
    ranked = sorted(zip(candidates, (float(p) for p in probabilities)), key=lambda cp: (-cp[1], cp[0].section_id))

    def sibling(pick: SectionCandidate, p: float) -> tuple[SectionCandidate, float] | None:
        # enough of the pick's probability, or good enough to be a pick itself: a sigmoid squeezes the
        # ratio of two probabilities near the top, so a ratio alone would rarely let a sibling through
        floor = min(decision.sibling_ratio * p, decision.first_pick)
        replacement = _sibling_of(call, pick, candidates, lambda c: p_of.get(c.section_id, 0.0), floor)
        if replacement is None:
            general = _general_of(call, pick, candidates)
            if general is None:
                return None
            replacement = _sibling_of(call, general, candidates, lambda c: p_of.get(c.section_id, 0.0), floor) or general
        return replacement, p_of.get(replacement.section_id, p)

    chosen, how = decision.choose(ranked, max_picks=settings.max_picks, max_supplementary=settings.max_supplementary,
                                  sibling=sibling)  # fmt: skip
    call.decide("documents", detail={"selector": how if how in ("clear_winner", "none") else "ranker"})
    if how == "best_candidate_low":
        call.decide("documents", detail={"fallback": how})
    call.decide("documents", detail={"lexical_only": sum(c.lexical_only for c in candidates)})
    return [(c, confidence, p) for c, confidence, p in chosen]


def _sibling_of(call: Call, pick: SectionCandidate, candidates: list[SectionCandidate],
                score: Callable[[SectionCandidate], float], floor: float) -> SectionCandidate | None:  # fmt: skip
    """A more specific sibling document's section to answer instead of ``pick`` (its title ends with the
    pick's document title and is longer; what makes it more specific is named by the question or the
    record): the section with the same heading as the pick (the regional version of the same rule), else
    its best candidate when that scores at least ``floor``."""
    document = call.documents.get(pick.document_id)
    if document is None:
        return None
    for doc_id in dict.fromkeys(c.document_id for c in candidates):
        sibling = call.documents.get(doc_id)
        if sibling is None or doc_id == pick.document_id:
            continue
        if not (sibling.title.lower().endswith(document.title.lower()) and len(sibling.title) > len(document.title)):
            continue
        own = [c for c in candidates if c.document_id == doc_id]
        best = max(own, key=score)
        if not _qualifier_applies(call, sibling.title[: -len(document.title)]):
            continue
        same = _same_section(pick, document, sibling, candidates, best.score)
        if same is None and score(best) < floor:  # the same heading in the named sibling needs no score
            continue
        replacement = same or best
        call.note("documents", pick.section_id, "select", "dropped", f"replaced_by_sibling:{doc_id}", pick.score)
        call.decide("documents", append={"siblings": [pick.section_id, replacement.section_id]})
        return replacement
    return None


def _general_of(call: Call, pick: SectionCandidate, candidates: list[SectionCandidate]) -> SectionCandidate | None:
    """The general document's section on the pick's topic (:func:`_same_section`), when the pick is in a
    more specific sibling (its title ends with the general one's and is longer) whose qualifier neither the
    question nor the record names: "Wales Tenancy Deposit Procedure" picked for a flat in Bristol gives way
    to the same section of "Tenancy Deposit Procedure". The general document must be among the candidates'."""
    document = call.documents.get(pick.document_id)
    if document is None:
        return None
    title = document.title.lower()
    for doc_id in dict.fromkeys(c.document_id for c in candidates):
        general = call.documents.get(doc_id)
        if general is None or doc_id == pick.document_id:
            continue
        if not (title.endswith(general.title.lower()) and len(title) > len(general.title)):
            continue
        if _qualifier_applies(call, document.title[: -len(general.title)]):
            return None  # the pick's qualifier is named: it stands
        same = _same_section(pick, document, general, candidates, pick.score)
        if same is None:
            continue
        call.note("documents", pick.section_id, "select", "dropped", f"replaced_by_general:{doc_id}", pick.score)
        call.decide("documents", append={"generals": [pick.section_id, same.section_id]})
        return same
    return None


def _select_heuristic(call: Call, candidates: list[SectionCandidate]) -> list[tuple[SectionCandidate, Confidence]]:
    """Selection without the learned ranker: cosine thresholds and the selector (heuristic or model)."""
    t, settings = call.settings.thresholds, call.settings
    ranked = sorted(candidates, key=rank_key)
    lexical_only = [c for c in candidates if c.lexical_only]
    gap = ranked[0].score - (ranked[1].score if len(ranked) > 1 else 0.0)
    call.decide("documents", detail={"lexical_only": len(lexical_only)})
    chosen: list[tuple[SectionCandidate, Confidence]] = []
    if not lexical_only and ranked[0].score >= t.clear_winner and gap >= t.clear_winner_margin:
        call.decide("documents", detail={"selector": "clear_winner"})
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
                call.decide("documents", detail={"fallback": "best_candidate_low"})
    picked = {c.section_id for c, _ in chosen}
    extra = [c for c in ranked if c.section_id not in picked and c.score >= t.supplementary][: settings.max_supplementary]
    chosen.extend((c, "supplementary") for c in extra)
    if not chosen and ranked[0].score >= t.fallback_last:
        chosen.append((ranked[0], "low"))
        call.decide("documents", detail={"fallback": "best_candidate_last"})
    return chosen


def rank_key(c: SectionCandidate) -> tuple:
    """Best first: by reranker score when a reranker ran (layers/rerank.py), else by cosine score."""
    return (c.rerank is None, -(c.rerank or 0.0), -c.score, c.section_id)


def _run_selector(call: Call, candidates: list[SectionCandidate]) -> tuple[list[Pick], dict[str, SectionCandidate]]:
    """The selector's picks and the candidates they may name. A model-backed selector runs only when the
    plan allows model steps; it sees the masked question; if it fails, or names only sections that do
    not exist, the heuristic picks instead and the route says why."""
    selector: Selector = call.steps.selector
    t = call.settings.thresholds
    heuristic = HeuristicSelector(floor=t.selector_floor, lexical_weight=t.lexical_weight)
    model = uses_model(selector)
    if call.plan and not call.plan.model_steps:
        selector, model = heuristic, False
    call.decide("documents", detail={"selector": selector.name})
    by_id = {c.section_id: c for c in candidates}
    ordered = sorted(candidates, key=rank_key)
    try:
        if not model:
            return selector.select(call.message, ordered, call.documents), by_id
        # documents first, in id order, then the question: the same candidates give the same prompt prefix
        masker = call.masker(fresh=True)
        documents = {i: _masked(call.documents[i], masker) for i in sorted(call.documents)}
        picks = selector.select(masker.mask(call.message), ordered, documents)
        picks, unknown = _known_picks(call, picks, by_id)
        if not picks and unknown:
            raise ValueError(f"picked only sections that do not exist: {', '.join(unknown)}")
        return picks, by_id
    except Exception as exc:  # noqa: BLE001 - selector failure falls back to the heuristic
        call.decide("documents", detail={"selector": heuristic.name})
        if model:
            call.step_failed("select", exc, fallback=heuristic.name)
            call.decide("documents", detail={"selector_fallback": "selector_error"})
        else:
            call.fail("documents", f"selector {selector.name} failed: {public_error(exc)}", keep_items=True)
            call.decide("documents", fallback_reason="selector_error")
        return heuristic.select(call.message, ordered, call.documents), by_id


def _masked(document: Document, masker: Masker) -> Document:
    """``document`` with personal data masked in its title, headings and texts (ids stay)."""
    sections = tuple(s.model_copy(update={"heading": masker.mask(s.heading), "text": masker.mask(s.text)})
                     for s in document.sections)  # fmt: skip
    return document.model_copy(update={"title": masker.mask(document.title), "sections": sections})


def _known_picks(call: Call, picks: list[Pick], by_id: dict[str, SectionCandidate]) -> tuple[list[Pick], list[str]]:
    """Picks that name a section of a candidate document (the catalogue the selector saw), and the ids
    that exist nowhere. A section the search did not return joins the candidates with its cosine score;
    ids that exist nowhere are ignored and reported in ``route.detail["unknown_picks"]``."""
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
        call.decide("documents", detail={"unknown_picks": unknown})
    return known, unknown


def _scored(call: Call, section_id: str, document_id: str) -> SectionCandidate:
    hits = call.guarded(
        "documents",
        lambda: call.store.search_vectors("section", call.query_vector(), org=call.org, limit=500, parents=[document_id]),
        what="scoring a picked section",
    )
    score = next((h.score for h in hits or [] if h.id == section_id), 0.0)
    return SectionCandidate(section_id=section_id, document_id=document_id, score=score)


def _prefer_siblings(
    call: Call, chosen: list[tuple[SectionCandidate, Confidence]], candidates: list[SectionCandidate]
) -> list[tuple[SectionCandidate, Confidence]]:
    ratio = call.settings.thresholds.sibling_ratio
    best_of: dict[str, SectionCandidate] = {}
    for c in candidates:
        if c.document_id not in best_of or c.score > best_of[c.document_id].score:
            best_of[c.document_id] = c
    out: list[tuple[SectionCandidate, Confidence]] = []

    def named_sibling(pick: SectionCandidate) -> SectionCandidate | None:
        document = call.documents.get(pick.document_id)
        for doc_id, best in best_of.items():
            sibling = call.documents.get(doc_id)
            if document is None or sibling is None or doc_id == pick.document_id:
                continue
            if sibling.title.lower().endswith(document.title.lower()) and len(sibling.title) > len(document.title):
                if best.score >= ratio * pick.score and _qualifier_applies(call, sibling.title[: -len(document.title)]):
                    replacement = _same_section(pick, document, sibling, candidates, best.score) or best
                    call.note("documents", pick.section_id, "select", "dropped", f"replaced_by_sibling:{doc_id}", pick.score)
                    call.decide("documents", append={"siblings": [pick.section_id, replacement.section_id]})
                    return replacement
        return None

    for pick, confidence in chosen:
        replacement = named_sibling(pick)
        if replacement is None:
            general = _general_of(call, pick, candidates)
            replacement = pick if general is None else named_sibling(general) or general
        if all(replacement.section_id != c.section_id for c, _ in out):
            out.append((replacement, confidence))
    return out


def _qualifier_applies(call: Call, qualifier: str) -> bool:
    """Whether what makes the sibling more specific ("EMEA" in "EMEA Pricing Guidelines") is named by the
    question or by the resolved record (or its aliases), e.g. a ``region: EMEA`` property, or by a place in
    the region that the question or the record itself names ("Doha" names "Middle East", a ``country:
    Poland`` property "EU": pipeline/places.py)."""
    words = {_singular(w) for w in re.findall(r"\w+", qualifier.lower()) if len(w) > 1}
    if not words:
        return True
    named = {_singular(w) for w in re.findall(r"\w+", " ".join(_context_texts(call)).lower())}
    negated = {_singular(w) for w in _NEGATED.findall(call.message.lower())}  # "a hotel, not an apartment"
    return bool(words & (named - negated | {_singular(w) for w in _regions(call)}))


_NEGATED = re.compile(r"\b(?:not|non|no)[\s-]+(?:an?\s+|the\s+)?(\w+)")


def _singular(word: str) -> str:
    """"students" names "Student ...", "HMOs" "HMO ...": a plural s folded (words of four letters or more)."""
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _same_section(
    pick: SectionCandidate, document: Document, sibling: Document, candidates: list[SectionCandidate], score: float
) -> SectionCandidate | None:
    """``sibling``'s section on the pick's topic: the one with the pick's heading, else the one whose
    heading holds all the words of the other's once the documents' qualifiers are set aside ("EMEA
    discount bands" in "EMEA Pricing Guidelines" and "Discount bands by seat count" in "Pricing
    Guidelines"), when exactly one does and two words or more are left to compare."""
    heading = next((s.heading for s in document.sections if s.id == pick.section_id), None)
    if heading is None:
        return None
    match = next((s for s in sibling.sections if s.heading.lower() == heading.lower()), None)
    if match is None:
        qualifiers = _title_words(document.title) ^ _title_words(sibling.title)
        mine = _title_words(heading) - qualifiers
        similar = []
        for s in sibling.sections:
            theirs = _title_words(s.heading) - qualifiers
            if min(len(mine), len(theirs)) >= 2 and (mine <= theirs or theirs <= mine):
                similar.append(s)
        match = similar[0] if len(similar) == 1 else None
    if match is None:
        return None
    known = next((c for c in candidates if c.section_id == match.id), None)
    return known or SectionCandidate(section_id=match.id, document_id=sibling.id, score=score)


def _title_words(text: str) -> set[str]:
    return {_singular(w) for w in re.findall(r"\w+", text.lower()) if len(w) > 1}


def _item(call: Call, c: SectionCandidate, confidence: Confidence, probability: float | None = None) -> SectionItem:
    document = call.documents[c.document_id]
    section = next(s for s in document.sections if s.id == c.section_id)
    return SectionItem(
        document_id=document.id, section_id=section.id, title=document.title, heading=section.heading,
        text=section.text, score=round(c.score, 4) if c.score else None, confidence=confidence,
        relevance=None if probability is None else rankers.relevance(float(probability)),
    )  # fmt: skip
