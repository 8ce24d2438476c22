"""Shared fixtures: the real embedding model (loaded once), a store per backend, an engine.

To run the store contract against another backend, add its name to ``BACKENDS`` and one branch to
``_open_store``; every test that takes ``store`` (or ``open_store``) then runs against it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

import dossier
from dossier.providers.embeddings import OnnxMiniLM
from dossier.stores.base import Store
from dossier.stores.sqlite import SQLiteStore

BACKENDS = ["sqlite"]


def _open_store(backend: str, tmp_path: Path) -> Store:
    """A new handle on the one database this test owns (a second call = another process)."""
    if backend == "sqlite":
        return SQLiteStore(tmp_path / "s.db")
    raise ValueError(f"unknown backend {backend!r}")


@pytest.fixture(scope="session")
def embedder() -> OnnxMiniLM:
    return OnnxMiniLM()


@pytest.fixture(params=BACKENDS)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens handles on this test's database; every handle is closed after the test."""
    handles: list[Store] = []

    def open_() -> Store:
        handles.append(_open_store(request.param, tmp_path))
        return handles[-1]

    yield open_
    for handle in handles:
        handle.close()


@pytest.fixture
def store(open_store: Callable[[], Store]) -> Store:
    return open_store()


@pytest.fixture
def engine(tmp_path: Path, embedder: OnnxMiniLM) -> Iterator[dossier.Engine]:
    with dossier.open(f"sqlite:///{tmp_path}/e.db", embedder=embedder) as engine:
        yield engine
