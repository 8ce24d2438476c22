"""Layer 3, resolve: find the record, follow merges, tombstone deletions, add same-domain aliases."""

from __future__ import annotations

from typing import cast

from ..bundle import Record
from ..identifiers import IdentifierKind, email_domain
from ..pipeline.call import Call, Resolution, public_error

MAX_MERGE_CHAIN = 20
IDENTIFIER_KIND = {"email": "contact", "phone": "contact", "profile_url": "contact", "website": "company"}


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
        expected = IDENTIFIER_KIND[kind]
        found = sorted(found, key=lambda r: (r.kind != expected, r.merged_into is not None, r.id))
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
    resolution = Resolution(record=record, merged_from=store.merged_from(record.id, org=org))
    try:
        resolution.aliases = _aliases(call, record, exclude={record.id, *resolution.merged_from})
    except Exception as exc:  # noqa: BLE001 - a failed alias lookup is reported, not fatal
        error = public_error(exc)
        call.decide("resolve", fallback_reason="alias_error", detail={"alias_error": error})
        call.degrade("resolve", error)
    call.resolution = resolution


def _follow_merges(call: Call, record: Record) -> Record:
    record, chain, broken = _survivor(call, record)
    if broken:
        call.decide("resolve", detail={"merge_error": f"merge chain of {chain[0]!r} breaks at {record.merged_into!r}"})
    if len(chain) > 1:
        call.decide("resolve", detail={"merged_chain": chain})
    return record


def _survivor(call: Call, record: Record) -> tuple[Record, list[str], bool]:
    """The record ``record`` was merged into, directly or not; the chain of ids; whether the chain broke."""
    chain = [record.id]
    while record.merged_into and len(chain) <= MAX_MERGE_CHAIN:
        survivors = call.store.get_records([record.merged_into], org=call.org)
        if not survivors or survivors[0].id in chain:
            return record, chain, True
        record = survivors[0]
        chain.append(record.id)
    return record, chain, False


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
