"""Layers 1 and 11, sessions: page through what a call could not fit (``expand`` mode).

A brief, scout, fetch or filter call whose items did not all fit its budget (``dropped > 0``) opens a
session: the items left over, how many were returned and who the call was about, kept in the service
tables (the same database as the data, so any worker can serve the next page) under an unguessable id,
returned as ``continuation``. ``expand`` with that id packs the next page from what is left, by the
same budget rules, and returns the same id while anything remains (``None`` once everything has been
returned, and the session is gone).

A session belongs to its org: another org's id reads exactly like an unknown one (nothing tells it exists). It
expires after ``Settings.service.session_idle_seconds`` (1 hour) unused. Every page is governed again
against fresh rows and the expanding caller's roles: a record deleted since the first page, or a document
whose roles changed, is not returned: the page goes into the same candidate slots as recall's, and
the one governance layer (layers/govern.py) judges it. An explicit ``sources: {x: false}`` keeps that
source's items out of this page (they stay in the session).

Two steps of ``PIPELINE`` (dossier.retrieve): :func:`restore_session` runs first (an expand call's page
and record; ``plan`` then plans the page from ``call.session``), :func:`keep_session` after synthesis,
before ``report`` (which returns ``call.continuation``).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from pydantic import TypeAdapter

from ..bundle import has_value
from ..errors import InvalidRequest
from ..identifiers import clip
from ..schema import MAX_BUDGET, SOURCE_NAMES, Item, SourceName, item_key
from ..stores.service_base import Session
from ..pipeline.call import Call, Resolution, Restored, public_error
from .budget import ELLIPSIS, MIN_CUT_BYTES, size
from .plan import infer_mode
from ..pipeline.visibility import shown_records, survivor
from .resolve import live_merged_from

_ITEM: TypeAdapter[Any] = TypeAdapter(Item)


def restore_session(call: Call) -> None:
    """An expand call: load its session, re-resolve who it was about, and put what is left into the
    candidate slots (governance judges it again). Other calls: nothing."""
    request = call.request
    if infer_mode(request) != "expand":
        return
    sid = request.continuation or ""
    if not sid:
        raise InvalidRequest("continuation is missing: expand pages through the continuation of an earlier call",
                             field="continuation")  # fmt: skip
    session = call.steps.service_store().get_session(sid)
    if session is not None and session.org != call.org:
        session = None  # another org's continuation reads exactly like an unknown one
    now = time.time()
    if session is None or session.last_used < now - call.settings.service.session_idle_seconds:
        raise unknown_continuation(sid)
    state = json.loads(session.state)
    call.resolution = _resolution(call, state)
    page: dict[SourceName, list[Any]] = {}
    for source, items in state["remaining"].items():
        if getattr(request.sources, source) is False:
            continue  # explicit false wins; those items wait in the session
        page[source] = [_ITEM.validate_python(item) for item in items]
    if call.resolution.tombstone:
        page = {}  # a tombstone carries nothing, and nothing attached to it anywhere
    for source in list(page):
        try:
            page[source] = _fresh(call, source, page[source])
        except Exception as exc:  # noqa: BLE001 - fail closed: nothing of a source that cannot be read again
            call.fail(source, f"reading the waiting items again failed: {public_error(exc)}")
            del page[source]  # its items wait in the session for the next page, as a source left out does
    for source, items in page.items():
        call.candidates[source] = items
        if call.results[source].status == "skipped":
            call.results[source].status = "empty"
    # what the session's own caller did with it (its call, its pages, how much it was given) is its own: a
    # caller paging through another's continuation is told none of it (the earlier pages may have held
    # items it may not see)
    own = session.caller == call.caller.id
    opened = {"opened_by": session.call_id, "page": state["page"] + 1, "returned_before": state["returned"]}
    call.decide("session", ran=True, backend="session", detail=opened if own else {})
    call.session = Restored(session=session, state=state, page=frozenset(page), own=own)


def _fresh(call: Call, source: str, items: list[Any]) -> list[Any]:
    """The waiting ``items`` of ``source`` as they are now: a memory's text, record and date, a section's title,
    heading and text, a property's value read again (one read per source), and those no longer there left
    out (a memory removed, a section dropped from its document, a property a record no longer has). Governance
    then judges what they are now, not what they were (a memory moved to another record since the first page
    is that record's). Edges come from the first call's walk made again (an edge deactivated since, or out of
    reach now, is left out); external items are served as kept."""
    store = call.store
    if source == "memories":
        rows = {m.id: m for m in store.get_memories([i.id for i in items], org=call.org)}
        return [i.model_copy(update={"text": rows[i.id].text, "record_id": rows[i.id].record, "created_at": rows[i.id].created_at})
                for i in items if i.id in rows]  # fmt: skip
    if source == "documents":
        documents = {d.id: d for d in store.get_documents(sorted({i.document_id for i in items}), org=call.org)}
        out = []
        for i in items:
            document = documents.get(i.document_id)
            section = next((s for s in document.sections if s.id == i.section_id), None) if document else None
            if document is not None and section is not None:
                out.append(i.model_copy(update={"title": document.title, "heading": section.heading, "text": section.text}))
        return out
    if source == "properties":
        records = {r.id: r for r in store.get_records(sorted({i.record_id for i in items}), org=call.org)}
        return [i.model_copy(update={"value": records[i.record_id].properties[i.name]}) for i in items
                if i.record_id in records and has_value(records[i.record_id].properties.get(i.name))]  # fmt: skip
    record = call.resolution.record
    if source == "graph" and record is not None and not call.resolution.tombstone:
        settings = call.settings  # the walk the first call made, made again: active edges, as many hops out
        around = [record.id, *call.resolution.merged_from]
        now = {h.edge.id: h for h in store.edges_around(around, org=call.org, max_hops=settings.graph_max_hops,
                                                         limit=settings.graph_max_edges, include_stubs=settings.include_stub_edges)}  # fmt: skip
        return [i.model_copy(update={"src": now[i.id].edge.src, "dst": now[i.id].edge.dst, "type": now[i.id].edge.type,
                                     "confidence": now[i.id].edge.confidence, "weight": now[i.id].edge.weight,
                                     "hops": now[i.id].hops}) for i in items if i.id in now]  # fmt: skip
    return items


def unknown_continuation(sid: str) -> InvalidRequest:
    """What an unknown, expired or other org's continuation gets, word for word."""
    return InvalidRequest(f"continuation {clip(sid)} is unknown or has expired", field="continuation")


def screen_page(call: Call) -> None:
    """After governance: a page of a session another caller opened that holds nothing this caller may see
    reads like an unknown continuation, whether governance removed what it held or the caller left
    sources out (``sources: {x: false}``). What waits is the opener's (its session keeps it,
    :func:`keep_session`); an empty page instead would tell this caller that items it may not see are
    waiting, and refusing it changes nothing of the session."""
    restored = call.session
    if restored is None or restored.own or call.resolution.tombstone:
        return
    if not any(call.candidates[s] for s in restored.page):
        raise unknown_continuation(restored.session.id)


def keep_session(call: Call) -> None:
    """Open (or advance) this call's session when anything is left over: ``call.continuation``."""
    call.continuation = _keep(call)


def _keep(call: Call) -> str | None:
    """The continuation id, or None when nothing is left."""
    assert call.plan is not None
    restored = call.session
    if call.plan.mode != "expand" and not any(call.results[s].dropped for s in SOURCE_NAMES):
        return None
    left: dict[str, list[Any]] = {}
    if restored is not None and not call.resolution.tombstone:  # sources this page left out wait on
        left = {s: items for s, items in restored.state["remaining"].items() if s not in restored.page}
    more = False  # anything this caller was cleared for is left
    unpackable = 0
    for source in SOURCE_NAMES:
        packed = {item_key(item) for item in call.results[source].items}
        waiting = [item for item in call.candidates[source] if item_key(item) not in packed]
        # an item no page can hold (no text to cut, and larger than the largest budget) would keep the session,
        # and a caller paging "while there is a continuation", going for ever: it is dropped and counted
        kept = [item for item in waiting if hasattr(item, "text") or size(item) <= MAX_BUDGET]
        unpackable += len(waiting) - len(kept)
        rest = [item.model_dump(mode="json") for item in kept]
        more = more or bool(rest)
        if restored is not None and not restored.own and source in restored.page and not call.resolution.tombstone:
            # another caller's page: what governance removed for this caller waits for the opener (whose
            # next page governs it again), in the order it waited
            rest = [item for item in restored.state["remaining"].get(source, [])
                    if _key(item) not in packed]  # fmt: skip
        if rest:
            left[source] = rest
    if unpackable:
        call.decide("session", detail={"unpackable": unpackable})
        if not left and restored is None:
            return None  # nothing any page could hold: no session to open
    if call.plan.mode == "expand" and left and not any(call.results[s].items for s in SOURCE_NAMES):
        # nothing fitted this page: say what the next item needs, so a caller can ask with that budget
        call.decide("session", detail={"needs_budget": min(_needs(item) for items in left.values() for item in items)})
    try:
        sid = _save(call, restored, left)
    except Exception as exc:  # noqa: BLE001 - the page itself is fine; say that no next page can follow
        error = public_error(exc)
        call.decide("session", fallback_reason="session_error", detail={"session_error": error})
        call.degrade("session", error)
        return None
    # a caller paging through another's session is given the id back only while items it was cleared for
    # wait (it holds the id: a later page governs what waits again, for it)
    return sid if restored is None or restored.own or more else None


def _needs(item: dict[str, Any]) -> int:
    """The least budget that packs some of ``item`` (as the session keeps it): a text is cut to fit, which
    needs room for all but its text (a section's title and heading), the ellipsis and one byte, and at least
    ``MIN_CUT_BYTES``; anything else fits whole or not at all."""
    model = _ITEM.validate_python(item)
    whole = size(model)
    if "text" not in item:
        return whole
    frame = size(model.model_copy(update={"text": ""})) + len(ELLIPSIS.encode()) + 1
    return min(whole, max(MIN_CUT_BYTES, frame))


def _key(item: dict[str, Any]) -> str:
    """``item_key`` of an item as the session keeps it (its JSON form)."""
    return item_key(_ITEM.validate_python(item))


def _save(call: Call, restored: Restored | None, left: dict[str, list[Any]]) -> str | None:
    store = call.steps.service_store()
    returned = sum(len(call.results[s].items) for s in SOURCE_NAMES)
    if restored is not None:
        session, state = restored.session, restored.state
        if not left:
            store.delete_session(session.id, org=call.org)
            return None
        sid, opened_by, created, owner = session.id, session.call_id, session.created_at, session.caller
        state = {**state, "remaining": left, "returned": state["returned"] + returned, "page": state["page"] + 1}
    else:
        res = call.resolution
        sid, opened_by, created, owner = secrets.token_urlsafe(18), call.call_id, time.time(), call.caller.id
        state = {
            "mode": call.plan.mode if call.plan else None,
            "depth": call.effective_depth if call.plan else None,
            "record": None if res.record is None else res.record.id,
            "merged_from": list(res.merged_from),
            "aliases": [a.id for a in res.aliases],
            "remaining": left,
            "returned": returned,
            "page": 1,
        }
    now = time.time()
    session = Session(id=sid, org=call.org, caller=owner, call_id=opened_by,  # the caller that opened it, kept
                      state=json.dumps(state, separators=(",", ":")), created_at=created, last_used=now)  # fmt: skip
    store.put_session(session, idle_before=now - call.settings.service.session_idle_seconds)
    # how many items wait is the opener's to know: what waits was governed for the opener, and a source this
    # page left out holds items not yet governed for another caller
    remaining = {"remaining": sum(len(v) for v in left.values())} if owner == call.caller.id else {}
    if restored is None:  # a new session (an expand call's route was opened by restore_session)
        call.decide("session", ran=True, backend="session", detail=remaining)
    else:
        call.decide("session", detail=remaining)
    return sid


def _resolution(call: Call, state: dict) -> Resolution:
    """Who the first call was about, re-read now: a record deleted since then becomes a tombstone."""
    if state.get("record") is None:
        return Resolution()
    ids = [state["record"], *state.get("merged_from", []), *state.get("aliases", [])]
    fresh = {r.id: r for r in call.store.get_records(ids, org=call.org)}
    record = fresh.get(state["record"])
    if record is None:
        return Resolution(not_found=True)
    # merged since into a record pending deletion (directly or not): its tombstone, as a new call would give
    end = survivor(call.store, record, org=call.org)[0]
    if end.pending_deletion:
        return Resolution(record=end, tombstone=True)
    shown = shown_records(call.store, [a for a in state.get("aliases", []) if a in fresh], org=call.org)
    aliases = [fresh[a] for a in state.get("aliases", []) if a in shown]
    live = set(live_merged_from(call.store, record.id, org=call.org))  # one pending deletion since is hidden now
    merged = [m for m in state.get("merged_from", []) if m in fresh and m in live]
    return Resolution(record=record, aliases=aliases, merged_from=merged)
