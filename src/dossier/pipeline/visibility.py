"""Who may see a document: the one rule, used by governance, fetch mode, the filter vocabulary and
every expand page alike."""

from __future__ import annotations

from typing import Collection, Protocol

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
