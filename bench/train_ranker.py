"""Fit the shipped section and memory rankers on training splits only, and report train and held-out.

Reproduce (from the repository root, after `pip install -e ".[train]"`; the external sets are read-only
in ../shared/data, or --data DIR, or $DOSSIER_SHARED_DATA):

    python bench/train_ranker.py --training-sets harbor,cedar,quill --adapter-without-training-sets \
        --section-objective listwise --policyqa-weight 0.25 --write
                                                # the shipped fit: print train / held-out, write providers/data/
    python bench/train_ranker.py                # PolicyQA, LoCoMo and the project set alone, without writing
    python bench/train_ranker.py --adapter-cv   # how the adapters' regularisation weight was chosen

Splits (fixed, by unit, never by question):
* PolicyQA dev: policies in sorted title order, even positions train, odd positions held out
  (`bench/policyqa.py --split test` measures the held-out half);
* LoCoMo dev: the first three conversations (sorted sample ids) train, the other two held out
  (`bench/locomo.py --split test`);
* the project's own set (examples/eval/sample-questions.json): by gold document, with a stable hash of
  the document id (dossier.evaluation.fit.split_of); unanswerable questions by a hash of their id;
* with --with-training-sets, also the training sets (examples/training/*-questions.json), or with
  --training-sets NAMES only those: every question trains, none is measured. The shipped models: the
  first command above (the rankers and thresholds see
  Harbor Line, Cedar & Stone and Quillfield Health, the section adapter does not; Birchwood Lettings is the
  validation set that chose this fit, the section ranker's listwise objective and PolicyQA's weight;
  docs/evaluation.md).
The handbook set (examples/handbook) is never read here: it is a test set only.

Section examples are the candidates that reach selection in a real call (fetch mode for PolicyQA,
brief for the project's set); memory examples are tier 2's vector and full-text candidates. The
decision thresholds are chosen on the labelled sets' training questions, the memory floor on the memory training questions.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import dossier
from dossier.evaluation import adapter as adapter_fit
from dossier.evaluation import external as ext
from dossier.evaluation import fit
from dossier.evaluation.dataset import load_dataset
from dossier.pipeline.features import MEMORY_FEATURES, SECTION_FEATURES
from dossier.layers.sections import Decision
from dossier.layers.understand import split_question
from dossier.loading import section_text
from dossier.providers import adapter as adapters
from dossier.providers.ranker import parse

REPO = Path(__file__).resolve().parents[1]
PROJECT_SET = REPO / "examples" / "eval" / "sample-questions.json"
TRAINING_SETS = sorted((REPO / "examples" / "training").glob("*-questions.json"))  # training only, every question
OUT = REPO / "src" / "dossier" / "providers" / "data" / "ranker.json"
ADAPTERS_OUT = OUT.with_name(adapters.SHIPPED)
ADAPTED = SECTION_FEATURES.index("adapted")


FOLDS: dict[str, int] = {}  # training unit -> 0 or 1, set by assign_folds


def assign_folds(units: list[str]) -> None:
    """Halve the training units (sorted, alternately), for the cross-fitted adapter features."""
    for position, unit in enumerate(sorted(units)):
        FOLDS[unit] = position % 2


def fold_of(unit: str) -> int | None:
    """The unit's half, or None for a unit no adapter was fitted on (an unanswerable question)."""
    return FOLDS.get(unit)


def adapter_key(side: str, unit: str) -> str:
    """Which adapter a question's features are computed with: held-out questions get the one fitted on all
    training units; a training question the one fitted on the other half, so that the ranker learns how
    far to trust the adapter on questions it was not fitted on."""
    fold = fold_of(unit)
    return "full" if side == "test" or fold is None else f"without{fold}"


def side_of(name: str, question) -> str:  # type: ignore[no-untyped-def]
    """A labelled set's question split for the section ranker: the project set's by gold document, a
    training set's always ``train``."""
    return fit.section_side(question) if name == "project" else "train"


def section_groups(engine, policyqa, labelled) -> list[tuple[str, adapter_fit.Group]]:  # type: ignore[no-untyped-def]
    """(unit, group) for every training unit: a PolicyQA training policy with its questions, and the labelled
    sets' training questions (``labelled``: name -> dataset), each over all of its org's sections."""
    out: list[tuple[str, adapter_fit.Group]] = []
    documents = [d["id"] for d in policyqa.bundle["documents"]]
    by_doc = {}
    for d in policyqa.bundle["documents"]:
        by_doc[d["id"]] = d
    questions: dict[str, list] = {}
    for q in policyqa.questions:
        if ext.policyqa_side(q.document_id, documents) == "train":
            questions.setdefault(q.document_id, []).append(q)
    for doc_id, asked in sorted(questions.items()):
        document = engine.store.get_documents([doc_id], org=ext.POLICYQA_ORG)[0]
        ids = [s.id for s in document.sections]
        texts = engine.embedder.embed_documents([section_text(document, s) for s in document.sections])
        gold = tuple((ids.index(q.gold),) for q in asked)
        vectors = np.stack([engine.embed_query(split_question(q.question)[0]) for q in asked])
        out.append((f"policyqa:{doc_id}", adapter_fit.Group(texts, vectors, gold)))
    by_org: dict[str, tuple[list[str], np.ndarray]] = {}
    for name, dataset in labelled.items():
        for q in dataset.questions:
            if q.org not in by_org:
                stored = engine.store.get_documents([d.id for d in dataset.bundle.documents if d.org == q.org and not d.is_system], org=q.org)
                texts = engine.embedder.embed_documents([section_text(d, s) for d in stored for s in d.sections])
                by_org[q.org] = ([s.id for d in stored for s in d.sections], texts)
            ids, texts = by_org[q.org]
            gold = tuple(ids.index(s) for s in q.gold.sections if s in ids)
            if gold and side_of(name, q) == "train":
                vector = engine.embed_query(split_question(q.message)[0])[None, :]
                out.append((f"{name}:{q.id}", adapter_fit.Group(texts, vector, (gold,))))
    return out


def memory_groups(engine, locomo) -> list[tuple[str, adapter_fit.Group]]:  # type: ignore[no-untyped-def]
    """(unit, group) for every LoCoMo training conversation: its questions over all of its turns."""
    records = [q.record_id for q in locomo.questions]
    out = []
    for record in sorted({r for r in records if ext.locomo_side(r, records) == "train"}):
        memories = [m for m in locomo.bundle["memories"] if m["record"] == record]
        ids = [m["id"] for m in memories]
        asked = [q for q in locomo.questions if q.record_id == record]
        texts = engine.embedder.embed_documents([m["text"] for m in memories])
        vectors = np.stack([engine.embed_query(q.question) for q in asked])
        gold = tuple(tuple(ids.index(e) for e in q.evidence) for q in asked)
        out.append((f"locomo:{record}", adapter_fit.Group(texts, vectors, gold)))
    return out


def fit_adapters(kind: str, groups: list[tuple[str, adapter_fit.Group]]) -> dict[str, np.ndarray]:
    """The adapter fitted on all training units and the two fitted on one half each."""
    assign_folds([u for u, _ in groups])
    out: dict[str, np.ndarray] = {}
    for key, keep in (("full", lambda u: True), ("without0", lambda u: fold_of(u) == 1), ("without1", lambda u: fold_of(u) == 0)):
        out[key] = adapter_fit.fit_adapter([g for u, g in groups if keep(u)])
        held = [g for u, g in groups if not keep(u)]
        if held:
            print(f"  {kind} adapter {key}: on the half left out, top-1 {adapter_fit.top_k(held, None, 1):.3f} -> "
                  f"{adapter_fit.top_k(held, out[key], 1):.3f}, top-5 {adapter_fit.top_k(held, None, 5):.3f} -> "
                  f"{adapter_fit.top_k(held, out[key], 5):.3f}, top-10 {adapter_fit.top_k(held, None, 10):.3f} -> "
                  f"{adapter_fit.top_k(held, out[key], 10):.3f}")  # fmt: skip
    return out


def adapter_cv(groups: list[tuple[str, adapter_fit.Group]], grid: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3)) -> None:
    """3-fold cross-validation of the adapter's regularisation weight over the PolicyQA training policies
    (sorted, every third policy a fold): the mean held-out fold top-1 and top-5 of the adapted cosine."""
    policies = sorted(u for u, _ in groups if u.startswith("policyqa:"))
    for lam in grid:
        scores = []
        for fold in range(3):
            held = set(policies[fold::3])
            matrix = adapter_fit.fit_adapter([g for u, g in groups if u in policies and u not in held], lam=lam)
            left_out = [g for u, g in groups if u in held]
            scores.append((adapter_fit.top_k(left_out, matrix, 1), adapter_fit.top_k(left_out, matrix, 5)))
        top1, top5 = np.mean(scores, axis=0)
        print(f"  lambda {lam:g}: held-out fold top-1 {top1:.3f}, top-5 {top5:.3f}", flush=True)


def use_adapter(path: Path | None) -> None:
    if path is None:
        os.environ.pop(adapters.FILE_ENV, None)
    else:
        os.environ[adapters.FILE_ENV] = str(path)
    adapters.clear_cache()


def policyqa_examples(engine, yardstick, key: str) -> dict[str, list[fit.Example]]:  # type: ignore[no-untyped-def]
    """The examples whose features are computed with adapter ``key`` (:func:`adapter_key`)."""
    documents = [d["id"] for d in yardstick.bundle["documents"]]
    out: dict[str, list[fit.Example]] = {"train": [], "test": []}
    for q in yardstick.questions:
        side = ext.policyqa_side(q.document_id, documents)
        if adapter_key(side, f"policyqa:{q.document_id}") != key:
            continue
        example = fit.section_example(engine, ext.section_request(q), org=ext.POLICYQA_ORG, caller=ext.CALLER,
                                      gold=[q.gold], group=f"policyqa:{q.document_id}")  # fmt: skip
        out[side].append(example)
    return out


def project_examples(engine, dataset, key: str, name: str = "project") -> dict[str, list[fit.Example]]:  # type: ignore[no-untyped-def]
    out: dict[str, list[fit.Example]] = {"train": [], "test": []}
    for q in dataset.questions:
        if not q.gold.documents and q.answerable:
            continue  # no section to find and not an abstention question
        side = side_of(name, q)
        if adapter_key(side, f"{name}:{q.id}") != key:
            continue
        request = {**fit.DEFAULT_REQUEST, **q.request, "message": q.message}
        if q.record is not None:
            request["record"] = q.record
        out[side].append(fit.section_example(engine, request, org=q.org, caller=q.caller, gold=q.gold.sections,
                                             group=f"{name}:{q.id}", answerable=q.answerable))  # fmt: skip
    return out


def locomo_examples(engine, yardstick, pool: int, key: str) -> dict[str, list[fit.Example]]:  # type: ignore[no-untyped-def]
    records = [q.record_id for q in yardstick.questions]
    out: dict[str, list[fit.Example]] = {"train": [], "test": []}
    for q in yardstick.questions:
        side = ext.locomo_side(q.record_id, records)
        if adapter_key(side, f"locomo:{q.record_id}") != key:
            continue
        example = fit.memory_example(engine, org=ext.LOCOMO_ORG, record_ids=[q.record_id], question=q.question,
                                     gold=q.evidence, group=f"locomo:{q.record_id}", pool=pool)  # fmt: skip
        out[side].append(example)
    return out


def project_memory_examples(engine, dataset, pool: int, name: str = "project") -> dict[str, list[fit.Example]]:  # type: ignore[no-untyped-def]
    """A labelled set's questions with gold memories: the project set's split by a hash of the question id,
    a training set's all ``train``."""
    out: dict[str, list[fit.Example]] = {"train": [], "test": []}
    for q in dataset.questions:
        if not q.gold.memories or not q.gold.records:
            continue
        records = sorted({m.record for m in dataset.bundle.memories if m.id in set(q.gold.memories)} | set(q.gold.records))
        side = fit.split_of(q.id) if name == "project" else "train"
        out[side].append(fit.memory_example(engine, org=q.org, record_ids=records, question=q.message,
                                            gold=q.gold.memories, group=f"{name}:{q.id}", pool=pool))  # fmt: skip
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
    parser.add_argument("--adapter-cv", action="store_true",
                        help="only cross-validate the section adapter's regularisation weight on the PolicyQA training policies")
    parser.add_argument("--with-training-sets", action="store_true",
                        help="also train on examples/training (not how the shipped models were fitted: docs/evaluation.md)")
    parser.add_argument("--training-sets", metavar="NAMES",
                        help="with --with-training-sets, only these sets (comma-separated names, e.g. harbor,cedar,quill); default all")
    parser.add_argument("--adapter-without-training-sets", action="store_true",
                        help="fit the section adapter on PolicyQA and the project set only, the training sets feeding the rankers alone")
    parser.add_argument("--out", metavar="DIR",
                        help="with --write, write ranker.json and adapters.npz into DIR instead of the package (to try a fit: "
                             "$DOSSIER_RANKER_FILE and $DOSSIER_ADAPTER_FILE point dossier at them)")
    parser.add_argument("--section-objective", choices=("pointwise", "listwise"), default="pointwise",
                        help="how the section ranker is fitted (dossier.evaluation.fit.fit; default: pointwise)")
    parser.add_argument("--memory-objective", choices=("pointwise", "listwise"), default="pointwise",
                        help="how the memory ranker is fitted (default: pointwise)")
    parser.add_argument("--policyqa-weight", type=float, default=1.0, metavar="SHARE",
                        help="PolicyQA's weight in the section fit, as a share of the labelled sets' (default 1: as much)")
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
    labelled = {"project": project}
    if args.with_training_sets or args.training_sets:
        chosen = TRAINING_SETS
        if args.training_sets:
            names = [n.strip() for n in args.training_sets.split(",") if n.strip()]
            known = {path.stem.removesuffix("-questions"): path for path in TRAINING_SETS}
            unknown = [n for n in names if n not in known]
            if unknown:
                parser.error(f"unknown training sets {unknown}; there are {sorted(known)}")
            chosen = [known[n] for n in names]
        labelled.update({f"training-{path.stem.removesuffix('-questions')}": load_dataset(path) for path in chosen})
    if args.adapter_cv:
        with tempfile.TemporaryDirectory() as tmp, dossier.open(f"sqlite:///{tmp}/sections.db") as engine:
            engine.load_bundle(policyqa.bundle)
            for dataset in labelled.values():
                engine.load_bundle(dataset.raw_bundle)
            print("section adapter, 3-fold cross-validation over the PolicyQA training policies:")
            adapter_cv(section_groups(engine, policyqa, labelled))
        return 0
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.is_file():
        with open(cache, "rb") as handle:
            sections, memories, shipped_adapters = pickle.load(handle)
    else:
        with tempfile.TemporaryDirectory() as tmp, dossier.open(f"sqlite:///{tmp}/sections.db") as engine, \
                dossier.open(f"sqlite:///{tmp}/memories.db") as memory_engine:  # fmt: skip
            engine.load_bundle(policyqa.bundle)
            for dataset in labelled.values():
                engine.load_bundle(dataset.raw_bundle)
            memory_engine.load_bundle(locomo.bundle)
            print("adapters (fitted on training units; each half-fit checked on the half it left out):")
            adapter_sets = {"project": project} if args.adapter_without_training_sets else labelled
            section_matrices = fit_adapters("sections", section_groups(engine, policyqa, adapter_sets))
            memory_matrices = fit_adapters("memories", memory_groups(memory_engine, locomo))
            files = {}
            for key in section_matrices:
                files[key] = Path(tmp) / f"adapters-{key}.npz"
                adapters.save(files[key], {"sections": section_matrices[key], "memories": memory_matrices[key]},
                              model_id=engine.embedder.model_id, fitted_on=key, script="bench/train_ranker.py")  # fmt: skip
            sections: dict[str, dict[str, list[fit.Example]]] = {name: {"train": [], "test": []} for name in ("policyqa", *labelled)}
            memories = {"train": [], "test": []}
            pool = memory_engine.settings.memory_candidates
            for key, path in files.items():
                use_adapter(path)
                found = {"policyqa": policyqa_examples(engine, policyqa, key)}
                found.update({name: project_examples(engine, dataset, key, name) for name, dataset in labelled.items()})
                for name, by_side in found.items():
                    for side, examples in by_side.items():
                        sections[name][side].extend(examples)
                for side, examples in locomo_examples(memory_engine, locomo, pool, key).items():
                    memories[side].extend(examples)
            shipped_adapters = files["full"].read_bytes()
        if cache is not None:
            with open(cache, "wb") as handle:
                pickle.dump((sections, memories, shipped_adapters), handle)
    with tempfile.TemporaryDirectory() as tmp, dossier.open(f"sqlite:///{tmp}/project.db") as engine:
        full = Path(tmp) / "adapters-full.npz"
        full.write_bytes(shipped_adapters)
        use_adapter(full)  # the project set's memory questions never trained an adapter
        project_memories: dict[str, list[fit.Example]] = {"train": [], "test": []}
        for name, dataset in labelled.items():
            engine.load_bundle(dataset.raw_bundle)
            for side, examples in project_memory_examples(engine, dataset, engine.settings.memory_candidates, name).items():
                project_memories[side].extend(examples)
    use_adapter(None)
    for example in memories["train"]:  # LoCoMo weighs as much as the labelled sets in the memory fit
        example.weight = len(project_memories["train"]) / len(memories["train"])
    # PolicyQA (one policy's segments per question) weighs --policyqa-weight times the labelled sets (a whole
    # org's sections each)
    org_wide = [e for name in labelled for e in sections[name]["train"]]
    for example in sections["policyqa"]["train"]:
        example.weight = args.policyqa_weight * len(org_wide) / len(sections["policyqa"]["train"])
    train_sections = sections["policyqa"]["train"] + org_wide
    section_cv: dict[str, float] = {}
    memory_cv: dict[str, float] = {}
    section_spec = fit.fit(train_sections, kind="sections", features=SECTION_FEATURES, objective=args.section_objective,
                           report=section_cv)  # fmt: skip
    section_ranker = parse(section_spec, kind="sections", expected=SECTION_FEATURES, origin="fit")
    section_spec["thresholds"] = fit.choose_thresholds(org_wide, section_ranker)
    section_ranker = parse(section_spec, kind="sections", expected=SECTION_FEATURES, origin="fit")
    memory_spec = fit.fit(memories["train"] + project_memories["train"], kind="memories", features=MEMORY_FEATURES, score=fit.any_at(10),
                         objective=args.memory_objective, report=memory_cv)
    memory_ranker = parse(memory_spec, kind="memories", expected=MEMORY_FEATURES, origin="fit")
    memory_spec["thresholds"] = {"floor": fit.memory_floor(memories["train"] + project_memories["train"], memory_ranker)}

    print(f"fitted in {time.perf_counter() - started:.0f} s; C sections {section_spec['c']}, memories {memory_spec['c']}")
    print(f"cross-validated on the training questions (3 folds; the chosen C's mean on the folds left out): sections "
          f"top-1 {section_cv['cv']:.3f} ({args.section_objective}), memories any@10 {memory_cv['cv']:.3f} ({args.memory_objective})")
    print("sections: ranking of the candidates that reach selection (share of questions with gold in the top k)")
    for name, split in sections.items():
        for side in ("train", "test"):
            examples = split[side]
            print(f"  {name:8} {side:5} n={len(examples):4}  ranker {ranks(examples, section_ranker.probabilities)}"
                  f"  cosine {ranks(examples, lambda x: x[:, 0])}  fused {ranks(examples, lambda x: x[:, 5])}"
                  f"  adapted {ranks(examples, lambda x: x[:, ADAPTED])}")  # fmt: skip
    print(f"  thresholds (chosen on the labelled sets' training questions): {section_spec['thresholds']}")
    decision = Decision.of(section_ranker)
    for name in labelled:
        for side in ("train", "test"):
            if sections[name][side]:
                print(f"  {name} {side} selection: {fit.selection_quality(sections[name][side], section_ranker, decision)}")
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
        counts = {"sections": {k: len(v["train"]) for k, v in sections.items()},
                  "memories": {"locomo": len(memories["train"]), "labelled": len(project_memories["train"])}}
        document = fit.ranker_file({"sections": section_spec, "memories": memory_spec},
                                   fitted_on=counts, script="bench/train_ranker.py")  # fmt: skip
        out, adapters_out = (OUT, ADAPTERS_OUT) if not args.out else (Path(args.out) / OUT.name, Path(args.out) / ADAPTERS_OUT.name)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        adapters_out.write_bytes(shipped_adapters)
        print(f"wrote {out} and {adapters_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
