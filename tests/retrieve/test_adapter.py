"""Query adapters: fitting learns a mapping the plain embedding misses, the file refuses what does not fit,
and a call without a usable adapter still ranks, on the plain cosine, and says so in its route."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import dossier
from dossier.evaluation import adapter as adapter_fit
from dossier.evaluation.fit import prepared_call
from dossier.pipeline.features import SECTION_FEATURES
from dossier.layers.sections import section_rows
from dossier.providers import adapter as adapters

EXAMPLE = {"mode": "brief", "budget": {"totalTokens": 8000}, "record": {"email": "jane@acme.com"},
           "message": "What pricing did we discuss, and what discount rules apply?"}  # fmt: skip


def _unit(m: np.ndarray) -> np.ndarray:
    return m / np.linalg.norm(m, axis=-1, keepdims=True)


def _groups(rng: np.random.Generator, mixing: np.ndarray, n: int) -> list[adapter_fit.Group]:
    """Groups of 12 texts; each question is its gold text seen through ``mixing`` (the words a question
    uses differ from the text's), plus noise."""
    out = []
    for _ in range(n):
        texts = _unit(rng.normal(size=(12, mixing.shape[0])))
        gold = rng.integers(0, 12, size=6)
        queries = _unit(texts[gold] @ mixing.T + 0.3 * rng.normal(size=(6, mixing.shape[0])))
        out.append(adapter_fit.Group(texts.astype(np.float32), queries.astype(np.float32), tuple((int(g),) for g in gold)))
    return out


def test_a_fitted_adapter_ranks_unseen_groups_better_than_the_plain_embedding() -> None:
    rng = np.random.default_rng(7)
    d = 16
    mixing = np.linalg.qr(rng.normal(size=(d, d)))[0]  # a rotation: questions and answers point apart
    train, held_out = _groups(rng, mixing, 40), _groups(rng, mixing, 20)
    matrix = adapter_fit.fit_adapter(train, lam=1e-3)
    plain, adapted = adapter_fit.top_k(held_out, None, 1), adapter_fit.top_k(held_out, matrix, 1)
    assert plain < 0.4 and adapted > plain + 0.4, (plain, adapted)
    with pytest.raises(ValueError):
        adapter_fit.fit_adapter([])


def test_an_adapter_file_round_trips_and_refuses_what_does_not_fit(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    matrix = (np.eye(8) + 0.05 * rng.normal(size=(8, 8))).astype(np.float32)
    path = tmp_path / "adapters.npz"
    adapters.save(path, {"sections": matrix}, model_id="model-a")
    loaded = adapters._load("sections", "model-a", 8, str(path))
    assert np.allclose(loaded.matrix, matrix, atol=1e-3)
    vector = _unit(rng.normal(size=8)).astype(np.float32)
    assert np.isclose(np.linalg.norm(loaded.apply(vector)), 1.0, atol=1e-5)
    with pytest.raises(adapters.AdapterUnavailable, match="fitted on model-a"):
        adapters._load("sections", "model-b", 8, str(path))
    with pytest.raises(adapters.AdapterUnavailable, match="no memories adapter"):
        adapters._load("memories", "model-a", 8, str(path))
    with pytest.raises(adapters.AdapterUnavailable, match="shape"):
        adapters._load("sections", "model-a", 16, str(path))
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not an npz file")
    with pytest.raises(adapters.AdapterUnavailable, match="unreadable"):
        adapters._load("sections", "model-a", 8, str(broken))


def test_an_unreadable_ranker_or_adapter_file_names_no_path(
    sample_engine: dossier.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dossier.providers import ranker as rankers

    monkeypatch.setenv(rankers.FILE_ENV, str(tmp_path / "missing-ranker.json"))
    monkeypatch.setenv(adapters.FILE_ENV, str(tmp_path / "missing-adapters.npz"))
    adapters.clear_cache()
    try:
        response = sample_engine.retrieve({**EXAMPLE, "trace": True}, org="northwind", caller="ana")
        assert response.route["documents"].detail["ranker"] == "heuristic"
        assert "unreadable" in response.route["documents"].detail["adapter"]
        assert str(tmp_path) not in json.dumps(response.model_dump(mode="json"))
    finally:
        monkeypatch.delenv(adapters.FILE_ENV)
        adapters.clear_cache()


def test_the_shipped_adapters_fit_the_default_model(sample_engine: dossier.Engine) -> None:
    embedder = sample_engine.embedder
    for kind in adapters.KINDS:
        adapter = adapters.load(kind, embedder.model_id, embedder.dimensions)
        assert adapter.matrix.shape == (embedder.dimensions, embedder.dimensions)
        assert not np.allclose(adapter.matrix, np.eye(embedder.dimensions)), "a fitted adapter, not the identity"
    response = sample_engine.retrieve({**EXAMPLE, "trace": True}, org="northwind", caller="ana")
    assert response.route["documents"].detail["adapter"] == "sections"
    assert response.route["memories"].detail["adapter"] == "memories"


@pytest.mark.parametrize("setting", ["none", "corrupt"])
def test_without_a_usable_adapter_calls_rank_on_the_plain_cosine_and_say_so(
    sample_engine: dossier.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    if setting == "corrupt":
        path = tmp_path / "adapters.npz"
        path.write_bytes(b"\x00" * 64)
        monkeypatch.setenv(adapters.FILE_ENV, str(path))
    else:
        monkeypatch.setenv(adapters.FILE_ENV, "none")
    adapters.clear_cache()
    try:
        response = sample_engine.retrieve({**EXAMPLE, "trace": True}, org="northwind", caller="ana")
        assert response.route["documents"].detail["adapter"].startswith("none: ")
        assert str(tmp_path) not in json.dumps(response.model_dump(mode="json"))  # no server path reaches a caller
        assert response.route["memories"].detail["adapter"] == "none"
        assert response.sources["documents"].items and response.sources["memories"].items
        call = prepared_call(sample_engine, EXAMPLE, org="northwind", caller="ana")
        rows = section_rows(call, call.sections)
        cosine, adapted = SECTION_FEATURES.index("cosine"), SECTION_FEATURES.index("adapted")
        assert len(rows) and np.allclose(rows[:, cosine], rows[:, adapted])
    finally:
        monkeypatch.delenv(adapters.FILE_ENV)
        adapters.clear_cache()
