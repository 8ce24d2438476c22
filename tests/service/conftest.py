"""The sample organisation behind the service: in-process (``service``) and over real sockets (``live``).

``live`` runs the real app (HTTP API and MCP at /mcp) under uvicorn in a thread on a free port of
127.0.0.1, over a private copy of the sample store; keys for callers of both orgs are made up front.
"""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

for _extra in ("fastapi", "uvicorn", "mcp"):  # the [server] extra (pulled in by [dev])
    pytest.importorskip(_extra)

import uvicorn  # noqa: E402

import dossier  # noqa: E402
from dossier.http import create_app  # noqa: E402
from dossier.schema import item_key  # noqa: E402
from dossier.service import Principal, Service  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample-org.json"
CALLERS = {"ana": "northwind", "ben": "northwind", "admin": "northwind", "zoe": "southwind", "b-admin": "southwind"}
BRIEF = {
    "mode": "brief",
    "record": {"email": "jane@acme.com"},
    "message": "What pricing did we discuss, and what discount rules apply?",
    "budget": {"totalTokens": 8000},
}


def org_ids(org: str) -> set[str]:
    """Every id the sample bundle gives to ``org``'s items (records, memories, documents, sections, edges)."""
    bundle = json.loads(SAMPLE.read_text(encoding="utf-8"))
    out: set[str] = set()
    for kind in ("records", "memories", "documents", "edges"):
        for item in bundle[kind]:
            if item["org"] == org:
                out.add(item["id"])
                out.update(s["id"] for s in item.get("sections", []))
    return out


def response_ids(response: dict[str, Any] | dossier.RetrieveResponse) -> set[str]:
    """Every id a response names: items, the records and documents they belong to, the resolved record."""
    data = response if isinstance(response, dict) else response.model_dump(mode="json")
    out: set[str] = set()
    for source in data["sources"].values():
        for item in source["items"]:
            for attr in ("id", "section_id", "document_id", "record_id", "src", "dst"):
                if item.get(attr):
                    out.add(item[attr])
    if data.get("record"):
        out.add(data["record"]["id"])
        out.update(data["record"]["aliases"])
    return out


def item_keys(response: dict[str, Any] | dossier.RetrieveResponse) -> dict[str, list[str]]:
    parsed = response if isinstance(response, dossier.RetrieveResponse) else dossier.RetrieveResponse.model_validate(response)
    return {s: [item_key(i) for i in r.items] for s, r in parsed.sources.items()}


def table_text(db: Path, table: str) -> str:
    """Every column of every row of ``table``, as one string."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(f"SELECT * FROM {table}").fetchall()  # noqa: S608 - test helper, fixed names
    return "\n".join("|".join("" if v is None else str(v) for v in row) for row in rows)


@pytest.fixture(scope="session")
def sample_db(tmp_path_factory: pytest.TempPathFactory, embedder) -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("service-sample") / "sample.db"
    with dossier.open(f"sqlite:///{path}", embedder=embedder) as engine:
        engine.load_bundle(SAMPLE)
    return path


def _copy(sample_db: Path, target: Path) -> Path:
    shutil.copy(sample_db, target)
    return target


@pytest.fixture
def db_path(tmp_path: Path, sample_db: Path) -> Path:
    """A private copy of the sample store (no re-embedding)."""
    return _copy(sample_db, tmp_path / "service.db")


@pytest.fixture
def sample(db_path: Path, embedder) -> Iterator[dossier.Engine]:  # type: ignore[no-untyped-def]
    with dossier.open(f"sqlite:///{db_path}", embedder=embedder) as engine:
        yield engine


@pytest.fixture
def service(sample: dossier.Engine) -> Service:
    return Service(sample)


def principal(caller: str) -> Principal:
    return Principal(org=CALLERS[caller], caller=caller, key_id=None)


@dataclass
class Live:
    url: str
    db: Path
    engine: dossier.Engine
    service: Service
    keys: dict[str, str] = field(default_factory=dict)

    def auth(self, caller: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[caller]}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, sample_db: Path, embedder) -> Iterator[Live]:  # type: ignore[no-untyped-def]
    """The app on a real socket: uvicorn in a thread, on 127.0.0.1, over a private copy of the sample."""
    path = _copy(sample_db, tmp_path_factory.mktemp("live") / "live.db")
    engine = dossier.open(f"sqlite:///{path}", embedder=embedder)
    service = Service(engine)
    keys = {caller: service.create_key(org, caller)[1] for caller, org in CALLERS.items()}
    port = free_port()
    app = create_app(service, allowed_hosts=["127.0.0.1:*", "localhost:*"])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield Live(url=f"http://127.0.0.1:{port}", db=path, engine=engine, service=service, keys=keys)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        engine.close()
