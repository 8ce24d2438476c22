"""Liveness, readiness, and what a store that cannot be written does to calls: ``dossier serve`` in a
process of its own, on a real socket, whose store then really cannot be written.

A test cannot fill a disk, so it does what a full disk does to SQLite from the outside: it lowers the
server process's limit on file size (``RLIMIT_FSIZE``, through ``prlimit``) to 0, after the server
started. Every write of that process to the store's files then fails in the kernel (``EFBIG``, which
SQLite reports as a disk I/O error) while reads go on, as on a full disk; raising the limit again is the
disk freed."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

import dossier
from dossier.service import Service

from .conftest import BRIEF, free_port

pytestmark = pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs Linux prlimit")


@pytest.fixture
def served(db_path: Path, embedder) -> Iterator[tuple[subprocess.Popen[str], httpx.Client, dict[str, str]]]:  # type: ignore[no-untyped-def]
    with dossier.open(f"sqlite:///{db_path}", embedder=embedder) as engine:
        key = Service(engine).create_key("northwind", "ana")[1]
    port = free_port()
    env = {**os.environ, "DOSSIER_DATABASE_URL": f"sqlite:///{db_path}"}
    proc = subprocess.Popen([sys.executable, "-m", "dossier.cli", "serve", "--port", str(port), "--no-access-log"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(proc.stderr or []), daemon=True)  # a pipe never fills
    reader.start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if client.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("dossier serve did not start:\n" + "".join(log))
            time.sleep(0.2)
        yield proc, client, {"Authorization": f"Bearer {key}"}
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=30)


def test_readyz_shows_a_store_that_cannot_be_written_and_no_call_answers_without_its_ledger_and_audit(
    served: tuple[subprocess.Popen[str], httpx.Client, dict[str, str]],
) -> None:
    proc, http, ana = served
    assert http.get("/readyz").json() == {"status": "ready"}
    assert http.post("/v1/retrieve", json=BRIEF, headers=ana).status_code == 200
    usage_before = http.get("/v1/usage", headers=ana).json()
    soft, hard = resource.prlimit(proc.pid, resource.RLIMIT_FSIZE)
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (0, hard))  # from now on its files cannot grow: a full disk
    try:
        assert http.get("/healthz").json() == {"status": "ok"}  # liveness: the process answers
        ready = http.get("/readyz")
        assert ready.status_code == 503
        assert set(ready.json()) == {"detail"} and ready.json()["detail"]["message"].startswith("not ready")
        assert "I/O" in ready.json()["detail"]["message"] or "full" in ready.json()["detail"]["message"]
        # the call cannot be charged, so it does not run: 503, and nothing of the org's data goes out
        call = http.post("/v1/retrieve", json=BRIEF, headers=ana)
        assert call.status_code == 503, call.text
        assert set(call.json()) == {"detail"} and "jane" not in call.text.lower()
        # reads of the service tables and refusals go on; a refusal releases nothing, so its audit row may fail
        assert http.get("/v1/usage", headers=ana).json() == usage_before
        assert http.post("/v1/retrieve", json={**BRIEF, "trace": "yes"}, headers=ana).status_code == 422
        memory = {"record": "rec-jane", "text": "Asked for a call back on Friday.", "id": "mem-full-disk"}
        written = http.post("/v1/memories", json=memory, headers=ana)
        assert written.status_code == 503 and set(written.json()) == {"detail"}, written.text
        assert http.get("/readyz").status_code == 503  # still: the failed writes left no transaction open
    finally:
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (soft, hard))  # the disk is freed
    assert http.get("/readyz").json() == {"status": "ready"}
    assert http.post("/v1/memories", json=memory, headers=ana).status_code == 200  # written now, once
    after = http.post("/v1/retrieve", json=BRIEF, headers=ana)
    assert after.status_code == 200 and after.json()["record"]["id"] == "rec-jane"
    usage = http.get("/v1/usage", headers=ana).json()
    assert usage["net"] == usage_before["net"] + 2  # the refused call was never charged
    call_id = after.json()["call_id"]
    assert json.loads(json.dumps(http.get(f"/v1/calls/{call_id}", headers=ana).json()))["status"] == "ok"
