"""Who may see a document: the one rule, used by governance, fetch mode, the filter vocabulary and
every expand page alike."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection, Protocol, Sequence

from ..stores.base import shown_records
from .call import Call

if TYPE_CHECKING:
    from ..bundle import Record

__all__ = ["Guarded", "IDENTIFIER_KIND", "MAX_MERGE_CHAIN", "document_verdict", "drawn_on", "preferred", "shown_records", "still_shown",
           "survivor", "verdict"]

MAX_MERGE_CHAIN = 20
#: The kind of record an identifier finds first: a website finds a company, the others a contact.
IDENTIFIER_KIND = {"email": "contact", "phone": "contact", "profile_url": "contact", "website": "company"}


class Guarded(Protocol):
    """What the rule reads of a document: a :class:`~dossier.bundle.Document`, or the access row a store
    keeps of one (:class:`~dossier.stores.base.DocumentAccess`)."""

    @property
    def org(self) -> str: ...
    @property
    def is_system(self) -> bool: ...
    @property
    def visible_to_roles(self) -> tuple[str, ...] | None: ...
    @property
    def attached_record(self) -> str | None: ...


def document_verdict(call: Call, document: Guarded | None) -> str | None:
    """Why ``document`` must not be returned to this call's caller, or None when it may be."""
    return verdict(document, org=call.org, roles=call.caller.roles, record_ids=call.resolution.record_ids)


def verdict(document: Guarded | None, *, org: str, roles: Collection[str], record_ids: Collection[str]) -> str | None:
    """Why ``document`` must not be returned to a caller of ``org`` with ``roles``, in a call about
    ``record_ids`` (the record, its merged-away records and aliases), or None when it may be."""
    if document is None:
        return "not_found"
    if document.org != org:
        return "other_org"
    if document.is_system:
        return "system_document"
    allowed = document.visible_to_roles
    if allowed is not None and not set(allowed) & set(roles):
        return "not_visible"
    if document.attached_record is not None and document.attached_record not in record_ids:
        return "attached_to_other_record"
    return None


def survivor(store: Any, record: "Record", *, org: str) -> tuple["Record", list[str], bool]:
    """The record ``record`` was merged into, directly or not (itself when it was not); the chain of ids;
    whether the chain broke (a hop to a record that is not there, or a loop). A record pending deletion ends
    the chain: it stands for itself and everything merged into it, whatever it was merged into."""
    chain = [record.id]
    while record.merged_into and not record.pending_deletion and len(chain) <= MAX_MERGE_CHAIN:
        found = store.get_records([record.merged_into], org=org)
        if not found or found[0].id in chain:
            return record, chain, True
        record = found[0]
        chain.append(record.id)
    return record, chain, False


def preferred(store: Any, found: Sequence["Record"], *, org: str, kind: str | None = None) -> list["Record"]:
    """The records one identifier names, best first: those of ``kind``, then those whose survivor is live
    (a record hidden by a deletion never takes an identifier from a live one: its tombstone comes back only
    when the identifier names nothing else), then those not merged away, then by id."""
    hidden = {r.id for r in found if survivor(store, r, org=org)[0].pending_deletion}
    return sorted(found, key=lambda r: (kind is not None and r.kind != kind, r.id in hidden, r.merged_into is not None, r.id))


def drawn_on(call: Call) -> dict[str, list[str]]:
    """What an answer synthesised from this call's packed items may repeat, for :func:`still_shown` to check
    again before the answer is served later (a deferred synthesis, or one that answered after its deadline):
    the records the call is about and those owning its memories, properties and edges' ends (those that are
    records), its memories, and its sections' documents and sections."""
    records = set(call.resolution.record_ids)
    memories: set[str] = set()
    documents: set[str] = set()
    sections: set[str] = set()
    ends: set[str] = set()
    for source, result in call.results.items():
        for item in result.items:
            if item.kind == "memory":
                memories.add(item.id)
                records.add(item.record_id)
            elif item.kind == "property":
                records.add(item.record_id)
            elif item.kind == "section":
                documents.add(item.document_id)
                sections.add(item.section_id)
            elif item.kind == "edge":
                ends |= {item.src, item.dst}
    if ends - records:  # an edge's end may be a stub, not a record: only the ends that are records count
        records |= {r.id for r in call.steps.store.get_records(sorted(ends - records), org=call.org)}
    return {"records": sorted(records), "memories": sorted(memories), "documents": sorted(documents),
            "sections": sorted(sections), "about": sorted(call.resolution.record_ids)}  # fmt: skip


def still_shown(store: Any, drawn: dict[str, list[str]], *, org: str, caller: str) -> bool:
    """Whether everything in ``drawn`` (:func:`drawn_on`) may still be seen by ``caller`` of ``org``, read
    afresh: every record there and not hidden by a deletion, every memory there, every document there and
    visible to the caller's roles now, every section still in its document. Fails closed: a caller that is
    gone, or a read that fails, is False."""
    try:
        who = store.get_caller(caller, org=org)
        if who is None:
            return False
        records = drawn.get("records", [])
        if records and shown_records(store, records, org=org) != set(records):
            return False
        memories = drawn.get("memories", [])
        if memories and {m.id for m in store.get_memories(memories, org=org)} != set(memories):
            return False
        documents = store.get_documents(drawn.get("documents", []), org=org) if drawn.get("documents") else []
        if len(documents) != len(drawn.get("documents", [])):
            return False
        about = drawn.get("about", [])
        if any(verdict(d, org=org, roles=who.roles, record_ids=about) is not None for d in documents):
            return False
        held = {section.id for d in documents for section in d.sections}
        return set(drawn.get("sections", [])) <= held
    except Exception:  # noqa: BLE001 - fail closed: an answer that cannot be checked is not served
        return False
