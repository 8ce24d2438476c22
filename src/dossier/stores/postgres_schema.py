"""Schema migrations of the PostgreSQL store; ``MIGRATIONS[i]`` moves a database from version i to i + 1.

Applied versions are rows of ``dossier_schema``. Every table holding org data has row-level security
keyed by the per-connection setting ``dossier.org`` (FORCE'd, so the owning role is held to it too):
a statement that forgets its org filter still sees only the org the connection was scoped to.

The one exception are the full-text tables ``sections_fts`` and ``memories_fts`` (ids, parent ids and
``tsvector`` lexemes; no text), as SQLite keeps its FTS5 tables beside the content: PostgreSQL does not
use a GIN index under a row-level security policy, because the ``@@`` operator is not leakproof, and
every full-text search would then read all of the org's rows. Full-text hits are joined back to the
protected table before they leave the store, so a search that forgot its org filter would still
return nothing of another org.
Vectors live in ``vectors``, list-partitioned by org; :func:`partition_ddl` adds one org's partition.
The full-text tables are list-partitioned by org too (version 5; :func:`text_partition_ddl`, recorded in
``text_partitions``): each org's GIN index holds its own rows alone, so no org's search reads, or takes
longer for, another org's postings.
Ids are ``COLLATE "C"`` so that ``ORDER BY id`` sorts bytewise, as the SQLite store does.
"""

from __future__ import annotations

#: A text's length in tokens, stop words included, which BM25 normalises by as FTS5 does: the last position
#: of its ``simple`` (no stop words) ``tsvector`` (PostgreSQL caps positions at 16383).
TEXT_LENGTH = "(SELECT coalesce(max(p), 1) FROM unnest(to_tsvector('simple', {text})) u, unnest(u.positions) p)"
MEMORY_LENGTH = TEXT_LENGTH.format(text="text")
SECTION_LENGTH = TEXT_LENGTH.format(text="title || ' ' || heading || ' ' || text")

ORG_TABLES = ("callers", "records", "memories", "documents", "sections", "edges", "vectors", "org_settings", "vector_partitions")
#: pgvector ships in pgserver as 0.6.2: HNSW indexes (0.5+), parallel HNSW builds (0.6+); no iterative scans
#: (0.8), which is one reason vectors are partitioned by org rather than filtered after an index scan.
ORG_SCOPE = "org = current_setting('dossier.org', true) COLLATE \"C\""


def _row_security(table: str, column: str = "org", extra: str = "") -> str:
    scope = f"{column} = current_setting('dossier.org', true) COLLATE \"C\"{extra}"
    return (
        f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;\n"
        f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY;\n"
        f"CREATE POLICY org_scope ON {table} USING ({scope}) WITH CHECK ({scope});\n"
    )


_V1_TABLES = """
CREATE TABLE dossier_meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE orgs (id text COLLATE "C" PRIMARY KEY, name text, hash text NOT NULL);
CREATE TABLE callers (
    org text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL, roles text[] NOT NULL, hash text NOT NULL,
    PRIMARY KEY (org, id)
);
CREATE TABLE records (
    org text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL, kind text NOT NULL,
    email text COLLATE "C", phone text COLLATE "C", website text COLLATE "C", profile_url text COLLATE "C",
    domain text COLLATE "C", properties json NOT NULL, merged_into text COLLATE "C",
    pending_deletion boolean NOT NULL, hash text NOT NULL, PRIMARY KEY (org, id)
);
CREATE INDEX records_email ON records (org, email) WHERE email IS NOT NULL;
CREATE INDEX records_phone ON records (org, phone) WHERE phone IS NOT NULL;
CREATE INDEX records_website ON records (org, website) WHERE website IS NOT NULL;
CREATE INDEX records_profile ON records (org, profile_url) WHERE profile_url IS NOT NULL;
CREATE INDEX records_domain ON records (org, domain, id) WHERE domain IS NOT NULL;
CREATE INDEX records_merged ON records (org, merged_into) WHERE merged_into IS NOT NULL;
CREATE TABLE memories (
    org text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL, record text COLLATE "C" NOT NULL,
    text text NOT NULL, created_at timestamptz NOT NULL, hash text NOT NULL, PRIMARY KEY (org, id)
);
CREATE INDEX memories_recent ON memories (org, record, created_at DESC, id);
CREATE TABLE memories_fts (
    org text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL, record text COLLATE "C" NOT NULL,
    tsv tsvector NOT NULL, PRIMARY KEY (org, id)
);
CREATE INDEX memories_fts_tsv ON memories_fts USING gin (tsv);
CREATE INDEX memories_fts_record ON memories_fts (org, record) INCLUDE (tsv);  -- a record's memories: index-only
CREATE TABLE documents (
    org text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL, title text NOT NULL, doc_type text NOT NULL,
    tags text[] NOT NULL, visible_to_roles text[], attached_record text COLLATE "C", is_system boolean NOT NULL,
    hash text NOT NULL, PRIMARY KEY (org, id)
);
CREATE TABLE sections (
    org text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL, document text COLLATE "C" NOT NULL,
    position integer NOT NULL, title text NOT NULL, heading text NOT NULL, text text NOT NULL,
    PRIMARY KEY (org, id)
);
CREATE INDEX sections_document ON sections (org, document, position);
CREATE TABLE sections_fts (
    org text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL, document text COLLATE "C" NOT NULL,
    tsv tsvector NOT NULL, PRIMARY KEY (org, id)
);
CREATE INDEX sections_fts_tsv ON sections_fts USING gin (tsv);
CREATE INDEX sections_fts_document ON sections_fts (org, document);
CREATE TABLE edges (
    org text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL, src text COLLATE "C" NOT NULL,
    dst text COLLATE "C" NOT NULL, type text NOT NULL, active boolean NOT NULL, confidence double precision NOT NULL,
    weight double precision NOT NULL, dst_is_stub boolean NOT NULL, hash text NOT NULL, PRIMARY KEY (org, id)
);
CREATE INDEX edges_src ON edges (org, src) INCLUDE (dst, active, dst_is_stub, confidence, weight);
CREATE INDEX edges_dst ON edges (org, dst) INCLUDE (src, active, dst_is_stub, confidence, weight);
CREATE INDEX records_live ON records (org, id) INCLUDE (pending_deletion);
CREATE TABLE vectors (
    org text COLLATE "C" NOT NULL, kind text NOT NULL, key text COLLATE "C" NOT NULL,
    parent text COLLATE "C" NOT NULL, text_hash text NOT NULL, embedding vector NOT NULL,
    PRIMARY KEY (org, kind, key)
) PARTITION BY LIST (org);
CREATE INDEX vectors_parent ON vectors (org, kind, parent);
CREATE TABLE vector_partitions (org text COLLATE "C" PRIMARY KEY, name text NOT NULL UNIQUE);
CREATE TABLE org_settings (org text COLLATE "C" PRIMARY KEY, settings json NOT NULL, updated_at timestamptz NOT NULL);
"""

MIGRATIONS: tuple[str, ...] = (
    # 1: everything the SQLite store has at its version 2, plus row-level security per org
    _V1_TABLES
    + "".join(_row_security(t) for t in ORG_TABLES)
    + _row_security("orgs", "id", " OR current_setting('dossier.admin', true) = 'on'"),
    # 2: results of deferred work (synthesis), fetched later by call id
    """
    CREATE TABLE results (
        org text COLLATE "C" NOT NULL, call_id text COLLATE "C" NOT NULL, result json NOT NULL,
        updated_at timestamptz NOT NULL, PRIMARY KEY (org, call_id)
    );
    """
    + _row_security("results"),
    # 3: covering indexes: a graph walk reads edges from these alone (index-only scans), and a record's
    # memories are matched against the query from the index, not the table
    """
    DROP INDEX edges_src;
    DROP INDEX edges_dst;
    DROP INDEX memories_fts_record;
    CREATE INDEX edges_src ON edges (org, src) INCLUDE (id, dst, type, active, confidence, weight, dst_is_stub);
    CREATE INDEX edges_dst ON edges (org, dst) INCLUDE (id, src, type, active, confidence, weight, dst_is_stub);
    CREATE INDEX memories_fts_record ON memories_fts (org, record) INCLUDE (id, tsv);
    """,
    # 4: each full-text row's length in tokens, which BM25 normalises by (and the record index covers it)
    """
    DROP INDEX memories_fts_record;
    ALTER TABLE memories_fts ADD COLUMN length integer NOT NULL DEFAULT 1;
    ALTER TABLE sections_fts ADD COLUMN length integer NOT NULL DEFAULT 1;
    """
    # the texts are behind row-level security: backfill one org at a time, scoped to it
    + f"""
    DO $$
    DECLARE o text;
    BEGIN
        FOR o IN SELECT org FROM memories_fts UNION SELECT org FROM sections_fts LOOP
            PERFORM set_config('dossier.org', o, true);
            UPDATE memories_fts f SET length = {MEMORY_LENGTH} FROM memories
                WHERE f.org = o AND memories.org = o AND memories.id = f.id;
            UPDATE sections_fts f SET length = {SECTION_LENGTH} FROM sections
                WHERE f.org = o AND sections.org = o AND sections.id = f.id;
        END LOOP;
        PERFORM set_config('dossier.org', '', true);
    END $$;
    """
    + "CREATE INDEX memories_fts_record ON memories_fts (org, record) INCLUDE (id, tsv, length);\n",
    # 5: the full-text tables list-partitioned by org, as vectors are: each org's GIN index holds its own rows
    # alone, so a search reads no other org's postings and takes no longer for what other orgs hold
    """
    ALTER TABLE memories_fts RENAME TO memories_fts_v4;
    ALTER TABLE sections_fts RENAME TO sections_fts_v4;
    ALTER INDEX memories_fts_tsv RENAME TO memories_fts_v4_tsv;
    ALTER INDEX memories_fts_record RENAME TO memories_fts_v4_record;
    ALTER INDEX sections_fts_tsv RENAME TO sections_fts_v4_tsv;
    ALTER INDEX sections_fts_document RENAME TO sections_fts_v4_document;
    ALTER TABLE memories_fts_v4 RENAME CONSTRAINT memories_fts_pkey TO memories_fts_v4_pkey;
    ALTER TABLE sections_fts_v4 RENAME CONSTRAINT sections_fts_pkey TO sections_fts_v4_pkey;
    CREATE TABLE memories_fts (
        org text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL, record text COLLATE "C" NOT NULL,
        tsv tsvector NOT NULL, length integer NOT NULL DEFAULT 1, PRIMARY KEY (org, id)
    ) PARTITION BY LIST (org);
    CREATE INDEX memories_fts_tsv ON memories_fts USING gin (tsv);
    CREATE INDEX memories_fts_record ON memories_fts (org, record) INCLUDE (id, tsv, length);
    CREATE TABLE sections_fts (
        org text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL, document text COLLATE "C" NOT NULL,
        tsv tsvector NOT NULL, length integer NOT NULL DEFAULT 1, PRIMARY KEY (org, id)
    ) PARTITION BY LIST (org);
    CREATE INDEX sections_fts_tsv ON sections_fts USING gin (tsv);
    CREATE INDEX sections_fts_document ON sections_fts (org, document);
    CREATE TABLE text_partitions (org text COLLATE "C" PRIMARY KEY, name text NOT NULL UNIQUE);
    """
    + _row_security("text_partitions")
    # every org with rows gets its partitions and its rows back (scoped to it: text_partitions is behind
    # row-level security); the rows of the old tables are not behind it
    + """
    DO $$
    DECLARE o text; h text;
    BEGIN
        FOR o IN SELECT org FROM memories_fts_v4 UNION SELECT org FROM sections_fts_v4 ORDER BY 1 LOOP
            PERFORM set_config('dossier.org', o, true);
            h := substr(encode(sha256(convert_to(o, 'UTF8')), 'hex'), 1, 20);
            FOR t IN 0..1 LOOP
                EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                               (ARRAY['memories_fts_', 'sections_fts_'])[t + 1] || h, (ARRAY['memories_fts', 'sections_fts'])[t + 1]);
                EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (org = %L COLLATE "C")',
                               (ARRAY['memories_fts_', 'sections_fts_'])[t + 1] || h,
                               (ARRAY['memories_fts_', 'sections_fts_'])[t + 1] || h || '_org', o);
                EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES IN (%L)',
                               (ARRAY['memories_fts', 'sections_fts'])[t + 1], (ARRAY['memories_fts_', 'sections_fts_'])[t + 1] || h, o);
            END LOOP;
            INSERT INTO text_partitions VALUES (o, h);
            INSERT INTO memories_fts (org, id, record, tsv, length) SELECT org, id, record, tsv, length FROM memories_fts_v4 WHERE org = o;
            INSERT INTO sections_fts (org, id, document, tsv, length) SELECT org, id, document, tsv, length FROM sections_fts_v4 WHERE org = o;
        END LOOP;
        PERFORM set_config('dossier.org', '', true);
    END $$;
    DROP TABLE memories_fts_v4;
    DROP TABLE sections_fts_v4;
    """,
    # 6: what a B-tree entry cannot hold (at most 2,704 bytes): a long memory's tsvector is covered by an index of
    # its own that leaves it out (``wide``), and emails and profile URLs (up to 2,048 characters, up to four bytes
    # each) are found through hash indexes, which hold a value's hash alone
    """
    ALTER TABLE memories_fts ADD COLUMN wide boolean NOT NULL DEFAULT false;
    DROP INDEX memories_fts_record;
    CREATE INDEX memories_fts_record ON memories_fts (org, record) INCLUDE (id, tsv, length) WHERE NOT wide;
    CREATE INDEX memories_fts_record_wide ON memories_fts (org, record) INCLUDE (id, length) WHERE wide;
    DROP INDEX records_email;
    DROP INDEX records_profile;
    CREATE INDEX records_email ON records USING hash (email) WHERE email IS NOT NULL;
    CREATE INDEX records_profile ON records USING hash (profile_url) WHERE profile_url IS NOT NULL;
    """,
)

#: A memory's full-text row is ``wide`` when its tsvector and keys would not fit one entry of the record index
#: (B-tree entries hold at most 2,704 bytes; the keys themselves take at most 2,400 of them, 200 characters
#: of up to four bytes each).
MEMORY_WIDE = "pg_column_size(tsv) + octet_length(org) + octet_length(record) + octet_length(id) > 2400"

SCHEMA_VERSION = len(MIGRATIONS)


def partition_ddl(name: str, org_literal: str) -> list[str]:
    """Statements that create and attach one org's vector partition (``org_literal`` already quoted).

    The table is created alone and then attached: ATTACH takes a lock on ``vectors`` that does not
    conflict with reads and writes of other orgs, where CREATE TABLE ... PARTITION OF would block them.
    The CHECK constraint lets ATTACH skip its validation scan.
    """
    return [
        f'CREATE TABLE {name} (LIKE vectors INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
        f'ALTER TABLE {name} ADD CONSTRAINT {name}_org CHECK (org = {org_literal} COLLATE "C")',
        f"ALTER TABLE vectors ATTACH PARTITION {name} FOR VALUES IN ({org_literal})",
        *_row_security(name).strip().rstrip(";").split(";\n"),
    ]


def text_partition_ddl(suffix: str, org_literal: str) -> list[str]:
    """Statements that create and attach one org's partitions of ``memories_fts`` and ``sections_fts``
    (``memories_fts_<suffix>``, ...; ``org_literal`` already quoted), as :func:`partition_ddl` does for vectors:
    the parent's indexes (its GIN index among them) are made on each partition as it is attached."""
    out = []
    for parent in ("memories_fts", "sections_fts"):
        name = f"{parent}_{suffix}"
        out += [
            f"CREATE TABLE {name} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
            f'ALTER TABLE {name} ADD CONSTRAINT {name}_org CHECK (org = {org_literal} COLLATE "C")',
            f"ALTER TABLE {parent} ATTACH PARTITION {name} FOR VALUES IN ({org_literal})",
        ]
    return out


#: The ``tsvector`` of a section (title and heading weigh as A, the text as B) and of a memory.
SECTION_TSV = (
    "setweight(to_tsvector('english', title), 'A') || setweight(to_tsvector('english', heading), 'A') "
    "|| setweight(to_tsvector('english', text), 'B')"
)
MEMORY_TSV = "to_tsvector('english', text)"
