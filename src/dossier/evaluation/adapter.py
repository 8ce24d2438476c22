"""Fitting a query adapter (:mod:`dossier.providers.adapter`) on labelled questions.

Each group is one unit of a training split (a policy, a conversation, an org): the embeddings of the
texts a question chooses among, the embeddings of its questions, and for each question the positions
of the texts that answer it. The adapter ``W`` minimises the softmax loss of the gold texts among
their group's texts, scored ``tau * s . (W q)``, plus ``lam * ||W - I||^2`` so that it stays near the
plain embedding where the data says little. Fitted with L-BFGS (scipy, in the ``train`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

LAMBDA = 0.03  # chosen by 3-fold cross-validation over the PolicyQA training policies (docs/evaluation.md)
TAU = 20.0


@dataclass(frozen=True)
class Group:
    texts: np.ndarray  # (n, d) unit vectors of the texts to choose among
    queries: np.ndarray  # (m, d) unit query vectors
    gold: tuple[tuple[int, ...], ...]  # per query, the rows of ``texts`` that answer it
    weight: float = 1.0  # per question


def fit_adapter(groups: Sequence[Group], *, lam: float = LAMBDA, tau: float = TAU, max_iter: int = 300) -> np.ndarray:
    """The fitted ``(d, d)`` matrix (the identity when there is nothing to learn from)."""
    from scipy.optimize import minimize

    groups = [g for g in groups if len(g.queries) and len(g.texts)]
    if not groups:
        raise ValueError("no labelled questions to fit an adapter on")
    d = groups[0].texts.shape[1]
    total_weight = sum(g.weight * len(g.queries) for g in groups)
    eye = np.eye(d)

    def loss(flat: np.ndarray) -> tuple[float, np.ndarray]:
        w = flat.reshape(d, d)
        value, grad = 0.0, np.zeros((d, d))
        for g in groups:
            logits = tau * ((g.queries @ w.T) @ g.texts.T)
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            target = np.zeros_like(p)
            for row, gold in enumerate(g.gold):
                mass = p[row, list(gold)]
                target[row, list(gold)] = mass / mass.sum()
                value -= g.weight * float(np.log(mass.sum() + 1e-12))
            grad += g.weight * tau * ((p - target) @ g.texts).T @ g.queries
        delta = w - eye
        return value / total_weight + lam * float((delta * delta).sum()), (grad / total_weight + 2 * lam * delta).ravel()

    result = minimize(loss, eye.ravel(), jac=True, method="L-BFGS-B", options={"maxiter": max_iter})
    return np.asarray(result.x.reshape(d, d), dtype=np.float32)


def top_k(groups: Sequence[Group], matrix: np.ndarray | None, k: int) -> float:
    """Share of questions with a gold text among the first ``k`` by (adapted) cosine."""
    hits = total = 0
    for g in groups:
        queries = g.queries if matrix is None else g.queries @ matrix.T
        order = np.argsort(-(queries @ g.texts.T), axis=1)[:, :k]
        for row, gold in enumerate(g.gold):
            hits += bool(set(order[row].tolist()) & set(gold))
            total += 1
    return hits / total if total else 0.0
