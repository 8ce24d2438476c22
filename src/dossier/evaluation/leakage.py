"""Who owns what in a bundle, and which returned items a caller must not see (leakage)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..schema import RetrieveResponse, item_key


@dataclass
class World:
    owner: dict[str, str] = field(default_factory=dict)  # item id -> org
    roles: dict[str, tuple[str, ...] | None] = field(default_factory=dict)  # section/document id -> roles
    attached: dict[str, str | None] = field(default_factory=dict)  # section/document id -> record
    system: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)  # records pending deletion
    memory_record: dict[str, str] = field(default_factory=dict)
    caller_roles: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, bundle: dict[str, Any]) -> "World":
        w = cls()
        for r in bundle.get("records", []):
            w.owner[r["id"]] = r["org"]
            if r.get("pending_deletion"):
                w.deleted.add(r["id"])
        for m in bundle.get("memories", []):
            w.owner[m["id"]] = m["org"]
            w.memory_record[m["id"]] = m["record"]
        for e in bundle.get("edges", []):
            w.owner[e["id"]] = e["org"]
        for d in bundle.get("documents", []):
            for key in [d["id"], *(s["id"] for s in d.get("sections", []))]:
                w.owner[key] = d["org"]
                w.roles[key] = tuple(d["visible_to_roles"]) if d.get("visible_to_roles") is not None else None
                w.attached[key] = d.get("attached_record")
                if d.get("is_system"):
                    w.system.add(key)
        for c in bundle.get("callers", []):
            w.caller_roles[(c["org"], c["id"])] = set(c.get("roles", []))
        return w


def leaks(world: World, response: RetrieveResponse, *, org: str, caller: str, forbidden: set[str]) -> list[str]:
    """Ids of returned items this caller must not see, each with the reason."""
    out: list[str] = []
    roles = world.caller_roles.get((org, caller), set())
    record = response.record
    allowed_attached: set[str] = set()
    if record is not None and not record.tombstone:
        allowed_attached = {record.id, *record.aliases, *record.merged_from}
    for name, result in response.sources.items():
        for item in result.items:
            keys = {item_key(item)}
            for attr in ("document_id", "record_id", "src", "dst"):
                if getattr(item, attr, None):
                    keys.add(getattr(item, attr))
            for key in keys:
                reason = None
                if key in forbidden:
                    reason = "forbidden"
                elif world.owner.get(key, org) != org:
                    reason = "other_org"
                elif key in world.deleted or world.memory_record.get(key) in world.deleted:
                    reason = "pending_deletion"
                elif key in world.system:
                    reason = "system_document"
                elif world.roles.get(key) is not None and not set(world.roles[key] or ()) & roles:
                    reason = "outside_roles"
                elif world.attached.get(key) is not None and world.attached[key] not in allowed_attached:
                    reason = "attached_to_other_record"
                if reason:
                    out.append(f"{key} ({reason})")
    return sorted(set(out))
