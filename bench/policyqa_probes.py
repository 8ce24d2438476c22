"""Probe: three signals that might lift PolicyQA's section selection, measured on its training policies
only (the even ones of bench/train_ranker.py's split). Nothing here changes the engine.

Reproduce (from the repository root, after `pip install -e .`; PolicyQA is read-only in ../shared/data,
or --data DIR, or $DOSSIER_SHARED_DATA); about a minute:

    python bench/policyqa_probes.py

The training policies are split in two by policy (alternating in sorted order). For every question of
one half, the segments of its own policy are ranked, and the supervised signals learn from the other
half only; top-1 / top-3 / top-5 are over both halves. Segments are embedded as the engine embeds
sections (``title: heading`` then the text), questions as queries, with the default model.

* cosine      -- the segment's vector against the question's: the plain model, the baseline;
* bm25        -- Okapi BM25 over the policy's segments (stop words out, a crude suffix stemmer);
* translation -- a word translation model (IBM Model 1, 5 rounds of EM) learned from the other half's
                 (question, gold segment) pairs: the question's words scored by their chance to be
                 "said" by the segment, its own words mixed (0.3) with translated ones, smoothed by the
                 policies' word frequencies (0.5); it bridges a question's words and the answer's;
* centred     -- the segment's vector less the mean of its policy's segments, the question's less the
                 mean of the training questions (what all policies and all questions share taken out);
* exemplars   -- the 20 training questions (other half) nearest the question, their gold segments'
                 vectors averaged (softmax of the cosine at temperature 0.05): the segment's cosine to
                 what answers looked like for questions like it.

Each signal is also added to the cosine after standardising both per question (weights 0.5 and 1).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dossier.evaluation import external as ext  # noqa: E402
from dossier.providers.embeddings import OnnxMiniLM  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STOP = frozenset(
    "a an the of to and or in on for with by is are was were be been do does did i my me we our you your it its this "
    "that these those what which who whom how when where why can will would should could may might any all there their "
    "they them if as at from about into than then so such not no yes has have had".split()
)
TRANSLATED, SMOOTHED, NEIGHBOURS, TEMPERATURE = 0.3, 0.5, 20, 0.05


def words(text: str) -> list[str]:
    out = []
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        if word in STOP:
            continue
        for suffix in ("ing", "ed", "es", "s", "ly"):
            if len(word) > 4 and word.endswith(suffix):
                word = word[: -len(suffix)]
                break
        out.append(word)
    return out


def model_one(pairs: Sequence[tuple[list[str], list[str]]], rounds: int = 5) -> dict[str, dict[str, float]]:
    """P(question word | segment word), learned by EM from (question words, gold segment words) pairs."""
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for asked, said in pairs:
        for s in set(said):
            for q in asked:
                table[s][q] = 1.0
    for _ in range(rounds):
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        for asked, said in pairs:
            source = [*said, "<null>"]
            for q in asked:
                chances = [table[s].get(q, 1e-6) for s in source]
                total = sum(chances)
                for s, chance in zip(source, chances):
                    counts[s][q] += chance / total
        table = defaultdict(dict, {s: {q: c / sum(row.values()) for q, c in row.items()} for s, row in counts.items()})
    return table


def bm25(asked: list[str], segments: list[list[str]]) -> np.ndarray:
    df = Counter(w for s in segments for w in set(s))
    n, mean = len(segments), float(np.mean([len(s) for s in segments]))
    scores = []
    for s in segments:
        tf, length = Counter(s), len(s)
        scores.append(sum(math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5)) * tf[w] * 2.2 / (tf[w] + 1.2 * (0.25 + 0.75 * length / mean))
                          for w in asked if tf[w]))  # fmt: skip
    return np.array(scores)


def standard(x: np.ndarray) -> np.ndarray:
    return (x - x.mean()) / (x.std() + 1e-9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help=f"directory holding {ext.POLICYQA_FILE} (default: ${ext.DATA_ENV} or ../shared/data)")
    args = parser.parse_args()
    path = ext.data_dir(args.data, repo_root=REPO) / ext.POLICYQA_FILE
    if not path.is_file():
        print(f"skipped: data not found at {path}")
        return 0
    yardstick = ext.load_policyqa(ext.read_json(path))
    questions = ext.on_side(yardstick.questions, "train", "document_id")
    policies = sorted({q.document_id for q in questions})
    segments = {d["id"]: [(s["id"], f'{d["title"]}: {s.get("heading", "")}\n{s["text"]}'.strip()) for s in d["sections"]]
                for d in yardstick.bundle["documents"] if d["id"] in policies}  # fmt: skip
    model = OnnxMiniLM()
    texts = {sid: text for doc in segments.values() for sid, text in doc}
    ids = list(texts)
    vectors = dict(zip(ids, model.embed_batch([texts[i] for i in ids])))
    asked = dict(zip([q.id for q in questions], model.embed_batch([q.question for q in questions], kind="query")))
    said = {sid: words(text) for sid, text in texts.items()}
    frequency = Counter(w for ws in said.values() for w in ws)
    total = sum(frequency.values())
    question_mean = np.mean(list(asked.values()), axis=0)

    ranks: dict[str, list[int]] = defaultdict(list)
    for half in (0, 1):
        tested = set(policies[half::2])
        learn = [q for q in questions if q.document_id not in tested]
        table = model_one([(words(q.question), said[q.gold]) for q in learn])
        learnt_questions = np.array([asked[q.id] for q in learn])
        learnt_answers = np.array([vectors[q.gold] for q in learn])
        for q in (q for q in questions if q.document_id in tested):
            doc = [sid for sid, _ in segments[q.document_id]]
            gold = doc.index(q.gold)
            matrix = np.array([vectors[s] for s in doc])
            v, ws = asked[q.id], words(q.question)

            def translation(sid: str) -> float:
                tf, length = Counter(said[sid]), max(len(said[sid]), 1)
                score = 0.0
                for w in ws:
                    moved = sum(table.get(s, {}).get(w, 0.0) * c for s, c in tf.items()) / length
                    chance = (1 - TRANSLATED) * tf[w] / length + TRANSLATED * moved
                    score += math.log(SMOOTHED * chance + (1 - SMOOTHED) * (frequency[w] + 1) / (total + 1))
                return score

            centred = matrix - matrix.mean(axis=0)
            centred /= np.linalg.norm(centred, axis=1, keepdims=True) + 1e-12
            centred_q = (v - question_mean) / np.linalg.norm(v - question_mean)
            near = learnt_questions @ v
            top = np.argsort(-near)[:NEIGHBOURS]
            weights = np.exp((near[top] - near[top].max()) / TEMPERATURE)
            exemplar = (weights[:, None] * learnt_answers[top]).sum(axis=0) / weights.sum()
            cosine = matrix @ v
            signals: dict[str, np.ndarray] = {
                "bm25": bm25(ws, [said[s] for s in doc]),
                "translation": np.array([translation(s) for s in doc]),
                "centred": centred @ centred_q,
                "exemplars": matrix @ exemplar,
            }
            ranks["cosine"].append(int((cosine > cosine[gold]).sum()))
            for name, signal in signals.items():
                ranks[name].append(int((signal > signal[gold]).sum()))
                for weight in (0.5, 1.0):
                    mixed = standard(cosine) + weight * standard(signal)
                    ranks[f"cosine + {weight} x {name}"].append(int((mixed > mixed[gold]).sum()))
    print(f"PolicyQA training policies: {len(policies)} policies, {len(questions)} questions, two halves by policy")
    print(f"{'ranked by':32s} {'top-1':>6s} {'top-3':>6s} {'top-5':>6s}")
    for name, found in ranks.items():
        r = np.array(found)
        print(f"{name:32s} {np.mean(r < 1):6.3f} {np.mean(r < 3):6.3f} {np.mean(r < 5):6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
