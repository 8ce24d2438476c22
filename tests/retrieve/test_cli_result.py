"""``dossier result`` tells why a call has no result to fetch, and the demo explains what it shows."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
from typer.testing import CliRunner, Result

import dossier
from dossier import cli
from dossier.errors import redacted_url
from dossier.stores.service_base import service_store_from_url

runner = CliRunner()
QUESTION = "What discount rules apply?"


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(cli.console, "_width", 500)
    monkeypatch.setattr(cli.err, "_width", 500)
    for name in ("DOSSIER_DATABASE_URL", "DOSSIER_LLM", "DOSSIER_RERANK"):
        monkeypatch.delenv(name, raising=False)
    yield


def run(*args: Any) -> Result:
    return runner.invoke(cli.app, [str(a) for a in args])


def call(db: str, org: str, caller: str) -> str:
    """A retrieve call through the CLI, without deferred synthesis; its call_id."""
    made = run("retrieve", "--org", org, "--caller", caller, "-m", QUESTION, "--json", "--db", db)
    assert made.exit_code == 0, made.output
    return str(json.loads(made.stdout)["call_id"])


def test_result_tells_an_unknown_call_from_one_that_was_not_deferred(fresh_engine: dossier.Engine) -> None:
    db = fresh_engine.store.url
    own = call(db, "northwind", "ana")
    audit = service_store_from_url(db)
    try:
        row = audit.get_audit(own)
    finally:
        audit.close()
    assert row is not None and (row.front_end, row.org, row.caller, row.outcome) == ("cli", "northwind", "ana", "ok")

    unknown = run("result", "0" * 32, "--org", "northwind", "--caller", "ana", "--db", db)
    assert unknown.exit_code == 1
    assert unknown.stderr == f"error: no call '{'0' * 32}' in org 'northwind' (store: {redacted_url(db)})\n"  # no password

    not_deferred = run("result", own, "--org", "northwind", "--caller", "ana", "--db", db)
    assert not_deferred.exit_code == 1 and not_deferred.stdout == ""
    [line] = not_deferred.stderr.splitlines()
    assert f"call '{own}' was not deferred" in line and "--deferred" in line

    other_caller = run("result", own, "--org", "northwind", "--caller", "ben", "--db", db)
    assert other_caller.exit_code == 1 and "no result" in other_caller.stderr and "another caller" in other_caller.stderr


def test_another_orgs_call_reads_exactly_like_an_unknown_one(fresh_engine: dossier.Engine) -> None:
    db = fresh_engine.store.url
    theirs = call(db, "southwind", "zoe")
    assert "was not deferred" in run("result", theirs, "--org", "southwind", "--caller", "zoe", "--db", db).stderr
    made_up = "f" * len(theirs)
    for caller in ("ana", "admin"):
        seen = run("result", theirs, "--org", "northwind", "--caller", caller, "--db", db)
        never = run("result", made_up, "--org", "northwind", "--caller", caller, "--db", db)
        assert (seen.exit_code, seen.stdout) == (never.exit_code, never.stdout) == (1, "")
        assert seen.stderr.replace(theirs, "ID") == never.stderr.replace(made_up, "ID")


def test_the_demo_says_what_aliases_are_and_where_empty_shares_went(sample_engine: dossier.Engine) -> None:
    response = sample_engine.retrieve(cli.EXAMPLE_CALL, org="northwind", caller="ana")
    assert response.record is not None and response.record.aliases  # the example call resolves aliases
    assert not response.budget.share.get("external")  # and external, not asked for, has no share
    aliases, budget = cli.explain(response)
    assert aliases.startswith("aliases: ") and all(a in aliases for a in response.record.aliases)
    assert "company domain" in aliases and "not merges" in aliases
    assert budget.startswith("budget: ") and "external had nothing to pack, so its share went to the others" in budget
    over = [s for s, used in response.budget.used.items() if used > response.budget.share.get(s, 0)]
    if over:
        assert f"so {', '.join(over)} used more than {'its' if len(over) == 1 else 'their'} share" in budget
