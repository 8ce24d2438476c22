"""The sample organisation (examples/), loaded once per session into a real store of each backend.

``sample_engine`` and ``fresh_engine`` are parametrized over ``BACKENDS`` (tests/conftest.py), so every
retrieve-level test runs against SQLite and against PostgreSQL.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterator

import pytest

import dossier
from tests.conftest import BACKENDS

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-org.json"


@pytest.fixture(scope="session")
def sample_bundle() -> dict:
    return json.loads(SAMPLE.read_text(encoding="utf-8"))


@pytest.fixture(scope="session", params=BACKENDS)
def sample_source(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, embedder) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A store holding the sample org, loaded once per backend; no engine stays open on it (it is copied)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('sample') / 'sample.db'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url = server.create_database()
    with dossier.open(url, embedder=embedder) as engine:
        engine.load_bundle(SAMPLE)
    yield url
    if request.param == "postgres":
        server.drop_database(url)


def _copy(source: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A private copy of the sample store (copied, not re-embedded)."""
    if source.startswith("sqlite:///"):
        target = tmp_path / "copy.db"
        shutil.copy(source[len("sqlite:///") :], target)
        return f"sqlite:///{target}"
    from psycopg.conninfo import conninfo_to_dict

    return request.getfixturevalue("postgres_server").create_database(template=conninfo_to_dict(source)["dbname"])


@pytest.fixture(scope="session")
def sample_engine(sample_source: str, tmp_path_factory: pytest.TempPathFactory, embedder, request: pytest.FixtureRequest) -> Iterator[dossier.Engine]:  # type: ignore[no-untyped-def]
    """Read-only use: tests that write or patch make their own engine with ``fresh_engine``."""
    url = _copy(sample_source, tmp_path_factory.mktemp("sample-ro"), request)
    with dossier.open(url, embedder=embedder) as engine:
        yield engine


@pytest.fixture
def fresh_engine(sample_source: str, tmp_path: Path, embedder, request: pytest.FixtureRequest) -> Iterator[dossier.Engine]:  # type: ignore[no-untyped-def]
    """A private copy of the sample store, free to patch or write."""
    with dossier.open(_copy(sample_source, tmp_path, request), embedder=embedder) as engine:
        yield engine


def ids(response: dossier.RetrieveResponse, source: str) -> list[str]:
    from dossier.schema import item_key

    return [item_key(item) for item in response.sources[source].items]  # type: ignore[index]


def all_ids(response: dossier.RetrieveResponse) -> set[str]:
    out: set[str] = set()
    for source in response.sources:
        out.update(ids(response, source))
        for item in response.sources[source].items:
            for attr in ("document_id", "record_id", "src", "dst"):
                if hasattr(item, attr):
                    out.add(getattr(item, attr))
    if response.record:
        out.add(response.record.id)
        out.update(response.record.aliases)
    return out
