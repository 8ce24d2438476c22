"""Layer 6, govern: remove what this caller may not see, re-checked against fresh rows, fail closed.

Runs after recall and before section selection, so that nothing the caller cannot see is ever
selected, packed, or handed to a model. Every store read is already scoped to the org, and the documents
source searches only the sections this caller may see (``sources/documents.py``: ``Hidden``); this layer
is the second line: it re-reads each candidate's owner and drops it when the check cannot decide.

What is left when it is done is what the caller may see (``Call.cleared``): the trace the caller
gets names those items only (``layers/report.py``), whatever layer noted what. A call that asked for
no trace gets none, so this layer then notes no drops and leaves ``Call.cleared`` empty.
"""

from __future__ import annotations

from typing import Any, Callable

from ..schema import SOURCE_NAMES, SourceName, item_key
from ..pipeline.call import Call, public_error
from ..pipeline.visibility import document_verdict, shown_records
from .session import screen_page


def govern(call: Call) -> None:
    _govern_documents(call)
    _govern_memories(call)
    _govern_records(call, "properties", lambda item: [item.record_id])
    _govern_records(call, "graph", lambda item: [item.src, item.dst])
    screen_page(call)  # an expand page of another caller's session with nothing left for this one
    if call.request.trace:  # only the trace reads it (layers/report.py)
        call.cleared = cleared(call)


def cleared(call: Call) -> set[tuple[str, str]]:
    """(source, item id) of everything governance let through: the candidates left, and every section
    of a document this caller may see (a later layer may pick a sibling section that was no candidate).
    External items are the registered adapters' answers to this caller, with nothing to re-check."""
    out = {("documents", s.id) for d in call.documents.values() for s in d.sections}
    for source in SOURCE_NAMES:
        out.update((source, item_key(item)) for item in call.candidates[source])
    return out


def _govern_documents(call: Call) -> None:
    """Sections whose documents this caller may see, on fresh rows: what recall found (section
    candidates) and an expand page alike (its section items, restored by layers/session.py)."""
    items = call.candidates["documents"]
    if not items:
        return
    ids = sorted({c.document_id for c in items})
    try:
        fresh = {d.id: d for d in call.store.get_documents(ids, org=call.org)}
    except Exception as exc:  # noqa: BLE001 - cannot decide: drop everything (fail closed)
        if call.request.trace:
            for c in items:
                call.note("documents", c.section_id, "govern", "dropped", "visibility_check_failed", c.score)
        call.candidates["documents"] = []
        call.fail("documents", f"visibility check failed: {public_error(exc)}")
        return
    # one verdict per document (the rule reads the document and the call, not the section), and the
    # section ids of each, read once
    verdicts = {i: document_verdict(call, fresh.get(i)) for i in ids}
    sections = {i: {s.id for s in d.sections} for i, d in fresh.items() if verdicts[i] is None}
    trace = call.request.trace
    kept = []
    for c in items:
        verdict = verdicts[c.document_id]
        if verdict is None and c.section_id not in sections[c.document_id]:
            verdict = "not_found"
        if verdict is None:
            kept.append(c)
        elif trace:
            call.note("documents", c.section_id, "govern", "dropped", verdict, c.score)
    call.candidates["documents"] = kept
    call.documents = {i: d for i, d in fresh.items() if verdicts[i] is None}


def _govern_memories(call: Call) -> None:
    allowed = set(call.resolution.record_ids)
    kept = []
    for item in call.candidates["memories"]:
        if item.record_id in allowed:
            kept.append(item)
        elif call.request.trace:
            call.note("memories", item.id, "govern", "dropped", "record_not_allowed", item.score)
    call.candidates["memories"] = kept


def _govern_records(call: Call, source: SourceName, owners: Callable[[Any], list[str]]) -> None:
    items = call.candidates[source]
    if not items:
        return
    ids = sorted({rid for item in items for rid in owners(item)})
    try:
        live = shown_records(call.store, ids, org=call.org)
    except Exception as exc:  # noqa: BLE001 - fail closed
        call.candidates[source] = []
        call.fail(source, f"visibility check failed: {public_error(exc)}")
        return
    kept = []
    for item in items:
        if all(rid in live for rid in owners(item)):
            kept.append(item)
        elif call.request.trace:
            call.note(source, item_key(item), "govern", "dropped", "record_hidden")
    call.candidates[source] = kept

