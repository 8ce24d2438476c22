"""Every README code block that a user would run is exercised here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dossier.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DOSSIER_DATABASE_URL", raising=False)
    return tmp_path


def test_python_example_runs(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [code] = [b for b in blocks("python") if "dossier.open" in b]
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own example
    out = capsys.readouterr().out
    assert ">" in out and "{" in out  # a section line, then the budget dict


def test_cli_examples_run(workdir: Path) -> None:
    [cli_block] = [b for b in blocks("sh") if "dossier load" in b]
    runner = CliRunner()
    for line in cli_block.strip().splitlines():
        command = line.split("#")[0].strip()
        if not command:
            continue
        args = shlex.split(command)
        assert args[0] == "dossier"
        if args[1] == "calibrate":
            continue  # minutes of work; covered by tests/evaluation/test_runner.py on a subset
        result = runner.invoke(app, args[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"


def test_the_two_setup_commands_are_there() -> None:
    sh = blocks("sh")
    assert any("pip install -e . && dossier demo" in b for b in sh)
    assert any('pip install -e ".[dev]" && pytest' in b for b in sh)
    assert "pytest" in (ROOT / ".ci" / "run").read_text()
