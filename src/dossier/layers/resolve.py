"""Layer 3, resolve: find the record, follow merges, tombstone deletions, add same-domain aliases."""

from __future__ import annotations

from typing import cast

from ..bundle import Record
from ..identifiers import IdentifierKind, email_domain
from ..pipeline.call import Call, Resolution, public_error
from ..pipeline.visibility import IDENTIFIER_KIND, preferred, survivor
from ..stores.base import Store



def resolve(call: Call) -> None:
    ref = call.request.record
    call.decide("resolve", ran=ref is not None)
    if ref is None:
        return
    kind, value = ref.identifier
    store, org = call.store, call.org
    if kind == "id":
        found = store.get_records([value], org=org)
    else:
        found = store.find_records(cast(IdentifierKind, kind), value, org=org)  # the request validated it
        found = preferred(store, found, org=org, kind=IDENTIFIER_KIND[kind])
    if not found:
        call.resolution = Resolution(not_found=True)
        call.decide("resolve", detail={"not_found": f"no record with {kind} {value!r}"})
        return
    record = _follow_merges(call, found[0])
    others = _others(call, found, record)
    if others:  # the identifier names more than one live record: say which others, not leave the caller to guess
        call.decide("resolve", detail={"ambiguous": others})
    if record.pending_deletion:
        call.resolution = Resolution(record=record, tombstone=True)
        call.decide("resolve", detail={"tombstone": True})
        return
    resolution = Resolution(record=record, merged_from=live_merged_from(store, record.id, org=org))
    try:
        resolution.aliases = _aliases(call, record, exclude={record.id, *resolution.merged_from})
    except Exception as exc:  # noqa: BLE001 - a failed alias lookup is reported, not fatal
        error = public_error(exc)
        call.decide("resolve", fallback_reason="alias_error", detail={"alias_error": error})
        call.degrade("resolve", error)
    call.resolution = resolution


def live_merged_from(store: Store, record_id: str, *, org: str) -> list[str]:
    """The records merged into ``record_id``, directly or not, whose data reaches it through records that are
    not pending deletion: a record pending deletion is hidden with everything attached to it, what was merged
    into it included, also once it was itself merged into another."""
    ids = store.merged_from(record_id, org=org)
    if not ids:
        return []
    rows = {r.id: r for r in store.get_records(ids, org=org)}

    def reaches(start: str) -> bool:
        row, seen = rows.get(start), set()
        while row is not None and row.id not in seen and not row.pending_deletion:
            if row.merged_into == record_id:
                return True
            seen.add(row.id)
            row = rows.get(row.merged_into or "")
        return False

    return [i for i in ids if reaches(i)]


def _follow_merges(call: Call, record: Record) -> Record:
    record, chain, broken = _survivor(call, record)
    if broken:
        call.decide("resolve", detail={"merge_error": f"merge chain of {chain[0]!r} breaks at {record.merged_into!r}"})
    if len(chain) > 1:
        call.decide("resolve", detail={"merged_chain": chain})
    return record


def _survivor(call: Call, record: Record) -> tuple[Record, list[str], bool]:
    """The record ``record`` was merged into, directly or not; the chain of ids; whether the chain broke (a
    record pending deletion ends the chain: it resolves to its tombstone, whatever it was merged into)."""
    return survivor(call.store, record, org=call.org)


def _others(call: Call, found: list[Record], chosen: Record) -> list[str]:
    """Other live records of the chosen one's kind that the same identifier names (each after its merges),
    in the order they were ranked: none when every match is the chosen record or merged into it."""
    others: list[str] = []
    for record in found[1:]:
        if record.kind != found[0].kind:
            continue
        survivor = _survivor(call, record)[0] if record.merged_into else record
        if survivor.id != chosen.id and not survivor.pending_deletion and survivor.id not in others:
            others.append(survivor.id)
    return others


def record_domain(record: Record) -> str | None:
    ids = record.identifiers
    if ids.website:
        return ids.website
    return email_domain(ids.email) if ids.email else None


def _aliases(call: Call, record: Record, *, exclude: set[str]) -> list[Record]:
    """Other live records of the record's company domain. An email's domain counts only where a record of
    the org has it as its website (the company): people who merely share a mail provider, however small
    and missing from the free-mail list, are not one another's aliases, and what they said is not read in
    calls about each other."""
    domain = record_domain(record)
    if domain is None:
        return []
    if not record.identifiers.website and not any(
        r.merged_into is None and not r.pending_deletion for r in call.store.find_records("website", domain, org=call.org)
    ):
        return []
    limit = call.settings.max_aliases
    found = call.store.records_by_domain(domain, org=call.org, limit=limit + len(exclude) + 20)
    live = [r for r in found if r.id not in exclude and not r.pending_deletion and r.merged_into is None]
    return live[:limit]
