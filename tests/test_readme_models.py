"""The README's chat-model example, run against a scripted OpenAI-compatible server on localhost."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dossier.cli import app
from tests.scripted_llm import ScriptedLLM, scripted, scripted_server  # noqa: F401 - fixtures
from tests.test_readme import blocks, workdir  # noqa: F401 - fixture

pytest.importorskip("openai")


def test_model_example_runs(workdir: Path, scripted: ScriptedLLM, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    [block] = [b for b in blocks("sh") if "export OPENAI_BASE_URL" in b]
    scripted.on("synthesize", {"answer": "Discounts above 15% need approval [D1].", "confidence": 0.7, "sources_used": ["D1"]})
    runner = CliRunner()
    assert runner.invoke(app, ["load", "examples/sample-org.json"]).exit_code == 0
    call_id = None
    for line in block.strip().splitlines():
        command = line.split("#")[0].strip()
        args = shlex.split(command)
        if args[0] == "export":
            for assignment in args[1:]:
                name, value = assignment.split("=", 1)
                monkeypatch.setenv(name, scripted.base_url if name == "OPENAI_BASE_URL" else value)
            continue
        assert args[0] == "dossier"
        args = [call_id if a == "CALL_ID" else a for a in args[1:]]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, f"{command}\n{result.output}"
        if "--json" in args:
            call_id = json.loads(result.stdout)["call_id"]
        if args[0] == "result":
            assert "Discounts above 15% need approval [D1]." in result.stdout
    assert {"filters", "rephrase", "synthesize"} <= set(scripted.steps())
    assert all(body["model"] == "qwen2.5:7b-instruct" for body in scripted.bodies())
