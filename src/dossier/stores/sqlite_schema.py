"""Schema migrations of the SQLite store; ``MIGRATIONS[i]`` moves a store from version i to i + 1 (a script,
or a function of the connection where what it does depends on what the store holds)."""

from __future__ import annotations

import sqlite3
from typing import Callable, Union

#: rowids of one parent's memories or sections: [slot << SLOT_BITS, (slot + 1) << SLOT_BITS)
SLOT_BITS = 24

#: An org holding more memories or more sections than this has full-text tables of its own; a smaller org's
#: rows share the file's ``memories_fts`` and ``sections_fts``, and its searches read its own rows alone,
#: kept in the process (``sqlite_fulltext.PrunedText._whole_org``). Either way no search of one org matches
#: an index that holds another org's rows, whose cost would tell what that org holds.
OWN_TEXT_ROWS = 5_000


def needs_own_text_tables(db: sqlite3.Connection, org: str) -> bool:
    """Whether ``org`` holds more than ``OWN_TEXT_ROWS`` memories or sections and has no tables of its own yet
    (at most ``OWN_TEXT_ROWS + 1`` index entries read per kind)."""
    if db.execute("SELECT 1 FROM text_tables WHERE org = ?", (org,)).fetchone():
        return False
    return any(
        db.execute(f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE org = ? LIMIT ?)", (org, OWN_TEXT_ROWS + 1)).fetchone()[0]
        > OWN_TEXT_ROWS
        for table in ("memories", "sections")
    )


def give_own_text_tables(db: sqlite3.Connection, org: str) -> int:
    """Give ``org`` full-text tables of its own, ``memories_fts_N`` and ``sections_fts_N`` (N its number in
    ``text_tables``, returned), and move its rows there from the shared ones (rowids kept). The tables have
    the shared ones' columns, so both are read alike."""
    db.execute("INSERT INTO text_tables (org) VALUES (?)", (org,))
    number = int(db.execute("SELECT number FROM text_tables WHERE org = ?", (org,)).fetchone()[0])
    ends = [db.execute(f"SELECT (SELECT min(org) FROM {t}), (SELECT max(org) FROM {t})").fetchone() for t in ("memories", "sections")]
    if all(low in (None, org) and high in (None, org) for low, high in ends):
        # the file holds no other org's memories or sections (most files): the shared tables are the org's
        for kind in ("memories", "sections"):
            db.execute(f"ALTER TABLE {kind}_fts RENAME TO {kind}_fts_{number}")
        _shared_text_tables(db)
        return number
    _shared_text_tables(db, suffix=f"_{number}")
    db.execute(f"INSERT INTO memories_fts_{number} (rowid, org, text) SELECT rowid, org, text FROM memories WHERE org = ?", (org,))
    db.execute(
        f"INSERT INTO sections_fts_{number} (rowid, org, title, heading, text) SELECT s.rowid, s.org, d.title, s.heading, s.text "
        "FROM sections s JOIN documents d ON d.org = s.org AND d.id = s.document WHERE s.org = ?",
        (org,),
    )
    db.execute("DELETE FROM memories_fts WHERE rowid IN (SELECT rowid FROM memories WHERE org = ?)", (org,))
    db.execute("DELETE FROM sections_fts WHERE rowid IN (SELECT rowid FROM sections WHERE org = ?)", (org,))
    return number


def _shared_text_tables(db: sqlite3.Connection, suffix: str = "") -> None:
    """The full-text tables as the shared ones are (``suffix`` names an org's own)."""
    db.execute(f"CREATE VIRTUAL TABLE memories_fts{suffix} USING fts5 (org UNINDEXED, text, tokenize = 'porter unicode61')")
    db.execute(
        f"CREATE VIRTUAL TABLE sections_fts{suffix} USING fts5 (org UNINDEXED, title, heading, text, tokenize = 'porter unicode61')"
    )


def _own_text_tables_for_large_orgs(db: sqlite3.Connection) -> None:
    """5: full-text tables of their own for the orgs holding more than ``OWN_TEXT_ROWS`` rows of a kind."""
    db.execute("CREATE TABLE text_tables (number INTEGER PRIMARY KEY, org TEXT NOT NULL UNIQUE)")
    for (org,) in db.execute("SELECT org FROM memories UNION SELECT org FROM sections ORDER BY 1").fetchall():
        if needs_own_text_tables(db, org):
            give_own_text_tables(db, org)


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
    _own_text_tables_for_large_orgs,
)

SCHEMA_VERSION = len(MIGRATIONS)
