"""Fit the shipped section and memory rankers on training splits only, and report train and held-out.

Reproduce (from the repository root, after `pip install -e ".[train]"`; the external sets are read-only
in ../shared/data, or --data DIR, or $DOSSIER_SHARED_DATA):

    python bench/train_ranker.py --write        # fit, print train / held-out, write providers/data/ranker.json
    python bench/train_ranker.py                # the same, without writing

Splits (fixed, by unit, never by question):
* PolicyQA dev: policies in sorted title order, even positions train, odd positions held out
  (`bench/policyqa.py --split test` measures the held-out half);
* LoCoMo dev: the first three conversations (sorted sample ids) train, the other two held out
  (`bench/locomo.py --split test`);
* the project's own set (examples/eval/sample-questions.json): by gold document, with a stable hash of
  the document id (dossier.evaluation.fit.split_of); unanswerable questions by a hash of their id.
The handbook set (examples/handbook) is never read here: it is a test set only.

Section examples are the candidates that reach selection in a real call (fetch mode for PolicyQA,
brief for the project's set); memory examples are tier 2's vector and full-text candidates. The
decision thresholds are chosen on the project set's training questions, the memory floor on LoCoMo's.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import dossier
from dossier.evaluation import external as ext
from dossier.evaluation import fit
from dossier.evaluation.dataset import load_dataset
from dossier.layers.features import MEMORY_FEATURES, SECTION_FEATURES
from dossier.layers.sections import Decision
from dossier.providers.ranker import parse

REPO = Path(__file__).resolve().parents[1]
PROJECT_SET = REPO / "examples" / "eval" / "sample-questions.json"
OUT = REPO / "src" / "dossier" / "providers" / "data" / "ranker.json"


def policyqa_examples(engine, yardstick) -> dict[str, list[fit.Example]]:  # type: ignore[no-untyped-def]
    documents = [d["id"] for d in yardstick.bundle["documents"]]
    out: dict[str, list[fit.Example]] = {"train": [], "test": []}
    for q in yardstick.questions:
        example = fit.section_example(engine, ext.section_request(q), org=ext.POLICYQA_ORG, caller=ext.CALLER,
                                      gold=[q.gold], group=f"policyqa:{q.document_id}")  # fmt: skip
        out[ext.policyqa_side(q.document_id, documents)].append(example)
    return out


def project_examples(engine, dataset) -> dict[str, list[fit.Example]]:  # type: ignore[no-untyped-def]
    out: dict[str, list[fit.Example]] = {"train": [], "test": []}
    for q in dataset.questions:
        if not q.gold.documents and q.answerable:
            continue  # no section to find and not an abstention question
        side = fit.section_side(q)
        request = {**fit.DEFAULT_REQUEST, **q.request, "message": q.message}
        if q.record is not None:
            request["record"] = q.record
        out[side].append(fit.section_example(engine, request, org=q.org, caller=q.caller, gold=q.gold.sections,
                                             group=f"project:{q.id}", answerable=q.answerable))  # fmt: skip
    return out


def locomo_examples(engine, yardstick, pool: int) -> dict[str, list[fit.Example]]:  # type: ignore[no-untyped-def]
    records = [q.record_id for q in yardstick.questions]
    out: dict[str, list[fit.Example]] = {"train": [], "test": []}
    for q in yardstick.questions:
        example = fit.memory_example(engine, org=ext.LOCOMO_ORG, record_ids=[q.record_id], question=q.question,
                                     gold=q.evidence, group=f"locomo:{q.record_id}", pool=pool)  # fmt: skip
        out[ext.locomo_side(q.record_id, records)].append(example)
    return out


def project_memory_examples(engine, dataset, pool: int) -> dict[str, list[fit.Example]]:  # type: ignore[no-untyped-def]
    """The project set's questions with gold memories, split by a hash of the question id."""
    out: dict[str, list[fit.Example]] = {"train": [], "test": []}
    for q in dataset.questions:
        if not q.gold.memories or not q.gold.records:
            continue
        records = sorted({m.record for m in dataset.bundle.memories if m.id in set(q.gold.memories)} | set(q.gold.records))
        out[fit.split_of(q.id)].append(fit.memory_example(engine, org=q.org, record_ids=records, question=q.message,
                                                          gold=q.gold.memories, group=f"project:{q.id}", pool=pool))  # fmt: skip
    return out


def ranks(examples: list[fit.Example], probabilities) -> dict[str, float]:  # type: ignore[no-untyped-def]
    out = {}
    for k in (1, 3, 5, 10):
        hits = [bool(e.y[np.argsort(-probabilities(e.x))[:k]].any()) for e in examples if len(e.y) and e.answerable]
        out[f"@{k}"] = round(float(np.mean(hits)) if hits else 0.0, 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help=f"directory of the external sets (default: ${ext.DATA_ENV} or ../shared/data)")
    parser.add_argument("--write", action="store_true", help=f"write the fitted models to {OUT.relative_to(REPO)}")
    parser.add_argument("--cache", help="keep the extracted examples in this file and reuse them (the features must not change)")
    args = parser.parse_args()
    data = ext.data_dir(args.data, repo_root=REPO)
    if not (data / ext.POLICYQA_FILE).is_file() or not (data / ext.LOCOMO_FILE).is_file():
        print(f"skipped: data not found at {data}")
        return 0
    started = time.perf_counter()
    policyqa = ext.load_policyqa(ext.read_json(data / ext.POLICYQA_FILE))
    locomo = ext.load_locomo(ext.read_json(data / ext.LOCOMO_FILE))
    project = load_dataset(PROJECT_SET)
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.is_file():
        with open(cache, "rb") as handle:
            sections, memories = pickle.load(handle)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            with dossier.open(f"sqlite:///{tmp}/sections.db") as engine:
                engine.load_bundle(policyqa.bundle)
                engine.load_bundle(project.raw_bundle)
                sections = {"policyqa": policyqa_examples(engine, policyqa), "project": project_examples(engine, project)}
            with dossier.open(f"sqlite:///{tmp}/memories.db") as engine:
                engine.load_bundle(locomo.bundle)
                pool = engine.settings.memory_candidates
                memories = locomo_examples(engine, locomo, pool)
        if cache is not None:
            with open(cache, "wb") as handle:
                pickle.dump((sections, memories), handle)
    with tempfile.TemporaryDirectory() as tmp, dossier.open(f"sqlite:///{tmp}/project.db") as engine:
        engine.load_bundle(project.raw_bundle)
        project_memories = project_memory_examples(engine, project, engine.settings.memory_candidates)
    for example in memories["train"]:  # LoCoMo weighs as much as the project's set in the memory fit
        example.weight = len(project_memories["train"]) / len(memories["train"])
    for example in sections["policyqa"]["train"]:  # each set weighs as much as the other in the fit
        example.weight = len(sections["project"]["train"]) / len(sections["policyqa"]["train"])
    train_sections = sections["policyqa"]["train"] + sections["project"]["train"]
    section_spec = fit.fit(train_sections, kind="sections", features=SECTION_FEATURES)
    section_ranker = parse(section_spec, kind="sections", expected=SECTION_FEATURES, origin="fit")
    section_spec["thresholds"] = fit.choose_thresholds(sections["project"]["train"], section_ranker)
    section_ranker = parse(section_spec, kind="sections", expected=SECTION_FEATURES, origin="fit")
    memory_spec = fit.fit(memories["train"] + project_memories["train"], kind="memories", features=MEMORY_FEATURES, score=fit.any_at(10))
    memory_ranker = parse(memory_spec, kind="memories", expected=MEMORY_FEATURES, origin="fit")
    memory_spec["thresholds"] = {"floor": fit.memory_floor(memories["train"] + project_memories["train"], memory_ranker)}

    print(f"fitted in {time.perf_counter() - started:.0f} s; C sections {section_spec['c']}, memories {memory_spec['c']}")
    print("sections: ranking of the candidates that reach selection (share of questions with gold in the top k)")
    for name, split in sections.items():
        for side in ("train", "test"):
            examples = split[side]
            print(f"  {name:8} {side:5} n={len(examples):4}  ranker {ranks(examples, section_ranker.probabilities)}"
                  f"  cosine {ranks(examples, lambda x: x[:, 0])}  fused {ranks(examples, lambda x: x[:, 5])}")  # fmt: skip
    print(f"  thresholds (chosen on project train): {section_spec['thresholds']}")
    decision = Decision.of(section_ranker)
    for side in ("train", "test"):
        print(f"  project {side} selection: {fit.selection_quality(sections['project'][side], section_ranker, decision)}")
    print("memories: LoCoMo, share of questions with an evidence turn in the top k")
    for side in ("train", "test"):
        examples = memories[side]
        print(f"  locomo {side:5} n={len(examples):4}  ranker {ranks(examples, memory_ranker.probabilities)}"
              f"  bm25 {ranks(examples, lambda x: x[:, 3] + 1e-3 * x[:, 0])}")  # fmt: skip
    for side in ("train", "test"):
        examples = project_memories[side]
        print(f"  project {side:5} n={len(examples):4}  ranker {ranks(examples, memory_ranker.probabilities)}"
              f"  bm25 {ranks(examples, lambda x: x[:, 3] + 1e-3 * x[:, 0])}")  # fmt: skip
    print(f"  floor (chosen on train): {memory_spec['thresholds']['floor']}")
    for kind, spec in (("sections", section_spec), ("memories", memory_spec)):
        weights = sorted(zip(spec["features"], spec["coef"]), key=lambda fw: -abs(fw[1]))
        print(f"  {kind} weights: " + ", ".join(f"{f} {w:+.2f}" for f, w in weights))
    if args.write:
        counts = {"sections": {k: len(v["train"]) for k, v in sections.items()}, "memories": {"locomo": len(memories["train"])}}
        document = fit.ranker_file({"sections": section_spec, "memories": memory_spec},
                                   fitted_on=counts, script="bench/train_ranker.py")  # fmt: skip
        OUT.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
