"""What a new user of the command line trips over: the version, help, a store that is not there, progress
in a log, the MCP key, and tables read through a pipe. Each friction point has its test here."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import click
import pytest
import typer.main
from typer.testing import CliRunner, Result

import dossier
from dossier import cli
from dossier.service import Service
from tests.test_loading import bundle

runner = CliRunner()
LONG_ORG = "northwind-traders-emea-enterprise-accounts-2026-renewals-and-expansion-programme"
LONG_CALLER = "sales-operations-automation-service-account-for-the-quarterly-renewals-pipeline"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("DOSSIER_DATABASE_URL", "DOSSIER_API_KEY", "DOSSIER_ORG", "DOSSIER_CALLER"):
        monkeypatch.delenv(name, raising=False)
    yield


def run(*args: Any, **kw: Any) -> Result:
    return runner.invoke(cli.app, [str(a) for a in args], **kw)


def _commands() -> Iterator[tuple[list[str], click.Command]]:
    def walk(command: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                yield from walk(sub, [*path, name])
        else:
            yield path, command

    return walk(typer.main.get_command(cli.app), [])


# -- version and help ----------------------------------------------------------------------------
def test_version_prints_the_package_version_and_exits_0() -> None:
    result = run("--version")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"dossier {dossier.__version__}"
    assert "--version" in run("--help").stdout


@pytest.mark.parametrize("path", [path for path, _ in _commands()], ids=" ".join)
def test_help_shows_flags_as_flags_and_states_every_default(path: list[str]) -> None:
    command = dict((tuple(p), c) for p, c in _commands())[tuple(path)]
    shown = run(*path, "--help")
    assert shown.exit_code == 0, shown.output
    assert "<bool>" not in shown.stdout
    shown_defaults = 0
    for param in command.params:
        is_flag = bool(getattr(param, "is_flag", False))
        if param.required or (is_flag and param.default is False):
            continue  # required, or a flag that is off unless given
        help_text = getattr(param, "help", "") or ""
        if param.default is None or getattr(param, "show_default", None) is False:
            assert "default" in help_text, f"{' '.join(path)} {param.name}: its help does not state the default"
        else:
            shown_defaults += 1
    assert " ".join(shown.stdout.split()).count("[default: ") >= shown_defaults
    for param in command.params:
        if getattr(param, "is_flag", False):
            opt = max(param.opts, key=len)
            [line] = [line for line in shown.stdout.splitlines() if re.match(rf"\s+(-\w, )?{re.escape(opt)}(\s|$)", line)]
            assert not line.split(opt, 1)[1].lstrip().startswith("<"), line


def test_retrieve_help_states_the_default_mode_depth_and_budget() -> None:
    shown = " ".join(run("retrieve", "--help").stdout.split())
    assert "else scout" in shown and "default: standard" in shown and "default: 8000" in shown


# -- a store that is not there ---------------------------------------------------------------------
#: every command but load (which creates a store): a read, or a write into a store that a typo named
NEED_A_STORE = [
    ["stats"],
    ["add-doc", "policy.md", "--org", "northwind"],
    ["retrieve", "--org", "northwind", "--caller", "ana", "--email", "jane@acme.com", "-m", "discounts?"],
    ["result", "c1", "--org", "northwind", "--caller", "ana"],
    ["keys", "list"],
    ["keys", "create", "--org", "northwind", "--caller", "ana"],
    ["keys", "revoke", "k1"],
    ["usage", "--org", "northwind"],
    ["serve"],
]


@pytest.mark.parametrize("args", NEED_A_STORE, ids=lambda a: " ".join(a[:2]))
def test_a_command_on_a_store_that_is_not_there_names_the_path_and_creates_nothing(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "elsewhere" / "crm.db"
    named = run(*args, "--db", f"sqlite:///{missing}")
    assert named.exit_code == 2, named.output
    [line] = named.stderr.splitlines()
    assert line.startswith("error: no store at ") and str(missing) in line and "from --db" in line
    by_default = run(*args)  # no --db and no DOSSIER_DATABASE_URL: ./dossier.db, which is not there
    assert by_default.exit_code == 2, by_default.output
    assert str(tmp_path / "dossier.db") in by_default.stderr and "from the default" in by_default.stderr
    from_env = run(*args, env={"DOSSIER_DATABASE_URL": f"sqlite:///{missing}"})
    assert from_env.exit_code == 2 and "from $DOSSIER_DATABASE_URL" in from_env.stderr
    assert list(tmp_path.iterdir()) == [], "the command created files"


def test_mcp_on_a_store_that_is_not_there_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "crm.db"
    result = run("mcp", "--db", f"sqlite:///{missing}", env={"DOSSIER_API_KEY": "dk_x_y"})
    assert result.exit_code == 2 and str(missing) in result.stderr
    assert not missing.exists()


def test_an_unknown_org_names_the_store_it_was_looked_for_in(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/crm.db"
    with dossier.open(url, embedder=embedder) as engine:
        engine.load_bundle({"orgs": [{"id": "acme"}], "callers": [{"id": "ana", "org": "acme"}]})
    result = run("keys", "create", "--org", "northwind", "--caller", "ana", "--db", url)
    assert result.exit_code == 1
    assert "unknown org 'northwind'" in result.stderr and f"(store: {url})" in result.stderr


# -- progress when stderr is not a terminal --------------------------------------------------------
def test_progress_lines_report_items_rate_and_time_left_at_most_every_interval() -> None:
    out = _Lines()
    now = [100.0]
    lines = cli.ProgressLines("embedding", out, clock=lambda: now[0])  # type: ignore[arg-type]
    lines(0, 1000)
    for done, at in ((100, 101.0), (200, 102.0), (500, 105.0), (600, 106.0), (900, 110.0), (1000, 111.0)):
        now[0] = at
        lines(done, 1000)
    # the first update after the start prints; then one line per PROGRESS_EVERY (5 s); then the closing line
    assert out.lines == [
        "embedding: 100/1000 (10%), 100/s, about 9 s left",
        "embedding: 600/1000 (60%), 100/s, about 4 s left",
        "embedding: 1000/1000 done in 11 s (91/s)",
    ]


def test_progress_is_silent_for_work_too_short_to_report() -> None:
    out = _Lines()
    lines = cli.ProgressLines("embedding", out)  # type: ignore[arg-type]
    lines(0, 7)
    lines(7, 7)
    assert out.lines == []


def test_load_prints_progress_lines_when_stderr_is_not_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "PROGRESS_EVERY", 0.0)
    data = bundle()
    data["memories"] += [{"id": f"m-x{i}", "org": "acme", "record": "r-jane", "text": f"Jane called about order {i}.",
                          "created_at": "2024-04-01T10:00:00Z"} for i in range(40)]  # fmt: skip
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(data))
    result = run("load", path, "--db", f"sqlite:///{tmp_path}/c.db")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert any(re.fullmatch(r"embedding: \d+/47 \(\d+%\), \d+(\.\d)?/s, about \d+ (s|min \d\d s) left", line)
               for line in lines), lines
    assert re.fullmatch(r"embedding: 47/47 done in \d+ s \(\d+(\.\d)?/s\)", lines[-1]), lines


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str, **_: Any) -> None:
        self.lines.append(text)


# -- dossier mcp and its key -----------------------------------------------------------------------
def test_mcp_without_a_key_names_the_variable_and_opens_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for env in ({}, {"DOSSIER_API_KEY": ""}):
        result = run("mcp", env=env)
        assert result.exit_code == 2 and result.stdout == ""
        [line] = result.stderr.splitlines()
        assert "DOSSIER_API_KEY" in line and "dossier keys create" in line and "Authorization" not in line
    assert list(tmp_path.iterdir()) == []


def test_mcp_with_an_unknown_key_names_the_variable_and_the_store(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/crm.db"
    with dossier.open(url, embedder=embedder) as engine:
        engine.load_bundle({"orgs": [{"id": "acme"}]})
    result = run("mcp", "--db", url, env={"DOSSIER_API_KEY": "dk_nope_nope"})
    assert result.exit_code == 2 and result.stdout == ""
    assert "DOSSIER_API_KEY" in result.stderr and "unknown or revoked" in result.stderr and url in result.stderr


# -- tables read through a pipe --------------------------------------------------------------------
def test_tables_keep_ids_whole_when_piped(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/crm.db"
    with dossier.open(url, embedder=embedder) as engine:
        engine.load_bundle({"orgs": [{"id": LONG_ORG}], "callers": [{"id": LONG_CALLER, "org": LONG_ORG}]})
        Service(engine).create_key(LONG_ORG, LONG_CALLER, name="a label long enough to squeeze the other columns")
    for args in (["stats"], ["keys", "list"]):
        # a real pipe (not a terminal), in a process of its own: the width is the CLI's choice, not the test's
        done = subprocess.run([sys.executable, "-m", "dossier.cli", *args, "--db", url], capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert LONG_ORG in done.stdout, done.stdout
        if args == ["keys", "list"]:
            assert LONG_CALLER in done.stdout and "…" not in done.stdout


# -- command-line mistakes ---------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "says"), [
    (["retrieve", "--bogus"], "error: No such option: --bogus"),
    (["retrieve", "--org", "o", "--caller", "c", "--budget", "abc", "-m", "q"], "error: Invalid value for '--budget'"),
    (["keys", "create", "--caller", "c"], "error: Missing option '--org'"),
], ids=["unknown option", "wrong type", "missing option"])  # fmt: skip
def test_a_command_line_mistake_is_one_line_and_exit_code_2(tmp_path: Path, args: list[str], says: str) -> None:
    url = f"sqlite:///{tmp_path}/nowhere.db"
    done = subprocess.run([sys.executable, "-m", "dossier.cli", *args, "--db", url], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, env={**os.environ, "DOSSIER_ORG": ""})  # fmt: skip
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(says) and "--help')" in line, line
    assert not (tmp_path / "nowhere.db").exists()


def test_a_command_s_own_exit_code_comes_through(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "dossier.cli", "stats", "--db", f"sqlite:///{tmp_path}/none.db"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("error: no store at "), done.stderr
    done = subprocess.run([sys.executable, "-m", "dossier.cli"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Commands" in done.stderr  # alone: the commands, as ever


# -- a light start ---------------------------------------------------------------------------------
HEAVY = ("numpy", "pydantic", "torch", "sentence_transformers", "onnxruntime", "fastapi", "starlette", "uvicorn",
         "psycopg", "mcp", "dossier.engine", "dossier.stores")  # fmt: skip


@pytest.mark.parametrize("argv", [None, ["--help"], ["--version"], ["retrieve", "--help"]], ids=str)
def test_the_cli_starts_without_heavy_imports(argv: list[str] | None) -> None:
    """``import dossier.cli`` and the commands that only talk (help, version) load no model runtime, web
    framework, database driver, numpy or pydantic (typer itself imports pydantic to read a command's
    Path and number options, so a command's own help may); the time it takes is in docs/scaling.md."""
    heavy = tuple(m for m in HEAVY if not (argv and len(argv) > 1 and m == "pydantic"))
    run_it = "" if argv is None else (
        f"sys.argv = ['dossier', *{argv!r}]\n"
        "try:\n    cli.main()\nexcept SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
    )  # fmt: skip
    code = f"import sys\nfrom dossier import cli\n{run_it}print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


#: what a command that reads a store without embedding must not load (typer's own pydantic aside)
STORE_HEAVY = ("numpy", "usearch", "torch", "sentence_transformers", "onnxruntime", "fastapi", "starlette", "uvicorn",
               "mcp", "dossier.engine", "dossier.loading", "dossier.bundle", "dossier.schema", "dossier.service")  # fmt: skip


@pytest.mark.parametrize("argv, code", [
    (["stats"], 0), (["keys", "list"], 0), (["usage", "--org", "acme"], 0),
    (["result", "no-such-call", "--org", "acme", "--caller", "ana"], 1),
], ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else str(a))  # fmt: skip
def test_store_commands_read_the_store_without_numpy_models_or_the_engine(
    argv: list[str], code: int, tmp_path: Path, embedder  # type: ignore[no-untyped-def]
) -> None:
    """The commands that open a store but never embed (counts, keys, usage, a stored result) answer from
    the store alone: no numpy, no vector search, no pydantic models of the bundle or the response, no engine.
    Their answers are the usual ones (checked here on the same run)."""
    url = f"sqlite:///{tmp_path}/crm.db"
    with dossier.open(url, embedder=embedder) as engine:
        engine.load_bundle({"orgs": [{"id": "acme"}], "callers": [{"id": "ana", "org": "acme"}]})
        Service(engine).create_key("acme", "ana", name="light")
    program = (
        "import sys\nfrom dossier import cli\n"
        f"sys.argv = ['dossier', *{argv!r}, '--db', {url!r}]\n"
        "try:\n    cli.main()\nexcept SystemExit as exc:\n    code = exc.code or 0\nelse:\n    code = 0\n"
        f"print('LOADED', code, sorted(m for m in {STORE_HEAVY!r} if m in sys.modules))\n"
    )  # fmt: skip
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    [last] = [line for line in done.stdout.splitlines() if line.startswith("LOADED")]
    assert last == f"LOADED {code} []", done.stdout + done.stderr
    if argv[0] == "stats":
        assert re.search(r"acme\s*│\s*1\s*│\s*0", done.stdout), done.stdout  # one caller, no records
    elif argv[0] == "keys":
        assert "light" in done.stdout and "1 API key(s)" in done.stdout
    elif argv[0] == "result":
        assert "no call 'no-such-call' in org 'acme'" in done.stderr


# -- the demo explains what it shows -----------------------------------------------------------------
def test_the_demo_explains_aliases_and_redistributed_shares_in_one_line_each(tmp_path: Path) -> None:
    result = run("demo", "--db", tmp_path / "demo.db")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    [aliases] = [line for line in lines if line.startswith("aliases: ")]
    [budget] = [line for line in lines if line.startswith("budget: the ")]
    assert "rec-acme" in aliases and "company domain" in aliases
    assert "external had nothing to pack, so its share went to the others" in budget


# -- passwords ---------------------------------------------------------------------------------------
def test_a_store_url_s_password_is_redacted_wherever_a_url_is_shown() -> None:
    from dossier.errors import redacted_url

    assert redacted_url("postgresql://app:S3cret@db:5432/crm") == "postgresql://app:***@db:5432/crm"
    assert redacted_url("postgresql://app:p@ss:w/rd@db/crm") == "postgresql://app:***@db/crm"  # not percent-encoded
    assert redacted_url("host=db password=S3cret dbname=crm") == "host=db password=*** dbname=crm"
    assert "S3cret" not in redacted_url("postgresql://app:pw@db/crm?password=S3cret&sslmode=require")
    assert "S3cret" not in redacted_url("postgresql://app:S3cret@db/crm?application_name=a@b")  # more hidden, never less
    for kept in ("postgresql://app@db/crm", "sqlite:///data/crm.db"):
        assert redacted_url(kept) == kept
    done = subprocess.run([sys.executable, "-m", "dossier.cli", "stats", "--db", "postgresql+psycopg://app:S3cret@db/crm"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 1 and "unknown store URL" in done.stderr and "S3cret" not in done.stderr, done.stderr


def test_no_command_output_or_report_shows_the_postgres_password(tmp_path: Path, postgres_server) -> None:  # type: ignore[no-untyped-def]
    from tests.postgres_server import APP_PASSWORD
    from tests.test_loading import bundle

    url = postgres_server.create_database()
    assert APP_PASSWORD in url
    data = bundle()
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(data))
    done = subprocess.run([sys.executable, "-m", "dossier.cli", "load", str(path), "--db", url], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "loaded into" in done.stdout and ":***@" in done.stdout and APP_PASSWORD not in done.stdout + done.stderr
    done = subprocess.run([sys.executable, "-m", "dossier.cli", "usage", "--org", "nowhere", "--db", url], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 1 and "(store: postgresql://" in done.stderr and APP_PASSWORD not in done.stderr, done.stderr
    dataset = {"name": "tiny", "bundle": data, "questions": [
        {"id": "q1", "org": "acme", "caller": "c-sales", "record": None, "message": "Does annual prepay earn a discount?",
         "gold": {"documents": ["d-disc"], "sections": ["s-prepay"]}}]}  # fmt: skip
    (tmp_path / "tiny.json").write_text(json.dumps(dataset))
    other = postgres_server.create_database()
    done = subprocess.run([sys.executable, "-m", "dossier.cli", "eval", str(tmp_path / "tiny.json"), "--store", other,
                           "--json", str(tmp_path / "report.json")], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "report.json").read_text()
    assert json.loads(report)["store"].startswith("postgresql://") and APP_PASSWORD not in report + done.stdout
