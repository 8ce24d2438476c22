"""Schema migrations of the SQLite store; ``MIGRATIONS[i]`` moves a store from version i to i + 1."""

MIGRATIONS: tuple[str, ...] = (
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
)

SCHEMA_VERSION = len(MIGRATIONS)
