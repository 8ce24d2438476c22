"""Rich rendering of a retrieve response for the terminal (used by ``dossier retrieve`` and ``demo``).

Everything that comes from the store or the request (ids, texts, errors) is escaped: it prints as it is,
never as rich markup.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .layers.budget import packed_text
from .schema import SOURCE_NAMES, RetrieveResponse, item_key

STATUS_STYLE = {"ok": "green", "empty": "yellow", "error": "red", "skipped": "dim"}


def render_response(console: Console, response: RetrieveResponse, *, width: int = 110) -> None:
    record = response.record
    if record is None:
        console.print("[bold]record:[/] none resolved")
    elif record.tombstone:
        console.print(f"[bold]record:[/] {escape(record.id)} ({record.kind}) "
                      f"[red]tombstone: pending deletion, nothing attached[/]")  # fmt: skip
    else:
        extra = []
        if record.merged_from:
            extra.append(f"merged from {', '.join(record.merged_from)}")
        if record.aliases:
            extra.append(f"aliases {', '.join(record.aliases)}")
        shown = f"  [dim]{escape('; '.join(extra))}[/]" if extra else ""
        console.print(f"[bold]record:[/] {escape(record.id)} ({record.kind}){shown}")
    console.print(f"[bold]mode:[/] {response.mode}   [bold]call:[/] {response.call_id}   "
                  f"[bold]partial:[/] {'[red]yes[/]' if response.partial else 'no'}")  # fmt: skip
    for name in SOURCE_NAMES:
        result = response.sources[name]
        route = response.route.get(name)
        style = STATUS_STYLE[result.status]
        head = f"[bold]{name}[/] [{style}]{result.status}[/] {len(result.items)} item(s), {result.bytes_used} B"
        if result.dropped:
            head += f", {result.dropped} dropped (budget)"
        if route and route.backend:
            head += f"  [dim]backend {escape(route.backend)}[/]"
        if route and route.fallback_reason:
            head += f"  [yellow]fallback: {escape(route.fallback_reason)}[/]"
        if route and route.detail.get("skipped"):
            head += f"  [dim]({escape(str(route.detail['skipped']))})[/]"
        console.print(head)
        if result.error:
            console.print(f"    [red]{escape(result.error)}[/]", highlight=False)
        for item in result.items:
            text = packed_text(item).replace("\n", " / ")
            if len(text) > width:
                text = text[: width - 1] + "…"
            tag = str(getattr(item, "tier", None) or getattr(item, "confidence", None) or "")
            console.print(f"    [cyan]{escape(item_key(item))}[/] [dim]{escape(tag)}[/] {escape(text)}", highlight=False)
    budget = response.budget
    table = Table(title=f"budget: {sum(budget.used.values())} of {budget.total_bytes} bytes used", title_justify="left")
    for column in ("source", "share", "used", "dropped"):
        table.add_column(column, justify="left" if column == "source" else "right")
    for name in SOURCE_NAMES:
        table.add_row(name, str(budget.share.get(name, 0)), str(budget.used.get(name, 0)), str(budget.dropped.get(name, 0)))
    console.print(table)
    if response.synthesis is not None:
        s = response.synthesis
        console.print(f"[bold]synthesis:[/] {escape(s.answer) if s.answer else '[dim]none[/]'}"
                      + (f"  [yellow]({escape(s.error)})[/]" if s.error else ""))  # fmt: skip
    if response.trace is not None:  # asked for: every decision, one line each, then the counts of the rest
        render_trace(console, response)


def render_trace(console: Console, response: RetrieveResponse) -> None:
    """The evidence trace, one line per decision (source, id, layer, decision, reason, score), and the
    drops of items the caller may not see, as counts per layer and reason."""
    trace = response.trace or []
    console.print(f"[bold]trace:[/] {len(trace)} decision(s)")
    for entry in trace:
        score = "-" if entry.score is None else f"{entry.score:.3f}"
        line = f"{entry.source} {entry.id} {entry.layer} {entry.decision} {entry.reason or '-'} {score}"
        console.print(f"    {escape(line)}", highlight=False)
    withheld = response.withheld or {}
    counts = "; ".join(f"{layer}: {reason} {n}" for layer, reasons in withheld.items() for reason, n in reasons.items())
    console.print(f"[bold]withheld:[/] {escape(counts) if counts else 'none'}", highlight=False)
