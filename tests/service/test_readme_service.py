"""The README's HTTP and MCP sections, run as written: keys, `dossier serve` in a subprocess, the curl
call, the usage commands, and both MCP host configurations (stdio and streamable HTTP)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from typer.testing import CliRunner

from dossier.cli import app

from .conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
runner = CliRunner()


def section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def commands(block: str) -> list[str]:
    joined = block.replace("\\\n", " ")
    return [line.split(" #")[0].strip() for line in joined.strip().splitlines() if line.split(" #")[0].strip()]


@pytest.fixture
def served(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The README's key and serve commands, run as written (the port swapped for a free one)."""
    url = f"sqlite:///{db_path}"
    monkeypatch.setenv("DOSSIER_DATABASE_URL", url)
    [setup, _curl, usage] = blocks(section("HTTP"), "sh")
    create, serve = commands(setup)
    assignment, _, command = create.partition("=$(")
    assert assignment == "KEY"
    result = runner.invoke(app, shlex.split(command.rstrip(")"))[1:])
    assert result.exit_code == 0, result.output
    key = result.stdout.strip()
    assert key.startswith("dk_") and "\n" not in key
    port = free_port()
    args = [a if a != "8000" else str(port) for a in shlex.split(serve)]
    assert args[:2] == ["dossier", "serve"] and str(port) in args
    env = {**os.environ, "DOSSIER_DATABASE_URL": url}
    server = subprocess.Popen([sys.executable, "-m", "dossier.cli", *args[1:]], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
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
        yield {"key": key, "port": port, "base": base, "url": url, "usage": usage}
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_http_section_runs_as_written(served: dict[str, Any]) -> None:
    [curl] = commands(blocks(section("HTTP"), "sh")[1])
    curl = curl.replace(":8000/", f":{served['port']}/")
    if shutil.which("curl"):
        done = subprocess.run(["bash", "-c", curl], env={**os.environ, "KEY": served["key"]}, capture_output=True,
                              text=True, timeout=60, check=True)  # fmt: skip
        body = json.loads(done.stdout)
    else:  # the same request, made with httpx
        args = shlex.split(curl.replace("$KEY", served["key"]))
        url = next(a for a in args if a.startswith("http"))
        headers = dict(args[i + 1].split(": ", 1) for i, a in enumerate(args) if a == "-H")
        body = httpx.post(url, content=args[args.index("-d") + 1], headers=headers, timeout=60).json()
    assert body["record"]["id"] == "rec-jane" and body["sources"]["documents"]["items"]
    for command in commands(served["usage"]):
        result = runner.invoke(app, shlex.split(command)[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"
        assert "standard" in result.stdout or "ana" in result.stdout


def list_tools(server: Any, headers: dict[str, str] | None = None) -> set[str]:
    async def run() -> set[str]:
        if headers is None:
            async with Client(server, read_timeout_seconds=120) as client:
                return {t.name for t in (await client.list_tools()).tools}
        async with create_mcp_http_client(headers=headers) as http:
            async with Client(streamable_http_client(server, http_client=http)) as client:
                return {t.name for t in (await client.list_tools()).tools}

    return asyncio.run(run())


def test_the_mcp_host_configurations_connect(served: dict[str, Any]) -> None:
    stdio, remote = (json.loads(b)["mcpServers"]["dossier"] for b in blocks(section("MCP"), "json"))
    dossier_bin = Path(sys.executable).parent / "dossier"
    assert stdio["command"].endswith("/bin/dossier") and stdio["args"] == ["mcp"]
    env = {**stdio["env"], "DOSSIER_API_KEY": served["key"], "DOSSIER_DATABASE_URL": served["url"]}
    params = StdioServerParameters(command=str(dossier_bin), args=stdio["args"], env=env)
    tools = {"retrieve_unified", "remember", "add_document", "feedback"}
    assert list_tools(params) == tools
    url = remote["url"].replace(":8000/", f":{served['port']}/")
    headers = {k: v.replace("dk_...", served["key"]) for k, v in remote["headers"].items()}
    assert remote["type"] == "http" and list_tools(url, headers) == tools
