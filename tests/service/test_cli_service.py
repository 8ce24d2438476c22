"""``dossier keys``, ``dossier usage`` and the server commands' failures, through typer's CliRunner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from typer.testing import CliRunner, Result

from dossier import cli
from dossier.service import Service

from .conftest import BRIEF, principal, table_text

runner = CliRunner()


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(cli.console, "_width", 400)
    monkeypatch.setattr(cli.err, "_width", 400)
    monkeypatch.delenv("DOSSIER_DATABASE_URL", raising=False)
    yield


def run(*args: str) -> Result:
    return runner.invoke(cli.app, [str(a) for a in args])


def test_keys_create_list_revoke(db_path: Path) -> None:
    db = f"sqlite:///{db_path}"
    made = run("keys", "create", "--org", "northwind", "--caller", "ben", "--name", "ci", "--db", db)
    assert made.exit_code == 0, made.output
    key = made.stdout.strip()
    key_id = key.split("_")[1]
    assert "shown once" in made.stderr and key not in made.stderr
    listed = run("keys", "list", "--org", "northwind", "--db", db)
    assert key_id in listed.stdout and "ben" in listed.stdout and key.split("_", 2)[2] not in listed.stdout
    assert key.split("_", 2)[2] not in table_text(db_path, "api_keys")
    assert run("keys", "revoke", key_id, "--db", db).exit_code == 0
    assert run("keys", "revoke", key_id, "--db", db).exit_code == 1  # no live key with that id: NotFound
    row = next(line for line in run("keys", "list", "--db", db).stdout.splitlines() if key_id in line)
    assert row.count("UTC") == 2  # created and revoked
    refused = run("keys", "create", "--org", "northwind", "--caller", "zoe", "--db", db)
    assert refused.exit_code == 1 and "unknown caller 'zoe'" in refused.stderr


def test_usage_reports_the_ledger(service: Service, db_path: Path) -> None:
    service.retrieve(principal("ana"), BRIEF)
    service.retrieve(principal("ana"), {**BRIEF, "depth": "deep"})
    shown = run("usage", "--org", "northwind", "--db", f"sqlite:///{db_path}")
    assert shown.exit_code == 0, shown.output
    assert "standard" in shown.stdout and "deep" in shown.stdout and "total" in shown.stdout
    as_json = json.loads(run("usage", "--org", "northwind", "--json", "--db", f"sqlite:///{db_path}").stdout)
    assert as_json["net"] == 2 + 2 and {i["item"]: i["refunded"] for i in as_json["items"]} == {"deep": 3, "standard": 0}
    assert run("usage", "--org", "northwind", "--since", "yesterday", "--db", f"sqlite:///{db_path}").exit_code == 2
    assert json.loads(run("usage", "--org", "southwind", "--json", "--db", f"sqlite:///{db_path}").stdout)["net"] == 0


def test_mcp_refuses_to_start_without_a_valid_key(db_path: Path) -> None:
    for key in ("", "dk_nope_nope"):
        env = {"DOSSIER_API_KEY": key, "DOSSIER_DATABASE_URL": f"sqlite:///{db_path}", "PATH": ""}
        done = subprocess.run([sys.executable, "-m", "dossier.cli", "mcp"], env=env, capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
        assert done.returncode == 2 and done.stdout == "" and "API key" in done.stderr


def test_serve_fails_in_one_line_when_the_store_cannot_open(tmp_path: Path) -> None:
    result = run("serve", "--db", "mysql://nowhere")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and "unknown store URL" in result.stderr
