"""A real ``dossier serve`` (a subprocess, on a free port of 127.0.0.1) over a private copy of the sample
organisation, with keys for its callers: the server the inspector, the client and the adapters talk to."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

for _extra in ("fastapi", "uvicorn", "httpx"):  # the [server] extra (pulled in by [dev])
    pytest.importorskip(_extra)

import httpx  # noqa: E402

import dossier  # noqa: E402
from dossier.providers.embeddings import OnnxMiniLM  # noqa: E402
from dossier.service import Service  # noqa: E402
from tests.service.conftest import BRIEF, CALLERS, SAMPLE, _copy, free_port, item_keys, sample_db  # noqa: E402, F401

__all__ = ["BRIEF", "CALLERS", "SAMPLE", "Served", "item_keys", "serve"]


@dataclass
class Served:
    """A running ``dossier serve``: its base URL, its store's URL and a key per caller of the sample."""

    url: str
    store_url: str
    keys: dict[str, str] = field(default_factory=dict)


def keys_for(store_url: str, embedder: OnnxMiniLM) -> dict[str, str]:
    with dossier.open(store_url, embedder=embedder) as engine:
        service = Service(engine)
        return {caller: service.create_key(org, caller)[1] for caller, org in CALLERS.items()}


def serve(store_url: str, **env_vars: str) -> Iterator[str]:
    """Run ``dossier serve`` on ``store_url`` until the generator is closed; yields its base URL. No chat
    model unless ``env_vars`` name one."""
    port = free_port()
    env = {**os.environ, "DOSSIER_DATABASE_URL": store_url, "DOSSIER_LLM": "none", **env_vars}
    server = subprocess.Popen(
        [sys.executable, "-m", "dossier.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-access-log"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"dossier serve did not start: {server.stderr.read().decode() if server.stderr else ''}")
        time.sleep(0.3)
    try:
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, sample_db: Path, embedder: OnnxMiniLM) -> Iterator[Served]:
    """``dossier serve`` over a private SQLite copy of the sample."""
    path = _copy(sample_db, tmp_path_factory.mktemp("reach") / "reach.db")
    store_url = f"sqlite:///{path}"
    keys = keys_for(store_url, embedder)
    for base in serve(store_url):
        yield Served(url=base, store_url=store_url, keys=keys)


@pytest.fixture
def engine_of(embedder: OnnxMiniLM) -> Iterator[Callable[[str], dossier.Engine]]:
    """Opens an engine on a served store (another handle on the same database), closed after the test."""
    opened: list[dossier.Engine] = []

    def open_(store_url: str) -> dossier.Engine:
        opened.append(dossier.open(store_url, embedder=embedder))
        return opened[-1]

    yield open_
    for engine in opened:
        engine.close()
