"""External yardsticks: LoCoMo and PolicyQA converted to bundles and scored.

The conversion and scoring tests use tiny hand-made data written here. One test runs a small slice of
the real data from ../shared/data and skips when it is absent (the data is never copied into the repo).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

import dossier
from dossier.bundle import Bundle
from dossier.evaluation import external as ext
from dossier.evaluation.external import MemoryQuestion, SectionQuestion

REPO = Path(__file__).resolve().parents[2]

LOCOMO = [
    {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Ana",
            "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a greyhound called Pixel last week."},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "Lovely! I started pottery classes on Tuesdays.",
                 "blip_caption": "a photo of a clay bowl", "img_url": ["https://example.invalid/x.jpg"]},
            ],
            "session_2_date_time": "not a date",
            "session_2": [
                {"speaker": "Ana", "dia_id": "D2:1", "text": "Pixel loves the beach near Brighton."},
            ],
            "session_10_date_time": "10:37 am on 27 June, 2023",
            "session_10": [
                {"speaker": "Bo", "dia_id": "D10:1", "text": "My pottery teacher moved to Lisbon."},
                {"speaker": "Ana", "dia_id": "D10:2", "text": "Pixel turned three today."},
            ],
        },
        "qa": [
            {"question": "What is the name of Ana's dog?", "answer": "Pixel", "evidence": ["D1:1"], "category": 4},
            {"question": "Where does Pixel like to go?", "answer": "the beach", "evidence": ["D2:1", "D"], "category": 1},
            {"question": "When did Bo start pottery?", "answer": "May 2023", "evidence": ["D1:2; D10:1"], "category": 2},
            {"question": "What is Bo's favourite film?", "answer": "unknown", "evidence": ["D30:05"], "category": 5},
            {"question": "What did they talk about?", "answer": "many things", "evidence": [], "category": 3},
        ],
    }
]

def _qa(qid: str, question: str, context: str, answer: str) -> dict:
    return {"id": qid, "question": question, "answers": [{"text": answer, "answer_start": context.index(answer)}]}


POLICY_0 = "Example Privacy Policy. Effective January 1, 2020."
POLICY_2 = "We share your email address with advertising partners for marketing."
COOKIES = "Cookies remember your preferences for one year."
SQUAD = {
    "version": "v1.0",
    "data": [
        {"title": "example.com", "paragraphs": [
            {"index": 0, "context": POLICY_0, "qas": [_qa("qa1", "When was the policy last changed?", POLICY_0, "January 1, 2020")]},
            {"index": 2, "context": POLICY_2, "qas": [_qa("qa2", "Who gets my data?", POLICY_2, "advertising partners"),
                                                      _qa("qa3", "Why is my data shared?", POLICY_2, "for marketing")]},
        ]},
        {"title": "other.org", "paragraphs": [
            {"index": 0, "context": COOKIES, "qas": [_qa("qa4", "How long are cookies kept?", COOKIES, "one year")]},
        ]},
    ],
}  # fmt: skip


# -- LoCoMo ------------------------------------------------------------------------------------------
def test_locomo_bundle_has_one_record_per_conversation_and_one_memory_per_turn() -> None:
    bundle = ext.locomo_bundle(LOCOMO)
    parsed = Bundle.model_validate(bundle)  # a valid bundle
    assert [o.id for o in parsed.orgs] == ["locomo"] and [c.id for c in parsed.callers] == ["eval"]
    assert [(r.id, r.kind) for r in parsed.records] == [("conv-x", "contact")]
    assert [m.id for m in parsed.memories] == ["conv-x:D1:1", "conv-x:D1:2", "conv-x:D2:1", "conv-x:D10:1", "conv-x:D10:2"]
    assert all(m.record == "conv-x" and m.org == "locomo" for m in parsed.memories)
    by_id = {m.id: m for m in parsed.memories}
    assert by_id["conv-x:D1:1"].text == "Ana: I adopted a greyhound called Pixel last week."
    assert by_id["conv-x:D1:2"].text.endswith("[image: a photo of a clay bowl]")


def test_locomo_created_at_is_the_session_date_with_a_fallback_that_keeps_order() -> None:
    memories = {m["id"]: datetime.fromisoformat(m["created_at"]) for m in ext.locomo_bundle(LOCOMO)["memories"]}
    first = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
    assert memories["conv-x:D1:1"] == first
    assert memories["conv-x:D1:2"] > first and memories["conv-x:D1:2"].date() == first.date()  # same day, in order
    assert memories["conv-x:D2:1"].date() == datetime(2023, 5, 9).date()  # unparseable: previous session + 1 day
    assert memories["conv-x:D10:1"] == datetime(2023, 6, 27, 10, 37, tzinfo=timezone.utc)  # session 10 after 2, not 1
    assert sorted(memories, key=memories.__getitem__) == list(memories)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)),
        ("12:09 am on 13 September, 2023", datetime(2023, 9, 13, 0, 9, tzinfo=timezone.utc)),
        ("8 May, 2023", datetime(2023, 5, 8, tzinfo=timezone.utc)),
        ("yesterday", None),
        (None, None),
    ],
)
def test_parse_session_date(text: str | None, expected: datetime | None) -> None:
    assert ext.parse_session_date(text) == expected


def test_locomo_questions_keep_usable_evidence_and_skip_the_rest() -> None:
    questions, notes = ext.locomo_questions(LOCOMO)
    assert [(q.id, q.category, q.evidence) for q in questions] == [
        ("conv-x:q0", 4, ("conv-x:D1:1",)),
        ("conv-x:q1", 1, ("conv-x:D2:1",)),  # 'D' skipped, the valid id kept
        ("conv-x:q2", 2, ("conv-x:D1:2", "conv-x:D10:1")),  # 'D1:2; D10:1' split
    ]  # q3 has only an id naming no turn, q4 no evidence at all
    assert all(q.record_id == "conv-x" for q in questions)
    assert "conv-x:q1: skipped evidence 'D'" in notes
    assert "conv-x:q2: split evidence 'D1:2; D10:1'" in notes
    assert "conv-x:q3: no usable evidence left, question skipped" in notes
    assert not any(n.startswith("conv-x:q4") for n in notes)


def test_score_memories_any_and_all_per_category_and_overall() -> None:
    qs = [
        MemoryQuestion("a", "r", "?", 1, ("m1", "m2")),
        MemoryQuestion("b", "r", "?", 1, ("m3",)),
        MemoryQuestion("c", "r", "?", 4, ("m4",)),
    ]
    rankings = {
        "a": ["m1", "x", "x", "x", "x", "m2"],  # one of two in top 5, both in top 10
        "b": ["x"] * 9 + ["m3"],  # only at rank 10
        # "c" missing: counts as a miss
    }
    scores = ext.score_memories(qs, rankings, ks=(5, 10))
    assert list(scores) == ["multi-hop", "single-hop", "overall"]
    assert scores["multi-hop"] == {"n": 2, "any@5": 0.5, "all@5": 0.0, "any@10": 1.0, "all@10": 1.0}
    assert scores["single-hop"] == {"n": 1, "any@5": 0.0, "all@5": 0.0, "any@10": 0.0, "all@10": 0.0}
    assert scores["overall"]["n"] == 3
    assert scores["overall"]["any@5"] == pytest.approx(1 / 3)
    assert scores["overall"]["all@10"] == pytest.approx(2 / 3)


# -- PolicyQA ----------------------------------------------------------------------------------------
def test_policyqa_one_document_per_policy_one_section_per_segment_gold_is_the_answer_segment() -> None:
    yardstick = ext.load_policyqa(SQUAD)
    parsed = Bundle.model_validate(yardstick.bundle)
    assert [(d.id, d.title, len(d.sections)) for d in parsed.documents] == [("example.com", "example.com", 2), ("other.org", "other.org", 1)]
    assert [s.id for s in parsed.documents[0].sections] == ["example.com#0", "example.com#2"]
    assert parsed.documents[0].sections[1].text.startswith("We share your email")
    assert [(q.id, q.document_id, q.gold) for q in yardstick.questions] == [
        ("qa1", "example.com", "example.com#0"),
        ("qa2", "example.com", "example.com#2"),
        ("qa3", "example.com", "example.com#2"),
        ("qa4", "other.org", "other.org#0"),
    ]
    assert yardstick.notes == []  # every answer span lies in its segment


def test_policyqa_notes_an_answer_span_that_is_not_in_its_segment() -> None:
    broken = {"data": [{"title": "t", "paragraphs": [{"context": "abc def", "qas": [
        {"id": "q", "question": "?", "answers": [{"text": "xyz", "answer_start": 0}]}]}]}]}  # fmt: skip
    yardstick = ext.load_policyqa(broken)
    assert yardstick.questions[0].gold == "t#0"  # no index: the position names the section
    assert yardstick.notes == ["q: answer span not found in its segment (kept, gold is its segment)"]


def test_score_sections_accuracy_and_recall() -> None:
    qs = [SectionQuestion("a", "d", "?", "s1"), SectionQuestion("b", "d", "?", "s2"), SectionQuestion("c", "d", "?", "s3"),
          SectionQuestion("e", "d", "?", "s4")]  # fmt: skip
    rankings = {"a": ["s1", "s2"], "b": ["s1", "s3", "s2"], "c": ["s1", "s2", "s4", "s5", "s3"], "e": []}
    assert ext.score_sections(qs, rankings) == {"n": 4, "acc@1": 0.25, "r@3": 0.5, "r@5": 0.75}


def test_table_aligns_columns() -> None:
    text = ext.table(["name", "n", "acc@1"], [["bm25", 3, 0.5], ["dossier", 12, 1.0]])
    assert text.splitlines() == [
        "name      n  acc@1",
        "-------  --  -----",
        "bm25      3  0.500",
        "dossier  12  1.000",
    ]


def test_data_dir_prefers_argument_then_environment_then_shared(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ext.DATA_ENV, raising=False)
    assert ext.data_dir(None, repo_root=tmp_path / "repo") == (tmp_path / "shared" / "data").resolve()
    monkeypatch.setenv(ext.DATA_ENV, "/somewhere")
    assert ext.data_dir(None, repo_root=tmp_path) == Path("/somewhere")
    assert ext.data_dir("/given", repo_root=tmp_path) == Path("/given")


# -- the hand-made data through a real engine ---------------------------------------------------------
def test_tiny_data_runs_through_every_retriever(engine: dossier.Engine) -> None:
    locomo, policy = ext.load_locomo(LOCOMO), ext.load_policyqa(SQUAD)
    engine.load_bundle(locomo.bundle)
    engine.load_bundle(policy.bundle)
    dog, pottery = locomo.questions[0], locomo.questions[2]
    assert set(ext.memories_bm25(engine, pottery, 5)[:2]) == {"conv-x:D1:2", "conv-x:D10:1"}  # the two "pottery" turns
    assert ext.memories_vector(engine, dog, 5)[0] == "conv-x:D1:1"  # "dog" matches "greyhound" by meaning
    ids, tiers = ext.memories_pipeline(engine, dog)
    assert set(ids) == {m["id"] for m in locomo.bundle["memories"]}  # 5 turns: all among the 25 most recent
    assert len(ids) == len(tiers) and set(tiers) <= {"recent", "semantic"}
    cookies = policy.questions[-1]
    assert ext.sections_pipeline(engine, cookies) == ["other.org#0"]
    assert ext.sections_vector(engine, cookies, 5) == ["other.org#0"]
    assert ext.sections_bm25(engine, cookies, 5) == ["other.org#0"]
    shared = policy.questions[1]  # "Who gets my data?" inside example.com only
    assert set(ext.sections_pipeline(engine, shared)) == {"example.com#0", "example.com#2"}


# -- a slice of the real data, when it is there --------------------------------------------------------
def test_real_data_slice_full_pipeline(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    data = ext.data_dir(None, repo_root=REPO)
    if not (data / ext.LOCOMO_FILE).is_file() or not (data / ext.POLICYQA_FILE).is_file():
        pytest.skip("../shared/data not found: external yardsticks need LoCoMo and PolicyQA")
    samples = ext.read_json(data / ext.LOCOMO_FILE)[:1]  # the first 30 questions are all in conversation 1
    squad = ext.read_json(data / ext.POLICYQA_FILE)
    squad = {"data": squad["data"][:1]}
    locomo, policy = ext.load_locomo(samples), ext.load_policyqa(squad)
    memory_qs, section_qs = locomo.questions[:30], policy.questions[:30]
    assert len(memory_qs) == 30 and len(section_qs) == 30
    with dossier.open(f"sqlite:///{tmp_path}/real.db", embedder=embedder) as engine:
        engine.load_bundle(locomo.bundle)
        engine.load_bundle(policy.bundle)
        memories = ext.score_memories(memory_qs, {q.id: ext.memories_pipeline(engine, q)[0] for q in memory_qs})
        sections = ext.score_sections(section_qs, {q.id: ext.sections_pipeline(engine, q) for q in section_qs})
    assert memories["overall"]["n"] == 30 and sections["n"] == 30
    for row in memories.values():
        assert all(0.0 <= row[m] <= 1.0 for m in ("any@5", "all@5", "any@10", "all@10"))
        assert row["all@5"] <= row["any@5"] <= row["any@10"] and row["all@5"] <= row["all@10"]
    assert 0.0 <= sections["acc@1"] <= sections["r@3"] <= sections["r@5"] <= 1.0
