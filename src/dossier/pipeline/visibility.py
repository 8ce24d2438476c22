"""Who may see a document: the one rule, used by governance, fetch mode, the filter vocabulary and
every expand page alike."""

from __future__ import annotations

from ..bundle import Document
from .call import Call


def document_verdict(call: Call, document: Document | None) -> str | None:
    """Why ``document`` must not be returned to this caller, or None when it may be."""
    if document is None:
        return "not_found"
    if document.org != call.org:
        return "other_org"
    if document.is_system:
        return "system_document"
    roles = document.visible_to_roles
    if roles is not None and not set(roles) & set(call.caller.roles):
        return "not_visible"
    if document.attached_record is not None and document.attached_record not in call.resolution.record_ids:
        return "attached_to_other_record"
    return None
