"""Who may see a document: the one rule, used by governance, fetch mode, the filter vocabulary and
every expand page alike."""

from __future__ import annotations

from typing import Any, Collection, Protocol, Sequence

from .call import Call


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


def shown_records(store: Any, ids: Sequence[str], *, org: str) -> set[str]:
    """Those of ``ids`` that exist and are not hidden by a deletion: neither pending deletion themselves nor
    merged (directly or not) into a record that is (it is hidden with what was merged into it). ``store``
    is a :class:`~dossier.stores.base.Store`; the chains are read a hop at a time."""
    rows = {r.id: r for r in store.get_records(list(ids), org=org)}
    ahead = {r.merged_into for r in rows.values() if r.merged_into} - set(rows)
    while ahead:
        found = store.get_records(sorted(ahead), org=org)
        rows.update((r.id, r) for r in found)
        ahead = {r.merged_into for r in found if r.merged_into} - set(rows)

    def shown(record_id: str) -> bool:
        row, seen = rows.get(record_id), set()
        if row is None:
            return False
        while row is not None and row.id not in seen:
            if row.pending_deletion:
                return False
            seen.add(row.id)
            row = rows.get(row.merged_into or "")
        return True

    return {i for i in ids if shown(i)}
