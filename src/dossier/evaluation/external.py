"""External yardsticks: LoCoMo (memory recall) and PolicyQA (section selection) as dossier bundles.

Both data sets were written by people outside this project, so their numbers cannot be tuned to; they
live read-only in ``../shared/data`` (see its README) and are read from there, never copied in.

* **LoCoMo**: one record per conversation, one memory per dialog turn (id ``<sample_id>:<dia_id>``,
  ``created_at`` the session's date, turns a second apart so their order survives). Every question
  with evidence is asked about its conversation's record; a question scores a hit at k when **any**
  (``any@k``) or **all** (``all@k``) of its evidence turns are among the first k memories returned.
* **PolicyQA** (SQuAD v1): one document per policy, one section per segment. A question's gold
  section is the segment its answer span lies in; the ranking of that document's sections scores
  ``acc@1`` and ``r@3`` / ``r@5``.

The converters and scorers are pure functions of parsed JSON. The retrievers at the end take an
:class:`~dossier.engine.Engine` and return ids in ranked order; ``bench/locomo.py`` and
``bench/policyqa.py`` put the two together.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:
    from ..engine import Engine

DATA_ENV = "DOSSIER_SHARED_DATA"
LOCOMO_FILE = "locomo_dev.json"
POLICYQA_FILE = "policyqa_dev.json"
LOCOMO_ORG, POLICYQA_ORG, CALLER = "locomo", "policyqa", "eval"
LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
OVERALL = "overall"

_SESSION = re.compile(r"session_(\d+)")
_DIA_ID = re.compile(r"D\d+:\d+")
_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%d %B, %Y", "%d %B %Y", "%Y-%m-%d")
FALLBACK_START = datetime(2000, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class MemoryQuestion:
    id: str
    record_id: str
    question: str
    category: int
    evidence: tuple[str, ...]  # memory ids


@dataclass(frozen=True)
class SectionQuestion:
    id: str
    document_id: str
    question: str
    gold: str  # section id


@dataclass
class Yardstick:
    """A converted data set: the bundle to load, the questions to ask, and what was skipped or repaired."""

    bundle: dict[str, Any]
    questions: list[Any]
    notes: list[str] = field(default_factory=list)


# -- locating and reading the data ---------------------------------------------------------------------
def data_dir(given: str | os.PathLike[str] | None, *, repo_root: Path) -> Path:
    """``given``, else ``$DOSSIER_SHARED_DATA``, else ``<repo_root>/../shared/data``."""
    if given:
        return Path(given)
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV])
    return (repo_root / ".." / "shared" / "data").resolve()


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


# -- LoCoMo --------------------------------------------------------------------------------------------
def parse_session_date(text: object) -> datetime | None:
    """``'1:56 pm on 8 May, 2023'`` (and a few plainer forms) as a UTC datetime, else None."""
    if not isinstance(text, str):
        return None
    cleaned = " ".join(text.split())
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(cleaned, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


def session_dates(conversation: Mapping[str, Any]) -> dict[int, datetime]:
    """Each session's start. An unparseable or missing date becomes the previous session's plus one day
    (the first session's fallback is 2000-01-01), so session order is kept."""
    numbers = sorted(int(m.group(1)) for key in conversation if (m := _SESSION.fullmatch(key)))
    out: dict[int, datetime] = {}
    previous: datetime | None = None
    for n in numbers:
        parsed = parse_session_date(conversation.get(f"session_{n}_date_time"))
        if parsed is None:
            parsed = previous + timedelta(days=1) if previous else FALLBACK_START
        out[n] = previous = parsed
    return out


def turn_text(turn: Mapping[str, Any]) -> str:
    """``Speaker: text``, with the caption of a shared image when the turn has one."""
    text = f"{turn.get('speaker') or 'unknown'}: {(turn.get('text') or '').strip()}"
    caption = (turn.get("blip_caption") or "").strip()
    return f"{text} [image: {caption}]" if caption else text


def locomo_bundle(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Org ``locomo``, caller ``eval``, one contact record per conversation, one memory per turn."""
    records, memories = [], []
    for sample in samples:
        sample_id, conversation = sample["sample_id"], sample["conversation"]
        records.append({"id": sample_id, "org": LOCOMO_ORG, "kind": "contact"})
        for n, start in session_dates(conversation).items():
            for position, turn in enumerate(conversation.get(f"session_{n}") or []):
                memories.append({
                    "id": f"{sample_id}:{turn['dia_id']}", "org": LOCOMO_ORG, "record": sample_id,
                    "text": turn_text(turn), "created_at": (start + timedelta(seconds=position)).isoformat(),
                })  # fmt: skip
    return {"orgs": [{"id": LOCOMO_ORG, "name": "LoCoMo (dev half)"}], "callers": [{"id": CALLER, "org": LOCOMO_ORG}],
            "records": records, "memories": memories}  # fmt: skip


def evidence_ids(raw: Iterable[object], known: set[str]) -> tuple[list[str], list[str]]:
    """(valid dia ids, skipped raw values). ``'D8:6; D9:17'`` is split into its two ids; an id that is
    malformed (``'D'``, ``'D:11:26'``) or names no turn of the conversation (``'D30:05'``) is skipped."""
    valid: list[str] = []
    skipped: list[str] = []
    for value in raw:
        parts = _split(value)
        good = [p for p in parts if _DIA_ID.fullmatch(p) and p in known]
        if not parts or len(good) != len(parts):
            skipped.append(str(value))
        valid.extend(p for p in good if p not in valid)
    return valid, skipped


def _split(value: object) -> list[str]:
    return [p for p in re.split(r"[;,\s]+", str(value)) if p]


def locomo_questions(samples: Sequence[Mapping[str, Any]]) -> tuple[list[MemoryQuestion], list[str]]:
    """Every QA with at least one usable evidence turn, and notes on what was skipped."""
    questions: list[MemoryQuestion] = []
    notes: list[str] = []
    for sample in samples:
        sample_id, conversation = sample["sample_id"], sample["conversation"]
        known = {t["dia_id"] for key, turns in conversation.items() if _SESSION.fullmatch(key) for t in turns or []}
        for index, qa in enumerate(sample.get("qa") or []):
            qid = f"{sample_id}:q{index}"
            if not qa.get("evidence"):
                continue  # no evidence in the data: not a retrieval question
            valid, skipped = evidence_ids(qa["evidence"], known)
            if skipped:
                notes.append(f"{qid}: skipped evidence {', '.join(map(repr, skipped))}")
            joined = [str(v) for v in qa["evidence"] if str(v) not in skipped and len(_split(v)) > 1]
            if joined:
                notes.append(f"{qid}: split evidence {', '.join(map(repr, joined))}")
            if not valid:
                notes.append(f"{qid}: no usable evidence left, question skipped")
                continue
            questions.append(MemoryQuestion(
                id=qid, record_id=sample_id, question=str(qa["question"]), category=int(qa.get("category") or 0),
                evidence=tuple(f"{sample_id}:{d}" for d in valid),
            ))  # fmt: skip
    return questions, notes


def load_locomo(samples: Sequence[Mapping[str, Any]]) -> Yardstick:
    questions, notes = locomo_questions(samples)
    return Yardstick(locomo_bundle(samples), questions, notes)


def category_name(category: int) -> str:
    return LOCOMO_CATEGORIES.get(category, f"category {category}")


def score_memories(
    questions: Sequence[MemoryQuestion], rankings: Mapping[str, Sequence[str]], ks: Sequence[int] = (5, 10)
) -> dict[str, dict[str, float]]:
    """Per category (official order) and ``overall``: ``n``, ``any@k`` and ``all@k`` for each k.
    A question missing from ``rankings`` counts as an empty ranking (a miss)."""
    groups: dict[str, list[MemoryQuestion]] = {}
    for q in sorted(questions, key=lambda q: q.category):
        groups.setdefault(category_name(q.category), []).append(q)
    groups[OVERALL] = list(questions)
    out: dict[str, dict[str, float]] = {}
    for name, group in groups.items():
        row: dict[str, float] = {"n": len(group)}
        for k in ks:
            tops = [set(rankings.get(q.id, ())[:k]) for q in group]
            row[f"any@{k}"] = _mean([any(e in top for e in q.evidence) for q, top in zip(group, tops)])
            row[f"all@{k}"] = _mean([all(e in top for e in q.evidence) for q, top in zip(group, tops)])
        out[name] = row
    return out


# -- PolicyQA ------------------------------------------------------------------------------------------
def load_policyqa(squad: Mapping[str, Any]) -> Yardstick:
    """Org ``policyqa``: one document per policy (id and title = the policy's title), one section per
    segment (id ``<title>#<segment index>``, no heading); each question's gold is its own segment."""
    documents, questions, notes = [], [], []
    seen_docs: set[str] = set()
    for article in squad["data"]:
        title = str(article["title"]).strip()
        doc_id = title
        if doc_id in seen_docs:
            doc_id = f"{title}~{len(seen_docs)}"
            notes.append(f"policy {title!r} appears twice; second copy loaded as {doc_id!r}")
        seen_docs.add(doc_id)
        sections, used = [], set()
        for position, paragraph in enumerate(article["paragraphs"]):
            index = paragraph.get("index", position)
            section_id = f"{doc_id}#{index}" if f"{doc_id}#{index}" not in used else f"{doc_id}#p{position}"
            used.add(section_id)
            context = paragraph["context"]
            sections.append({"id": section_id, "heading": "", "text": context})
            for qa in paragraph.get("qas") or []:
                spans = [a for a in qa.get("answers") or [] if isinstance(a.get("answer_start"), int)]
                if spans and not any(context[a["answer_start"]:][: len(a["text"])] == a["text"] for a in spans):
                    notes.append(f"{qa['id']}: answer span not found in its segment (kept, gold is its segment)")
                questions.append(SectionQuestion(id=str(qa["id"]), document_id=doc_id, question=str(qa["question"]), gold=section_id))
        documents.append({"id": doc_id, "org": POLICYQA_ORG, "title": title, "doc_type": "policy",
                          "tags": ["privacy"], "sections": sections})  # fmt: skip
    bundle = {"orgs": [{"id": POLICYQA_ORG, "name": "PolicyQA (dev split)"}],
              "callers": [{"id": CALLER, "org": POLICYQA_ORG}], "documents": documents}  # fmt: skip
    return Yardstick(bundle, questions, notes)


def score_sections(
    questions: Sequence[SectionQuestion], rankings: Mapping[str, Sequence[str]], ks: Sequence[int] = (1, 3, 5)
) -> dict[str, float]:
    """``n``, ``acc@1`` (gold ranked first) and ``r@k`` for the other ks (gold among the first k)."""
    row: dict[str, float] = {"n": len(questions)}
    for k in ks:
        row["acc@1" if k == 1 else f"r@{k}"] = _mean([q.gold in rankings.get(q.id, ())[:k] for q in questions])
    return row


# -- retrievers: each returns ids, best first ----------------------------------------------------------
def memories_bm25(engine: "Engine", q: MemoryQuestion, k: int) -> list[str]:
    hits = engine.store.search_text("memory", q.question, org=LOCOMO_ORG, limit=k, parents=[q.record_id])
    return [h.id for h in hits]


def memories_vector(engine: "Engine", q: MemoryQuestion, k: int) -> list[str]:
    vector = engine.embed_query(q.question)
    return [h.id for h in engine.store.search_vectors("memory", vector, org=LOCOMO_ORG, limit=k, parents=[q.record_id])]


def memory_request(q: MemoryQuestion) -> dict[str, Any]:
    return {"mode": "scout", "record": {"id": q.record_id}, "message": q.question, "budget": {"totalTokens": 50000},
            "sources": {"memories": True, "properties": False, "documents": False, "graph": False, "external": False}}  # fmt: skip


def memories_pipeline(engine: "Engine", q: MemoryQuestion) -> tuple[list[str], list[str]]:
    """The full retrieve call's memories in returned order, with the tier of each."""
    response = engine.retrieve(memory_request(q), org=LOCOMO_ORG, caller=CALLER)
    from ..schema import MemoryItem

    items = [i for i in response.sources["memories"].items if isinstance(i, MemoryItem)]
    return [i.id for i in items], [i.tier for i in items]


def sections_bm25(engine: "Engine", q: SectionQuestion, k: int) -> list[str]:
    hits = engine.store.search_text("section", q.question, org=POLICYQA_ORG, limit=k, parents=[q.document_id])
    return [h.id for h in hits]


def sections_vector(engine: "Engine", q: SectionQuestion, k: int) -> list[str]:
    vector = engine.embed_query(q.question)
    return [h.id for h in engine.store.search_vectors("section", vector, org=POLICYQA_ORG, limit=k, parents=[q.document_id])]


def section_request(q: SectionQuestion) -> dict[str, Any]:
    return {"mode": "fetch", "fetch": [q.document_id], "message": q.question, "budget": {"totalTokens": 50000}}


def sections_pipeline(engine: "Engine", q: SectionQuestion) -> list[str]:
    """The fetch call's sections of the question's document, in returned order."""
    response = engine.retrieve(section_request(q), org=POLICYQA_ORG, caller=CALLER)
    from ..schema import SectionItem

    return [i.section_id for i in response.sources["documents"].items if isinstance(i, SectionItem)]


# -- the fixed training / held-out splits of the learned rankers (bench/train_ranker.py) --------------------
LOCOMO_TRAIN_CONVERSATIONS = 3
SPLITS = ("train", "test", "all")


def policyqa_side(document_id: str, document_ids: Iterable[str]) -> str:
    """``train`` for policies at even positions in sorted order, ``test`` for the others."""
    return "train" if sorted(set(document_ids)).index(document_id) % 2 == 0 else "test"


def locomo_side(record_id: str, record_ids: Iterable[str]) -> str:
    """``train`` for the first three conversations in sorted order, ``test`` for the others."""
    return "train" if sorted(set(record_ids)).index(record_id) < LOCOMO_TRAIN_CONVERSATIONS else "test"


def on_side(questions: Sequence[Any], side: str, unit: str) -> list[Any]:
    """The questions of one split (``all``: every question); ``unit`` is the attribute the split is by."""
    if side == "all":
        return list(questions)
    units = [getattr(q, unit) for q in questions]
    by = policyqa_side if unit == "document_id" else locomo_side
    sides = {u: by(u, units) for u in set(units)}
    return [q for q in questions if sides[getattr(q, unit)] == side]


# -- reporting -----------------------------------------------------------------------------------------
def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain text table: first column left-aligned, the rest right-aligned; floats to 3 places."""
    cells = [[_cell(v) for v in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _mean(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0
