"""The sample organisation (examples/), loaded once per session into a real SQLite store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

import dossier

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-org.json"


@pytest.fixture(scope="session")
def sample_bundle() -> dict:
    return json.loads(SAMPLE.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def sample_engine(tmp_path_factory: pytest.TempPathFactory, embedder) -> Iterator[dossier.Engine]:  # type: ignore[no-untyped-def]
    """Read-only use: tests that write or patch make their own engine with ``fresh_engine``."""
    path = tmp_path_factory.mktemp("sample") / "sample.db"
    with dossier.open(f"sqlite:///{path}", embedder=embedder) as engine:
        engine.load_bundle(SAMPLE)
        yield engine


@pytest.fixture
def fresh_engine(tmp_path: Path, sample_engine: dossier.Engine, embedder) -> Iterator[dossier.Engine]:  # type: ignore[no-untyped-def]
    """A private copy of the sample store (copied file: no re-embedding), free to patch or write."""
    import shutil

    source = Path(sample_engine.store.path)  # type: ignore[attr-defined]
    sample_engine.store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # type: ignore[attr-defined]
    target = tmp_path / "copy.db"
    shutil.copy(source, target)
    with dossier.open(f"sqlite:///{target}", embedder=embedder) as engine:
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
