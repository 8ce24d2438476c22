"""The learned rankers: the same features on both stores, a fallback that says so, one org's model
never ranking another's calls, and multi-part questions split as docs/retrieve.md says."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import dossier
from dossier.evaluation.dataset import load_dataset
from dossier.evaluation.fit import memory_example, prepared_call
from dossier.pipeline.features import MEMORY_FEATURES, SECTION_FEATURES
from dossier.layers.sections import section_rows
from dossier.layers.understand import split_question
from dossier.providers import ranker as rankers

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "examples" / "sample-org.json"
QUESTIONS = REPO / "examples" / "eval" / "sample-questions.json"
BRIEF = {"mode": "brief", "budget": {"totalTokens": 8000}}
# Cosines, ranks and word features agree to float precision. Full-text scores are BM25 on both stores,
# but PostgreSQL reads document frequencies from a sample (docs/scaling.md), so the BM25 share of the
# best hit, its rank, and what mixes them in may differ by a few hundredths.
TOLERANCE = 2e-3
BM25_TOLERANCE = 0.1
# ... and what depends on which sections full text found: the document aggregates and the lexical-only flag
BM25_FEATURES = {"text_score", "text_rr", "fused", "hybrid", "hybrid_gap", "hybrid_rr", "day_best", "next_best", "around_best",
                 "lexical_only", "doc_best_gap", "doc_mean", "doc_matches", "day_count"}


def _tolerances(names: tuple[str, ...]) -> np.ndarray:
    return np.array([BM25_TOLERANCE if name in BM25_FEATURES else TOLERANCE for name in names])
EXAMPLE = {**BRIEF, "record": {"email": "jane@acme.com"}, "message": "What pricing did we discuss, and what discount rules apply?"}


def _request(q) -> dict:  # type: ignore[no-untyped-def]
    request = {**BRIEF, **q.request, "message": q.message}
    if q.record is not None:
        request["record"] = q.record
    return request


@pytest.fixture(scope="module")
def both_stores(postgres_server, tmp_path_factory, embedder):  # type: ignore[no-untyped-def]
    urls = [f"sqlite:///{tmp_path_factory.mktemp('ranker') / 'r.db'}", postgres_server.create_database()]
    engines = [dossier.open(url, embedder=embedder) for url in urls]
    for engine in engines:
        engine.load_bundle(SAMPLE)
    yield engines
    for engine in engines:
        engine.close()
    postgres_server.drop_database(urls[1])


def _compare(rows: list[dict[str, np.ndarray]], names: tuple[str, ...], where: str) -> tuple[int, int]:
    """Every feature but the full-text ones equal on both stores; the full-text ones (BM25 differs at the
    edges: PostgreSQL samples document frequencies, docs/scaling.md) within 0.1. Returns (rows, rows
    whose full-text features agreed)."""
    exact = np.array([name not in BM25_FEATURES for name in names])
    compared = agreed = 0
    for key in set(rows[0]) & set(rows[1]):
        a, b = rows[0][key], rows[1][key]
        assert np.all(np.abs(a - b)[exact] <= TOLERANCE), (where, key, a, b)
        compared += 1
        agreed += bool(np.all(np.abs(a - b)[~exact] <= BM25_TOLERANCE))
    return compared, agreed


def test_section_and_memory_features_are_the_same_on_both_stores(both_stores) -> None:  # type: ignore[no-untyped-def]
    sqlite, postgres = both_stores
    questions = load_dataset(QUESTIONS).questions
    compared = agreed = candidates = 0
    for q in [q for q in questions if q.gold.sections][:24]:
        calls = [prepared_call(engine, _request(q), org=q.org, caller=q.caller) for engine in (sqlite, postgres)]
        rows = [{c.section_id: r for c, r in zip(call.sections, section_rows(call, call.sections))} for call in calls]
        n, ok = _compare(rows, SECTION_FEATURES, q.id)
        compared, agreed, candidates = compared + n, agreed + ok, candidates + max(len(rows[0]), len(rows[1]))
    # the same candidates (full-text hits at the edge of the limit may differ), the same features
    assert compared > 100 and compared >= 0.85 * candidates and agreed >= 0.8 * compared, (compared, agreed, candidates)
    compared = agreed = 0
    for q in [q for q in questions if q.gold.memories][:8]:
        record = q.gold.records[0]
        examples = [memory_example(engine, org=q.org, record_ids=[record], question=q.message, gold=q.gold.memories,
                                   group=q.id, pool=50) for engine in (sqlite, postgres)]  # fmt: skip
        assert examples[0].x.shape[1] == len(MEMORY_FEATURES)
        assert set(examples[0].ids) == set(examples[1].ids), q.id
        n, ok = _compare([dict(zip(e.ids, e.x)) for e in examples], MEMORY_FEATURES, q.id)
        compared, agreed = compared + n, agreed + ok
    assert compared > 20 and agreed >= 0.9 * compared, (compared, agreed)


def test_the_shipped_ranker_runs_and_reports_itself(sample_engine: dossier.Engine) -> None:
    response = sample_engine.retrieve({**EXAMPLE, "trace": True}, org="northwind", caller="ana")
    documents, memories = response.route["documents"], response.route["memories"]
    assert documents.detail["ranker"].startswith("shipped:")
    assert memories.detail["ranker"].startswith("shipped:")
    items = response.sources["documents"].items
    assert items and all(1 <= item.relevance <= 5 for item in items)  # type: ignore[union-attr]
    high = [item for item in items if item.confidence == "high"]  # type: ignore[union-attr]
    assert len(high) <= 3
    assert all(item.relevance >= 3 for item in high[:1])  # type: ignore[union-attr]


@pytest.mark.parametrize("content", [None, "{not json", json.dumps({"format": 1, "sections": {"features": ["cosine"]}})])
def test_a_missing_or_corrupt_ranker_file_runs_the_heuristic_and_says_so(
    sample_engine: dossier.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None
) -> None:
    path = tmp_path / "ranker.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    monkeypatch.setenv(rankers.FILE_ENV, str(path))
    response = sample_engine.retrieve(EXAMPLE, org="northwind", caller="ana")
    for source in ("documents", "memories"):
        route = response.route[source]
        assert route.detail["ranker"] == "heuristic", source
        assert route.detail["ranker_fallback"], source
    assert response.sources["documents"].items, "the heuristic still selects"
    assert response.sources["memories"].items
    assert all(item.relevance is None for item in response.sources["documents"].items)  # type: ignore[union-attr]


def _shipped_spec(kind: str) -> dict:
    path = REPO / "src" / "dossier" / "providers" / "data" / "ranker.json"
    return json.loads(path.read_text(encoding="utf-8"))[kind]


def test_one_orgs_ranker_never_ranks_another_orgs_calls(fresh_engine: dossier.Engine) -> None:
    own = _shipped_spec("sections")
    own["coef"] = [-w for w in own["coef"]]  # a different model, to tell it apart by its name and its ranking
    fresh_engine.save_org_settings("northwind", {"rankers": {"sections": own}})
    mine = fresh_engine.retrieve(EXAMPLE, org="northwind", caller="ana").route["documents"].detail["ranker"]
    assert mine.startswith("org:")
    other_orgs = sorted({q.org for q in load_dataset(QUESTIONS).questions} - {"northwind"})
    assert other_orgs, "the sample set has a second org"
    for org in other_orgs:
        caller = next(q.caller for q in load_dataset(QUESTIONS).questions if q.org == org)
        theirs = fresh_engine.retrieve({**BRIEF, "message": "What discount rules apply?"}, org=org, caller=caller)
        if "ranker" in theirs.route["documents"].detail:
            assert theirs.route["documents"].detail["ranker"].startswith("shipped:"), org


def test_a_broken_org_ranker_falls_back_to_the_heuristic_for_that_org_only(fresh_engine: dossier.Engine) -> None:
    fresh_engine.save_org_settings("northwind", {"rankers": {"sections": {"features": list(SECTION_FEATURES), "coef": [1]}}})
    route = fresh_engine.retrieve(EXAMPLE, org="northwind", caller="ana").route["documents"]
    assert route.detail["ranker"] == "heuristic"
    assert "malformed" in route.detail["ranker_fallback"] or "shape" in route.detail["ranker_fallback"]


@pytest.mark.parametrize(
    ("message", "documents", "memories"),
    [
        ("What pricing did we discuss, and what discount rules apply?", "what discount rules apply?", "What pricing did we discuss?"),
        ("Who is her manager and what is the escalation process?", "what is the escalation process?", "Who is her manager?"),
        ("What did we tell Priya about her laptop? What does the policy say about replacement?",
         "What does the policy say about replacement?", "What did we tell Priya about her laptop?"),
        # no rules or customer words: by which way each part leans (what happened, or what must be done)
        ("What did Omar ask about his refund in March, and can we waive the fee?",
         "can we waive the fee?", "What did Omar ask about his refund in March?"),
        ("Why did Lena cancel her order, and how quickly must we refund her?",
         "how quickly must we refund her?", "Why did Lena cancel her order?"),
        ("The courier lost Ana's parcel. What happened, and who pays for it?",
         "who pays for it?", "The courier lost Ana's parcel. What happened?"),
        ("When is Tom moving, and how long is the notice period?",  # one part leans neither way: asked whole
         "When is Tom moving, and how long is the notice period?", "When is Tom moving, and how long is the notice period?"),
        # one part, or parts that are not one of each: asked whole, by both sources
        ("How long is the refund window?", "How long is the refund window?", "How long is the refund window?"),
        ("What discount did we offer Jane, and who approved it?",
         "What discount did we offer Jane, and who approved it?", "What discount did we offer Jane, and who approved it?"),
        ("What is the refund policy and what are the SLA rules?",
         "What is the refund policy and what are the SLA rules?", "What is the refund policy and what are the SLA rules?"),
    ],
)
def test_multi_part_questions_are_split_per_source(message: str, documents: str, memories: str) -> None:
    assert split_question(message) == (documents, memories)


def test_the_route_reports_both_queries(sample_engine: dossier.Engine) -> None:
    response = sample_engine.retrieve(EXAMPLE, org="northwind", caller="ana")
    detail = response.route["understand"].detail
    assert detail["document_query"] == "what discount rules apply?"
    assert detail["memory_query"] == "What pricing did we discuss?"
    assert response.sources["memories"].items and response.sources["documents"].items


def test_an_org_fits_its_own_section_ranker_or_says_why_not(fresh_engine: dossier.Engine) -> None:
    from dossier.evaluation.fit import MIN_ORG_QUESTIONS, fit_org

    dataset = load_dataset(QUESTIONS)
    shipped = rankers.shipped("sections", SECTION_FEATURES)
    outcome = fit_org(fresh_engine, dataset.questions, org="northwind", shipped=shipped)
    assert outcome.held_out["questions"] > 0
    if outcome.spec is None:  # kept the shipped one: only when the fit was worse on held-out questions
        assert outcome.held_out["fitted"] < outcome.held_out["shipped"], outcome.reason
    else:
        assert outcome.held_out["fitted"] >= outcome.held_out["shipped"]
        fresh_engine.save_org_settings("northwind", {"rankers": {"sections": outcome.spec}})
        assert fresh_engine.retrieve(EXAMPLE, org="northwind", caller="ana").route["documents"].detail["ranker"].startswith("org:")
    too_few = fit_org(fresh_engine, dataset.questions[:10], org="northwind", shipped=shipped)
    assert too_few.spec is None and str(MIN_ORG_QUESTIONS) in too_few.reason
    # gold sections the org does not hold (a labelling mistake) are not counted towards the minimum
    made_up = [q.model_copy(update={"gold": q.gold.model_copy(update={"sections": ["no-such-section"]})})
               for q in dataset.questions if q.gold.sections]  # fmt: skip
    none = fit_org(fresh_engine, made_up, org="northwind", shipped=shipped)
    assert none.spec is None and none.reason.startswith("0 questions with gold sections the org holds")


def _synthetic_groups(seed: int, groups: int) -> list:  # type: ignore[type-arg]
    """Questions of 12 candidates each: the gold one leads on feature 0 by 2.5 noise deviations; a tenth
    of the questions have no gold candidate (nobody leads). Feature 1 is one value per question (noise)."""
    from dossier.evaluation.fit import Example

    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        answerable = g % 10 != 0
        x = np.zeros((12, 2))
        x[:, 0] = rng.normal(0.0, 1.0, 12)
        x[:, 1] = rng.normal(0.0, 1.0)
        y = np.zeros(12)
        if answerable:
            y[0] = 1.0
            x[0, 0] += 2.5
        out.append(Example(f"q{g}", x, y, [f"c{i}" for i in range(12)], answerable=answerable))
    return out


@pytest.mark.parametrize("objective", ["pointwise", "listwise"])
def test_both_objectives_learn_the_ranking_and_give_calibrated_probabilities(objective: str) -> None:
    from dossier.evaluation.fit import fit, top1

    report: dict[str, float] = {}
    spec = fit(_synthetic_groups(1, 300), kind="sections", features=("lead", "question"), objective=objective, report=report)
    model = rankers.parse(spec, kind="sections", expected=("lead", "question"), origin="fit")
    held_out = _synthetic_groups(2, 300)
    assert top1(held_out, model.probabilities) >= top1(held_out, lambda x: x[:, 0]) - 0.02  # the lead decides
    assert abs(report["cv"] - top1(held_out, model.probabilities)) < 0.1  # cross-validation foretold it
    predicted = np.concatenate([model.probabilities(e.x) for e in held_out])
    observed = np.concatenate([e.y for e in held_out])
    assert abs(float(predicted.mean()) - float(observed.mean())) < 0.02  # 0.075 of the candidates are gold
    hits = [float(model.probabilities(e.x).max()) for e in held_out if e.answerable]
    misses = [float(model.probabilities(e.x).max()) for e in held_out if not e.answerable]
    assert np.mean(hits) > np.mean(misses) + 0.2  # a question with no gold candidate gets a lower best probability


def test_an_unknown_objective_is_refused() -> None:
    from dossier.errors import UsageError
    from dossier.evaluation.fit import fit

    with pytest.raises(UsageError, match="pointwise or listwise"):
        fit(_synthetic_groups(1, 30), kind="sections", features=("lead", "question"), objective="pairwise")
