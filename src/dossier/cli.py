"""The ``dossier`` command line: a thin front end over the public API."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import dossier

from .errors import BundleError, DossierError, UsageError
from .loading import LoadReport
from .render import render_response
from .schema import RetrieveRequest

app = typer.Typer(no_args_is_help=True, add_completion=False, help="dossier: one call, one record, one byte budget.")
console = Console()
err = Console(stderr=True)
DB_OPTION = typer.Option(None, "--db", help="Store URL (default: $DOSSIER_DATABASE_URL or sqlite:///dossier.db).")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LLM_OPTION = typer.Option(
    None, "--llm", envvar="DOSSIER_LLM",
    help="Chat model for deep steps and synthesis: openai:<model> (honours OPENAI_BASE_URL and OPENAI_API_KEY).",
)  # fmt: skip
RERANK_OPTION = typer.Option(
    None, "--rerank", envvar="DOSSIER_RERANK",
    help="Reranker for deep calls: cross-encoder:<local dir>, openai:<model> or an http(s) rerank URL.",
)  # fmt: skip


def _url(db: str | None) -> str:
    return db or os.environ.get("DOSSIER_DATABASE_URL") or "sqlite:///dossier.db"


@contextmanager
def _errors() -> Iterator[None]:
    """Turn dossier errors into one line per problem and an exit code (2: your input, 1: ours)."""
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
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


@contextmanager
def _progress(label: str) -> Iterator:
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, 1))

        yield update


def _print_report(report: LoadReport, *, where: str, to: Console = console) -> None:
    table = Table(title=f"loaded into {where} in {report.seconds:.2f} s", title_justify="left")
    for column in ("kind", "inserted", "updated", "unchanged"):
        table.add_column(column, justify="right" if column != "kind" else "left")
    kinds = ("orgs", "callers", "records", "memories", "documents", "edges")
    for kind in kinds:
        table.add_row(kind, *(str(getattr(report, f).get(kind, 0)) for f in ("inserted", "updated", "unchanged")))
    to.print(table)
    to.print(f"embedded {report.embedded} text(s); inserted {report.total_inserted}, updated {report.total_updated}")
    for line in report.ignored_lines():
        to.print(line, highlight=False)


@app.command()
def load(file: Path = typer.Argument(..., help="A bundle (JSON)."), db: Optional[str] = DB_OPTION) -> None:
    """Load a JSON bundle; idempotent by id, all or nothing."""
    with _errors(), dossier.open(_url(db)) as engine, _progress("embedding") as update:
        report = engine.load_bundle(file, progress=update)
    _print_report(report, where=_url(db))


@app.command("add-doc")
def add_doc(
    file: Path = typer.Argument(..., help="A markdown file; sections start at headings."),
    org: str = typer.Option(..., "--org", help="The org the document belongs to."),
    title: Optional[str] = typer.Option(None, "--title", help="Title (default: the file's '# Title')."),
    doc_id: Optional[str] = typer.Option(None, "--id", help="Document id (default: slug of the title)."),
    doc_type: str = typer.Option("guideline", "--type", help="Document type, e.g. guideline, policy, playbook."),
    tags: str = typer.Option("", "--tags", help="Comma-separated tags."),
    roles: Optional[str] = typer.Option(None, "--roles", help="Comma-separated roles that may see it (default: whole org)."),
    db: Optional[str] = DB_OPTION,
) -> None:
    """Load a markdown document, split into sections at its headings."""
    split = lambda text: [t.strip() for t in text.split(",") if t.strip()]  # noqa: E731
    with _errors(), dossier.open(_url(db)) as engine, _progress("embedding") as update:
        report = engine.add_markdown(
            file, org=org, title=title, doc_id=doc_id, doc_type=doc_type, tags=split(tags),
            visible_to_roles=None if roles is None else split(roles), progress=update,
        )  # fmt: skip
    _print_report(report, where=_url(db))


@app.command()
def stats(db: Optional[str] = DB_OPTION) -> None:
    """Counts per kind, per org, of what the store holds."""
    with _errors(), dossier.open(_url(db)) as engine:
        _print_counts(engine)


def _print_counts(engine: dossier.Engine, to: Console = console) -> None:
    orgs = engine.store.org_ids() if hasattr(engine.store, "org_ids") else []
    table = Table(title="store contents", title_justify="left")
    table.add_column("org")
    kinds = ("callers", "records", "memories", "documents", "sections", "edges", "vectors")
    for kind in kinds:
        table.add_column(kind, justify="right")
    for org in orgs:
        counts = engine.store.counts(org=org)
        table.add_row(org, *(str(counts[k]) for k in kinds))
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
    request_file: Optional[Path] = typer.Argument(None, help="A request as JSON (file, or - for stdin); options below override it."),
    org: str = typer.Option(..., "--org", envvar="DOSSIER_ORG", help="The caller's org."),
    caller: str = typer.Option(..., "--caller", envvar="DOSSIER_CALLER", help="The caller id (its roles decide visibility)."),
    message: Optional[str] = typer.Option(None, "--message", "-m", help="The question."),
    email: Optional[str] = typer.Option(None, "--email", help="Record by email."),
    phone: Optional[str] = typer.Option(None, "--phone", help="Record by phone."),
    website: Optional[str] = typer.Option(None, "--website", help="Record by website."),
    profile_url: Optional[str] = typer.Option(None, "--profile-url", help="Record by profile URL."),
    record_id: Optional[str] = typer.Option(None, "--record-id", help="Record by id."),
    mode: Optional[str] = typer.Option(None, "--mode", help="brief | scout | fetch | filter | expand."),
    depth: Optional[str] = typer.Option(None, "--depth", help="fast | standard | deep."),
    budget: Optional[int] = typer.Option(None, "--budget", help="Budget in bytes (totalTokens), at most 50000."),
    fetch: Optional[str] = typer.Option(None, "--fetch", help="Comma-separated document ids (fetch mode)."),
    as_json: bool = typer.Option(False, "--json", help="Print the raw response as JSON."),
    trace: bool = typer.Option(False, "--trace", help="Include the per-item evidence trace."),
    synthesize: bool = typer.Option(False, "--synthesize", help="Also answer from the packed context (needs --llm)."),
    deferred: bool = typer.Option(False, "--deferred", help="Synthesize in the background: the context prints at once, "
                                  "the answer is stored for 'dossier result CALL_ID'."),
    llm: Optional[str] = LLM_OPTION,
    rerank: Optional[str] = RERANK_OPTION,
    db: Optional[str] = DB_OPTION,
) -> None:
    """One retrieve call about one record; prints a summary (or --json)."""
    import json

    with _errors():
        body: dict = {}
        if request_file is not None:
            text = sys.stdin.read() if str(request_file) == "-" else _read(request_file)
            try:
                body = json.loads(text)
            except json.JSONDecodeError as exc:
                raise UsageError(f"request is not valid JSON: {exc}") from None
            if not isinstance(body, dict):
                raise UsageError("request must be a JSON object")
        ref = {k: v for k, v in (("email", email), ("phone", phone), ("website", website),
                                 ("profile_url", profile_url), ("id", record_id)) if v}  # fmt: skip
        if ref:
            body["record"] = ref
        for key, value in (("message", message), ("mode", mode), ("depth", depth)):
            if value is not None:
                body[key] = value
        if budget is not None:
            body.setdefault("budget", {})["totalTokens"] = budget
        if fetch:
            body["fetch"] = [f.strip() for f in fetch.split(",") if f.strip()]
        if trace:
            body["trace"] = True
        if synthesize or deferred:
            body["synthesize"] = True
        if deferred:
            body["deferred"] = True
        with dossier.open(_url(db), llm=llm, reranker=rerank) as engine:
            response = engine.retrieve(body, org=org, caller=caller)
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
    as_json: bool = typer.Option(False, "--json", help="Print the synthesis as JSON."),
    db: Optional[str] = DB_OPTION,
) -> None:
    """The synthesis of an earlier deferred call (exit code 3 while it is still running)."""
    with _errors(), dossier.open(_url(db), llm="none", reranker="none") as engine:
        synthesis = engine.result(call_id, org=org, caller=caller, wait=wait)
    if as_json:
        print(synthesis.model_dump_json(indent=2))
    elif synthesis.pending:
        console.print(f"call {call_id}: synthesis still running")
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


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


@app.command()
def schema(which: str = typer.Argument("both", help="request | response | both | bundle | dataset")) -> None:
    """Print a JSON Schema: the retrieve request and response, a bundle, or an evaluation dataset."""
    import json

    print(json.dumps(json_schemas(which), indent=2))


def json_schemas(which: str) -> dict:
    from .bundle import Bundle
    from .evaluation.dataset import dataset_schema
    from .schema import RetrieveResponse

    makers = {
        "request": RetrieveRequest.model_json_schema,
        "response": RetrieveResponse.model_json_schema,
        "bundle": Bundle.model_json_schema,
        "dataset": dataset_schema,
    }
    if which == "both":
        return {"request": makers["request"](), "response": makers["response"]()}
    if which not in makers:
        err.print(f"error: unknown schema {which!r}; expected request, response, both, bundle or dataset")
        raise typer.Exit(2)
    return makers[which]()


@app.command()
def demo(
    db: Path = typer.Option(Path("dossier-demo.db"), "--db", help="Where to create the demo store (replaced)."),
    bundle: Path = typer.Option(EXAMPLES / "sample-org.json", "--bundle", help="The sample bundle."),
    as_json: bool = typer.Option(False, "--json", help="Print the example call's raw response as JSON."),
) -> None:
    """Load the sample organisation into a fresh local store and show what it holds."""
    with _errors():
        if not bundle.is_file():
            raise UsageError(f"sample bundle not found at {bundle}; run from a clone of dossier or pass --bundle")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        started = time.perf_counter()
        with dossier.open(f"sqlite:///{db}") as engine:
            with _progress("embedding") as update:
                report = engine.load_bundle(bundle, progress=update)
            for doc in sorted(EXAMPLES.glob("docs/*.md")) if bundle.parent == EXAMPLES else []:
                report_md = engine.add_markdown(doc, org="northwind", doc_type="policy")
                report.embedded += report_md.embedded
                report.inserted["documents"] = report.inserted.get("documents", 0) + report_md.total_inserted
            out = err if as_json else console
            _print_report(report, where=str(db.resolve()), to=out)
            _print_counts(engine, to=out)
            out.print(f"demo store: {db.resolve()} (loaded in {time.perf_counter() - started:.2f} s)")
            out.print(f"\n[bold]example call[/] as caller ana of northwind: {EXAMPLE_CALL}", highlight=False)
            response = engine.retrieve(EXAMPLE_CALL, org="northwind", caller="ana")
        if as_json:
            print(response.model_dump_json(indent=2))
        else:
            render_response(console, response)


@app.command("eval")
def eval_(
    dataset: Path = typer.Argument(..., help="A labelled dataset (docs/evaluation.md)."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL to evaluate on (default: a fresh temporary SQLite file)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the full report (per question) as JSON here."),
    depth: Optional[str] = typer.Option(None, "--depth", help="Request depth for every question."),
    synthesize: bool = typer.Option(False, "--synthesize", help="Ask for synthesis on every question (cost per layer)."),
    llm: Optional[str] = LLM_OPTION,
    rerank: Optional[str] = RERANK_OPTION,
) -> None:
    """Run a labelled dataset through retrieve: quality per category and layer, leakage, latency, model cost."""
    import json

    from .evaluation.render import render_eval
    from .evaluation.runner import evaluate

    with _errors(), _progress("questions") as update:
        request = {**({"depth": depth} if depth else {}), **({"synthesize": True} if synthesize else {})}
        report = evaluate(dataset, store_url=store, request=request or None, progress=update, llm=llm, reranker=rerank)
    render_eval(console, report)
    if json_out is not None:
        json_out.write_text(json.dumps(report.as_dict(), indent=2, default=str), encoding="utf-8")
        console.print(f"report written to {json_out}")
    if report.leakage:
        raise typer.Exit(1)


@app.command()
def calibrate(
    dataset: Path = typer.Argument(..., help="A labelled dataset (docs/evaluation.md)."),
    write: bool = typer.Option(False, "--write", help="Store the recommended thresholds as the dataset orgs' settings in --db."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the calibration as JSON here."),
    db: Optional[str] = DB_OPTION,
) -> None:
    """Measure every threshold on labelled questions and recommend values for this corpus and model."""
    import dataclasses
    import json
    import tempfile

    from .evaluation.calibrate import calibrate as run_calibration
    from .evaluation.dataset import load_dataset
    from .evaluation.render import render_calibration

    with _errors():
        data = load_dataset(dataset)
        orgs = sorted({q.org for q in data.questions})
        with tempfile.TemporaryDirectory(prefix="dossier-calibrate-") as tmp, dossier.open(f"sqlite:///{tmp}/c.db") as engine:
            engine.load_bundle(data.bundle)
            with err.status("scanning thresholds") as status:
                result = run_calibration(engine, data, orgs=orgs, progress=lambda name: status.update(f"scanning {name}"))
        render_calibration(console, result)
        if json_out is not None:
            json_out.write_text(json.dumps(result.as_dict(), indent=2), encoding="utf-8")
        if write:
            fits = _fit_rankers(data, orgs)
            with dossier.open(_url(db)) as target:
                for org in orgs:
                    own = {"thresholds": dataclasses.asdict(result.thresholds)}
                    if fits[org].spec is not None:
                        own["rankers"] = {"sections": fits[org].spec}
                    target.save_org_settings(org, own)
                    console.print(f"{org}: section ranker: {fits[org].reason}")
            console.print(f"stored the recommended thresholds for {', '.join(orgs)} in {_url(db)}")


def _fit_rankers(data, orgs: list[str]) -> dict:  # type: ignore[no-untyped-def]
    """Each org's own section ranker, fitted on its labelled questions (or the reason it keeps the shipped one)."""
    import tempfile

    from .evaluation.fit import OrgFit, fit_org
    from .layers.features import SECTION_FEATURES
    from .providers.ranker import RankerUnavailable, shipped

    try:
        base = shipped("sections", SECTION_FEATURES)
    except RankerUnavailable as exc:
        return {org: OrgFit(org, None, f"no shipped ranker to compare with ({exc})", {}) for org in orgs}
    with tempfile.TemporaryDirectory(prefix="dossier-fit-") as tmp, dossier.open(f"sqlite:///{tmp}/f.db") as engine:
        engine.load_bundle(data.bundle)
        fits = {}
        with err.status("fitting section rankers"):
            for org in orgs:
                try:
                    fits[org] = fit_org(engine, data.questions, org=org, shipped=base)
                except DossierError as exc:  # scikit-learn missing, nothing to learn from ...
                    fits[org] = OrgFit(org, None, f"{exc}: the shipped ranker stays", {})
        return fits


# -- the service: keys, usage, HTTP and MCP servers (docs/service.md) ---------------------------------
keys_app = typer.Typer(no_args_is_help=True, help="API keys of the HTTP and MCP servers (stored hashed).")
app.add_typer(keys_app, name="keys")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@keys_app.command("create")
def keys_create(
    org: str = typer.Option(..., "--org", help="The org the key acts in."),
    caller: str = typer.Option(..., "--caller", help="The caller the key acts as (its roles decide visibility)."),
    name: Optional[str] = typer.Option(None, "--name", help="A label for people, shown by 'keys list'."),
    db: Optional[str] = DB_OPTION,
) -> None:
    """Create an API key and print it once (only its hash is stored)."""
    from .service import Service

    with _errors(), dossier.open(_url(db)) as engine:
        row, key = Service(engine).create_key(org, caller, name=name)
    err.print(f"key {row.id} for caller {caller!r} of org {org!r}; it is shown once, store it now:", markup=False)
    print(key)


@keys_app.command("list")
def keys_list(org: Optional[str] = typer.Option(None, "--org", help="Only this org's keys."), db: Optional[str] = DB_OPTION) -> None:
    """List keys (ids, org, caller, when created and revoked; never the keys themselves)."""
    from .service import Service

    with _errors(), dossier.open(_url(db)) as engine:
        rows = Service(engine).list_keys(org=org)
    table = Table(title=f"{len(rows)} API key(s)", title_justify="left")
    for column in ("id", "org", "caller", "name", "created", "revoked"):
        table.add_column(column)
    for r in rows:
        table.add_row(r.id, r.org, r.caller, r.name or "", _when(r.created_at), _when(r.revoked_at) if r.revoked_at else "")
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="The key's id (from 'keys list'), or the key itself."),
                db: Optional[str] = DB_OPTION) -> None:  # fmt: skip
    """Revoke a key; requests with it are refused (401) from then on."""
    from .service import Service, split_key

    parts = split_key(key_id)
    with _errors(), dossier.open(_url(db)) as engine:
        Service(engine).revoke_key(parts[0] if parts else key_id)
    console.print(f"revoked {parts[0] if parts else key_id}")


@app.command()
def usage(
    org: str = typer.Option(..., "--org", help="The org whose ledger to sum."),
    since: Optional[str] = typer.Option(None, "--since", help="From this UTC date (YYYY-MM-DD) on."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    db: Optional[str] = DB_OPTION,
) -> None:
    """An org's billing ledger: units charged up front per call, refunded when a call failed."""
    import json
    from datetime import datetime, timezone

    from .service import Service

    with _errors():
        start = None
        if since:
            try:
                start = datetime.strptime(since, "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()
            except ValueError:
                raise UsageError(f"--since {since!r} is not a date like 2025-01-31") from None
        with dossier.open(_url(db)) as engine:
            lines = Service(engine).usage(org, since=start)
    if as_json:
        print(json.dumps({"org": org, "items": [{"item": u.item, "calls": u.calls, "charged": u.charged,
              "refunded": u.refunded, "net": u.net} for u in lines], "net": sum(u.net for u in lines)}, indent=2))  # fmt: skip
        return
    table = Table(title=f"usage of {org}" + (f" since {since}" if since else ""), title_justify="left")
    for column in ("item", "calls", "charged", "refunded", "net"):
        table.add_column(column, justify="left" if column == "item" else "right")
    for u in lines:
        table.add_row(u.item, str(u.calls), str(u.charged), str(u.refunded), str(u.net))
    table.add_row("total", str(sum(u.calls for u in lines)), str(sum(u.charged for u in lines)),
                  str(sum(u.refunded for u in lines)), str(sum(u.net for u in lines)), style="bold")  # fmt: skip
    console.print(table)


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 for every interface)."),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    workers: int = typer.Option(1, "--workers", help="Worker processes (they share nothing but the store)."),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log", help="Log one line per request."),
    db: Optional[str] = DB_OPTION,
) -> None:
    """Serve the HTTP API (/v1/...) and MCP over streamable HTTP (/mcp); keys from 'dossier keys create'."""
    import uvicorn

    url = _url(db)
    with _errors(), dossier.open(url):
        pass  # fail here, in one line, if the store cannot be opened
    os.environ["DOSSIER_DATABASE_URL"] = url
    # every worker runs calls on a few threads (Settings.service.call_threads): one inference thread each
    # unless cores are left over (more would spin and steal from the calls)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_worker = max(workers, 1) * dossier.Settings().service.call_threads
    os.environ.setdefault("DOSSIER_EMBED_THREADS", str(max(1, cores // per_worker)))
    if host in LOOPBACK:  # MCP's DNS-rebinding check of the Host header, as the SDK does on loopback
        os.environ["DOSSIER_ALLOWED_HOSTS"] = "127.0.0.1:*,localhost:*,[::1]:*"
    err.print(f"dossier: serving {url} on http://{host}:{port} (API /v1, MCP /mcp, docs /docs)", markup=False)
    uvicorn.run("dossier.http:app_from_env", factory=True, host=host, port=port, workers=workers,
                access_log=access_log, log_level="info" if access_log else "warning")  # fmt: skip


@app.command("mcp")
def mcp_stdio(db: Optional[str] = DB_OPTION) -> None:
    """Serve MCP over stdio as the caller of the key in $DOSSIER_API_KEY (for desktop MCP hosts)."""
    from .mcp import serve_stdio
    from .service import Service

    with _errors(), dossier.open(_url(db)) as engine:
        service = Service(engine)
        service.authenticate(os.environ.get("DOSSIER_API_KEY"))
        engine.embed_query("warm up")  # load the model before the first call
        serve_stdio(service, os.environ.get("DOSSIER_API_KEY"))


def _when(at: float | None) -> str:
    from datetime import datetime, timezone

    return "" if at is None else datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":
    main()
