"""Layer 7, rerank (optional, ``deep`` only): a reranker reorders the fused document candidates.

It runs after fusion and after governance, so no section the caller may not see is sent to a rerank
endpoint (and personal data is masked before texts leave the process). It reranks the best
``document_candidates`` of the fused list; the rest keep their fused order behind them. Section
selection then ranks by the reranker's order (thresholds stay on cosine scores). If the reranker
fails, or has not answered by the rerank step's end time under the call's deadline
(:mod:`dossier.deadline`), the fused order stands, and the documents route says so (``deep_timeout`` /
``deep_error``, ``detail["rerank_fallback"] = "rerank_error"``).
"""

from __future__ import annotations

from ..deadline import run_step
from ..pipeline.call import Call

MAX_TEXT_CHARS = 2000  # cross-encoders read ~512 tokens; a longer text only costs bandwidth


def rerank(call: Call) -> None:
    reranker = call.steps.reranker
    plan = call.plan
    if reranker is None or not call.sections or plan is None or not plan.model_steps:
        return
    if plan.mode == "fetch" or (plan.mode == "filter" and not call.message):
        return
    top = [c for c in call.sections[: call.settings.document_candidates] if c.document_id in call.documents]
    if not top:
        return
    texts = []
    for c in top:
        document = call.documents[c.document_id]
        section = next(s for s in document.sections if s.id == c.section_id)
        texts.append(f"{document.title} > {section.heading}\n{section.text}"[:MAX_TEXT_CHARS])
    query = call.message
    if getattr(reranker, "remote", True):
        masker = call.masker()
        query, texts = masker.mask(query), [masker.mask(t) for t in texts]
    try:
        scores = run_step("rerank", lambda: reranker.rerank(query, texts))
        if len(scores) != len(top):
            raise ValueError(f"{len(scores)} scores for {len(top)} texts")
    except Exception as exc:  # noqa: BLE001 - the fused order stands
        call.step_failed("rerank", exc, fallback="fused order")
        call.decide("documents", detail={"rerank": "failed", "rerank_fallback": "rerank_error"})
        return
    for c, score in zip(top, scores):
        c.rerank = float(score)
    reranked = {c.section_id for c in top}
    call.candidates["documents"] = sorted(top, key=lambda c: (-(c.rerank or 0.0), c.section_id)) + [
        c for c in call.sections if c.section_id not in reranked
    ]
    call.decide("documents", detail={"rerank": reranker.name, "reranked": len(top)})
