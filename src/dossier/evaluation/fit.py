"""Fitting the learned rankers (:mod:`dossier.providers.ranker`) on labelled questions.

Examples come out of the real pipeline: each question runs the layers up to selection (plan,
resolve, understand, recall, govern, rerank) and the candidates that reach selection are turned into
feature rows by the same functions a live call uses, so training and serving cannot drift apart. A
row is labelled 1 when its section (or memory) is gold. The model is a standardised logistic model
(scikit-learn and SciPy; the ``train`` extra), fitted row by row (``pointwise``) or question by question
(``listwise``: the gold candidates should win the softmax over their question's candidates; a one-slope
logistic fit then makes its score a probability); its decision thresholds are chosen on the same
training questions, never on the questions it is reported on.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import UsageError
from ..pipeline.call import Call, SectionCandidate
from ..pipeline.features import MEMORY_FEATURES, SECTION_FEATURES, memory_features
from ..layers.sections import Decision, section_rows
from ..providers.ranker import FORMAT, LinearRanker, parse
from ..retrieve import PIPELINE, parse_request
from ..sources.memories import memory_evidence, memory_searches

DEFAULT_REQUEST = {"mode": "brief", "budget": {"totalTokens": 8000}}
C_GRID = (0.03, 0.1, 0.3, 1.0)


@dataclass
class Example:
    """One question's candidates: feature rows, labels (1 = gold) and ids, plus what scoring needs."""

    group: str
    x: np.ndarray
    y: np.ndarray
    ids: list[str]
    answerable: bool = True
    candidates: list[SectionCandidate] | None = None
    weight: float = 1.0  # of each of its rows in the fit (to balance sets of different sizes)


def split_of(key: str, *, test_share: float = 0.5) -> str:
    """``train`` or ``test`` for ``key``, by a stable hash (the same on every machine and run)."""
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if h < test_share else "train"


def section_side(question: Any) -> str:
    """A labelled question's split for the section ranker: by its gold documents (``train`` only when all
    are), else, for a question nothing answers, by its id."""
    if question.gold.documents:
        return "train" if {split_of(d) for d in question.gold.documents} == {"train"} else "test"
    return split_of(question.id)


def prepared_call(engine: Any, request: Mapping[str, Any], *, org: str, caller: str) -> Call:
    """A call run up to (not including) section selection: what selection and the rankers see."""
    who = engine.store.get_caller(caller, org=org)
    if who is None:
        raise UsageError(f"unknown caller {caller!r} in org {org!r}")
    call = Call(steps=engine.steps(org=org, caller=caller), request=parse_request(dict(request)), org=org, caller=who, settings=engine.settings_for(org))
    for layer in PIPELINE:
        if layer.__name__ == "select_sections":
            break
        layer(call)
    return call


def section_example(engine: Any, request: Mapping[str, Any], *, org: str, caller: str, gold: Iterable[str],
                    group: str, answerable: bool = True) -> Example:  # fmt: skip
    call = prepared_call(engine, request, org=org, caller=caller)
    candidates = list(call.sections)
    wanted = set(gold)
    x = section_rows(call, candidates) if candidates else np.zeros((0, len(SECTION_FEATURES)))
    y = np.array([c.section_id in wanted for c in candidates], dtype=np.float64)
    return Example(group, x, y, [c.section_id for c in candidates], answerable, candidates)


def memory_example(engine: Any, *, org: str, record_ids: Sequence[str], question: str, gold: Iterable[str],
                   group: str, pool: int) -> Example:  # fmt: skip
    """The memory ranker's candidates for ``question`` over ``record_ids``: the vector and full-text
    searches' best ``pool`` each, as tier 2 sees them."""
    vector = engine.embed_query(question)
    semantic, adapted = memory_searches(engine.store, engine.embedder, vector, org=org, record_ids=list(record_ids), pool=pool)
    lexical = engine.store.search_text("memory", question, org=org, parents=list(record_ids), limit=pool)
    ids = list(dict.fromkeys([h.id for h in semantic] + [h.id for h in lexical] + [h.id for h in adapted or []]))
    found = {m.id: m for m in engine.store.get_memories(ids, org=org)}
    evidence = memory_evidence(question, semantic, lexical, found, adapted)
    wanted = set(gold)
    return Example(group, memory_features(question, evidence), np.array([e.id in wanted for e in evidence], dtype=np.float64),
                   [e.id for e in evidence])  # fmt: skip


def fit(examples: Sequence[Example], *, kind: str, features: Sequence[str], c_grid: Sequence[float] = C_GRID,
        score: Callable[[Sequence[Example], Callable[[np.ndarray], np.ndarray]], float] | None = None,
        objective: str = "pointwise", report: dict[str, float] | None = None) -> dict[str, Any]:  # fmt: skip
    """A logistic model as the JSON form :func:`dossier.providers.ranker.parse` reads. The inverse
    regularisation strength is chosen by cross-validation over question groups (three folds).

    ``objective``: ``pointwise`` fits each candidate's label alone (logistic regression); ``listwise``
    fits the weights so that each question's gold candidates win the softmax over its candidates (what
    top-1 asks), then turns the score into a probability with one more logistic fit over every candidate
    (Platt scaling), so that the thresholds read a calibrated probability either way. ``report``, when
    given, receives ``cv``: the chosen strength's mean score on the folds it was not fitted on."""
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise UsageError("fitting a ranker needs scikit-learn: pip install 'dossier-engine[train]'") from None
    if objective not in ("pointwise", "listwise"):
        raise UsageError(f"unknown ranker objective {objective!r}: pointwise or listwise")
    estimator: Any = LogisticRegression if objective == "pointwise" else functools.partial(_Listwise, LogisticRegression)
    usable = [e for e in examples if len(e.y)]
    if not any(e.y.any() for e in usable):
        raise UsageError(f"no {kind} question has a gold candidate among what recall found: nothing to learn from")
    score = score or top1
    folds = [[e for i, e in enumerate(usable) if i % 3 == k] for k in range(3)]
    best_c, best = c_grid[0], -1.0
    for c in c_grid:
        results = []
        for k in range(3):
            train = [e for j, f in enumerate(folds) if j != k for e in f]
            if not train or not folds[k] or not any(e.y.any() for e in train):
                continue
            model = _fit_one(train, c, estimator)
            results.append(score(folds[k], functools.partial(_probabilities, model)))
        if results and float(np.mean(results)) > best + 1e-9:
            best_c, best = c, float(np.mean(results))
    if report is not None:
        report["cv"] = best
    model = _fit_one(usable, best_c, estimator)
    mean, scale, coef, intercept = model
    return {"kind": kind, "features": list(features), "mean": mean.tolist(), "scale": scale.tolist(),
            "coef": coef.tolist(), "intercept": intercept, "c": best_c, "objective": objective}  # fmt: skip


def _fit_one(examples: Sequence[Example], c: float, estimator: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    x = np.vstack([e.x for e in examples])
    y = np.concatenate([e.y for e in examples])
    w = np.concatenate([np.full(len(e.y), e.weight) for e in examples])
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    model = estimator(C=c, max_iter=5000)
    if getattr(model, "grouped", False):  # listwise: which question each row belongs to
        groups = np.concatenate([np.full(len(e.y), n) for n, e in enumerate(examples)])
        model.fit((x - mean) / scale, y, sample_weight=w, groups=groups)
    else:
        model.fit((x - mean) / scale, y, sample_weight=w)
    return mean, scale, model.coef_[0].astype(np.float64), float(model.intercept_[0])


class _Listwise:
    """The estimator of the ``listwise`` objective, with the part of scikit-learn's interface ``_fit_one``
    uses: ``fit(x, y, sample_weight, groups)`` then ``coef_`` and ``intercept_``."""

    grouped = True

    def __init__(self, calibrator: Any, *, C: float, max_iter: int) -> None:  # noqa: N803 - scikit-learn's name
        self.calibrator, self.c, self.max_iter = calibrator, C, max_iter

    def fit(self, x: np.ndarray, y: np.ndarray, *, sample_weight: np.ndarray, groups: np.ndarray) -> "_Listwise":
        from scipy.optimize import minimize

        starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
        bounds = list(zip(starts, [*starts[1:], len(groups)]))
        answered = [(a, b) for a, b in bounds if y[a:b].any()]
        weights = np.array([sample_weight[a] for a, _ in answered])

        def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
            total, grad = 0.5 * float(w @ w) / self.c, w / self.c
            for (a, b), weight in zip(answered, weights):
                rows = x[a:b]
                s = rows @ w
                p = np.exp(s - s.max())
                p /= p.sum()
                gold = y[a:b] > 0
                won = float(p[gold].sum())
                total -= weight * np.log(max(won, 1e-300))
                q = np.where(gold, p / max(won, 1e-300), 0.0)  # the gold candidates' share of what they won
                grad = grad - weight * (rows.T @ (q - p))
            return total, grad

        w = minimize(loss, np.zeros(x.shape[1]), jac=True, method="L-BFGS-B", options={"maxiter": self.max_iter}).x
        platt = self.calibrator(C=1e6, max_iter=self.max_iter).fit((x @ w)[:, None], y, sample_weight=sample_weight)
        slope = float(platt.coef_[0][0])
        self.coef_ = (slope * w)[None, :]
        self.intercept_ = np.array([float(platt.intercept_[0])])
        return self


def _probabilities(model: tuple[np.ndarray, np.ndarray, np.ndarray, float], x: np.ndarray) -> np.ndarray:
    mean, scale, coef, intercept = model
    return 1.0 / (1.0 + np.exp(-(((x - mean) / scale) @ coef + intercept)))


def top1(examples: Sequence[Example], probabilities: Callable[[np.ndarray], np.ndarray]) -> float:
    """Share of answerable examples whose best candidate is gold."""
    hits = [bool(e.y[int(np.argmax(probabilities(e.x)))]) for e in examples if len(e.y) and e.answerable]
    return float(np.mean(hits)) if hits else 0.0


def any_at(k: int) -> Callable[[Sequence[Example], Callable[[np.ndarray], np.ndarray]], float]:
    def score(examples: Sequence[Example], probabilities: Callable[[np.ndarray], np.ndarray]) -> float:
        hits = [bool(e.y[np.argsort(-probabilities(e.x))[:k]].any()) for e in examples if len(e.y)]
        return float(np.mean(hits)) if hits else 0.0

    return score


# -- decision thresholds, chosen on training questions ---------------------------------------------------
THRESHOLD_GRID = {
    "first_pick": (0.2, 0.3, 0.4, 0.5),
    "other_pick": (0.5, 0.6, 0.7, 0.8),
    "clear_winner": (0.5, 0.6, 0.7, 0.8),
    "clear_margin": (0.2, 0.3, 0.4),
    "fallback_low": (0.0, 0.03, 0.05, 0.1, 0.15, 0.2),
    "supplementary": (0.7, 0.8, 0.9, 1.01),
}


def selection_quality(examples: Sequence[Example], ranker: LinearRanker, decision: Decision) -> dict[str, float]:
    """Section accuracy, recall@3 of gold, precision of what comes back and abstention, as the layer
    would decide on these examples (sibling replacement aside)."""
    acc, recall, precision, abstain = [], [], [], []
    for e in examples:
        candidates = e.candidates or []
        p = ranker.probabilities(e.x) if len(e.y) else np.zeros(0)
        ranked = sorted(zip(candidates, (float(v) for v in p)), key=lambda cp: (-cp[1], cp[0].section_id))
        chosen, _ = decision.choose(ranked, max_picks=3, max_supplementary=3)
        gold = {i for i, y in zip(e.ids, e.y) if y}
        returned = [c.section_id for c, _, _ in chosen]
        if e.answerable:
            acc.append(bool(returned) and returned[0] in gold)
            if gold:
                recall.append(len(gold & set(returned[:3])) / len(gold))
            if returned:
                precision.append(len(gold & set(returned)) / len(returned))
        else:
            abstain.append(not any(conf == "high" for _, conf, _ in chosen))
    m = lambda v: float(np.mean(v)) if v else 0.0  # noqa: E731
    return {"sec_acc": m(acc), "sec_r3": m(recall), "precision": m(precision), "abstain": m(abstain)}


def choose_thresholds(examples: Sequence[Example], ranker: LinearRanker) -> dict[str, float]:
    """The grid point with the best mean utility per question (ties keep the first, stricter point): an
    answerable question scores half for a gold first section, a quarter each for recall@3 of its gold
    sections and for the precision of what came back; an unanswerable one scores 1 for abstaining."""
    best: tuple[float, dict[str, float]] | None = None
    names = list(THRESHOLD_GRID)
    answerable = sum(e.answerable for e in examples)
    unanswerable = len(examples) - answerable
    for values in itertools.product(*(THRESHOLD_GRID[n] for n in names)):
        point = dict(zip(names, values))
        if point["other_pick"] < point["first_pick"] or point["fallback_low"] > point["first_pick"]:
            continue
        q = selection_quality(examples, ranker, Decision(**point))
        value = answerable * (0.5 * q["sec_acc"] + 0.25 * q["sec_r3"] + 0.25 * q["precision"]) + unanswerable * q["abstain"]
        if best is None or value > best[0] + 1e-9:
            best = (value, point)
    assert best is not None
    return best[1]


def memory_floor(examples: Sequence[Example], ranker: LinearRanker, *, k: int = 10, tolerance: float = 0.01) -> float:
    """The highest probability floor that costs at most ``tolerance`` of any@k on these examples."""
    def any_k(floor: float) -> float:
        hits = []
        for e in examples:
            p = ranker.probabilities(e.x) if len(e.y) else np.zeros(0)
            order = [i for i in np.argsort(-p) if p[i] >= floor][:k]
            hits.append(bool(len(order) and e.y[order].any()))
        return float(np.mean(hits)) if hits else 0.0

    base = any_k(0.0)
    floor = 0.0
    for candidate in (0.01, 0.02, 0.03, 0.05, 0.08, 0.1, 0.15, 0.2):
        if any_k(candidate) >= base - tolerance:
            floor = candidate
    return floor


def ranker_file(models: Mapping[str, Mapping[str, Any]], **about: Any) -> dict[str, Any]:
    """The JSON file form: ``format``, one model per kind, and what they were fitted on."""
    for kind, spec in models.items():
        parse(spec, kind=kind, expected=SECTION_FEATURES if kind == "sections" else MEMORY_FEATURES, origin="fit")
    return {"format": FORMAT, **about, **models}


# -- an org's own section ranker (dossier calibrate --write) --------------------------------------------
MIN_ORG_QUESTIONS = 30  # questions with gold sections; fewer cannot be split and still say anything


@dataclass
class OrgFit:
    """The outcome of fitting one org's section ranker: the model to store (or None) and why."""

    org: str
    spec: dict[str, Any] | None
    reason: str
    held_out: dict[str, float]  # section accuracy on the held-out questions: shipped and fitted


def fit_org(engine: Any, questions: Sequence[Any], *, org: str, shipped: LinearRanker) -> OrgFit:
    """Fit ``org``'s own section ranker on its labelled questions, split by gold document (a stable hash);
    keep it only when its held-out section accuracy is at least the shipped model's."""
    ids = engine.store.document_ids(org=org)
    known = {s.id for d in engine.store.get_documents(ids, org=org) for s in d.sections}
    # a gold section the org does not hold is a labelling mistake: such a question teaches nothing and is not counted
    labelled = [q for q in questions if q.org == org and (set(q.gold.sections) & known or not q.answerable)]
    if sum(bool(q.gold.sections) for q in labelled) < MIN_ORG_QUESTIONS:
        return OrgFit(org, None, f"{sum(bool(q.gold.sections) for q in labelled)} questions with gold sections the org holds; "
                                 f"an org's own ranker needs at least {MIN_ORG_QUESTIONS}: the shipped ranker stays", {})  # fmt: skip
    sides: dict[str, list[Example]] = {"train": [], "test": []}
    for q in labelled:
        side = section_side(q)
        request = {**DEFAULT_REQUEST, **q.request, "message": q.message}
        if q.record is not None:
            request["record"] = q.record
        sides[side].append(section_example(engine, request, org=org, caller=q.caller, gold=q.gold.sections,
                                           group=q.id, answerable=q.answerable))  # fmt: skip
    if not any(e.answerable and e.y.any() for e in sides["test"]) or not any(e.y.any() for e in sides["train"]):
        return OrgFit(org, None, "the split by document left no held-out (or no training) question with a recalled gold "
                                 "section: the shipped ranker stays", {})  # fmt: skip
    spec = fit(sides["train"], kind="sections", features=SECTION_FEATURES)
    spec["thresholds"] = dict(shipped.thresholds)
    fitted = parse(spec, kind="sections", expected=SECTION_FEATURES, origin="org")
    spec["thresholds"] = choose_thresholds(sides["train"], fitted)
    fitted = parse(spec, kind="sections", expected=SECTION_FEATURES, origin="org")
    held_out = {"shipped": top1(sides["test"], shipped.probabilities), "fitted": top1(sides["test"], fitted.probabilities),
                "questions": float(len(sides["test"]))}  # fmt: skip
    if held_out["fitted"] < held_out["shipped"]:
        return OrgFit(org, None, f"the fitted ranker is worse on held-out questions ({held_out['fitted']:.3f} < "
                                 f"{held_out['shipped']:.3f}): the shipped ranker stays", held_out)  # fmt: skip
    return OrgFit(org, spec, f"fitted on {len(sides['train'])} questions, held-out section accuracy "
                             f"{held_out['fitted']:.3f} (shipped {held_out['shipped']:.3f})", held_out)  # fmt: skip
