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

app = typer.Typer(no_args_is_help=True, add_completion=False, help="dossier: one call, one record, one byte budget.")
console = Console()
err = Console(stderr=True)
DB_OPTION = typer.Option(None, "--db", help="Store URL (default: $DOSSIER_DATABASE_URL or sqlite:///dossier.db).")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _url(db: str | None) -> str:
    return db or os.environ.get("DOSSIER_DATABASE_URL") or "sqlite:///dossier.db"


@contextmanager
def _errors() -> Iterator[None]:
    """Turn dossier errors into one line per problem and an exit code (2: your input, 1: ours)."""
    try:
        yield
    except BundleError as exc:
        for problem in exc.problems:
            err.print(f"error: {problem}", markup=False, highlight=False)
        err.print(f"nothing was loaded ({len(exc.problems)} problem(s))", markup=False)
        raise typer.Exit(2) from None
    except UsageError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    except DossierError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from None


@contextmanager
def _progress(label: str) -> Iterator:
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, 1))

        yield update


def _print_report(report: LoadReport, *, where: str) -> None:
    table = Table(title=f"loaded into {where} in {report.seconds:.2f} s", title_justify="left")
    for column in ("kind", "inserted", "updated", "unchanged"):
        table.add_column(column, justify="right" if column != "kind" else "left")
    kinds = ("orgs", "callers", "records", "memories", "documents", "edges")
    for kind in kinds:
        table.add_row(kind, *(str(getattr(report, f).get(kind, 0)) for f in ("inserted", "updated", "unchanged")))
    console.print(table)
    console.print(f"embedded {report.embedded} text(s); inserted {report.total_inserted}, updated {report.total_updated}")


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


def _print_counts(engine: dossier.Engine) -> None:
    orgs = engine.store.org_ids() if hasattr(engine.store, "org_ids") else []
    table = Table(title="store contents", title_justify="left")
    table.add_column("org")
    kinds = ("callers", "records", "memories", "documents", "sections", "edges", "vectors")
    for kind in kinds:
        table.add_column(kind, justify="right")
    for org in orgs:
        counts = engine.store.counts(org=org)
        table.add_row(org, *(str(counts[k]) for k in kinds))
    console.print(table)


@app.command()
def demo(
    db: Path = typer.Option(Path("dossier-demo.db"), "--db", help="Where to create the demo store (replaced)."),
    bundle: Path = typer.Option(EXAMPLES / "sample-org.json", "--bundle", help="The sample bundle."),
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
            _print_report(report, where=str(db.resolve()))
            _print_counts(engine)
        console.print(f"demo store: {db.resolve()} ({time.perf_counter() - started:.2f} s in all)")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":
    main()
