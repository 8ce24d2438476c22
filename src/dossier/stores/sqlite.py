"""The embedded store: one SQLite file (WAL), FTS5 for full text, numpy / usearch for vectors."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from ..errors import SchemaMismatch, StoreError, StoreUnavailable
from ..identifiers import IdentifierKind, email_domain, normalize
from ..settings import HNSW_MIN_ROWS
from .base import (RESTRICTED_SQL, DocumentAccess, EdgeHop, GuardReads, Hit, ItemKind, RestrictedIndex, TextKind, VectorKind, Viewer, WriteBatch,
                   merge_cycle, merge_cycle_error, property_key, require_org, shown_records, text_scope_asked, write_guard,
                   walk_edges)
from .fulltext import fts5_query, terms
from .sqlite_cache import GenerationCache, document_chars, memory_chars
from .sqlite_connect import connect
from .sqlite_fulltext import PrunedText, Seen
from .sqlite_schema import MIGRATIONS, OWN_TEXT_ROWS, SCHEMA_VERSION, SLOT_BITS, give_own_text_tables, needs_own_text_tables

if TYPE_CHECKING:
    import numpy as np

    from ..bundle import Caller, Document, Edge, Memory, Org, Record
    from .ann import AnnIndexes
    from .sqlite_vectors import SQLiteVectors

# numpy, the bundle's pydantic models and the vector search are imported where they are first used, so a
# store opened for counts, settings or stored results (the CLI's light commands) loads none of them

_log = logging.getLogger(__name__)
_TABLES: dict[str, str] = {
    "org": "orgs", "caller": "callers", "record": "records",
    "memory": "memories", "document": "documents", "edge": "edges",
}  # fmt: skip


class SQLiteStore:
    """A :class:`~dossier.stores.base.Store` in one SQLite file."""

    #: one connection, one read at a time (behind a lock): the engine does not prefetch
    concurrent_reads = False

    def __init__(
        self,
        path: str | Path,
        *,
        hnsw_min_rows: int = HNSW_MIN_ROWS,
        ann_min_rows: int = 5_000,
        ann_compact_after: int = 5_000,
        vector_cache_bytes: int = 256 << 20,
        text_prune_rows: int = 30_000,
    ) -> None:
        """``hnsw_min_rows``: org-wide searches of an org and kind with this many vectors ask the ANN index.
        ``ann_min_rows``: an org and kind this large gets its persisted ANN index (built by the write that
        crosses it), and parents holding this many rows (and a sixteenth of the org's) search it too.
        ``ann_compact_after``: logged changes folded into a new index file by the write that reaches it.
        ``text_prune_rows``: a full-text search over a scope this large (the org's rows of a kind, or the
        given parents') is pruned by IDF (``stores/sqlite_fulltext.py``); below it the ranking is complete."""
        self.path = str(path)
        self.url = f"sqlite:///{self.path}"
        self.hnsw_min_rows = hnsw_min_rows
        self.text_prune_rows = text_prune_rows
        self._lock = threading.RLock()
        try:
            self._db = connect(self.path)
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailable(f"cannot open SQLite store at {self.path}: {exc}") from exc
        self._ann_options = {"compact_after": ann_compact_after}
        self._vector_options = {"hnsw_min_rows": hnsw_min_rows, "ann_min_rows": ann_min_rows,
                                "cache_bytes": vector_cache_bytes}  # fmt: skip
        self._vector_search: SQLiteVectors | None = None  # made on first use (numpy, usearch)
        self._text_numbers: dict[str, int] = {}  # org -> its number in text_tables (committed, never changes)
        self._searching: tuple[str, int | None] | None = None  # (org, its number) during one full-text search
        self._text = PrunedText(self._query, self._text_number)  # full text over large scopes
        #: org -> (its generation, its sections' full-text index key, its restricted documents' slots): SQLiteStore._seen
        self._restricted: dict[str, tuple[int | None, tuple, RestrictedIndex[int], dict[int, str]]] = {}
        # a hidden set of slots -> the ids of its documents (_hidden_documents), the last few
        self._hidden_ids: OrderedDict[int, tuple[frozenset[int], frozenset[str]]] = OrderedDict()
        # documents and memories kept while their org's generation stays (stores/sqlite_cache.py)
        self._documents: GenerationCache[Document] = GenerationCache(self._generation, document_chars)
        self._memories: GenerationCache[Memory] = GenerationCache(self._generation, memory_chars)

    @property
    def _vectors(self) -> SQLiteVectors:
        """The vector search (exact numpy, the persisted ANN indexes), made when first needed."""
        if self._vector_search is None:
            from .ann import AnnIndexes
            from .sqlite_vectors import SQLiteVectors

            with self._lock:
                if self._vector_search is None:
                    directory = None if self.path == ":memory:" else Path(f"{self.path}-ann")  # the ANN index files
                    ann = AnnIndexes(self._db, self._lock, directory, **self._ann_options)
                    self._vector_search = SQLiteVectors(self._query, self._lock, ann, **self._vector_options)
        return self._vector_search

    @property
    def ann(self) -> AnnIndexes:
        """The persisted ANN indexes (``stores/ann.py``)."""
        return self._vectors.ann

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._vector_search is not None:
                self._vector_search.close()
            self._documents.clear()
            self._memories.clear()
            self._db.close()

    def _migrate(self) -> None:
        if self._current():  # nothing to write: a store that can be read but not written opens for reading
            return
        with self._transaction() as db:
            has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone()
            version = 0
            if has_meta:
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise SchemaMismatch(
                    f"{self.path} has schema version {version}; this dossier knows up to {SCHEMA_VERSION}: upgrade dossier"
                )
            for script in MIGRATIONS[version:]:
                if callable(script):
                    script(db)
                    continue
                for statement in _statements(script):
                    db.execute(statement)
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            # names this database for the files kept beside it (an index file of another store is never used)
            db.execute("INSERT OR IGNORE INTO meta VALUES ('store_id', lower(hex(randomblob(16))))")

    def _current(self) -> bool:
        """The file is at this dossier's schema version and named (read without a transaction)."""
        with self._lock:
            if not self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():
                return False
            rows = dict(self._db.execute("SELECT key, value FROM meta WHERE key IN ('schema_version', 'store_id')").fetchall())
        version = str(rows.get("schema_version", "0"))
        if version.isdigit() and int(version) > SCHEMA_VERSION:  # said before any write is tried
            raise SchemaMismatch(f"{self.path} has schema version {version}; this dossier knows up to {SCHEMA_VERSION}: "
                                 "upgrade dossier")  # fmt: skip
        return version == str(SCHEMA_VERSION) and "store_id" in rows

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:  # "database is locked", after busy_timeout (30 s)
                raise StoreError(f"SQLite store {self.path} cannot be written now ({exc}): another process holds "
                                 "its write lock (a load, say); try again once it is done") from exc  # fmt: skip
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"SQLite query failed: {exc}") from exc

    def bind_embedder(self, model_id: str, dimensions: int) -> None:
        wanted = f"{model_id}:{dimensions}"
        bound = self._query("SELECT value FROM meta WHERE key = 'embedder'")
        if bound and bound[0][0] == wanted:
            return  # the usual case, read without the write lock: a reader never waits for a load
        with self._transaction() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('embedder', ?)", (wanted,))
            elif row[0] != wanted:
                raise SchemaMismatch(
                    f"{self.path} holds vectors of {row[0]}, not {wanted}: open it with the same embedder"
                )

    # -- writes ------------------------------------------------------------------------------------
    def write(self, batch: WriteBatch) -> None:
        self.write_many([batch])

    def write_many(self, batches: Iterable[WriteBatch]) -> None:
        touched: set[str] = set()
        kinds: set[tuple[str, str]] = set()  # (org, kind) whose vectors may have changed
        try:
            with self._transaction() as db:
                rowids = _Rowids()
                merged: set[tuple[str, str]] = set()  # (org, record) merged by this write
                for batch in batches:
                    if batch.guard:  # under the write lock: a deletion committed before this write counts
                        write_guard(batch, self._guard_reads(db, batch))
                    self._write_batch(db, batch, rowids, touched)
                    merged |= {(r.org, r.id) for r, _ in batch.records if r.merged_into}
                    kinds |= {(v.org, v.kind) for v in batch.vectors}
                    kinds |= {(r.org, "property") for r, _ in batch.records} | {(d.org, "section") for d, _ in batch.documents}
                    rowids.own_text_tables(db)  # after each batch: a large load writes the rest into them
                for org_id, record_id in sorted(merged):  # checked under the write lock: no other writer between

                    def target(rid: str, org_id: str = org_id) -> str | None:
                        row = db.execute("SELECT merged_into FROM records WHERE org = ? AND id = ?", (org_id, rid)).fetchone()
                        return row[0] if row else None

                    cycle = merge_cycle(target, record_id)
                    if cycle is not None:
                        raise StoreError(merge_cycle_error(org_id, cycle))
                for org_id in touched:
                    db.execute("UPDATE orgs SET generation = generation + 1 WHERE id = ?", (org_id,))
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"SQLite write failed (nothing was written): {exc}") from exc
        for org_id, kind in sorted(kinds):
            try:
                self._vectors.after_write(org_id, kind)
            except Exception as exc:  # noqa: BLE001 - the write is committed: it stands whatever the index does
                _log.warning("the ANN index of %s/%s was not brought up to date after a write (%s): the next search "
                             "checks it against the database", org_id, kind, type(exc).__name__)  # fmt: skip

    @staticmethod
    def _guard_reads(db: sqlite3.Connection, batch: WriteBatch) -> GuardReads:
        """The reads :func:`~dossier.stores.base.write_guard` makes, on the write's own transaction."""
        orgs = {item.org for items in (batch.records, batch.memories, batch.documents) for item, _ in items}
        org = require_org(next(iter(orgs)) if len(orgs) == 1 else "", "a guarded write (one org)")

        def rows(sql: str, ids: list[str]) -> list[tuple]:
            out: list[tuple] = []
            for chunk in _chunks(ids):
                out += db.execute(sql.format(marks=",".join("?" * len(chunk))), [org, *chunk]).fetchall()
            return out

        def holders(kind: str, value: str) -> list[str]:
            column = {"email": "email", "phone": "phone", "website": "website", "profile_url": "profile_url"}[kind]
            return [r[0] for r in db.execute(f"SELECT id FROM records WHERE org = ? AND {column} = ?", (org, value))]

        return GuardReads(
            records=lambda ids: {i: (bool(p), m) for i, p, m in rows("SELECT id, pending_deletion, merged_into FROM records WHERE org = ? AND id IN ({marks})", ids)},
            memory_owners=lambda ids: {i: r for i, r in rows("SELECT id, record FROM memories WHERE org = ? AND id IN ({marks})", ids)},
            attached=lambda ids: {i: a for i, a in rows("SELECT id, attached_record FROM documents WHERE org = ? AND id IN ({marks})", ids)},
            holders=holders,
        )  # fmt: skip

    def _write_batch(self, db: sqlite3.Connection, batch: WriteBatch, rowids: "_Rowids", touched: set[str]) -> None:
        for org in batch.orgs:
            db.execute(
                "INSERT INTO orgs (id, name, hash) VALUES (?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET name = excluded.name, hash = excluded.hash",
                (require_org(org.id, "write"), org.name, org.content_hash),
            )
            touched.add(org.id)
        for caller in batch.callers:
            db.execute(
                "INSERT OR REPLACE INTO callers VALUES (?, ?, ?, ?)",
                (require_org(caller.org, "write"), caller.id, json.dumps(list(caller.roles)), caller.content_hash),
            )
        for record, digest in batch.records:
            self._write_record(db, record, digest)
            touched.add(record.org)
        for memory, digest in batch.memories:
            self._write_memory(db, memory, digest, rowids)
            touched.add(memory.org)
        for document, digest in batch.documents:
            self._write_document(db, document, digest, rowids)
            touched.add(document.org)
        for e, digest in batch.edges:
            db.execute(
                "INSERT OR REPLACE INTO edges VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (require_org(e.org, "write"), e.id, e.src, e.dst, e.type, int(e.active), e.confidence,
                 e.weight, int(e.dst_is_stub), digest),
            )  # fmt: skip
            touched.add(e.org)
        if batch.vectors:
            import numpy as np
        for v in batch.vectors:
            blob = np.asarray(v.vector, dtype=np.float32).tobytes()
            # delete, then insert: the vector gets a new rowid and both show in the change log
            db.execute("DELETE FROM vectors WHERE org = ? AND kind = ? AND key = ?", (require_org(v.org, "write"), v.kind, v.key))
            db.execute("INSERT INTO vectors VALUES (?, ?, ?, ?, ?, ?)", (v.org, v.kind, v.key, v.parent, v.text_hash, blob))
            touched.add(v.org)

    def _write_record(self, db: sqlite3.Connection, r: Record, digest: str) -> None:
        ids = r.identifiers
        domain = ids.website or (email_domain(ids.email) if ids.email else None)
        db.execute(
            "INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (require_org(r.org, "write"), r.id, r.kind, ids.email, ids.phone, ids.website, ids.profile_url, domain,
             json.dumps(r.properties), r.merged_into, int(r.pending_deletion), digest),
        )  # fmt: skip
        from ..bundle import has_value

        # a record pending deletion keeps no property vectors: discovery by property never finds it
        keep = [] if r.pending_deletion else [property_key(r.id, n) for n, v in r.properties.items() if has_value(v)]
        db.execute(
            f"DELETE FROM vectors WHERE org = ? AND kind = 'property' AND parent = ? "
            f"AND key NOT IN ({','.join('?' * len(keep))})",
            (r.org, r.id, *keep),
        )

    def _write_memory(self, db: sqlite3.Connection, m: Memory, digest: str, rowids: "_Rowids") -> None:
        org = require_org(m.org, "write")
        old = db.execute("SELECT rowid, record FROM memories WHERE org = ? AND id = ?", (org, m.id)).fetchone()
        fts = rowids.text_table(db, org, "memories_fts")
        if old:
            db.execute(f"DELETE FROM {fts} WHERE rowid = ?", (old[0],))
            db.execute("DELETE FROM memories WHERE rowid = ?", (old[0],))
        # a memory keeps its rowid while it stays with its record; a new or moved one takes the next in the record's range
        rowid = old[0] if old and old[1] == m.record else rowids.next(db, "memories", org, "memory", m.record)
        db.execute(
            "INSERT INTO memories (rowid, org, id, record, text, created_at, hash) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (rowid, org, m.id, m.record, m.text, _iso(m.created_at), digest),
        )
        db.execute(f"INSERT INTO {fts} (rowid, org, text) VALUES (?, ?, ?)", (rowid, org, m.text))
        db.execute(
            "UPDATE vectors SET parent = ? WHERE org = ? AND kind = 'memory' AND key = ? AND parent <> ?",
            (m.record, org, m.id, m.record),
        )

    def _write_document(self, db: sqlite3.Connection, d: Document, digest: str, rowids: "_Rowids") -> None:
        org = require_org(d.org, "write")
        roles = None if d.visible_to_roles is None else json.dumps(list(d.visible_to_roles))
        db.execute(
            "INSERT OR REPLACE INTO documents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (org, d.id, d.title, d.doc_type, json.dumps(list(d.tags)), roles, d.attached_record, int(d.is_system),
             digest),
        )  # fmt: skip
        fts = rowids.text_table(db, org, "sections_fts")
        old = db.execute("SELECT rowid, id FROM sections WHERE org = ? AND document = ?", (org, d.id)).fetchall()
        for rowid, _ in old:
            db.execute(f"DELETE FROM {fts} WHERE rowid = ?", (rowid,))
        db.execute("DELETE FROM sections WHERE org = ? AND document = ?", (org, d.id))
        new_ids = {s.id for s in d.sections}
        for _, section_id in old:
            if section_id not in new_ids:
                db.execute("DELETE FROM vectors WHERE org = ? AND kind = 'section' AND key = ?", (org, section_id))
        if len(d.sections) > _PER_SLOT:
            raise StoreError(f"document {d.id!r} has more than {_PER_SLOT} sections")
        first = rowids.slot(db, org, "section", d.id) << SLOT_BITS  # a document's sections: one rowid range, in order
        for position, s in enumerate(d.sections):
            db.execute(
                "INSERT INTO sections (rowid, org, id, document, position, heading, text) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (first + position, org, s.id, d.id, position, s.heading, s.text),
            )
            db.execute(
                f"INSERT INTO {fts} (rowid, org, title, heading, text) VALUES (?, ?, ?, ?, ?)",
                (first + position, org, d.title, s.heading, s.text),
            )

    def content_hashes(self, kind: ItemKind, ids: Sequence[str], *, org: str) -> dict[str, str]:
        require_org(org, "content_hashes")
        table = _TABLES[kind]
        scope = "id = ?" if kind == "org" else "org = ?"  # an org row is its own scope
        out: dict[str, str] = {}
        for chunk in _chunks(list(ids)):
            sql = f"SELECT id, hash FROM {table} WHERE {scope} AND id IN ({','.join('?' * len(chunk))})"
            out.update(dict(self._query(sql, [org, *chunk])))
        return out

    def vector_hashes(self, kind: VectorKind, keys: Sequence[str], *, org: str) -> dict[str, str]:
        require_org(org, "vector_hashes")
        out: dict[str, str] = {}
        for chunk in _chunks(list(keys)):
            sql = f"SELECT key, text_hash FROM vectors WHERE org = ? AND kind = ? AND key IN ({','.join('?' * len(chunk))})"
            out.update(dict(self._query(sql, [org, kind, *chunk])))
        return out

    def put_settings(self, settings: dict, *, org: str) -> None:
        require_org(org, "put_settings")
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO org_settings VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))",
                (org, json.dumps(settings, sort_keys=True)),
            )
            db.execute("UPDATE orgs SET generation = generation + 1 WHERE id = ?", (org,))

    def update_settings(self, change: Callable[[dict | None], dict], *, org: str) -> dict:
        require_org(org, "update_settings")
        with self._transaction() as db:  # BEGIN IMMEDIATE: the file's write lock, taken before the read
            row = db.execute("SELECT settings FROM org_settings WHERE org = ?", (org,)).fetchone()
            try:
                stored = json.loads(row[0]) if row else None
            except ValueError:
                stored = None  # a row that cannot be read is replaced
            settings = change(stored)
            db.execute(
                "INSERT OR REPLACE INTO org_settings VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))",
                (org, json.dumps(settings, sort_keys=True)),
            )
            db.execute("UPDATE orgs SET generation = generation + 1 WHERE id = ?", (org,))
        return settings

    def get_settings(self, *, org: str) -> dict | None:
        require_org(org, "get_settings")
        rows = self._query("SELECT settings FROM org_settings WHERE org = ?", (org,))
        return json.loads(rows[0][0]) if rows else None

    def put_result(self, call_id: str, result: dict, *, org: str) -> None:
        require_org(org, "put_result")
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO results VALUES (?, ?, ?, strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))",
                (org, call_id, json.dumps(result, sort_keys=True, default=str)),
            )

    def get_result(self, call_id: str, *, org: str) -> dict | None:
        require_org(org, "get_result")
        rows = self._query("SELECT result FROM results WHERE org = ? AND call_id = ?", (org, call_id))
        return json.loads(rows[0][0]) if rows else None

    # -- reads by id -------------------------------------------------------------------------------
    def get_org(self, *, org: str) -> Org | None:
        require_org(org, "get_org")
        from ..bundle import Org

        rows = self._query("SELECT id, name FROM orgs WHERE id = ?", (org,))
        return Org(id=rows[0][0], name=rows[0][1]) if rows else None

    def get_caller(self, caller_id: str, *, org: str) -> Caller | None:
        require_org(org, "get_caller")
        from ..bundle import Caller

        rows = self._query("SELECT id, org, roles FROM callers WHERE org = ? AND id = ?", (org, caller_id))
        return Caller(id=rows[0][0], org=rows[0][1], roles=tuple(json.loads(rows[0][2]))) if rows else None

    def get_records(self, ids: Sequence[str], *, org: str) -> list[Record]:
        require_org(org, "get_records")
        return _in_order(ids, self._select_records("id IN ({})", ids, org))

    def _select_records(self, where: str, values: Sequence[Any], org: str, tail: str = "") -> list[Record]:
        out: list[Record] = []
        for chunk in _chunks(list(values)):
            sql = (
                "SELECT org, id, kind, email, phone, website, profile_url, properties, merged_into, pending_deletion "
                f"FROM records WHERE org = ? AND {where.format(','.join('?' * len(chunk)))} {tail}"
            )
            out.extend(_records(self._query(sql, [org, *chunk])))
        return out

    def get_memories(self, ids: Sequence[str], *, org: str) -> list[Memory]:
        require_org(org, "get_memories")
        with self._lock:  # the org's generation, then the memories not kept (stores/sqlite_cache.py)
            if self._db.in_transaction:  # inside a write not yet committed: nothing kept from it
                return _in_order(ids, self._read_memories(list(dict.fromkeys(ids)), org=org))
            return self._memories.get(ids, org=org, read=lambda missing: self._read_memories(missing, org=org))

    def _read_memories(self, ids: list[str], *, org: str) -> list[Memory]:
        out: list[Memory] = []
        for chunk in _chunks(ids):
            sql = f"SELECT org, id, record, text, created_at FROM memories WHERE org = ? AND id IN ({','.join('?' * len(chunk))})"
            out.extend(_memories(self._query(sql, [org, *chunk])))
        return out

    def get_documents(self, ids: Sequence[str], *, org: str) -> list[Document]:
        require_org(org, "get_documents")
        with self._lock:  # the org's generation, then the documents not kept (stores/sqlite_cache.py)
            if self._db.in_transaction:  # inside a write not yet committed: nothing kept from it
                return _in_order(ids, self._read_documents(list(dict.fromkeys(ids)), org=org))
            return self._documents.get(ids, org=org, read=lambda missing: self._read_documents(missing, org=org))

    def _generation(self, org: str) -> int | None:
        rows = self._query("SELECT generation FROM orgs WHERE id = ?", [org])
        return int(rows[0][0]) if rows else None

    def _read_documents(self, ids: list[str], *, org: str) -> list[Document]:
        from ..bundle import Document, Section

        out: list[Document] = []
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            sections: dict[str, list[Section]] = {}
            for doc_id, sid, heading, text in self._query(
                f"SELECT document, id, heading, text FROM sections WHERE org = ? AND document IN ({marks}) "
                "ORDER BY document, position",
                [org, *chunk],
            ):
                # built without validation, as records and memories are: the rows were validated when written
                sections.setdefault(doc_id, []).append(Section.model_construct(id=sid, heading=heading, text=text))
            for row in self._query(
                "SELECT org, id, title, doc_type, tags, visible_to_roles, attached_record, is_system "
                f"FROM documents WHERE org = ? AND id IN ({marks})",
                [org, *chunk],
            ):
                roles = None if row[5] is None else tuple(json.loads(row[5]))
                out.append(
                    Document.model_construct(
                        org=row[0], id=row[1], title=row[2], doc_type=row[3], tags=tuple(json.loads(row[4])),
                        visible_to_roles=roles, attached_record=row[6], is_system=bool(row[7]),
                        sections=tuple(sections.get(row[1], ()))
                        or (Section.model_construct(id=f"{row[1]}-empty", heading="", text=""),),
                    )
                )  # fmt: skip
        return out

    def find_documents(
        self, *, org: str, doc_types: Sequence[str] = (), tags: Sequence[str] = (), limit: int
    ) -> list[Document]:
        require_org(org, "find_documents")
        return self.get_documents(self.document_ids(org=org, doc_types=doc_types, tags=tags, limit=limit), org=org)

    def document_ids(
        self, *, org: str, doc_types: Sequence[str] = (), tags: Sequence[str] = (), limit: int | None = None,
        roles: Sequence[str] | None = None, record_ids: Sequence[str] = (),
    ) -> list[str]:
        require_org(org, "document_ids")
        sql, params = "SELECT id FROM documents WHERE org = ?", [org]
        if doc_types:
            sql += f" AND doc_type IN ({','.join('?' * len(doc_types))})"
            params.extend(doc_types)
        if tags:
            sql += f" AND EXISTS (SELECT 1 FROM json_each(documents.tags) WHERE value IN ({','.join('?' * len(tags))}))"
            params.extend(tags)
        if roles is not None:  # the visibility rule (pipeline/visibility.py) as a query
            sql += " AND NOT is_system AND (visible_to_roles IS NULL"
            if roles:
                sql += f" OR EXISTS (SELECT 1 FROM json_each(documents.visible_to_roles) WHERE value IN ({','.join('?' * len(roles))}))"
                params.extend(roles)
            sql += ") AND (attached_record IS NULL"
            if record_ids:
                sql += f" OR attached_record IN ({','.join('?' * len(record_ids))})"
                params.extend(record_ids)
            sql += ")"
        sql += " ORDER BY id" if limit is None else " ORDER BY id LIMIT ?"
        return [r[0] for r in self._query(sql, params if limit is None else [*params, int(limit)])]

    def restricted_documents(self, *, org: str, ids: Sequence[str] | None = None) -> list[DocumentAccess]:
        require_org(org, "restricted_documents")
        sql = (
            "SELECT d.id, d.is_system, d.visible_to_roles, d.attached_record FROM documents d "
            f"WHERE d.org = ? AND {RESTRICTED_SQL}"
        )
        if ids is None:
            rows = self._query(sql + " ORDER BY d.id", [org])
        else:
            rows = [r for chunk in _chunks(sorted(set(ids)))
                    for r in self._query(sql + f" AND d.id IN ({','.join('?' * len(chunk))}) ORDER BY d.id", [org, *chunk])]  # fmt: skip
        return [
            DocumentAccess(id=r[0], org=org, is_system=bool(r[1]),
                           visible_to_roles=None if r[2] is None else tuple(json.loads(r[2])), attached_record=r[3])  # fmt: skip
            for r in rows
        ]

    # -- records -----------------------------------------------------------------------------------
    def find_records(self, kind: IdentifierKind, value: str, *, org: str) -> list[Record]:
        require_org(org, "find_records")
        if kind not in ("email", "phone", "website", "profile_url"):
            raise ValueError(f"unknown identifier kind {kind!r}")
        try:
            value = normalize(kind, value)
        except ValueError:
            return []  # not an identifier of this kind, so no record has it
        # sorted here: with ORDER BY id SQLite walks the org's records in id order (its primary key) and
        # tests each one's identifier, 5 ms at 20,000 records, where the identifier's index reads one row
        return sorted(self._select_records(f"{kind} IN ({{}})", [value], org), key=lambda r: r.id)

    def records_by_domain(self, domain: str, *, org: str, limit: int) -> list[Record]:
        require_org(org, "records_by_domain")
        return self._select_records("domain IN ({})", [domain], org, f"ORDER BY id LIMIT {int(limit)}")

    def merged_from(self, record_id: str, *, org: str) -> list[str]:
        require_org(org, "merged_from")
        found: list[str] = []
        frontier = [record_id]
        while frontier:
            rows = self._select_records("merged_into IN ({})", frontier, org)
            frontier = [r.id for r in rows if r.id not in found and r.id != record_id]
            found.extend(frontier)
        return sorted(found)

    # -- recall ------------------------------------------------------------------------------------
    def search_text(
        self, kind: TextKind, query: str, *, org: str, limit: int, parents: Sequence[str] | None = None,
        viewer: Viewer | None = None,
    ) -> list[Hit]:
        require_org(org, "search_text")
        match = fts5_query(query)
        if match is None or limit <= 0 or (parents is not None and not parents):
            return []
        # The org is checked on the joined row (s.org / m.org), which always has the org of its full-text row
        # (same rowid, written and deleted together). Checking the full-text table's UNINDEXED org column as
        # well cost a content-table lookup per match (~40% of the query at 20,000 sections) and filtered nothing.
        if kind == "section":
            fts, table, alias, column, weights = "sections_fts", "sections", "s", "document", "0.0, 2.0, 2.0, 1.0"
        elif kind == "memory":
            fts, table, alias, column, weights = "memories_fts", "memories", "m", "record", ""
        else:
            raise ValueError(f"no full-text search over {kind!r}")
        with self._lock:  # the pruned search's statistics and scratch table belong to this connection
            number = self._text_number(org)
            if number is not None:  # the org's own tables (an org past OWN_TEXT_ROWS, see sqlite_schema)
                fts = f"{fts}_{number}"
            self._searching = (org, number)  # read once per search, however often the pruned search asks
            try:
                seen = self._seen(org, viewer) if kind == "section" and viewer is not None else None
                return self._search_text(kind, query, match, fts, table, alias, column, weights, org=org, limit=limit,
                                         parents=parents, seen=seen)  # fmt: skip
            finally:
                self._searching = None

    def text_scope_rows(self, kind: TextKind, *, org: str, most: int, parents: Sequence[str] | None = None) -> int:
        if not text_scope_asked(kind, org, most, parents):
            return 0
        with self._lock:  # counted once while the table's index is unchanged (PrunedText.scope_rows)
            if parents is None:
                return self._text.scope_rows(kind, most, org=org, slots=None)
            slots = self._slots(kind, org, parents)
            return self._text.scope_rows(kind, most, org=org, slots=slots) if slots else 0

    def _text_number(self, org: str) -> int | None:
        """The org's number in ``text_tables`` (its own full-text tables' suffix), None while its rows share
        the file's tables."""
        if self._searching is not None and self._searching[0] == org:
            return self._searching[1]
        number = self._text_numbers.get(org)
        if number is None:
            found = self._query("SELECT number FROM text_tables WHERE org = ?", [org])
            if not found:
                return None
            number = self._text_numbers[org] = int(found[0][0])
        return number

    def _seen(self, org: str, viewer: Viewer) -> Seen | None:
        """Which sections' rows a search for ``viewer`` counts in its statistics (None: the org's restricted
        documents hold none): the org's restricted documents' slots, kept while the org's generation stays or
        its sections' full-text table is unchanged, and those of the ones ``viewer`` may see."""
        generation = self._generation(org)
        kept = self._restricted.get(org)
        if kept is None or generation is None or kept[0] != generation:
            # the org wrote: its documents changed only if its sections' full-text table did (a document written
            # rewrites its sections' rows; documents are never deleted), so a memory written keeps the index.
            # The key is read before the documents: a write landing meanwhile changes it.
            text_key = self._text.index_key("section", org=org)
            if kept is not None and generation is not None and text_key == kept[1]:
                kept = self._restricted[org] = (generation, text_key, kept[2], kept[3])
        if kept is None or generation is None or kept[0] != generation:
            # one row of JSON, not a row per document (the org may restrict tens of thousands, notes about records)
            rows = json.loads(self._query(
                "SELECT json_group_array(json_array(p.slot, d.is_system, json(d.visible_to_roles), d.attached_record, d.id)) "
                "FROM documents d JOIN parent_slots p ON p.org = d.org AND p.kind = 'section' AND p.parent = d.id "
                f"WHERE d.org = ? AND {RESTRICTED_SQL}",
                [org],
            )[0][0])  # fmt: skip
            index = RestrictedIndex((int(slot), bool(system), roles, attached) for slot, system, roles, attached, _ in rows)
            if len(self._restricted) >= _ORGS_RESTRICTED_KEPT:
                self._restricted.clear()
            kept = self._restricted[org] = (generation, text_key, index, {int(row[0]): str(row[4]) for row in rows})
        index = kept[2]
        if not index.keys:
            return None
        return Seen(restricted=index.keys, shown=index.shown(viewer))

    def _hidden_documents(self, org: str, viewer: Viewer) -> frozenset[str] | None:
        """The ids of the org's documents ``viewer`` may not see (None: it restricts none), as of the org's last
        write (:meth:`_seen`): one set object per set of hidden slots, so the vector search's mask of their rows
        is worked out once (SQLiteVectors._mask)."""
        with self._lock:
            seen = self._seen(org, viewer)
            if seen is None:
                return None
            slots = self._text.hidden_of(seen)
            kept = self._hidden_ids.get(id(slots))
            if kept is None or kept[0] is not slots:
                ids = self._restricted[org][3]
                kept = self._hidden_ids[id(slots)] = (slots, frozenset(ids[s] for s in slots))
                while len(self._hidden_ids) > _HIDDEN_KEPT:
                    self._hidden_ids.popitem(last=False)
            self._hidden_ids.move_to_end(id(slots))
            return kept[1]

    def _search_text(
        self, kind: str, query: str, match: str, fts: str, table: str, alias: str, column: str, weights: str, *,
        org: str, limit: int, parents: Sequence[str] | None, seen: Seen | None = None,
    ) -> list[Hit]:
        # FTS5's bm25() weighs each term by its frequency in the whole table, so it ranks by itself only where
        # the org is alone in its table (its own tables, past OWN_TEXT_ROWS, or a file holding one org) and the
        # caller may see all of it; otherwise (at most OWN_TEXT_ROWS rows of a kind, or restricted sections the
        # caller may not see) the same BM25 is computed over what the caller may see of the org's own rows,
        # kept in the process (sqlite_fulltext.PrunedText): nothing another org or caller holds moves a score
        sole = self._text.sole(kind, org) and seen is None
        # for a viewer, a scope past OWN_TEXT_ROWS is pruned: without FTS5's own ranking, a complete one would
        # score every match in Python, its texts read again at every search
        line = self.text_prune_rows if seen is None else min(self.text_prune_rows, OWN_TEXT_ROWS + 1)
        if parents is None and self._text.scope_rows(kind, line, org=org, slots=None) >= line:
            return self._pruned(kind, query, org=org, limit=limit, slots=None, prune=True, seen=seen)
        rank = f"bm25({fts}{', ' + weights if weights else ''})"
        # CROSS JOIN keeps the full-text table outside: probing it once per content row would run the whole
        # match (and bm25's statistics) again for every row
        full = (
            f"SELECT {alias}.id, {alias}.{column}, {rank} AS rank "
            f"FROM {fts} CROSS JOIN {table} {alias} ON {alias}.rowid = {fts}.rowid WHERE {fts} MATCH ?"
        )
        if parents is None:
            if not sole:
                return self._pruned(kind, query, org=org, limit=limit, slots=None, prune=False, seen=seen)
            return self._hits(full + f" AND {alias}.org = ? ORDER BY rank, 1 LIMIT ?", [match, org, int(limit)])
        # A parent's rows are one rowid range (its slot, see sqlite_schema): FTS5 reads one parent's range
        # alone, so the search costs what that record (or document) holds, not every match in the store.
        # For several parents each match's slot is tested, with no table read (a range per parent would
        # count every term's matches, which bm25 does per query, once per parent).
        slots = self._slots(kind, org, parents)
        if not slots:
            return []
        held = self._text.scope_rows(kind, line, org=org, slots=slots)
        if held >= line:
            return self._pruned(kind, query, org=org, limit=limit, slots=slots, prune=True, seen=seen)
        if not sole or (len(slots) > 1 and self._text.table_rows(kind, org=org) >= _WHOLE_TABLE * max(held, 1)):
            # another org's rows are in the table (above), or FTS5 would read every match in the table (testing
            # each one's slot) and every term's whole doclist for bm25's statistics; the same ranking, computed
            # over these parents' rows alone, costs what they hold (the same hits, order and scores: tested
            # against bm25() over the org's own rows)
            return self._pruned(kind, query, org=org, limit=limit, slots=slots, prune=False, seen=seen)
        if len(slots) == 1:
            scope, scope_params = f"{fts}.rowid BETWEEN ? AND ?", [slots[0] << SLOT_BITS, ((slots[0] + 1) << SLOT_BITS) - 1]
        else:
            scope, scope_params = f"({fts}.rowid >> {SLOT_BITS}) IN ({','.join('?' * len(slots))})", list(slots)
        # The best rows by rank are picked in the full-text table alone, and only they are joined to their
        # content rows (ids, org check): a join per match cost ~40% of a search over a large record. When the
        # last rank taken is tied, rows past the cut could hold ids that sort first: then every row ranked at
        # or above that tie is joined, and the order by rank, then id, decides.
        fetch = int(limit) + _TIE_SLACK
        matched = f"SELECT {fts}.rowid AS rowid, {rank} AS rank FROM {fts} WHERE {fts} MATCH ? AND {scope}"
        joined = f"CROSS JOIN {table} {alias} ON {alias}.rowid = r.rowid WHERE {alias}.org = ?"
        rows = self._query(
            f"SELECT {alias}.id, {alias}.{column}, r.rank FROM ({matched} ORDER BY rank LIMIT ?) r {joined} ORDER BY r.rank, 1",
            [match, *scope_params, fetch, org],
        )
        if len(rows) == fetch and rows[int(limit) - 1][2] == rows[-1][2]:
            rows = self._query(
                f"SELECT {alias}.id, {alias}.{column}, r.rank FROM ({matched}) r {joined} AND r.rank <= ? ORDER BY r.rank, 1 LIMIT ?",
                [match, *scope_params, org, rows[-1][2], int(limit)],
            )
        return [Hit(id=r[0], parent=r[1], score=-float(r[2])) for r in rows[: int(limit)]]

    def _pruned(
        self, kind: str, query: str, *, org: str, limit: int, slots: list[int] | None, prune: bool, seen: Seen | None = None
    ) -> list[Hit]:
        found = self._text.search(kind, terms(query), org=org, limit=limit, slots=slots, prune=prune, seen=seen)
        return [Hit(id=i, parent=p, score=s) for i, p, s in found]

    def _hits(self, sql: str, params: list[Any]) -> list[Hit]:
        return [Hit(id=r[0], parent=r[1], score=-float(r[2])) for r in self._query(sql, params)]

    def _slots(self, kind: str, org: str, parents: Sequence[str]) -> list[int]:
        """The slots of ``parents`` that hold rows of ``kind`` (a parent without any has none)."""
        out: list[int] = []
        for chunk in _chunks(sorted(set(parents))):
            out.extend(
                r[0] for r in self._query(
                    f"SELECT slot FROM parent_slots WHERE org = ? AND kind = ? AND parent IN ({','.join('?' * len(chunk))})",
                    [org, kind, *chunk],
                )
            )  # fmt: skip
        return sorted(out)

    def search_vectors(
        self, kind: VectorKind, vector: np.ndarray, *, org: str, limit: int, parents: Sequence[str] | None = None,
        viewer: Viewer | None = None,
    ) -> list[Hit]:
        require_org(org, "search_vectors")
        hidden = self._hidden_documents(org, viewer) if kind == "section" and viewer is not None else None
        try:
            found = self._vectors.search(kind, org, vector, limit, parents, hidden)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"SQLite query failed: {exc}") from exc
        return [Hit(id=k, parent=p, score=s) for k, p, s in found]

    def search_vectors_many(
        self, kind: VectorKind, vectors: Sequence[np.ndarray], *, org: str, limit: int, parents: Sequence[str] | None = None,
        viewer: Viewer | None = None,
    ) -> list[list[Hit]]:
        require_org(org, "search_vectors_many")
        hidden = self._hidden_documents(org, viewer) if kind == "section" and viewer is not None else None
        try:
            found = self._vectors.search_many(kind, org, list(vectors), limit, parents, hidden)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"SQLite query failed: {exc}") from exc
        return [[Hit(id=k, parent=p, score=s) for k, p, s in rows] for rows in found]

    def stored_vectors(self, kind: VectorKind, keys: Sequence[str], *, org: str) -> dict[str, np.ndarray]:
        import numpy as np

        require_org(org, "stored_vectors")
        out: dict[str, np.ndarray] = {}
        for chunk in _chunks(list(dict.fromkeys(keys))):
            sql = f"SELECT key, embedding FROM vectors WHERE org = ? AND kind = ? AND key IN ({','.join('?' * len(chunk))})"
            out.update((key, np.frombuffer(blob, dtype=np.float32).copy()) for key, blob in self._query(sql, [org, kind, *chunk]))
        return out

    def recent_memories(self, record_ids: Sequence[str], *, org: str, limit: int) -> list[Memory]:
        require_org(org, "recent_memories")
        if not record_ids or limit <= 0:
            return []
        # Newest ``limit`` of each record from the (org, record, created_at DESC) index, then merged: the same
        # rows as one query over all records, without reading and sorting every memory of every record.
        rows: list[tuple] = []
        for record_id in sorted(set(record_ids)):
            rows.extend(
                self._query(
                    "SELECT org, id, record, text, created_at FROM memories WHERE org = ? AND record = ? "
                    "ORDER BY created_at DESC, id LIMIT ?",
                    (org, record_id, int(limit)),
                )
            )
        rows.sort(key=lambda row: row[1])  # ORDER BY created_at DESC, id (sorts are stable)
        rows.sort(key=lambda row: row[4], reverse=True)
        return _memories(rows[:limit])

    def edges_around(
        self,
        record_ids: Sequence[str],
        *,
        org: str,
        max_hops: int,
        limit: int,
        include_inactive: bool = False,
        include_stubs: bool = False,
    ) -> list[EdgeHop]:
        require_org(org, "edges_around")
        flags = ("" if include_inactive else " AND active = 1") + ("" if include_stubs else " AND dst_is_stub = 0")

        def read_hop(frontier: list[str], fetch: int) -> tuple[list[Edge], bool]:
            rows: list[tuple] = []
            complete = True
            for chunk in _chunks(frontier):
                marks = ",".join("?" * len(chunk))
                # Two index searches, the second without the edges the first found (so UNION ALL: no temporary
                # table of every row to drop duplicates); the best ``read`` edges are cut before their ends'
                # records are looked up (a hub's 1,400 edges: 2 ms instead of 7). An edge with an end pending
                # deletion comes back marked and is dropped here; when that leaves too few of a cut read, the
                # hop reads more. One statement per chunk of the frontier.
                edges = (
                    f"SELECT {_EDGE_COLUMNS} FROM edges WHERE org = ? AND src IN ({marks}){flags} UNION ALL "
                    f"SELECT {_EDGE_COLUMNS} FROM edges WHERE org = ? AND dst IN ({marks}) AND src NOT IN ({marks}){flags}"
                )
                sql = (
                    "SELECT e.org, e.id, e.src, e.dst, e.type, e.active, e.confidence, e.weight, e.dst_is_stub, "
                    "s.id IS NOT NULL AND d.id IS NOT NULL FROM ("
                    f"SELECT * FROM ({edges}) ORDER BY confidence DESC, weight DESC, id LIMIT ?) e "
                    "LEFT JOIN records s ON s.org = e.org AND s.id = e.src AND s.pending_deletion = 0 "
                    "LEFT JOIN records d ON d.org = e.org AND d.id = e.dst AND d.pending_deletion = 0"
                )
                params = [org, *chunk, org, *chunk, *chunk]
                read = fetch
                while True:
                    got = self._query(sql, [*params, read])
                    live = [row[:9] for row in got if row[9]]
                    whole = len(got) < read  # every edge of this chunk was read
                    if whole or len(live) >= fetch:
                        break
                    read *= 4
                complete = complete and whole
                rows.extend(live)
            rows.sort(key=lambda r: (-r[6], -r[7], r[1]))  # best first, chunks merged
            return _edges(rows if complete else rows[:fetch]), complete

        return walk_edges(record_ids, max_hops=max_hops, limit=limit, read_hop=read_hop,
                          shown=lambda ids: shown_records(self, ids, org=org))

    def counts(self, *, org: str) -> dict[str, int]:
        require_org(org, "counts")
        out = {}
        for name, table in (("callers", "callers"), ("records", "records"), ("memories", "memories"),
                            ("documents", "documents"), ("sections", "sections"), ("edges", "edges")):  # fmt: skip
            out[name] = self._query(f"SELECT count(*) FROM {table} WHERE org = ?", (org,))[0][0]
        out["vectors"] = self._query("SELECT count(*) FROM vectors WHERE org = ?", (org,))[0][0]
        return out

    def org_ids(self) -> list[str]:
        """Every org in the store (an administrative read, used by the CLI's summary)."""
        return [r[0] for r in self._query("SELECT id FROM orgs ORDER BY id")]


_EDGE_COLUMNS = "org, id, src, dst, type, active, confidence, weight, dst_is_stub"
_HIDDEN_KEPT = 8  # sets of hidden documents' ids kept (SQLiteStore._hidden_documents)
_ORGS_RESTRICTED_KEPT = 256  # orgs whose restricted sections' slots a store keeps (SQLiteStore._seen)
_TIE_SLACK = 32  # rows a full-text search among parents shortlists beyond its limit (see search_text)
_WHOLE_TABLE = 16  # several parents' full text is ranked in Python once the table holds this many times their rows
_PER_SLOT = 1 << SLOT_BITS


class _Rowids:
    """Slots of parents and the next free rowid of each slot's range, for the rows one write inserts."""

    def __init__(self) -> None:
        self._slots: dict[tuple[str, str, str], int] = {}
        self._next: dict[tuple[str, int], int] = {}
        self._numbers: dict[str, int | None] = {}  # org -> its number in text_tables (None: the shared tables)
        self._shared: set[str] = set()  # orgs that wrote texts to the shared tables since the last check

    def text_table(self, db: sqlite3.Connection, org: str, fts: str) -> str:
        """The full-text table ``fts`` of ``org``: its own (``fts`` and its number) or the shared one."""
        if org not in self._numbers:
            row = db.execute("SELECT number FROM text_tables WHERE org = ?", (org,)).fetchone()
            self._numbers[org] = None if row is None else int(row[0])
        number = self._numbers[org]
        if number is None:
            self._shared.add(org)
            return fts
        return f"{fts}_{number}"

    def own_text_tables(self, db: sqlite3.Connection) -> None:
        """Give the orgs that this write took past ``OWN_TEXT_ROWS`` full-text tables of their own (their rows
        moved there; later batches of the write go to them)."""
        for org in sorted(self._shared):
            if needs_own_text_tables(db, org):
                self._numbers[org] = give_own_text_tables(db, org)
        self._shared.clear()

    def slot(self, db: sqlite3.Connection, org: str, kind: str, parent: str) -> int:
        key = (org, kind, parent)
        if key not in self._slots:
            db.execute("INSERT OR IGNORE INTO parent_slots (org, kind, parent) VALUES (?, ?, ?)", key)
            row = db.execute("SELECT slot FROM parent_slots WHERE org = ? AND kind = ? AND parent = ?", key).fetchone()
            self._slots[key] = int(row[0])
        return self._slots[key]

    def next(self, db: sqlite3.Connection, table: str, org: str, kind: str, parent: str) -> int:
        slot = self.slot(db, org, kind, parent)
        first, last = slot << SLOT_BITS, ((slot + 1) << SLOT_BITS) - 1
        rowid = self._next.get((table, slot))
        if rowid is None:
            top = db.execute(f"SELECT max(rowid) FROM {table} WHERE rowid BETWEEN ? AND ?", (first, last)).fetchone()[0]
            rowid = first if top is None else top + 1
        if rowid > last:  # the top of the range is taken: the lowest free rowid below it
            rowid = db.execute(
                f"SELECT coalesce((SELECT ? WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE rowid = ?)), "
                f"(SELECT min(t.rowid) + 1 FROM {table} t WHERE t.rowid BETWEEN ? AND ? "
                f"AND NOT EXISTS (SELECT 1 FROM {table} u WHERE u.rowid = t.rowid + 1)))",
                (first, first, first, last - 1),
            ).fetchone()[0]
            if rowid is None:
                raise StoreError(f"{parent!r} holds {_PER_SLOT} {table} already: no room for more")
            self._next.pop((table, slot), None)
            return int(rowid)
        self._next[(table, slot)] = rowid + 1
        return int(rowid)


def _statements(script: str) -> Iterator[str]:
    """The statements of a migration script (a trigger's body holds semicolons of its own)."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                yield pending
            pending = ""
    if pending.strip(" \n;"):
        raise SchemaMismatch(f"incomplete statement in a migration: {pending[:80]!r}")


def _chunks(values: list, size: int = 500) -> Iterator[list]:
    for i in range(0, len(values), size):
        yield values[i : i + size]


def _in_order(ids: Sequence[str], items: list) -> list:
    by_id = {item.id: item for item in items}
    return [by_id[i] for i in dict.fromkeys(ids) if i in by_id]


def _iso(value: Any) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _records(rows: Iterable[tuple]) -> list[Record]:
    from ..bundle import Identifiers, Record

    out = []
    for row in rows:
        identifiers = Identifiers.model_construct(email=row[3], phone=row[4], website=row[5], profile_url=row[6])
        out.append(Record.model_construct(
            org=row[0], id=row[1], kind=row[2], identifiers=identifiers, properties=json.loads(row[7]),
            merged_into=row[8], pending_deletion=bool(row[9]),
        ))  # fmt: skip
    return out


def _memories(rows: Iterable[tuple]) -> list[Memory]:
    from datetime import datetime

    from ..bundle import Memory

    return [
        Memory.model_construct(org=row[0], id=row[1], record=row[2], text=row[3], created_at=datetime.fromisoformat(row[4]))
        for row in rows
    ]


def _edges(rows: Iterable[tuple]) -> list[Edge]:
    from ..bundle import Edge

    return [
        Edge.model_construct(
            org=row[0], id=row[1], src=row[2], dst=row[3], type=row[4], active=bool(row[5]), confidence=row[6],
            weight=row[7], dst_is_stub=bool(row[8]),
        )  # fmt: skip
        for row in rows
    ]
