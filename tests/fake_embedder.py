"""A deterministic stand-in for the embedding model, for fast unit tests of the layers.

Each content word is hashed to a signed position in a 64-dimensional vector; a text's vector is the
normalised sum of its words'. Texts sharing words are close, texts sharing none are near orthogonal:
enough for the layers' logic (thresholds, fusion, budgets, governance) to have something to rank,
nothing like a real model's meaning. The real model stays in the integration tests (``embedder``).
"""

from __future__ import annotations

import hashlib
import re
from typing import Sequence

import numpy as np

from dossier.providers.embeddings import Embedder, InputKind

_WORD = re.compile(r"[a-z0-9]+")


class HashEmbedder(Embedder):
    model_id = "hash-test"
    dimensions = 64

    def embed_batch(self, texts: Sequence[str], *, kind: InputKind = "document") -> np.ndarray:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.lower()):
                digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
                position = int.from_bytes(digest[:2], "little") % self.dimensions
                out[row, position] += 1.0 if digest[2] % 2 else -1.0
            norm = float(np.linalg.norm(out[row]))
            if norm == 0.0:
                out[row, 0] = norm = 1.0
            out[row] /= norm
        return out
