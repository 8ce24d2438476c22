"""The ``dossier`` command line, driven in-process through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from typer.testing import CliRunner, Result

import dossier
from dossier import cli
from dossier.errors import UsageError
from dossier.layers.synthesize import NO_MODEL
from dossier.stores.sqlite import SQLiteStore
from tests.test_loading import HANDBOOK, bundle

runner = CliRunner()


@pytest.fixture(autouse=True)
def console_width(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fixed, wide console: the output does not depend on the terminal the tests run in."""
    monkeypatch.setattr(cli.console, "_width", 500)
    monkeypatch.setattr(cli.err, "_width", 500)
    for name in ("DOSSIER_DATABASE_URL", "DOSSIER_LLM"):
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/cli.db"


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


def run(*args: str, **kw: Any) -> Result:
    return runner.invoke(cli.app, [str(a) for a in args], catch_exceptions=False, **kw)


def _counts(db: str) -> dict[str, int]:
    store = SQLiteStore(db[len("sqlite:///") :])
    try:
        return store.counts(org="acme")
    finally:
        store.close()


def test_load_twice_is_idempotent(tmp_path: Path, db: str) -> None:
    path = _write(tmp_path / "bundle.json", bundle())
    first = run("load", path, "--db", db)
    assert first.exit_code == 0, first.output
    assert "embedded 7 text(s); inserted 8, updated 0" in first.stdout
    second = run("load", path, "--db", db)
    assert second.exit_code == 0, second.output
    assert "embedded 0 text(s); inserted 0, updated 0" in second.stdout
    assert _counts(db)["vectors"] == 7


def test_the_database_url_comes_from_the_environment(tmp_path: Path, db: str) -> None:
    path = _write(tmp_path / "bundle.json", bundle())
    assert run("load", path, env={"DOSSIER_DATABASE_URL": db}).exit_code == 0
    assert _counts(db)["records"] == 2
    stats = run("stats", env={"DOSSIER_DATABASE_URL": db})
    assert stats.exit_code == 0 and "acme" in stats.stdout


def test_a_broken_bundle_exits_2_with_one_line_per_problem_and_loads_nothing(tmp_path: Path, db: str) -> None:
    assert run("load", _write(tmp_path / "good.json", bundle()), "--db", db).exit_code == 0
    stats_before = run("stats", "--db", db).stdout
    counts_before = _counts(db)
    broken = bundle()
    broken["records"].append({"id": "r-new", "org": "acme", "kind": "contact"})  # valid, must not be written
    broken["memories"].append({"id": "m-lost", "org": "acme", "record": "r-ghost", "text": "Hi.",
                               "created_at": "2024-01-01T00:00:00Z"})  # fmt: skip
    broken["edges"].append({"id": "e-lost", "org": "acme", "src": "r-jane", "dst": "r-nobody", "type": "knows"})
    result = run("load", _write(tmp_path / "broken.json", broken), "--db", db)
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2
    assert "m-lost" in errors[0] and "r-ghost" in errors[0]
    assert "e-lost" in errors[1] and "r-nobody" in errors[1]
    assert result.stdout == ""
    assert run("stats", "--db", db).stdout == stats_before
    assert _counts(db) == counts_before


def test_an_invalid_item_is_named_on_its_line(tmp_path: Path, db: str) -> None:
    broken = bundle()
    broken["records"][0]["identifiers"]["email"] = "jane-at-acme"
    broken["records"][1]["kind"] = "robot"
    result = run("load", _write(tmp_path / "broken.json", broken), "--db", db)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert [line.split(":")[1].strip() for line in lines if line.startswith("error:")] == ["record r-jane", "record r-acme"]


def test_a_long_problem_stays_on_one_line_in_an_80_column_console(
    tmp_path: Path, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli.err, "_width", 80)
    broken = bundle()
    broken["memories"].append({"id": "memory-imported-from-crm-000123", "org": "acme", "record": "record-that-is-not-there",
                               "text": "Hi.", "created_at": "2024-01-01T00:00:00Z"})  # fmt: skip
    result = run("load", _write(tmp_path / "broken.json", broken), "--db", db)
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 2  # the problem, then "nothing was loaded"


def test_a_missing_file_exits_2_with_one_line(tmp_path: Path, db: str) -> None:
    result = run("load", tmp_path / "missing.json", "--db", db)
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("error:") and "missing.json" in line
    assert run("load", _write(tmp_path / "bundle.json", bundle()), "--db", db).exit_code == 0
    add = run("add-doc", tmp_path / "missing.md", "--org", "acme", "--db", db)
    assert add.exit_code == 2
    [line] = add.stderr.splitlines()
    assert "missing.md" in line


def test_add_doc_loads_markdown_with_its_options(tmp_path: Path, db: str) -> None:
    assert run("load", _write(tmp_path / "bundle.json", bundle()), "--db", db).exit_code == 0
    path = tmp_path / "returns.md"
    path.write_text(HANDBOOK)
    args = ("add-doc", path, "--org", "acme", "--title", "Returns", "--type", "policy", "--tags", "a, b,", "--db", db)
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "embedded 4 text(s); inserted 1, updated 0" in result.stdout
    store = SQLiteStore(db[len("sqlite:///") :])
    try:
        [doc] = store.get_documents(["returns"], org="acme")
    finally:
        store.close()
    assert (doc.title, doc.doc_type, doc.tags, doc.visible_to_roles) == ("Returns", "policy", ("a", "b"), None)
    assert [s.heading for s in doc.sections] == ["Introduction", "Refunds", "Partial refunds", "Shipping damage"]
    assert "embedded 0 text(s); inserted 0, updated 0" in run(*args).stdout


def test_re_adding_a_restricted_document_without_its_roles_does_not_widen_it(tmp_path: Path, db: str) -> None:
    assert run("load", _write(tmp_path / "bundle.json", bundle()), "--db", db).exit_code == 0
    path = tmp_path / "salary.md"
    path.write_text("# Salary Bands\n\n## Bands\n\nL5 is 180k.\n")

    def roles() -> tuple[str, ...] | None:
        store = SQLiteStore(db[len("sqlite:///") :])
        try:
            [doc] = store.get_documents(["salary-bands"], org="acme")
            return doc.visible_to_roles
        finally:
            store.close()

    assert run("add-doc", path, "--org", "acme", "--roles", "finance", "--db", db).exit_code == 0
    path.write_text("# Salary Bands\n\n## Bands\n\nL5 is 185k.\n")
    refused = run("add-doc", path, "--org", "acme", "--db", db)
    assert refused.exit_code == 2
    [line] = refused.stderr.splitlines()
    assert "--roles finance" in line and "--org-wide" in line
    assert roles() == ("finance",)
    assert run("add-doc", path, "--org", "acme", "--roles", "finance", "--db", db).exit_code == 0
    assert roles() == ("finance",)
    assert run("add-doc", path, "--org", "acme", "--roles", "finance", "--org-wide", "--db", db).exit_code == 2
    assert run("add-doc", path, "--org", "acme", "--org-wide", "--db", db).exit_code == 0
    assert roles() is None


def test_a_load_that_fails_into_a_new_store_leaves_no_store_behind(tmp_path: Path, db: str) -> None:
    broken = bundle()
    broken["memories"][0]["record"] = "r-ghost"
    result = run("load", _write(tmp_path / "broken.json", broken), "--db", db)
    assert result.exit_code == 2
    assert list(tmp_path.iterdir()) == [tmp_path / "broken.json"], "a failed load left a new, empty store"
    assert run("load", _write(tmp_path / "good.json", bundle()), "--db", db).exit_code == 0
    assert run("load", tmp_path / "broken.json", "--db", db).exit_code == 2
    assert _counts(db)["records"] == 2  # a store that was there before stays, untouched


def test_a_failed_load_never_removes_a_new_store_another_process_has_open(tmp_path: Path, db: str) -> None:
    """A load that fails into a new path removes the store it made, but not while another process has it open
    (a second load into the same new path, which may be writing), and never one holding an org."""
    import subprocess
    import sys

    path = Path(db[len("sqlite:///") :])
    dossier.open(db).close()  # the empty store a failed load leaves
    holder = subprocess.Popen(  # another process has it open, as a second load does while it embeds
        [sys.executable, "-c", "import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1]); "
         "db.execute('SELECT count(*) FROM orgs').fetchall(); print('open', flush=True); time.sleep(60)", str(path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        cli._remove_unused_store(path)
        assert path.exists(), "removed a store another process has open"
    finally:
        holder.kill()
        holder.wait()
    assert run("load", _write(tmp_path / "good.json", bundle()), "--db", db).exit_code == 0
    cli._remove_unused_store(path)
    assert path.exists() and _counts(db)["records"] == 2  # it holds an org: kept
    empty = tmp_path / "empty.db"
    dossier.open(f"sqlite:///{empty}").close()
    cli._remove_unused_store(empty)
    assert not empty.exists()  # unused and empty: removed


def test_add_doc_of_a_file_that_is_not_utf8_exits_2_with_one_line(tmp_path: Path, db: str) -> None:
    assert run("load", _write(tmp_path / "bundle.json", bundle()), "--db", db).exit_code == 0
    path = tmp_path / "bin.md"
    path.write_bytes(b"# T\n\xff\xfe x")
    result = run("add-doc", path, "--org", "acme", "--db", db)
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert line == f"error: {path} is not UTF-8 text (byte 4)"
    with dossier.open(db) as engine, pytest.raises(UsageError, match="is not UTF-8 text"):
        engine.add_markdown(path, org="acme")


def test_add_doc_into_a_store_that_is_not_there_creates_none(tmp_path: Path, db: str) -> None:
    path = tmp_path / "returns.md"
    path.write_text(HANDBOOK)
    result = run("add-doc", path, "--org", "acme", "--db", db)
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("error: no store at ") and "cli.db" in line
    assert list(tmp_path.iterdir()) == [path]


def test_add_doc_with_roles_that_name_no_role_is_refused(tmp_path: Path, db: str) -> None:
    assert run("load", _write(tmp_path / "bundle.json", bundle()), "--db", db).exit_code == 0
    path = tmp_path / "returns.md"
    path.write_text(HANDBOOK)
    before = SQLiteStore(db.removeprefix("sqlite:///")).counts(org="acme")["documents"]
    for roles in ("", " , "):  # an empty list would hide the document from every caller
        result = run("add-doc", path, "--org", "acme", "--roles", roles, "--db", db)
        assert result.exit_code == 2
        [line] = result.stderr.splitlines()
        assert "--roles names no role" in line
    assert SQLiteStore(db.removeprefix("sqlite:///")).counts(org="acme")["documents"] == before


def test_add_doc_into_an_unknown_org_exits_2(tmp_path: Path, db: str) -> None:
    assert run("load", _write(tmp_path / "bundle.json", bundle()), "--db", db).exit_code == 0
    path = tmp_path / "returns.md"
    path.write_text(HANDBOOK)
    result = run("add-doc", path, "--org", "nowhere", "--db", db)
    assert result.exit_code == 2
    assert "returns-handbook" in result.stderr and "nowhere" in result.stderr


@pytest.mark.parametrize("message", ["discounts?", None], ids=["no model", "no model nor message"])
def test_result_of_a_deferred_call_refused_up_front_prints_the_refusal_and_exits_0(
    tmp_path: Path, db: str, message: str | None
) -> None:
    assert run("load", _write(tmp_path / "bundle.json", bundle()), "--db", db).exit_code == 0
    ask = ["retrieve", "--org", "acme", "--caller", "c-sales", "--email", "jane@acme.com", "--synthesize", "--deferred",
           "--json", "--db", db, *(["-m", message] if message else [])]  # fmt: skip
    called = run(*ask)
    assert called.exit_code == 0, called.output
    response = json.loads(called.stdout)
    assert response["synthesis"] == {**response["synthesis"], "pending": False, "error": NO_MODEL}
    fetched = run("result", response["call_id"], "--org", "acme", "--caller", "c-sales", "--db", db)
    assert fetched.exit_code == 0, fetched.output
    assert fetched.stdout.strip() == f"call {response['call_id']}: no answer ({NO_MODEL})"
    as_json = run("result", response["call_id"], "--org", "acme", "--caller", "c-sales", "--json", "--db", db)
    assert json.loads(as_json.stdout)["error"] == NO_MODEL


def test_result_refuses_a_negative_wait_in_one_line(tmp_path: Path, db: str) -> None:
    result = run("result", "c1", "--org", "acme", "--caller", "c-sales", "--wait", "-5", "--db", db)
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("error: --wait -5:") and "negative" in line


def test_usage_of_an_unknown_org_is_refused_as_keys_create_refuses_it(tmp_path: Path, db: str) -> None:
    assert run("load", _write(tmp_path / "bundle.json", bundle()), "--db", db).exit_code == 0
    usage = run("usage", "--org", "nope", "--db", db)
    keys = run("keys", "create", "--org", "nope", "--caller", "c-sales", "--db", db)
    assert usage.exit_code == keys.exit_code == 1 and usage.stdout == ""
    assert usage.stderr == keys.stderr and "unknown org 'nope'" in usage.stderr
    assert run("usage", "--org", "acme", "--db", db).exit_code == 0


def test_a_bad_database_url_is_a_configuration_error() -> None:
    result = run("stats", "--db", "mysql://localhost/x")
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("error:") and "mysql://localhost/x" in line


@pytest.mark.parametrize("which", ["request", "response", "bundle", "dataset"])
def test_published_schemas_in_docs_match_the_code(which: str) -> None:
    import json

    published = Path(__file__).resolve().parents[1] / "docs" / "schemas" / f"{which}.schema.json"
    assert json.loads(published.read_text()) == cli.json_schemas(which), f"regenerate: dossier schema {which} > {published}"


# -- data prints as it is ------------------------------------------------------------------------------
MARKUP = "Jane said [bold]yes[/bold] to [/] and :smile:"  # rich markup (an error, a tag) and an emoji code


def test_data_that_looks_like_markup_prints_as_it_is(tmp_path: Path, db: str) -> None:
    data = bundle(org="acme[/]")
    data["orgs"][0]["[/]"] = 1  # a field the load ignores, and names
    data["memories"][0]["text"] = MARKUP
    loaded = run("load", _write(tmp_path / "bundle.json", data), "--db", db)
    assert loaded.exit_code == 0, loaded.output
    assert "ignored fields of orgs: [/] (1)" in loaded.stdout
    stats = run("stats", "--db", db)
    assert stats.exit_code == 0, stats.output
    assert "acme[/]" in stats.stdout
    called = run("retrieve", "--org", "acme[/]", "--caller", "c-sales", "--email", "jane@acme.com",
                 "-m", "What did Jane say?", "--db", db)  # fmt: skip
    assert called.exit_code == 0, called.output
    assert MARKUP in called.stdout


# -- the trace in the human output -----------------------------------------------------------------------
def test_retrieve_trace_prints_each_decision_and_the_withheld_counts(tmp_path: Path, db: str) -> None:
    assert run("load", _write(tmp_path / "bundle.json", bundle()), "--db", db).exit_code == 0
    ask = ["retrieve", "--org", "acme", "--caller", "c-sales", "--email", "jane@acme.com", "-m", "discounts?",
           "--db", db]  # fmt: skip
    response = json.loads(run(*ask, "--trace", "--json").stdout)
    shown = run(*ask, "--trace")
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    start = lines.index(f"trace: {len(response['trace'])} decision(s)")
    assert response["trace"] and lines[start + 1 : start + 1 + len(response["trace"])] == [
        f"    {t['source']} {t['id']} {t['layer']} {t['decision']} {t['reason'] or '-'} "
        + ("-" if t["score"] is None else f"{t['score']:.3f}")
        for t in response["trace"]
    ]
    withheld = response["withheld"].items()
    counts = [f"{layer}: {reason} {n}" for layer, reasons in withheld for reason, n in reasons.items()]
    assert lines[start + 1 + len(response["trace"])] == f"withheld: {'; '.join(counts) or 'none'}"
    plain = run(*ask).stdout
    assert "trace:" not in plain and "withheld:" not in plain


# -- an empty record option ------------------------------------------------------------------------------
@pytest.mark.parametrize(("option", "field"), [("--email", "email"), ("--phone", "phone"), ("--website", "website"),
                                               ("--profile-url", "profile_url"), ("--record-id", "id")])  # fmt: skip
def test_an_empty_record_option_is_refused_not_dropped(tmp_path: Path, db: str, option: str, field: str) -> None:
    assert run("load", _write(tmp_path / "bundle.json", bundle()), "--db", db).exit_code == 0
    result = run("retrieve", "--org", "acme", "--caller", "c-sales", option, "", "-m", "discounts?", "--db", db)
    assert result.exit_code == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: invalid request: record.{field}:"), line


@pytest.mark.parametrize("value", ["", " , "])
def test_a_fetch_option_naming_no_document_is_refused_not_dropped(tmp_path: Path, db: str, value: str) -> None:
    assert run("load", _write(tmp_path / "bundle.json", bundle()), "--db", db).exit_code == 0
    result = run("retrieve", "--org", "acme", "--caller", "c-sales", "--fetch", value, "-m", "discounts?", "--db", db)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: --fetch {value!r} names no document id"]


# -- output paths ----------------------------------------------------------------------------------------
DATASET = Path(__file__).resolve().parents[1] / "examples" / "eval" / "sample-questions.json"


@pytest.mark.parametrize(("args", "says"), [
    (["calibrate", DATASET, "--json", "{tmp}/no/such/c.json", "--write"], "c.json (--json): there is no folder"),
    (["eval", DATASET, "--json", "{tmp}/out"], "out (--json): it is a folder"),
    (["eval", DATASET, "--html", "{tmp}/out"], "out (--html): it is a folder"),
    (["demo", "--db", "{tmp}/out"], "out (--db): it is a folder"),
], ids=["calibrate --json", "eval --json", "eval --html", "demo --db"])  # fmt: skip
def test_an_output_path_that_cannot_be_written_fails_in_one_line_before_the_work(
    tmp_path: Path, db: str, args: list[Any], says: str
) -> None:
    (tmp_path / "out").mkdir()
    result = run(*(str(a).format(tmp=tmp_path) for a in args), *(["--db", db] if args[0] == "calibrate" else []))
    assert result.exit_code == 2 and result.stdout == ""  # nothing ran, so nothing to show
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: cannot write {tmp_path}/") and says in line, line
    assert sorted(tmp_path.iterdir()) == [tmp_path / "out"] and not any((tmp_path / "out").iterdir())


def test_a_demo_of_a_broken_bundle_leaves_no_store_behind(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    result = run("demo", "--bundle", broken, "--db", tmp_path / "demo.db")
    assert result.exit_code == 2 and "broken.json is not valid JSON" in result.stderr
    assert list(tmp_path.iterdir()) == [broken], "a failed demo left a store behind"


# -- calibration's score distributions -------------------------------------------------------------------
@pytest.mark.parametrize(("values", "expected"), [
    ([0.5], (0.5, 0.5, 0.5, 0.5, 0.5)),
    ([0.57, 0.39], (0.408, 0.435, 0.48, 0.525, 0.552)),
    ([0.0, 0.1, 0.2, 0.3, 0.4], (0.04, 0.1, 0.2, 0.3, 0.36)),
    ([0.3, 0.1, 0.2, 0.9], (0.13, 0.175, 0.25, 0.45, 0.72)),
])  # fmt: skip
def test_calibration_percentiles_interpolate_as_numpy_does(values: list[float], expected: tuple[float, ...]) -> None:
    from dossier.evaluation.calibrate import _stats

    stats = _stats(values)
    assert stats == {"n": len(values), **dict(zip(("p10", "p25", "median", "p75", "p90"), expected))}
    assert stats["p10"] <= stats["p25"] <= stats["median"] <= stats["p75"] <= stats["p90"]
