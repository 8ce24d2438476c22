"""Writing a batch to PostgreSQL: one org's rows at a time, set-based where the SQLite store loops.

Called by :meth:`PostgresStore.write <dossier.stores.postgres.PostgresStore.write>` inside its one
transaction, after it has pointed row-level security at the org (``dossier.org``).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import psycopg

from ..bundle import Document, Memory, Record, has_value
from ..identifiers import email_domain
from .base import WriteBatch, property_key, require_org
from .postgres_schema import MEMORY_LENGTH, MEMORY_TSV, MEMORY_WIDE, SECTION_LENGTH, SECTION_TSV


def group_by_org(batch: WriteBatch) -> dict[str, dict[str, list]]:
    """The batch's items per org (each org's rows are written under that org's row-level security)."""
    groups: dict[str, dict[str, list]] = {}

    def add(org: str, name: str, item: Any) -> None:
        require_org(org, "write")
        groups.setdefault(org, {k: [] for k in ("orgs", "callers", "records", "memories", "documents", "edges", "vectors")})
        groups[org][name].append(item)

    for o in batch.orgs:
        add(o.id, "orgs", o)
    for c in batch.callers:
        add(c.org, "callers", c)
    for name in ("records", "memories", "documents", "edges"):
        for item in getattr(batch, name):
            add(item[0].org, name, item)
    for v in batch.vectors:
        add(v.org, "vectors", v)
    # every write takes its items' row locks in one order (by id): two loads upserting the same rows in other
    # orders would otherwise each hold a row the other waits for, and one of them fail with "deadlock detected".
    # Vectors keep the bundle's order: the order they are stored in is the order an HNSW index built over them
    # later takes them in, and that changes the graph (which neighbours a search finds), not only the locks.
    for group in groups.values():
        group["orgs"].sort(key=lambda o: o.id)
        group["callers"].sort(key=lambda c: c.id)
        for name in ("records", "memories", "documents", "edges"):
            group[name].sort(key=lambda item: item[0].id)
    return groups


def write_org(cur: psycopg.Cursor, org: str, g: dict[str, list]) -> None:
    """Upsert one org's part of a batch, in :class:`~dossier.stores.base.WriteBatch` order, on ``cur``'s transaction."""
    if g["orgs"]:
        cur.executemany(
            "INSERT INTO orgs (id, name, hash) VALUES (%b, %b, %b) "
            "ON CONFLICT (id) DO UPDATE SET name = excluded.name, hash = excluded.hash",
            [(o.id, o.name, o.content_hash) for o in g["orgs"]],
        )
    if g["callers"]:
        cur.executemany(
            "INSERT INTO callers VALUES (%b, %b, %b::text[], %b) "
            "ON CONFLICT (org, id) DO UPDATE SET roles = excluded.roles, hash = excluded.hash",
            [(c.org, c.id, list(c.roles), c.content_hash) for c in g["callers"]],
        )
    if g["records"]:
        _write_records(cur, org, g["records"])
    if g["memories"]:
        _write_memories(cur, org, g["memories"])
    if g["documents"]:
        _write_documents(cur, org, g["documents"])
    if g["edges"]:
        cur.executemany(
            "INSERT INTO edges VALUES (%b, %b, %b, %b, %b, %b, %b, %b, %b, %b) ON CONFLICT (org, id) DO UPDATE SET "
            "src = excluded.src, dst = excluded.dst, type = excluded.type, active = excluded.active, "
            "confidence = excluded.confidence, weight = excluded.weight, dst_is_stub = excluded.dst_is_stub, "
            "hash = excluded.hash",
            [(e.org, e.id, e.src, e.dst, e.type, e.active, float(e.confidence), float(e.weight), e.dst_is_stub, h)
             for e, h in g["edges"]],
        )  # fmt: skip
    if g["vectors"]:
        cur.executemany(
            "INSERT INTO vectors VALUES (%b, %b, %b, %b, %b, %b) ON CONFLICT (org, kind, key) DO UPDATE SET "
            "parent = excluded.parent, text_hash = excluded.text_hash, embedding = excluded.embedding",
            [(v.org, v.kind, v.key, v.parent, v.text_hash, np.asarray(v.vector, dtype=np.float32)) for v in g["vectors"]],
        )

def _write_records(cur: psycopg.Cursor, org: str, records: list[tuple[Record, str]]) -> None:
    rows = []
    keep: list[str] = []
    for r, digest in records:
        ids = r.identifiers
        domain = ids.website or (email_domain(ids.email) if ids.email else None)
        rows.append((r.org, r.id, r.kind, ids.email, ids.phone, ids.website, ids.profile_url, domain,
                     json.dumps(r.properties), r.merged_into, r.pending_deletion, digest))  # fmt: skip
        if not r.pending_deletion:  # a record pending deletion keeps no property vectors (see loading)
            keep.extend(property_key(r.id, n) for n, v in r.properties.items() if has_value(v))
    cur.executemany(
        "INSERT INTO records VALUES (%b, %b, %b, %b, %b, %b, %b, %b, %b::json, %b, %b, %b) "
        "ON CONFLICT (org, id) DO UPDATE SET kind = excluded.kind, email = excluded.email, phone = excluded.phone, "
        "website = excluded.website, profile_url = excluded.profile_url, domain = excluded.domain, "
        "properties = excluded.properties, merged_into = excluded.merged_into, "
        "pending_deletion = excluded.pending_deletion, hash = excluded.hash",
        rows,
    )
    # vectors of properties the records no longer have (a key names its record: "record/name")
    cur.execute(
        "DELETE FROM vectors WHERE org = %b AND kind = 'property' AND parent = ANY(%b::text[]) "
        "AND NOT (key = ANY(%b::text[]))",
        [org, [r.id for r, _ in records], keep],
    )

def _write_memories(cur: psycopg.Cursor, org: str, memories: list[tuple[Memory, str]]) -> None:
    cur.executemany(
        "INSERT INTO memories (org, id, record, text, created_at, hash) VALUES (%b, %b, %b, %b, %b, %b) "
        "ON CONFLICT (org, id) DO UPDATE SET record = excluded.record, text = excluded.text, "
        "created_at = excluded.created_at, hash = excluded.hash",
        [(m.org, m.id, m.record, m.text, m.created_at, digest) for m, digest in memories],
    )
    cur.execute(
        f"INSERT INTO memories_fts (org, id, record, tsv, length, wide) SELECT org, id, record, tsv, length, {MEMORY_WIDE} "
        f"FROM (SELECT org, id, record, {MEMORY_TSV} AS tsv, {MEMORY_LENGTH} AS length "
        "FROM memories WHERE org = %b AND id = ANY(%b::text[])) m "
        "ON CONFLICT (org, id) DO UPDATE SET record = excluded.record, tsv = excluded.tsv, length = excluded.length, "
        "wide = excluded.wide",
        [org, [m.id for m, _ in memories]],
    )
    # a memory moved to another record takes its vector along
    cur.execute(
        "UPDATE vectors v SET parent = m.record FROM memories m WHERE v.org = %b AND v.kind = 'memory' "
        "AND m.org = v.org AND m.id = v.key AND m.id = ANY(%b::text[]) AND v.parent <> m.record",
        [org, [m.id for m, _ in memories]],
    )

def _write_documents(cur: psycopg.Cursor, org: str, documents: list[tuple[Document, str]]) -> None:
    cur.executemany(
        "INSERT INTO documents VALUES (%b, %b, %b, %b, %b::text[], %b::text[], %b, %b, %b) "
        "ON CONFLICT (org, id) DO UPDATE SET title = excluded.title, doc_type = excluded.doc_type, "
        "tags = excluded.tags, visible_to_roles = excluded.visible_to_roles, "
        "attached_record = excluded.attached_record, is_system = excluded.is_system, hash = excluded.hash",
        [(d.org, d.id, d.title, d.doc_type, list(d.tags),
          None if d.visible_to_roles is None else list(d.visible_to_roles), d.attached_record, d.is_system, digest)
         for d, digest in documents],
    )  # fmt: skip
    cur.execute(
        "DELETE FROM sections WHERE org = %b AND document = ANY(%b::text[]) RETURNING id, document",
        [org, [d.id for d, _ in documents]],
    )
    old = cur.fetchall()
    cur.executemany(
        "INSERT INTO sections (org, id, document, position, title, heading, text) VALUES (%b, %b, %b, %b, %b, %b, %b)",
        [(d.org, s.id, d.id, position, d.title, s.heading, s.text)
         for d, _ in documents for position, s in enumerate(d.sections)],
    )  # fmt: skip
    cur.execute("DELETE FROM sections_fts WHERE org = %b AND document = ANY(%b::text[])", [org, [d.id for d, _ in documents]])
    cur.execute(
        f"INSERT INTO sections_fts (org, id, document, tsv, length) SELECT org, id, document, {SECTION_TSV}, "
        f"{SECTION_LENGTH} FROM sections WHERE org = %b AND document = ANY(%b::text[])",
        [org, [d.id for d, _ in documents]],
    )
    new = {(s.id, d.id) for d, _ in documents for s in d.sections}
    gone = [section_id for section_id, document_id in old if (section_id, document_id) not in new]
    if gone:
        cur.execute("DELETE FROM vectors WHERE org = %b AND kind = 'section' AND key = ANY(%b::text[])", [org, gone])

