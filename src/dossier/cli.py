"""The ``dossier`` command line: a thin front end over the public API.

Start-up stays light: this module imports typer and rich's console only, and each command imports what
it uses when it runs (``dossier --help`` and ``--version`` never load numpy, pydantic or a model).
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import typer
from rich.console import Console
from rich.markup import escape

import dossier

from .errors import BundleError, DossierError, NotFound, UsageError, redacted_url

if TYPE_CHECKING:
    from .evaluation.dataset import Dataset
    from .evaluation.fit import OrgFit
    from .loading import LoadReport
    from .providers.ranker import LinearRanker
    from .schema import Synthesis

DEFAULT_DB = "sqlite:///dossier.db"
#: width of output that is not a terminal (a pipe, a file): wide enough that tables never cut an id
PIPE_WIDTH = 10_000
#: seconds between two progress lines when stderr is not a terminal
PROGRESS_EVERY = 5.0


def _console(*, stderr: bool) -> Console:
    """A console for the CLI's output. Data (ids, names, texts, paths) is printed escaped or with markup off,
    and never turns into emoji (``:smile:`` in a memory prints as it is)."""
    stream = sys.stderr if stderr else sys.stdout
    piped = not (hasattr(stream, "isatty") and stream.isatty())
    return Console(stderr=stderr, width=PIPE_WIDTH if piped else None, emoji=False)


app = typer.Typer(
    no_args_is_help=True, add_completion=False, rich_markup_mode=None,
    context_settings={"show_default": True, "max_content_width": 100},
    help="dossier: one call, one record, one byte budget.",
)  # fmt: skip
console = _console(stderr=False)
err = _console(stderr=True)
DB_OPTION = typer.Option(
    None, "--db", show_default=False,
    help=f"Store URL: sqlite:///PATH or postgresql://... (default: $DOSSIER_DATABASE_URL, else {DEFAULT_DB}).",
)  # fmt: skip
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LLM_OPTION = typer.Option(
    None, "--llm", envvar="DOSSIER_LLM", show_default=False,
    help="Chat model for deep steps and synthesis: openai:<model> (honours OPENAI_BASE_URL and OPENAI_API_KEY; "
         "default: none, every model step uses its heuristic).",
)  # fmt: skip
RERANK_OPTION = typer.Option(
    None, "--rerank", envvar="DOSSIER_RERANK", show_default=False,
    help="Reranker for deep calls: cross-encoder:<local dir>, openai:<model> or an http(s) rerank URL "
         "(default: none, the fused order stays).",
)  # fmt: skip


def flag(name: str, help: str) -> Any:  # noqa: A002 - typer's own word
    """An on/off option, off unless given (shown as the bare flag, without a type)."""
    return typer.Option(False, name, help=help, metavar="", show_default=False)


def _show_version(value: bool) -> None:
    if value:
        print(f"dossier {dossier.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True, metavar="",
                                 show_default=False, help="Print the version and exit."),  # fmt: skip
) -> None:
    """dossier: one call, one record, one byte budget."""


def _url(db: str | None) -> str:
    return db or os.environ.get("DOSSIER_DATABASE_URL") or DEFAULT_DB


def _existing(db: str | None) -> str:
    """The store URL of a command that needs a store (every one but ``load``, which creates it): a SQLite
    file that is not there is an error naming the path looked for (opening it would create an empty store,
    and a read would answer from nothing, a write land in a store that a typo named)."""
    url = _url(db)
    path = _sqlite_path(url)
    if path is not None and not path.exists():
        whence = "--db" if db else "$DOSSIER_DATABASE_URL" if os.environ.get("DOSSIER_DATABASE_URL") else "the default"
        with _errors():  # one line, exit code 2, wherever this is called
            raise UsageError(f"no store at {path.resolve()} ({url}, from {whence}); create one with 'dossier load "
                             f"FILE' or name an existing one with --db or $DOSSIER_DATABASE_URL")  # fmt: skip
    return url


def _sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL; None for an in-memory or non-SQLite store (or a malformed URL,
    which opening reports)."""
    if not url.startswith("sqlite:///") or url in ("sqlite:///", "sqlite:///:memory:"):
        return None
    return Path(url[len("sqlite:///") :])


@contextmanager
def _errors(url: str | None = None) -> Iterator[None]:
    """Turn dossier errors into one line per problem and an exit code (2: your input, 1: ours). A
    not-found error names the store it looked in (``url``)."""
    try:
        yield
    except BundleError as exc:
        for problem in exc.problems:
            err.print(f"error: {problem}", markup=False, highlight=False, soft_wrap=True)
        err.print(f"nothing was loaded ({len(exc.problems)} problem(s))", markup=False)
        raise typer.Exit(2) from None
    except UsageError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except DossierError as exc:
        where = f" (store: {redacted_url(url)})" if url and isinstance(exc, NotFound) else ""
        err.print(f"error: {exc}{where}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


@contextmanager
def _progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on a terminal; elsewhere (a log, a pipe) a line every PROGRESS_EVERY seconds."""
    if not err.is_terminal:
        yield ProgressLines(label, err)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, 1))

        yield update


class ProgressLines:
    """``(done, total)`` updates as plain lines: items done, rate and time left, at most one line every
    ``PROGRESS_EVERY`` seconds, and a closing line once the work that printed lines is done."""

    def __init__(self, label: str, out: Console, clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.out, self.clock = label, out, clock
        self.started = clock()
        self.last: float | None = None

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        elapsed = max(now - self.started, 1e-9)
        rate = done / elapsed
        per_second = f"{rate:.1f}/s" if rate < 10 else f"{rate:.0f}/s"
        if total and done >= total:
            if self.last is not None:
                self._line(f"{self.label}: {done}/{total} done in {_duration(elapsed)} ({per_second})")
            return
        if done <= 0 or (self.last is not None and now - self.last < PROGRESS_EVERY):
            return
        self.last = now
        left = f", about {_duration((total - done) / rate)} left" if total else ""
        share = f"/{total} ({100 * done / total:.0f}%)" if total else ""
        self._line(f"{self.label}: {done}{share}, {per_second}{left}")

    def _line(self, text: str) -> None:
        self.out.print(text, markup=False, highlight=False, soft_wrap=True)


def _duration(seconds: float) -> str:
    seconds = max(int(round(seconds)), 0)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _print_report(report: LoadReport, *, where: str, to: Console = console) -> None:
    from rich.table import Table

    table = Table(title=f"loaded into {escape(where)} in {report.seconds:.2f} s", title_justify="left")
    for column in ("kind", "inserted", "updated", "unchanged"):
        table.add_column(column, justify="right" if column != "kind" else "left")
    kinds = ("orgs", "callers", "records", "memories", "documents", "edges")
    for kind in kinds:
        table.add_row(kind, *(str(getattr(report, f).get(kind, 0)) for f in ("inserted", "updated", "unchanged")))
    to.print(table)
    to.print(f"embedded {report.embedded} text(s); inserted {report.total_inserted}, updated {report.total_updated}")
    for line in report.ignored_lines():
        to.print(line, markup=False, highlight=False)


@app.command()
def load(file: Path = typer.Argument(..., help="A bundle (JSON)."), db: Optional[str] = DB_OPTION) -> None:
    """Load a JSON bundle; idempotent by id, all or nothing."""
    path = _sqlite_path(_url(db))
    new = path is not None and not path.exists()
    try:
        with _errors(), dossier.open(_url(db)) as engine, _progress("embedding") as update:
            report = engine.load_bundle(file, progress=update)
    except typer.Exit:
        if path is not None and new:  # nothing of the bundle was stored (all or nothing): leave no empty store
            _remove_unused_store(path)  # for a later command, unless another load or server has it open
        raise
    _print_report(report, where=redacted_url(_url(db)))


def _remove_store(path: Path) -> None:
    """Delete a SQLite store: its file and the journal files beside it, where there are any."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _remove_unused_store(path: Path) -> None:
    """Delete the store this command made for a load that failed, only while no other process has it open
    (another load into the same new path, a server) and it holds no org: never what another wrote."""
    import fcntl

    shm = Path(f"{path}-shm")
    try:
        if not shm.exists():  # no connection has it open
            _remove_if_empty(path)
            return
        with open(shm, "r+b") as held:
            # every open connection of a WAL store holds a shared lock on byte 128 of its -shm file (SQLite's
            # "dead man switch"): an exclusive one is granted only where no other process holds it
            fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 128)
            _remove_if_empty(path)
    except OSError:  # in use by another process: leave it
        return


def _remove_if_empty(path: Path) -> None:
    import sqlite3

    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0)) as db:
            if db.execute("SELECT count(*) FROM orgs").fetchone()[0]:
                return
    except sqlite3.Error:  # not a store this command can judge: leave it
        return
    _remove_store(path)


@app.command("add-doc")
def add_doc(
    file: Path = typer.Argument(..., help="A markdown file; sections start at headings."),
    org: str = typer.Option(..., "--org", help="The org the document belongs to."),
    title: Optional[str] = typer.Option(None, "--title", help="Title (default: the file's '# Title')."),
    doc_id: Optional[str] = typer.Option(None, "--id", help="Document id (default: slug of the title)."),
    doc_type: str = typer.Option("guideline", "--type", help="Document type, e.g. guideline, policy, playbook."),
    tags: str = typer.Option("", "--tags", show_default=False, help="Comma-separated tags (default: none)."),
    roles: Optional[str] = typer.Option(None, "--roles", help="Comma-separated roles that may see it (default: whole org)."),
    org_wide: bool = typer.Option(False, "--org-wide", help="Let the whole org see it, also where it replaces a "
                                  "document only some roles may see (without --roles that is refused)."),
    db: Optional[str] = DB_OPTION,
) -> None:
    """Load a markdown document, split into sections at its headings."""
    split = lambda text: [t.strip() for t in text.split(",") if t.strip()]  # noqa: E731
    url = _existing(db)  # a document needs its org, loaded first: a store that is not there is a typo
    with _errors():
        if roles is not None and not split(roles):  # an empty list would hide it from every caller
            raise UsageError("--roles names no role: leave it out for the whole org, or list the roles that may see it")
        if roles is not None and org_wide:
            raise UsageError("--roles and --org-wide say different things: give one of them")
    with _errors(url), dossier.open(url) as engine, _progress("embedding") as update:
        if roles is None and not org_wide:
            _keeps_its_audience(engine, file, org=org, title=title, doc_id=doc_id)
        report = engine.add_markdown(
            file, org=org, title=title, doc_id=doc_id, doc_type=doc_type, tags=split(tags),
            visible_to_roles=None if roles is None else split(roles), progress=update,
        )  # fmt: skip
    _print_report(report, where=redacted_url(url))


def _keeps_its_audience(engine: Any, file: Path, *, org: str, title: str | None, doc_id: str | None) -> None:
    """Refuse to show the whole org a document that replaces one only some roles may see, unless asked to
    (``--org-wide``): re-adding an edited file without repeating its ``--roles`` would otherwise widen it."""
    from .loading import document_from_markdown

    made = document_from_markdown(_read(file), org=org, title=title, doc_id=doc_id)
    for existing in engine.store.get_documents([made.id], org=org):
        if existing.visible_to_roles is not None:
            kept = ",".join(existing.visible_to_roles)
            raise UsageError(f"document {made.id!r} may be seen by {kept or 'no role'} only, and without --roles this "
                             f"would show it to the whole org: give --roles {kept or 'ROLES'} to keep that, or "
                             "--org-wide to widen it")  # fmt: skip


@app.command()
def stats(db: Optional[str] = DB_OPTION) -> None:
    """Counts per kind, per org, of what the store holds."""
    from .stores import store_from_url

    with _errors():
        store = store_from_url(_existing(db))
        try:
            _print_counts(store)
        finally:
            store.close()


def _print_counts(store: Any, to: Console = console) -> None:
    from rich.table import Table

    orgs = store.org_ids() if hasattr(store, "org_ids") else []
    table = Table(title="store contents", title_justify="left")
    table.add_column("org")
    kinds = ("callers", "records", "memories", "documents", "sections", "edges", "vectors")
    for kind in kinds:
        table.add_column(kind, justify="right")
    for org in orgs:
        counts = store.counts(org=org)
        table.add_row(escape(org), *(str(counts[k]) for k in kinds))
    to.print(table)


EXAMPLE_CALL = {
    "mode": "brief",
    "record": {"email": "jane@acme.com"},
    "message": "What pricing did we discuss, and what discount rules apply?",
    "budget": {"totalTokens": 8000},
    "synthesize": True,
}


@app.command()
def retrieve(
    request_file: Optional[Path] = typer.Argument(None, help="A request as JSON (file, or - for stdin); options below override it "
                                          "(default: none, the options alone make the request)."),
    org: str = typer.Option(..., "--org", envvar="DOSSIER_ORG", help="The caller's org."),
    caller: str = typer.Option(..., "--caller", envvar="DOSSIER_CALLER", help="The caller id (its roles decide visibility)."),
    message: Optional[str] = typer.Option(None, "--message", "-m", help="The question (default: none)."),
    email: Optional[str] = typer.Option(None, "--email", help="Record by email (default: none; with no record option, "
                                        "the call is about no record)."),
    phone: Optional[str] = typer.Option(None, "--phone", help="Record by phone (default: none)."),
    website: Optional[str] = typer.Option(None, "--website", help="Record by website (default: none)."),
    profile_url: Optional[str] = typer.Option(None, "--profile-url", help="Record by profile URL (default: none)."),
    record_id: Optional[str] = typer.Option(None, "--record-id", help="Record by id (default: none)."),
    mode: Optional[str] = typer.Option(None, "--mode", help="brief | scout | fetch | filter | expand (default: from the "
                                       "request's shape: fetch with --fetch, filter with filters, expand with a "
                                       "continuation, else scout)."),
    depth: Optional[str] = typer.Option(None, "--depth", help="fast | standard | deep (default: standard)."),
    budget: Optional[int] = typer.Option(None, "--budget", help="Budget in bytes (totalTokens), at most 50000 "
                                         "(default: 8000)."),
    fetch: Optional[str] = typer.Option(None, "--fetch", help="Comma-separated document ids (fetch mode; default: none)."),
    as_json: bool = flag("--json", "Print the raw response as JSON."),
    trace: bool = flag("--trace", "Include the per-item evidence trace."),
    synthesize: bool = flag("--synthesize", "Also answer from the packed context (needs --llm)."),
    deferred: bool = flag("--deferred", "Synthesize in the background: the context prints at once, the answer is "
                          "stored for 'dossier result CALL_ID'."),
    llm: Optional[str] = LLM_OPTION,
    rerank: Optional[str] = RERANK_OPTION,
    db: Optional[str] = DB_OPTION,
) -> None:
    """One retrieve call about one record; prints a summary (or --json). The call is audited and counted in
    the org's ledger like a call over HTTP, so that 'dossier result' knows it."""
    import json

    from .render import render_response
    from .service import Principal, Service

    url = _existing(db)
    with _errors(url):
        body: dict = {}
        if request_file is not None:
            text = sys.stdin.read() if str(request_file) == "-" else _read(request_file)
            try:
                body = json.loads(text)
            except json.JSONDecodeError as exc:
                raise UsageError(f"request is not valid JSON: {exc}") from None
            if not isinstance(body, dict):
                raise UsageError("request must be a JSON object")
        # a record option given empty ("") goes into the request, whose validation refuses it: it never turns
        # the call into one about no record
        ref = {k: v for k, v in (("email", email), ("phone", phone), ("website", website),
                                 ("profile_url", profile_url), ("id", record_id)) if v is not None}  # fmt: skip
        if ref:
            body["record"] = ref
        for key, value in (("message", message), ("mode", mode), ("depth", depth)):
            if value is not None:
                body[key] = value
        if budget is not None:
            body.setdefault("budget", {})["totalTokens"] = budget
        if fetch is not None:
            body["fetch"] = [f.strip() for f in fetch.split(",") if f.strip()]
            if not body["fetch"]:
                raise UsageError(f"--fetch {fetch!r} names no document id")
        if trace:
            body["trace"] = True
        if synthesize or deferred:
            body["synthesize"] = True
        if deferred:
            body["deferred"] = True
        with dossier.open(url, llm=llm, reranker=rerank) as engine:
            response = Service(engine).retrieve(Principal(org=org, caller=caller), body, front_end="cli")
            if as_json:
                print(response.model_dump_json(indent=2))
            else:
                render_response(console, response)
            sys.stdout.flush()
            if response.synthesis is not None and response.synthesis.pending:
                err.print(f"synthesis continues in the background; then: dossier result {response.call_id} "
                          f"--org {org} --caller {caller}", markup=False, highlight=False, soft_wrap=True)  # fmt: skip
        # leaving the block waits for a deferred synthesis to finish and be stored


@app.command()
def result(
    call_id: str = typer.Argument(..., help="The call_id of a retrieve call made with deferred synthesis."),
    org: str = typer.Option(..., "--org", envvar="DOSSIER_ORG", help="The caller's org."),
    caller: str = typer.Option(..., "--caller", envvar="DOSSIER_CALLER", help="The caller that made the call."),
    wait: float = typer.Option(0.0, "--wait", help="Seconds to wait for a synthesis that is still running."),
    as_json: bool = flag("--json", "Print the synthesis as JSON."),
    db: Optional[str] = DB_OPTION,
) -> None:
    """The synthesis of an earlier deferred call. Exit code 0: its answer (or the error that stopped it);
    3: still running; 1: no result, and the error says why (no such call in the org, another caller's
    call, a call that was not deferred, or one that failed)."""
    if wait < 0:
        with _errors():
            raise UsageError(f"--wait {wait:g}: seconds to wait cannot be negative (0, the default, does not wait)")
    url = _existing(db)
    with _errors(url):
        synthesis = _find_result(url, call_id, org=org, caller=caller, wait=wait)
    if as_json:
        print(synthesis.model_dump_json(indent=2))
    elif synthesis.pending:
        console.print(f"call {call_id}: synthesis still running", markup=False, highlight=False)
    elif synthesis.answer is None:
        console.print(f"call {call_id}: no answer ({synthesis.error})", markup=False, highlight=False)
    else:
        console.print(synthesis.answer, markup=False, highlight=False)
        if synthesis.reasoning:
            console.print(f"reasoning: {synthesis.reasoning}", markup=False, highlight=False, style="dim")
        cited = ", ".join(f"{label}={item}" for label, item in synthesis.citations.items())
        console.print(f"confidence {synthesis.confidence:g}; cited: {cited or 'nothing'}", markup=False, highlight=False)
    if synthesis.pending:
        raise typer.Exit(3)


def _find_result(url: str, call_id: str, *, org: str, caller: str, wait: float) -> Synthesis:
    """The stored synthesis of ``call_id`` for ``caller`` of ``org`` (read as ``Engine.result`` reads it from
    another process, without loading the engine), waiting up to ``wait`` seconds while it is pending. Without
    one, the org's audit log tells why: no such call in the org (another org's call reads exactly the same),
    a call of another caller, a call that was not deferred, or one that failed before its synthesis."""
    from .stores import store_from_url
    from .stores.service_base import service_store_from_url

    store = store_from_url(url)
    try:
        deadline = time.monotonic() + max(wait, 0.0)
        while (stored := store.get_result(call_id, org=org)) is not None and stored.get("caller") == caller:
            from .schema import Synthesis  # only once there is one to read (an unknown id loads no models)

            synthesis = Synthesis.model_validate(stored["synthesis"])
            if not synthesis.pending or time.monotonic() >= deadline:
                return synthesis
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))
    finally:
        store.close()
    audit = service_store_from_url(url)
    try:
        row = audit.get_audit(call_id)
    finally:
        audit.close()
    if row is None or row.org != org:
        raise NotFound(f"no call {call_id!r} in org {org!r}")
    if row.caller != caller:
        raise NotFound(f"no result for call {call_id!r}: another caller of {org!r} made it, and its answer is theirs")
    import json

    if not json.loads(row.shape or "{}").get("deferred"):
        raise NotFound(f"call {call_id!r} was not deferred: its answer, if it asked for one, came back with the call, "
                       f"and nothing was stored to fetch later (retrieve --deferred stores it)")  # fmt: skip
    if row.outcome != "ok":
        raise NotFound(f"call {call_id!r} failed ({row.error_type or row.outcome}) before its synthesis could run")
    raise NotFound(f"no result was stored for call {call_id!r}: the process that ran it ended before its synthesis "
                   f"was stored")  # fmt: skip


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start})") from None


def _writable(path: Path, option: str) -> None:
    """A UsageError for an output path that cannot be a file (a folder, or in a folder that is not there),
    raised before the work whose result it would hold, not after it."""
    if path.is_dir():
        raise UsageError(f"cannot write {path} ({option}): it is a folder; name a file")
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {path} ({option}): there is no folder {path.parent}")


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


@app.command()
def schema(which: str = typer.Argument("both", help="request | response | both | bundle | dataset")) -> None:
    """Print a JSON Schema: the retrieve request and response, a bundle, or an evaluation dataset."""
    import json

    print(json.dumps(json_schemas(which), indent=2))


def json_schemas(which: str) -> dict:
    from .bundle import Bundle
    from .evaluation.dataset import dataset_schema
    from .schema import RetrieveRequest, RetrieveResponse

    makers = {
        "request": RetrieveRequest.model_json_schema,
        "response": RetrieveResponse.model_json_schema,
        "bundle": Bundle.model_json_schema,
        "dataset": dataset_schema,
    }
    if which == "both":
        return {"request": makers["request"](), "response": makers["response"]()}
    if which not in makers:
        err.print(f"error: unknown schema {which!r}; expected request, response, both, bundle or dataset", markup=False)
        raise typer.Exit(2)
    return makers[which]()


@app.command()
def demo(
    db: Path = typer.Option(Path("dossier-demo.db"), "--db", help="Where to create the demo store (replaced)."),
    bundle: Path = typer.Option(EXAMPLES / "sample-org.json", "--bundle", help="The sample bundle."),
    as_json: bool = flag("--json", "Print the example call's raw response as JSON."),
) -> None:
    """Load the sample organisation into a fresh local store and show what it holds."""
    from .render import render_response

    with _errors():
        if not bundle.is_file():
            raise UsageError(f"sample bundle not found at {bundle}; run from a clone of dossier or pass --bundle")
        _writable(db, "--db")
    _remove_store(db)
    started = time.perf_counter()
    try:
        with _errors():
            with dossier.open(f"sqlite:///{db}") as engine:
                with _progress("embedding") as update:
                    report = engine.load_bundle(bundle, progress=update)
                for doc in sorted(EXAMPLES.glob("docs/*.md")) if bundle.parent == EXAMPLES else []:
                    report_md = engine.add_markdown(doc, org="northwind", doc_type="policy")
                    report.embedded += report_md.embedded
                    report.inserted["documents"] = report.inserted.get("documents", 0) + report_md.total_inserted
                out = err if as_json else console
                _print_report(report, where=str(db.resolve()), to=out)
                _print_counts(engine.store, to=out)
                out.print(f"demo store: {db.resolve()} (loaded in {time.perf_counter() - started:.2f} s)", markup=False)
                out.print(f"\n[bold]example call[/] as caller ana of northwind: {escape(str(EXAMPLE_CALL))}",
                          highlight=False)  # fmt: skip
                response = engine.retrieve(EXAMPLE_CALL, org="northwind", caller="ana")
            if as_json:
                print(response.model_dump_json(indent=2))
            else:
                render_response(console, response)
                for line in explain(response):
                    console.print(line, markup=False, highlight=False, soft_wrap=True)
    except typer.Exit:  # as load: a failed demo (a broken bundle) leaves no empty or half-made store behind
        _remove_store(db)
        raise


def explain(response: Any) -> list[str]:
    """One line each on what a first reader of a response might misread: what its aliases are, and why a
    source's share differs from its default (and why "used" may pass "share")."""
    from .schema import SOURCE_NAMES

    lines = []
    record = response.record
    if record is not None and record.aliases:
        lines.append(f"aliases: {', '.join(record.aliases)} are other live records on {record.id}'s company domain "
                     f"(not merges): their memories are read together with {record.id}'s own")  # fmt: skip
    budget = response.budget
    empty = [s for s in SOURCE_NAMES if not budget.share.get(s)]
    over = [s for s in SOURCE_NAMES if budget.used.get(s, 0) > budget.share.get(s, 0)]
    text = f"budget: the {budget.total_bytes} bytes are shared by default weights"
    if empty:
        text += f"; {', '.join(empty)} had nothing to pack, so {'its' if len(empty) == 1 else 'their'} share went to the others"
    if over:
        text += (f"; bytes a source left unused went to sources with items waiting, so {', '.join(over)} used more "
                 f"than {'its' if len(over) == 1 else 'their'} share")
    lines.append(text)
    return lines


@app.command("eval")
def eval_(
    dataset: Path = typer.Argument(..., help="A labelled dataset (docs/evaluation.md)."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL to evaluate on (default: a fresh temporary SQLite file)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the full report (per question) as JSON here "
                                            "(default: not written)."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="Also write the report as one self-contained HTML file "
                                            "here, with charts (needs the report extra; default: not written)."),
    against: Optional[Path] = typer.Option(None, "--against", help="An earlier --json report of the same set: show "
                                           "each metric's change question by question, with its 95% interval "
                                           "(default: none)."),
    depth: Optional[str] = typer.Option(None, "--depth", help="Request depth for every question: fast | standard | deep "
                                        "(default: the dataset's own, else standard)."),
    synthesize: bool = flag("--synthesize", "Ask for synthesis on every question (cost per layer)."),
    deadline_ms: Optional[int] = typer.Option(None, "--deadline-ms", help="Deadline of every call in milliseconds; "
                                              "the report shows which model steps ran out of it (default: 10000)."),
    llm: Optional[str] = LLM_OPTION,
    rerank: Optional[str] = RERANK_OPTION,
) -> None:
    """Run a labelled dataset through retrieve: quality per category and layer, leakage, latency, model cost."""
    import json

    from .evaluation.render import render_eval
    from .evaluation.runner import compare, evaluate

    with _errors():  # say so before the run, not after it
        for out, option in ((json_out, "--json"), (html_out, "--html")):
            if out is not None:
                _writable(out, option)
        earlier = None if against is None else _earlier_report(against)
        if html_out is not None:
            import importlib.util

            if importlib.util.find_spec("pygal") is None:
                raise dossier.MissingExtra("the HTML evaluation report", "report")
    with _errors(), _progress("questions") as update:
        request = {**({"depth": depth} if depth else {}), **({"synthesize": True} if synthesize else {}),
                   **({"deadline_ms": deadline_ms} if deadline_ms is not None else {})}  # fmt: skip
        report = evaluate(dataset, store_url=store, request=request or None, progress=update, llm=llm, reranker=rerank)
    if earlier is not None:
        compare(report, earlier, label=str(against))
    render_eval(console, report)
    if json_out is not None:
        with _errors():
            _write(json_out, json.dumps(report.as_dict(), indent=2, default=str))
        console.print(f"report written to {json_out}", markup=False)
    if html_out is not None:
        from .evaluation.dataset import load_dataset
        from .evaluation.report_html import gold_items, render_html

        with _errors():
            _write(html_out, render_html(report, gold_total=gold_items(load_dataset(dataset))))
        console.print(f"HTML report written to {html_out}", markup=False)
    if report.leakage:
        raise typer.Exit(1)


def _earlier_report(path: Path) -> dict:
    """The ``--json`` report named by ``--against``, or a UsageError saying what is wrong with it."""
    import json

    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise UsageError(f"{path} is not JSON: --against takes a report written by dossier eval --json") from None
    questions = earlier.get("per_question") if isinstance(earlier, dict) else None
    if not isinstance(questions, list) or not all(isinstance(q, dict) and "id" in q and isinstance(q.get("metrics"), dict)
                                                  for q in questions):  # fmt: skip
        raise UsageError(f"{path} has no per-question metrics: --against takes a report written by dossier eval --json")
    return earlier


@app.command()
def calibrate(
    dataset: Path = typer.Argument(..., help="A labelled dataset (docs/evaluation.md)."),
    write: bool = flag("--write", "Store the recommended thresholds as the dataset orgs' settings in --db."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the calibration as JSON here (default: "
                                            "not written)."),
    db: Optional[str] = DB_OPTION,
) -> None:
    """Measure every threshold on labelled questions and recommend values for this corpus and model."""
    import dataclasses
    import json
    import tempfile

    from .evaluation.calibrate import calibrate as run_calibration
    from .evaluation.dataset import load_dataset
    from .evaluation.render import render_calibration
    from .identifiers import clip

    with _errors():
        if json_out is not None:  # say so before the scan, not after it
            _writable(json_out, "--json")
        data = load_dataset(dataset)
        orgs = sorted({q.org for q in data.questions})
        callers = {(c.org, c.id) for c in data.bundle.callers}
        for q in data.questions:  # said before the scan, as the dataset's other errors are
            if q.org not in {o.id for o in data.bundle.orgs} or (q.org, q.caller) not in callers:
                raise UsageError(f"dataset {dataset}: question {clip(q.id)} asks as {clip(q.caller)} of org {clip(q.org)}, "
                                 "which its bundle does not hold")  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="dossier-calibrate-") as tmp, dossier.open(f"sqlite:///{tmp}/c.db") as engine:
            engine.load_bundle(data.bundle)
            with err.status("scanning thresholds") as status:
                result = run_calibration(engine, data, orgs=orgs, progress=lambda name: status.update(f"scanning {name}"))
        render_calibration(console, result)
        if json_out is not None:
            _write(json_out, json.dumps(result.as_dict(), indent=2))
        if write:
            url = _url(db)  # a write: the store may be new (thresholds can be set before the data is loaded)
            fits = _fit_rankers(data, orgs)
            with dossier.open(url) as target:
                for org in orgs:
                    own: dict[str, Any] = {"thresholds": dataclasses.asdict(result.thresholds)}
                    reason = fits[org].reason
                    if fits[org].spec is not None:
                        own["rankers"] = {"sections": fits[org].spec}
                    elif _stored_ranker(target, org):
                        # the org's other settings, and a ranker fitted earlier, are kept (save_org_settings merges)
                        reason = reason.replace("the shipped ranker stays", "the org's ranker fitted earlier stays")
                    target.save_org_settings(org, own)
                    console.print(f"{org}: section ranker: {reason}", markup=False)
            console.print(f"stored the recommended thresholds for {', '.join(orgs)} in {redacted_url(url)}",
                          markup=False)  # fmt: skip


def _stored_ranker(engine: Any, org: str) -> bool:
    """Whether ``org`` has a section ranker of its own stored (a row that cannot be read has none)."""
    try:
        rankers = (engine.store.get_settings(org=org) or {}).get("rankers")
    except (ValueError, TypeError, AttributeError):
        return False
    return isinstance(rankers, dict) and bool(rankers.get("sections"))


def _ranker_to_beat() -> "LinearRanker":
    """The section ranker an org without its own runs: the shipped one, or the file ``$DOSSIER_RANKER_FILE``
    names. An org's fit is kept only where it beats that one on the org's held-out questions."""
    from .pipeline.features import SECTION_FEATURES
    from .providers.ranker import FILE_ENV, shipped

    return shipped("sections", SECTION_FEATURES, path=os.environ.get(FILE_ENV) or None)


def _fit_rankers(data: "Dataset", orgs: list[str]) -> dict[str, "OrgFit"]:
    """Each org's own section ranker, fitted on its labelled questions (or the reason it keeps the shipped one)."""
    import tempfile

    from .evaluation.fit import OrgFit, fit_org
    from .providers.ranker import RankerUnavailable

    try:
        base = _ranker_to_beat()
    except RankerUnavailable as exc:
        return {org: OrgFit(org, None, f"no shipped ranker to compare with ({exc})", {}) for org in orgs}
    with tempfile.TemporaryDirectory(prefix="dossier-fit-") as tmp, dossier.open(f"sqlite:///{tmp}/f.db") as engine:
        engine.load_bundle(data.bundle)
        fits: dict[str, OrgFit] = {}
        with err.status("fitting section rankers"):
            for org in orgs:
                try:
                    fits[org] = fit_org(engine, data.questions, org=org, shipped=base)
                except DossierError as exc:  # scikit-learn missing, nothing to learn from ...
                    fits[org] = OrgFit(org, None, f"{exc}: the shipped ranker stays", {})
        return fits


# -- the service: keys, usage, HTTP and MCP servers (docs/service.md) ---------------------------------
keys_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, context_settings=app.info.context_settings,
                       help="API keys of the HTTP and MCP servers (stored hashed).")
app.add_typer(keys_app, name="keys")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@keys_app.command("create")
def keys_create(
    org: str = typer.Option(..., "--org", help="The org the key acts in."),
    caller: str = typer.Option(..., "--caller", help="The caller the key acts as (its roles decide visibility)."),
    name: Optional[str] = typer.Option(None, "--name", help="A label for people, shown by 'keys list' (default: none)."),
    db: Optional[str] = DB_OPTION,
) -> None:
    """Create an API key and print it once (only its hash is stored)."""
    from .service import Service

    url = _existing(db)
    with _errors(url), dossier.open(url) as engine:
        row, key = Service(engine).create_key(org, caller, name=name)
    err.print(f"key {row.id} for caller {caller!r} of org {org!r}; it is shown once, store it now:", markup=False)
    print(key)


@keys_app.command("list")
def keys_list(org: Optional[str] = typer.Option(None, "--org", help="Only this org's keys (default: every org's)."),
              db: Optional[str] = DB_OPTION) -> None:  # fmt: skip
    """List keys (ids, org, caller, when created and revoked; never the keys themselves)."""
    from rich.table import Table

    with _errors(), _service_store(db) as store:
        rows = store.list_keys(org=org)
    table = Table(title=f"{len(rows)} API key(s)", title_justify="left")
    for column in ("id", "org", "caller", "name", "created", "revoked"):
        table.add_column(column)
    for r in rows:
        table.add_row(*map(escape, (r.id, r.org, r.caller, r.name or "")), _when(r.created_at),
                      _when(r.revoked_at) if r.revoked_at else "")  # fmt: skip
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="The key's id (from 'keys list'), or the key itself."),
                db: Optional[str] = DB_OPTION) -> None:  # fmt: skip
    """Revoke a key; requests with it are refused (401) from then on."""
    from .service import Service, split_key

    parts = split_key(key_id)
    url = _existing(db)
    with _errors(url), dossier.open(url) as engine:
        Service(engine).revoke_key(parts[0] if parts else key_id)
    console.print(f"revoked {parts[0] if parts else key_id}", markup=False)


@app.command()
def usage(
    org: str = typer.Option(..., "--org", help="The org whose ledger to sum."),
    since: Optional[str] = typer.Option(None, "--since", help="From this UTC date (YYYY-MM-DD) on (default: all time)."),
    as_json: bool = flag("--json", "Print JSON."),
    db: Optional[str] = DB_OPTION,
) -> None:
    """An org's billing ledger: units charged up front per call, refunded when a call failed."""
    import json
    from datetime import datetime, timezone

    from rich.table import Table

    url = _existing(db)
    with _errors(url):
        start = None
        if since:
            try:
                start = datetime.strptime(since, "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()
            except ValueError:
                raise UsageError(f"--since {since!r} is not a date like 2025-01-31") from None
        _known_org(url, org)
        with _service_store(db) as store:
            lines = store.usage(org=org, since=start, until=None)
    if as_json:
        print(json.dumps({"org": org, "items": [{"item": u.item, "calls": u.calls, "charged": u.charged,
              "refunded": u.refunded, "net": u.net} for u in lines], "net": sum(u.net for u in lines)}, indent=2))  # fmt: skip
        return
    table = Table(title=f"usage of {escape(org)}" + (f" since {escape(since)}" if since else ""), title_justify="left")
    for column in ("item", "calls", "charged", "refunded", "net"):
        table.add_column(column, justify="left" if column == "item" else "right")
    for u in lines:
        table.add_row(escape(u.item), str(u.calls), str(u.charged), str(u.refunded), str(u.net))
    table.add_row("total", str(sum(u.calls for u in lines)), str(sum(u.charged for u in lines)),
                  str(sum(u.refunded for u in lines)), str(sum(u.net for u in lines)), style="bold")  # fmt: skip
    console.print(table)


def _known_org(url: str, org: str) -> None:
    """NotFound for an org the store does not hold (read without the engine), as 'keys create' says it."""
    from .stores import store_from_url

    store = store_from_url(url)
    try:
        known = getattr(store, "org_ids", None)  # an administrative read, not of the Store protocol (as stats)
        if known is not None and org not in known():
            raise NotFound(f"unknown org {org!r}: load it first (dossier load)")
    finally:
        store.close()


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 for every interface)."),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    workers: int = typer.Option(1, "--workers", help="Worker processes (they share nothing but the store)."),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log", help="Log one line per request."),
    api_docs: bool = typer.Option(False, "--api-docs", help="Also serve Swagger UI at /docs (its script comes from a CDN)."),
    db: Optional[str] = DB_OPTION,
) -> None:
    """Serve the HTTP API (/v1/...) and MCP over streamable HTTP (/mcp); keys from 'dossier keys create'."""
    import uvicorn

    url = _existing(db)
    with _errors(url), dossier.open(url):
        pass  # fail here, in one line, if the store cannot be opened
    os.environ["DOSSIER_DATABASE_URL"] = url
    # every worker runs calls on a few threads (Settings.service.call_threads): one inference thread each
    # unless cores are left over (more would spin and steal from the calls)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_worker = max(workers, 1) * dossier.Settings().service.call_threads
    os.environ.setdefault("DOSSIER_EMBED_THREADS", str(max(1, cores // per_worker)))
    if host in LOOPBACK:  # MCP's DNS-rebinding check of the Host header, as the SDK does on loopback
        os.environ["DOSSIER_ALLOWED_HOSTS"] = "127.0.0.1:*,localhost:*,[::1]:*"
    if api_docs:
        os.environ["DOSSIER_API_DOCS"] = "1"
    served = "API /v1, MCP /mcp, inspector /inspect, OpenAPI /openapi.json" + (", Swagger UI /docs" if api_docs else "")
    err.print(f"dossier: serving {redacted_url(url)} on http://{host}:{port} ({served})", markup=False)
    uvicorn.run("dossier.http:app_from_env", factory=True, host=host, port=port, workers=workers,
                access_log=access_log, log_level="info" if access_log else "warning")  # fmt: skip


@app.command("mcp")
def mcp_stdio(db: Optional[str] = DB_OPTION) -> None:
    """Serve MCP over stdio as the caller of the key in $DOSSIER_API_KEY (for desktop MCP hosts)."""
    from .errors import Unauthorized

    key = os.environ.get("DOSSIER_API_KEY")
    if not key:
        with _errors():
            raise UsageError("dossier mcp serves the caller of one API key: set DOSSIER_API_KEY to a key from "
                             "'dossier keys create --org ORG --caller CALLER'")  # fmt: skip
    url = _existing(db)
    from .mcp import serve_stdio
    from .service import Service

    with _errors(url), dossier.open(url) as engine:
        service = Service(engine)
        try:
            service.authenticate(key)
        except Unauthorized as exc:
            raise Unauthorized(f"DOSSIER_API_KEY: {exc} (store: {redacted_url(url)})") from None
        engine.embed_query("warm up")  # load the model before the first call
        serve_stdio(service, key)


@contextmanager
def _service_store(db: str | None) -> Iterator[Any]:
    """The service tables (keys, audit, ledger) of an existing store, without loading the engine."""
    from .stores.service_base import service_store_from_url

    store = service_store_from_url(_existing(db))
    try:
        yield store
    finally:
        store.close()


def _when(at: float | None) -> str:
    from datetime import datetime, timezone

    return "" if at is None else datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def main() -> None:
    # the click that typer runs on (its own copy in recent typer releases, click itself before)
    click = sys.modules[typer.BadParameter.__module__]
    no_args = getattr(click, "NoArgsIsHelpError", ())
    try:
        outcome = app(standalone_mode=False)
    except no_args as exc:  # a command group alone: its help, as before
        exc.show()
        sys.exit(exc.exit_code)
    except click.UsageError as exc:  # an unknown option, a missing one, a value of the wrong type: one line
        see = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        print(f"error: {exc.format_message().rstrip('.')}{see}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):  # pragma: no cover - Ctrl-C
        sys.exit(130)
    sys.exit(outcome if isinstance(outcome, int) else 0)


if __name__ == "__main__":
    main()
