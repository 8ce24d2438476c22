"""The default embedder reproduces all-MiniLM-L6-v2 and behaves like an Embedder should."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import numpy as np
import pytest

import dossier
from dossier.providers.embeddings import MINILM, CachedQueries, Embedder, OnnxMiniLM, embedder_from_spec

REFERENCE = json.loads((Path(__file__).parents[1] / "fixtures" / "minilm_reference.json").read_text())


def test_the_reference_fixture_is_what_it_claims() -> None:
    assert "all-MiniLM-L6-v2" in REFERENCE["model"]
    vectors = np.asarray(REFERENCE["vectors"])
    assert vectors.shape == (len(REFERENCE["sentences"]), 384) and len(vectors) >= 5


@pytest.mark.parametrize("index", range(len(REFERENCE["sentences"])), ids=[s[:30] for s in REFERENCE["sentences"]])
def test_onnx_minilm_matches_the_reference_model(embedder: OnnxMiniLM, index: int) -> None:
    reference = np.asarray(REFERENCE["vectors"][index], dtype=np.float32)
    reference /= np.linalg.norm(reference)
    sentence = REFERENCE["sentences"][index]
    for vector in (embedder.embed_query(sentence), embedder.embed_documents([sentence])[0]):
        assert float(vector @ reference) >= 0.99


def test_the_reference_sentences_as_one_batch_match_too(embedder: OnnxMiniLM) -> None:
    # padded together in one batch: padding must not leak into the mean pooling
    vectors = embedder.embed_batch(REFERENCE["sentences"])
    reference = np.asarray(REFERENCE["vectors"], dtype=np.float32)
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    assert np.min(np.sum(vectors * reference, axis=1)) >= 0.99


def test_vectors_are_unit_length_float32(embedder: OnnxMiniLM) -> None:
    texts = ["short", "", "   ", "a much longer sentence about refunds, discounts and renewals " * 30]
    vectors = embedder.embed_documents(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (4, embedder.dimensions) == (4, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(np.linalg.norm(embedder.embed_query("why"), axis=0), 1.0, atol=1e-5)


def test_embed_documents_keeps_the_input_order(embedder: OnnxMiniLM) -> None:
    # more texts than one batch, of very different lengths, so batching reorders them internally
    texts = [f"note {i}: " + "customer renewal discussion " * (i % 7) + f"item {i * 37 % 11}" for i in range(40)]
    done: list[int] = []
    together = embedder.embed_documents(texts, progress=done.append)
    one_by_one = np.stack([embedder.embed_query(t) for t in texts])
    assert np.allclose(together, one_by_one, atol=1e-4)
    assert sum(done) == len(texts)
    assert embedder.embed_documents([]).shape == (0, 384)


def test_similar_meaning_scores_higher(embedder: OnnxMiniLM) -> None:
    q = embedder.embed_query("How much discount can we give?")
    near, far = embedder.embed_documents(["Discounts above 20% need VP approval.", "The office plants are watered on Fridays."])
    assert float(q @ near) > float(q @ far) + 0.2


def test_cached_queries_return_the_same_vector(embedder: OnnxMiniLM) -> None:
    cached = CachedQueries(embedder, size=2)
    first = cached("discount rules")
    assert cached("discount rules") is first
    cached("a"), cached("b")
    assert cached("discount rules") is not first  # evicted, recomputed
    assert np.allclose(cached("discount rules"), first, atol=1e-6)


def test_the_default_spec_is_the_local_model() -> None:
    for spec in (None, "local", "onnx"):
        model = embedder_from_spec(spec)
        assert isinstance(model, OnnxMiniLM) and model.model_id == MINILM and model.dimensions == 384


def test_openai_spec_without_the_openai_package_names_the_extra() -> None:
    if importlib.util.find_spec("openai") is not None:
        pytest.skip("the openai package is installed here, so the missing-extra path cannot be exercised")
    with pytest.raises(dossier.MissingExtra) as caught:
        embedder_from_spec("openai:text-embedding-3-small")
    assert caught.value.extra == "openai"
    assert '"openai"' in str(caught.value) and "dossier-engine[openai]" in str(caught.value)


@pytest.mark.parametrize("spec", ["bogus", "openai:", "openai", "huggingface:all-MiniLM-L6-v2"])
def test_an_unknown_spec_is_a_config_error(spec: str) -> None:
    with pytest.raises(dossier.ConfigError, match="unknown embedder"):
        embedder_from_spec(spec)


def test_a_subclass_needs_only_embed_batch() -> None:
    class Constant(Embedder):
        model_id, dimensions, batch_size = "constant", 2, 3

        def embed_batch(self, texts, *, kind="document"):  # type: ignore[no-untyped-def]
            return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)

    vectors = Constant().embed_documents(["ccc", "a", "bb", "dddd"])
    assert vectors[:, 0].tolist() == [3, 1, 2, 4]
    assert Constant().embed_query("xy").tolist() == [2, 1]


def test_the_model_threads_stop_spinning_when_a_run_ends() -> None:
    # onnxruntime's threads otherwise spin on for tens of milliseconds after each run: a core of the
    # machine's few taken from the rest of the call (see docs/scaling.md, "The model's idle threads")
    model = OnnxMiniLM(threads=2)
    for session in (model._query_session, model._batch_session):
        assert session.get_session_options().get_session_config_entry("session.force_spinning_stop") == "1"
    assert model.embed_query("still the same vector").shape == (384,)


def test_query_vectors_do_not_depend_on_their_batch(embedder: OnnxMiniLM) -> None:
    questions = ["What discount applies?", "Who approves refunds above 500 EUR?", "SSO", "Is NW-EDU-40 a course?"]
    alone = np.stack([embedder.embed_query(q) for q in questions])
    assert np.array_equal(embedder.embed_batch(questions, kind="query"), alone)


def test_a_text_stored_as_a_document_has_the_vector_it_gets_as_a_query(embedder: OnnxMiniLM) -> None:
    """``symmetric``: a memory's stored vector (made in a load's batches, on one core each) may stand for its
    query vector (the documents source reads it instead of embedding the memory again)."""
    assert embedder.symmetric and not Embedder.symmetric  # an embedder says so; the default is to embed again
    texts = [f"Jane asked about the {word} discount for a three-year prepay." * (1 + i % 3)
             for i, word in enumerate(["annual", "education", "volume", "nonprofit", "partner", "renewal"] * 6)]
    stored = embedder.embed_documents(texts)
    assert all(np.array_equal(stored[i], embedder.embed_query(text)) for i, text in enumerate(texts))


def test_a_question_embedded_beside_other_work_gets_the_same_vector_on_one_core() -> None:
    # the engine embeds a call's question ahead on one core while its reads that need no vector run, and the
    # vector lands in the cache every later call takes from: it must be the one every core gives, bit for bit
    model = OnnxMiniLM(threads=2)
    questions = ["What discount applies?", "Who approves refunds above 500 EUR?", "SSO", "Is NW-EDU-40 a course?",
                 "What did Jane say about the renewal of the Acme contract in June, and which rules apply?"]
    for question in questions:
        assert np.array_equal(model.embed_query_beside(question), model.embed_query(question))
    cached = CachedQueries(model)
    assert np.array_equal(cached(questions[0], ("northwind", "ana"), beside=True), model.embed_query(questions[0]))


class _Gated(Embedder):
    """Holds its first run until ``release`` is set, and records every run's texts."""

    model_id, dimensions = "gated", 4

    def __init__(self) -> None:
        self.release = threading.Event()
        self.runs: list[list[str]] = []
        self.fail = False

    def embed_batch(self, texts, *, kind="document"):  # type: ignore[no-untyped-def]
        self.runs.append(list(texts))
        assert self.release.wait(60)
        if self.fail:
            raise RuntimeError("model down")
        return np.array([[len(t), 1.0, 0.0, 0.0] for t in texts], dtype=np.float32)


def _ask_together(cached: CachedQueries, gated: _Gated, questions: list[str]) -> list:
    out: list = [None] * len(questions)

    def ask(n: int) -> None:
        try:
            out[n] = cached(questions[n])
        except RuntimeError as exc:
            out[n] = exc

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(len(questions))]
    threads[0].start()
    while not gated.runs:  # the first question's run has started (and is held)
        threading.Event().wait(0.001)
    for thread in threads[1:]:
        thread.start()
    while len(cached._queue) < len(set(questions)) - 1:  # the others are queued behind it
        threading.Event().wait(0.001)
    gated.release.set()
    for thread in threads:
        thread.join(60)
    return out


def test_concurrent_questions_share_model_runs_and_each_gets_its_own_vector() -> None:
    gated = _Gated()
    cached = CachedQueries(gated, max_batch=8)
    questions = [f"question {'x' * n}" for n in range(12)] + ["question "] * 3  # the first one asked four times
    got = _ask_together(cached, gated, questions)
    assert [float(v[0]) for v in got] == [float(len(q)) for q in questions]
    assert gated.runs[0] == ["question "]  # alone: nothing else was asked yet
    assert sorted(len(run) for run in gated.runs[1:]) == [3, 8]  # 11 others, 8 per run, oldest first
    assert sum(len(run) for run in gated.runs) == 12  # each distinct question embedded once
    assert cached("question xx") is got[2]  # and cached


def test_a_failed_run_fails_every_question_waiting_on_it_and_the_next_call_retries() -> None:
    gated = _Gated()
    gated.fail = True
    cached = CachedQueries(gated)
    got = _ask_together(cached, gated, ["a", "bb", "ccc"])
    assert all(isinstance(v, RuntimeError) for v in got)
    gated.fail = False
    assert float(cached("bb")[0]) == 2.0


def test_a_vector_cached_in_one_scope_is_never_reused_in_another() -> None:
    gated = _Gated()
    gated.release.set()
    cached = CachedQueries(gated)
    first = cached("what is the refund window?", ("northwind", "ana"))
    assert len(gated.runs) == 1
    again = cached("what is the refund window?", ("northwind", "ana"))  # the same caller: from the cache
    assert again is first and len(gated.runs) == 1
    for scope in (("southwind", "zoe"), ("northwind", "ben")):  # another org, another caller: a model run each
        other = cached("what is the refund window?", scope)
        assert other is not first and np.array_equal(other, first)
    assert len(gated.runs) == 3


def test_a_question_in_flight_in_one_scope_is_embedded_again_for_another() -> None:
    gated = _Gated()
    cached = CachedQueries(gated, max_batch=8)
    out: dict[str, np.ndarray] = {}

    def ask(scope: tuple[str, str], text: str) -> None:
        out[scope[0] + text] = cached(text, scope)

    blocker = threading.Thread(target=ask, args=(("northwind", "ana"), "first"))
    blocker.start()
    while not gated.runs:  # the first run has started and is held
        threading.Event().wait(0.001)
    askers = [threading.Thread(target=ask, args=(scope, "same question")) for scope in (("northwind", "ana"), ("southwind", "zoe"))]
    for thread in askers:
        thread.start()
    while len(cached._queue) < 2:  # both wait: one key each, nothing shared across the orgs
        threading.Event().wait(0.001)
    gated.release.set()
    for thread in [blocker, *askers]:
        thread.join(60)
    assert gated.runs[1] == ["same question", "same question"]  # one run, embedded once per org
    assert out["northwindsame question"] is not out["southwindsame question"]

