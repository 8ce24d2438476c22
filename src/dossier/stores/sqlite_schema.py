"""Schema migrations of the SQLite store; ``MIGRATIONS[i]`` moves a store from version i to i + 1 (a script,
or a function of the connection where the statements depend on what the store holds)."""

from __future__ import annotations

import sqlite3
from typing import Callable, Union

#: rowids of one parent's memories or sections: [slot << SLOT_BITS, (slot + 1) << SLOT_BITS)
SLOT_BITS = 24


def text_table_ddl(number: int) -> list[str]:
    """The full-text tables of the org numbered ``number`` in ``text_tables``: each org has its own, so a
    search reads (and BM25 counts) that org's rows alone, whatever other orgs of the file hold."""
    return [
        f"CREATE VIRTUAL TABLE memories_fts_{int(number)} USING fts5 (text, tokenize = 'porter unicode61')",
        f"CREATE VIRTUAL TABLE sections_fts_{int(number)} USING fts5 (title, heading, text, tokenize = 'porter unicode61')",
    ]


def _text_tables_per_org(db: sqlite3.Connection) -> None:
    """5: the full text of every org in tables of its own (before, one table per kind held every org's rows:
    a match read the postings of every org, so its cost told what other orgs hold, and FTS5's statistics
    counted them). Rowids are kept; each org's rows are indexed again from the content tables."""
    db.execute("CREATE TABLE text_tables (number INTEGER PRIMARY KEY, org TEXT NOT NULL UNIQUE)")
    db.execute("INSERT INTO text_tables (org) SELECT org FROM memories UNION SELECT org FROM sections ORDER BY 1")
    for number, org in db.execute("SELECT number, org FROM text_tables ORDER BY number").fetchall():
        for statement in text_table_ddl(number):
            db.execute(statement)
        db.execute(f"INSERT INTO memories_fts_{number} (rowid, text) SELECT rowid, text FROM memories WHERE org = ?", (org,))
        db.execute(
            f"INSERT INTO sections_fts_{number} (rowid, title, heading, text) SELECT s.rowid, d.title, s.heading, s.text "
            "FROM sections s JOIN documents d ON d.org = s.org AND d.id = s.document WHERE s.org = ?",
            (org,),
        )
    db.execute("DROP TABLE memories_fts")
    db.execute("DROP TABLE sections_fts")


MIGRATIONS: tuple[Union[str, Callable[[sqlite3.Connection], None]], ...] = (
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE orgs (
        id TEXT PRIMARY KEY, name TEXT, hash TEXT NOT NULL, generation INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE callers (
        org TEXT NOT NULL, id TEXT NOT NULL, roles TEXT NOT NULL, hash TEXT NOT NULL,
        PRIMARY KEY (org, id)
    );
    CREATE TABLE records (
        org TEXT NOT NULL, id TEXT NOT NULL, kind TEXT NOT NULL,
        email TEXT, phone TEXT, website TEXT, profile_url TEXT, domain TEXT,
        properties TEXT NOT NULL, merged_into TEXT, pending_deletion INTEGER NOT NULL,
        hash TEXT NOT NULL, PRIMARY KEY (org, id)
    );
    CREATE INDEX records_email ON records (org, email);
    CREATE INDEX records_phone ON records (org, phone);
    CREATE INDEX records_website ON records (org, website);
    CREATE INDEX records_profile ON records (org, profile_url);
    CREATE INDEX records_domain ON records (org, domain);
    CREATE INDEX records_merged ON records (org, merged_into);
    CREATE TABLE memories (
        rowid INTEGER PRIMARY KEY, org TEXT NOT NULL, id TEXT NOT NULL, record TEXT NOT NULL,
        text TEXT NOT NULL, created_at TEXT NOT NULL, hash TEXT NOT NULL, UNIQUE (org, id)
    );
    CREATE INDEX memories_recent ON memories (org, record, created_at DESC);
    CREATE TABLE documents (
        org TEXT NOT NULL, id TEXT NOT NULL, title TEXT NOT NULL, doc_type TEXT NOT NULL,
        tags TEXT NOT NULL, visible_to_roles TEXT, attached_record TEXT, is_system INTEGER NOT NULL,
        hash TEXT NOT NULL, PRIMARY KEY (org, id)
    );
    CREATE TABLE sections (
        rowid INTEGER PRIMARY KEY, org TEXT NOT NULL, id TEXT NOT NULL, document TEXT NOT NULL,
        position INTEGER NOT NULL, heading TEXT NOT NULL, text TEXT NOT NULL, UNIQUE (org, id)
    );
    CREATE INDEX sections_document ON sections (org, document, position);
    CREATE TABLE edges (
        org TEXT NOT NULL, id TEXT NOT NULL, src TEXT NOT NULL, dst TEXT NOT NULL, type TEXT NOT NULL,
        active INTEGER NOT NULL, confidence REAL NOT NULL, weight REAL NOT NULL,
        dst_is_stub INTEGER NOT NULL, hash TEXT NOT NULL, PRIMARY KEY (org, id)
    );
    CREATE INDEX edges_src ON edges (org, src);
    CREATE INDEX edges_dst ON edges (org, dst);
    CREATE TABLE vectors (
        org TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL, parent TEXT NOT NULL,
        text_hash TEXT NOT NULL, embedding BLOB NOT NULL, PRIMARY KEY (org, kind, key)
    );
    CREATE INDEX vectors_parent ON vectors (org, kind, parent);
    CREATE VIRTUAL TABLE sections_fts USING fts5 (
        org UNINDEXED, title, heading, text, tokenize = 'porter unicode61'
    );
    CREATE VIRTUAL TABLE memories_fts USING fts5 (org UNINDEXED, text, tokenize = 'porter unicode61');
    """,
    # 2: per-org settings (calibrated thresholds), as JSON
    """
    CREATE TABLE org_settings (org TEXT PRIMARY KEY, settings TEXT NOT NULL, updated_at TEXT NOT NULL);
    """,
    # 3: results of deferred work (synthesis), fetched later by call id
    """
    CREATE TABLE results (
        org TEXT NOT NULL, call_id TEXT NOT NULL, result TEXT NOT NULL, updated_at TEXT NOT NULL,
        PRIMARY KEY (org, call_id)
    );
    """,
    # 4: record-keyed rowids, and the log of vector changes that persisted ANN indexes catch up from.
    # Each (org, kind, parent) gets a slot; the memories of a record (the sections of a document) take rowids
    # in [slot << 24, (slot + 1) << 24), so the full text of one record is one rowid range that FTS5 reads
    # alone. Existing rows are renumbered (and their full text rebuilt) once.
    """
    CREATE TABLE parent_slots (
        slot INTEGER PRIMARY KEY, org TEXT NOT NULL, kind TEXT NOT NULL, parent TEXT NOT NULL,
        UNIQUE (org, kind, parent)
    );
    INSERT INTO parent_slots (org, kind, parent) SELECT DISTINCT org, 'memory', record FROM memories ORDER BY 1, 3;
    INSERT INTO parent_slots (org, kind, parent) SELECT DISTINCT org, 'section', document FROM sections ORDER BY 1, 3;
    CREATE TABLE memories_keyed (
        rowid INTEGER PRIMARY KEY, org TEXT NOT NULL, id TEXT NOT NULL, record TEXT NOT NULL,
        text TEXT NOT NULL, created_at TEXT NOT NULL, hash TEXT NOT NULL, UNIQUE (org, id)
    );
    INSERT INTO memories_keyed (rowid, org, id, record, text, created_at, hash)
        SELECT (p.slot << 24) + row_number() OVER (PARTITION BY m.org, m.record ORDER BY m.rowid) - 1,
               m.org, m.id, m.record, m.text, m.created_at, m.hash
        FROM memories m JOIN parent_slots p ON p.org = m.org AND p.kind = 'memory' AND p.parent = m.record;
    DROP TABLE memories;
    ALTER TABLE memories_keyed RENAME TO memories;
    CREATE INDEX memories_recent ON memories (org, record, created_at DESC);
    CREATE TABLE sections_keyed (
        rowid INTEGER PRIMARY KEY, org TEXT NOT NULL, id TEXT NOT NULL, document TEXT NOT NULL,
        position INTEGER NOT NULL, heading TEXT NOT NULL, text TEXT NOT NULL, UNIQUE (org, id)
    );
    INSERT INTO sections_keyed (rowid, org, id, document, position, heading, text)
        SELECT (p.slot << 24) + s.position, s.org, s.id, s.document, s.position, s.heading, s.text
        FROM sections s JOIN parent_slots p ON p.org = s.org AND p.kind = 'section' AND p.parent = s.document;
    DROP TABLE sections;
    ALTER TABLE sections_keyed RENAME TO sections;
    CREATE INDEX sections_document ON sections (org, document, position);
    DROP TABLE memories_fts;
    CREATE VIRTUAL TABLE memories_fts USING fts5 (org UNINDEXED, text, tokenize = 'porter unicode61');
    INSERT INTO memories_fts (rowid, org, text) SELECT rowid, org, text FROM memories;
    CREATE TEMP TABLE section_titles AS
        SELECT s.rowid AS rowid, d.title AS title FROM sections s JOIN documents d ON d.org = s.org AND d.id = s.document;
    DROP TABLE sections_fts;
    CREATE VIRTUAL TABLE sections_fts USING fts5 (
        org UNINDEXED, title, heading, text, tokenize = 'porter unicode61'
    );
    INSERT INTO sections_fts (rowid, org, title, heading, text)
        SELECT s.rowid, s.org, t.title, s.heading, s.text FROM sections s JOIN temp.section_titles t ON t.rowid = s.rowid;
    DROP TABLE temp.section_titles;
    CREATE TABLE vector_indexes (
        org TEXT NOT NULL, kind TEXT NOT NULL, saved_seq INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (org, kind)
    );
    CREATE TABLE vector_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, org TEXT NOT NULL, kind TEXT NOT NULL, vector INTEGER NOT NULL);
    CREATE INDEX vector_log_scope ON vector_log (org, kind, seq);
    CREATE TRIGGER vectors_insert_logged AFTER INSERT ON vectors
        WHEN EXISTS (SELECT 1 FROM vector_indexes WHERE org = new.org AND kind = new.kind)
    BEGIN
        INSERT INTO vector_log (org, kind, vector) VALUES (new.org, new.kind, new.rowid);
    END;
    CREATE TRIGGER vectors_delete_logged AFTER DELETE ON vectors
        WHEN EXISTS (SELECT 1 FROM vector_indexes WHERE org = old.org AND kind = old.kind)
    BEGIN
        INSERT INTO vector_log (org, kind, vector) VALUES (old.org, old.kind, old.rowid);
    END;
    CREATE TRIGGER vectors_update_logged AFTER UPDATE OF org, kind, embedding ON vectors
    BEGIN
        INSERT INTO vector_log (org, kind, vector)
            SELECT old.org, old.kind, old.rowid WHERE EXISTS (SELECT 1 FROM vector_indexes WHERE org = old.org AND kind = old.kind);
        INSERT INTO vector_log (org, kind, vector)
            SELECT new.org, new.kind, new.rowid WHERE EXISTS (SELECT 1 FROM vector_indexes WHERE org = new.org AND kind = new.kind);
    END;
    """,
    _text_tables_per_org,
)

SCHEMA_VERSION = len(MIGRATIONS)
