"""Shared fixtures: the real embedding model (loaded once), a store per backend, an engine.

To run the store contract against another backend, add its name to ``BACKENDS`` and one branch to
``store_url``; every test that takes ``store`` (or ``open_store``) then runs against it too.

PostgreSQL is a real server (``tests/postgres_server.py``): ``DOSSIER_DATABASE_URL`` if it names one,
else a throwaway pgserver started on first use; each test gets a database of its own.

Markers, set here at collection: ``postgres`` on every test that runs against PostgreSQL, ``slow`` on
every test that loads the real embedding model, starts a server, a subprocess or a browser, or runs an
evaluation set. ``pytest -m "not slow and not postgres"`` is the fast subset for development (the
layers' unit tests run on :class:`tests.fake_embedder.HashEmbedder`); ``pytest`` runs everything.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import pytest

import dossier
from dossier.providers.embeddings import OnnxMiniLM
from dossier.stores import store_from_url
from dossier.stores.base import Store

if TYPE_CHECKING:
    from tests.postgres_server import TestServer

BACKENDS = ["sqlite", "postgres"]

# fixtures that load the real model, a server or a subprocess: a test that uses one (directly or through
# another fixture) is slow
SLOW_FIXTURES = {"embedder", "postgres_server", "live", "served", "server", "sample_engine", "fresh_engine", "sample_source"}
# modules whose tests open engines with the default (real) model, run subprocesses or evaluation sets
SLOW_MODULES = {
    "tests/test_cli.py", "tests/test_cli_friction.py", "tests/test_readme.py", "tests/test_readme_models.py",
    "tests/test_loading.py", "tests/test_public_api.py", "tests/evaluation/test_external.py",
    "tests/evaluation/test_handbook_set.py", "tests/evaluation/test_runner.py", "tests/evaluation/test_store_parity.py",
    "tests/evaluation/test_report_html.py", "tests/providers/test_embeddings.py",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        params = {str(v) for v in callspec.params.values()} if callspec is not None else set()
        if "postgres_server" in names or "postgres" in params:
            item.add_marker(pytest.mark.postgres)
        module = item.nodeid.split("::", 1)[0]
        if names & SLOW_FIXTURES or module in SLOW_MODULES or module.startswith(("tests/service/", "tests/reach/")):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def embedder() -> OnnxMiniLM:
    return OnnxMiniLM()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator["TestServer"]:
    """The session's PostgreSQL server, started on first use."""
    from tests.postgres_server import start

    server = start()
    yield server
    server.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def store_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a new, empty store that this test owns."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path}/s.db"
    elif backend == "postgres":
        server = request.getfixturevalue("postgres_server")
        url = server.create_database()
        yield url
        server.drop_database(url)
    else:
        raise ValueError(f"unknown backend {backend!r}")


@pytest.fixture
def open_store(store_url: str) -> Iterator[Callable[[], Store]]:
    """Opens handles on this test's database (a second handle = another process); all closed after the test."""
    handles: list[Store] = []

    def open_() -> Store:
        handles.append(store_from_url(store_url))
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
