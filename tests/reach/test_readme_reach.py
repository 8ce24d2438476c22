"""The README's client and adapter snippets, run as written against a real ``dossier serve`` (its URL swapped
in for the README's, the key given as ``DOSSIER_API_KEY``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import Served

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def python_blocks(title: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", section(title), flags=re.S)


def run(code: str, served: Served, monkeypatch: pytest.MonkeyPatch, caller: str = "ana") -> None:
    assert "http://127.0.0.1:8000" in code
    monkeypatch.setenv("DOSSIER_API_KEY", served.keys[caller])
    exec(compile(code.replace("http://127.0.0.1:8000", served.url), "README.md", "exec"), {})  # noqa: S102


def test_the_client_snippet_runs(served: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    [code] = python_blocks("Python client")
    run(code, served, monkeypatch)
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(" > " in line for line in lines)  # a section: title > heading score


def test_the_adapter_snippets_run(served: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    langchain, llama = python_blocks("Framework adapters")
    assert "integrations.langchain" in langchain and "integrations.llama_index" in llama
    run(langchain, served, monkeypatch)
    out = capsys.readouterr().out.splitlines()
    assert {line.split()[0] for line in out} >= {"properties", "memories", "documents"}  # scout: the inferred mode
    assert any(line.startswith("documents ") and " > " in line for line in out)
    run(llama, served, monkeypatch)
    out = capsys.readouterr().out.splitlines()
    sources = {line.split()[1] for line in out}
    assert "documents" in sources and "graph" not in sources
    assert any("documents" in line and " > " in line for line in out)


def test_the_readme_says_how_ci_gets_its_browser() -> None:
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text(encoding="utf-8")
    assert "apt-get install -y -q chromium chromium-driver" in ci
    assert "apt-get install -y chromium chromium-driver" in README and ".ci/run" in README
    assert "/inspect?call=" in section("Inspector")
