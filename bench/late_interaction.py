"""Probe: does late interaction (token-level MaxSim over MiniLM's own token vectors) find gold sections
that the section vector's cosine misses? Training side only; nothing here changes the engine.

Reproduce (from the repository root, after `pip install -e .`; PolicyQA is read-only in ../shared/data,
or --data DIR, or $DOSSIER_SHARED_DATA):

    python bench/late_interaction.py                      # the labelled training sets and the project set
    python bench/late_interaction.py --sets policyqa      # PolicyQA's training policies (slow: ~20 min)

For every answerable question, each section it chooses among (the org's sections; for PolicyQA, the
segments of its policy) is scored two ways, from the same model run that gives the section vector:

* cosine -- the section vector (mean of its token vectors) against the question's, as the engine ranks;
* maxsim -- for each word piece of the question, the best cosine with any token of the section,
            averaged over the question's pieces (ColBERT's late interaction, with MiniLM's own vectors);
* words  -- the same with context-free word vectors: each content word (stop words out) of the question
            and of the section embedded alone, for each question word the best cosine with a section
            word, averaged (a vector per distinct word, shared by every section, instead of a vector per
            token of every section).

It prints top-1 / top-5 (a gold section first / among the first five) by each, and by the cosine plus
maxsim or words after standardising each per question, at three weights. Sections are embedded as the engine embeds them
(``title: heading`` then the text). The handbook is never read: it is a test set only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dossier.evaluation import external as ext  # noqa: E402
from dossier.evaluation.dataset import load_dataset  # noqa: E402
from dossier.providers.embeddings import OnnxMiniLM  # noqa: E402
from dossier.stores.fulltext import STOP_WORDS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SETS = {
    "harbor": REPO / "examples/training/harbor-questions.json",
    "cedar": REPO / "examples/training/cedar-questions.json",
    "quill": REPO / "examples/training/quill-questions.json",
    "birch": REPO / "examples/training/birch-questions.json",
    "project": REPO / "examples/eval/sample-questions.json",
}
Group = tuple[list[tuple[str, str]], list[tuple[str, set[str]]]]  # (section id, text) and (question, gold ids)


class Tokens:
    """MiniLM run once per text: its pooled vector and its token vectors (unit rows)."""

    def __init__(self) -> None:
        self.model = OnnxMiniLM(threads=1)
        vocab = self.model._tokenizer.get_vocab()
        self.words = np.zeros(max(vocab.values()) + 1, dtype=bool)
        for piece, i in vocab.items():  # a question keeps its word pieces: no [CLS], [SEP] or punctuation
            self.words[i] = piece.startswith("##") or (piece.isalnum() and not piece.startswith("["))

    def __call__(self, texts: Sequence[str], *, question: bool) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for start in range(0, len(texts), 16):
            batch = [t if t.strip() else " " for t in texts[start : start + 16]]
            encodings = self.model._tokenizer.encode_batch(batch)
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            hidden = self.model._batch_session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
            for row, n in enumerate(mask.sum(axis=1)):
                tokens = hidden[row, :n].astype(np.float32)
                pooled = tokens.mean(axis=0)
                kept = tokens[self.words[ids[row, :n]]] if question else tokens
                kept = kept if len(kept) else tokens
                out.append((pooled / np.linalg.norm(pooled), kept / np.linalg.norm(kept, axis=1, keepdims=True)))
        return out


class Words:
    """Context-free word vectors: MiniLM run on each content word alone, once per distinct word."""

    def __init__(self, model: OnnxMiniLM) -> None:
        self.model = model
        self.kept: dict[str, np.ndarray] = {}

    def __call__(self, text: str) -> np.ndarray:
        words = [w for w in dict.fromkeys(re.findall(r"[a-z0-9]+", text.lower())) if len(w) > 1 and w not in STOP_WORDS]
        missing = [w for w in words if w not in self.kept]
        for start in range(0, len(missing), 64):
            self.kept.update(zip(missing[start : start + 64], self.model.embed_batch(missing[start : start + 64])))
        return np.stack([self.kept[w] for w in words]) if words else np.zeros((0, self.model.dimensions), np.float32)


def labelled(path: Path) -> list[Group]:
    dataset = load_dataset(path)
    org = Counter(q.org for q in dataset.questions).most_common(1)[0][0]
    sections = [(s.id, f"{d.title}: {s.heading}\n{s.text}".strip()) for d in dataset.bundle.documents if d.org == org for s in d.sections]
    asked = [(q.message, set(q.gold.sections)) for q in dataset.questions if q.org == org and q.answerable and q.gold.sections]
    return [(sections, asked)]


def policyqa(data: str | None) -> list[Group]:
    path = ext.data_dir(data, repo_root=REPO) / ext.POLICYQA_FILE
    if not path.is_file():
        print(f"skipped policyqa: data not found at {path}")
        return []
    yardstick = ext.load_policyqa(ext.read_json(path))
    sections = {d["id"]: [(s["id"], f'{d["title"]}: {s.get("heading", "")}\n{s["text"]}'.strip()) for s in d["sections"]]
                for d in yardstick.bundle["documents"]}  # fmt: skip
    asked: dict[str, list[tuple[str, set[str]]]] = {}
    for q in ext.on_side(yardstick.questions, "train", "document_id"):
        asked.setdefault(q.document_id, []).append((q.question, {q.gold}))
    return [(sections[doc], questions) for doc, questions in sorted(asked.items())]


def set_groups(name: str, data: str | None) -> list[Group] | None:
    """The questions of the training-side set ``name`` with the sections each chooses among (None: no such
    set); shared with bench/second_model.py."""
    if name == "policyqa":
        return policyqa(data)
    return labelled(SETS[name]) if name in SETS else None


def measure(name: str, groups: list[Group], tokens: Tokens) -> None:
    started = time.perf_counter()
    vectors = Words(tokens.model)
    rows = []  # per question: cosine, maxsim, words, gold mask
    for sections, asked in groups:
        embedded = tokens([text for _, text in sections], question=False)
        pooled = np.stack([p for p, _ in embedded])
        held = [vectors(text) for _, text in sections]
        for (message, gold), (q, q_tokens) in zip(asked, tokens([message for message, _ in asked], question=True)):
            mask = np.array([sid in gold for sid, _ in sections])
            if mask.any():
                maxsim = np.array([float((q_tokens @ t.T).max(axis=1).mean()) for _, t in embedded])
                q_words = vectors(message)
                words = np.array([float((q_words @ w.T).max(axis=1).mean()) if len(w) and len(q_words) else 0.0 for w in held])
                rows.append((pooled @ q, maxsim, words, mask))

    def at(score) -> str:  # type: ignore[no-untyped-def]
        first = np.mean([r[-1][np.argmax(score(r))] for r in rows])
        five = np.mean([r[-1][np.argsort(-score(r), kind="stable")[:5]].any() for r in rows])
        return f"{first:.3f} / {five:.3f}"

    def z(a: np.ndarray) -> np.ndarray:
        return (a - a.mean()) / (a.std() + 1e-9)

    mixes = "  ".join(f"cosine + {w} {what} {at(lambda r, w=w, c=c: z(r[0]) + w * z(r[c]))}"
                      for c, what in ((1, "maxsim"), (2, "words")) for w in (0.5, 1.0, 2.0))
    print(f"{name:8s} {len(rows):5d} q  top-1 / top-5: cosine {at(lambda r: r[0])}  maxsim {at(lambda r: r[1])}  "
          f"words {at(lambda r: r[2])}  {mixes}"
          f"  ({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="harbor,cedar,quill,birch,project", help="comma-separated: " + ", ".join([*SETS, "policyqa"]))
    parser.add_argument("--data", help=f"directory holding {ext.POLICYQA_FILE} (default: ${ext.DATA_ENV} or ../shared/data)")
    args = parser.parse_args()
    tokens = Tokens()
    for name in args.sets.split(","):
        groups = set_groups(name, args.data)
        if groups is None:
            print(f"unknown set {name!r}", file=sys.stderr)
            return 2
        measure(name, groups, tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
