"""Full-text search over large scopes of the SQLite store (``stores/sqlite_fulltext.py``), on real SQLite.

Below the size line the answers are FTS5's own ``bm25()`` ranking over the org's own rows, hit for hit
and score for score (the reference ranks a copy of the file holding that org alone: another org's rows
must not move a score); above it the search is pruned by IDF: rows holding the rare terms come first,
each scored as that bm25() scores it, and another org's rows never come back either way. An org of more
than ``OWN_TEXT_ROWS`` rows of a kind has full-text tables of its own; no statement of any org's search
matches an index holding another org's rows.
"""

from __future__ import annotations

import random
import re
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import pytest

from dossier.bundle import Document, Memory, Org, Section
from dossier.stores.base import Hit, TextKind, WriteBatch
from dossier.stores.sqlite import SQLiteStore
from dossier.stores import sqlite_fulltext, sqlite_schema
from dossier.stores.sqlite_fulltext import TABLES

WORDS = ("discount renewal contract pricing seats approval quote refund invoice escalation support onboarding "
         "security migration training rollout budget procurement legal review").split()  # fmt: skip
RARE = "zanzibar"
WHEN = datetime(2025, 1, 1, tzinfo=timezone.utc)
QUESTIONS = [
    "What discount applies at renewal?",
    f"Was {RARE} part of the discount?",
    "NW-EDU-40 pricing for seats",
    "Café naïve résumé approval",
    "refunds refund refunded invoices",
    "foo_bar deal_stage support",
    "nothing matches xyzzy",
    "invoice 2024 for 40 seats",
    "pricing-review of the contract renewal",  # a phrase of common words: many rows hold it, more its words apart  # runs of digits: each its own token, never tokenised ahead (see learn)
]


def _text(rng: random.Random, extra: str = "") -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
    if rng.random() < 0.1:
        words.insert(rng.randrange(len(words)), rng.choice(["NW-EDU-40", "Café", "naïve", "résumé", "foo_bar", "refunded",
                                                            "2024", "40", f"#{rng.randrange(100_000)}"]))  # fmt: skip
    return (" ".join(words) + extra).capitalize() + "."


def _memories(org: str, record: str, count: int, rng: random.Random, rare: int = 0) -> list[tuple[Memory, str]]:
    out = []
    for i in range(count):
        text = _text(rng, f" {RARE} {rng.choice(WORDS)}" if i < rare else "")
        out.append((Memory(id=f"{record}-m{i}", org=org, record=record, text=text, created_at=WHEN), f"h{i}"))
    return out


def _documents(org: str, count: int, rng: random.Random, rare: int = 0) -> list[tuple[Document, str]]:
    out = []
    for d in range(count):
        sections = tuple(
            Section(id=f"{org}-d{d}-s{s}", heading=_text(rng, f" {RARE}" if d < rare and s == 0 else ""), text=_text(rng) + " " + _text(rng))
            for s in range(8)
        )  # fmt: skip
        out.append((Document(id=f"{org}-d{d}", org=org, title=f"Policy {rng.choice(WORDS)}", sections=sections), f"h{d}"))
    return out


def _complete(path: Path, kind: TextKind, query: str, *, org: str, limit: int, parents: list[str] | None = None) -> list[Hit]:
    """FTS5's complete bm25() ranking, as the store ranked every search before pruning (the reference)."""
    from dossier.stores.fulltext import fts5_query

    match = fts5_query(query)
    if match is None:
        return []
    within = f" AND c.{'record' if kind == 'memory' else 'document'} IN ({','.join('?' * len(parents))})" if parents else ""
    db = sqlite3.connect(_alone(path, org))
    try:
        fts = _fts(db, kind, org)
        if kind == "memory":
            table, parent, rank = "memories", "record", f"bm25({fts})"
        else:
            table, parent, rank = "sections", "document", f"bm25({fts}, 0.0, 2.0, 2.0, 1.0)"
        rows = db.execute(
            f"SELECT c.id, c.{parent}, {rank} AS rank FROM {fts} CROSS JOIN {table} c ON c.rowid = {fts}.rowid "
            f"WHERE {fts} MATCH ? AND c.org = ?{within} ORDER BY rank, c.id LIMIT ?",
            [match, org, *(parents or []), limit],
        ).fetchall()
    finally:
        db.close()
    return [Hit(id=r[0], parent=r[1], score=-float(r[2])) for r in rows]


def _two_orgs(path: Path, rng: random.Random, *, documents: list[tuple[int, int]], memories: list[tuple[int, int]]) -> SQLiteStore:
    """A store at ``path`` holding orgs a and b: their documents and their record's memories, as (how many,
    how many of them hold the rare word) for a, then b."""
    store = SQLiteStore(path)
    batch = WriteBatch(orgs=[Org(id="a"), Org(id="b")])
    for org, (count, rare) in zip("ab", documents):
        batch.documents += _documents(org, count, rng, rare=rare)
    for org, (count, rare) in zip("ab", memories):
        batch.memories += _memories(org, f"{org}-r", count, rng, rare=rare)
    store.write(batch)
    return store


def _fts(db: sqlite3.Connection, kind: str, org: str) -> str:
    """The full-text table of ``kind`` holding ``org``'s rows: its own (an org past OWN_TEXT_ROWS) or the shared one."""
    found = db.execute("SELECT number FROM text_tables WHERE org = ?", [org]).fetchone()
    base = "memories_fts" if kind == "memory" else "sections_fts"
    return base if found is None else f"{base}_{found[0]}"


_ALONE: dict[tuple, Path] = {}  # (file, org, its mtime and size) -> the copy made of it


def _alone(path: Path, org: str) -> Path:
    """``path`` itself when ``org`` is the only org in it, else a copy holding ``org``'s full-text rows alone
    (so that FTS5's statistics, and bm25(), are the org's own)."""
    db = sqlite3.connect(path)
    try:
        others = db.execute("SELECT (SELECT count(*) FROM memories WHERE org != ?) + (SELECT count(*) FROM sections WHERE org != ?)",
                            [org, org]).fetchone()[0]  # fmt: skip
        if not others:
            return path
        wal = path.with_name(path.name + "-wal")  # a write may be in the write-ahead log alone
        key = (path, org, *((f.stat().st_mtime_ns, f.stat().st_size) for f in (path, wal) if f.exists()))
        if key in _ALONE:
            return _ALONE[key]
        copy = path.with_name(f"{path.stem}-alone-{org}.db")
        if copy.exists():
            copy.unlink()
        db.execute("VACUUM INTO ?", [str(copy)])
    finally:
        db.close()
    _ALONE[key] = copy
    alone = sqlite3.connect(copy)
    try:
        alone.execute("DELETE FROM memories_fts WHERE rowid IN (SELECT rowid FROM memories WHERE org != ?)", [org])
        alone.execute("DELETE FROM sections_fts WHERE rowid IN (SELECT rowid FROM sections WHERE org != ?)", [org])
        alone.commit()
    finally:
        alone.close()
    return copy


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two orgs in one file: org a with one large record and three small ones, 300 documents; org b small."""
    path = tmp_path_factory.mktemp("text") / "mixed.db"
    rng = random.Random(11)
    store = SQLiteStore(path)
    batch = WriteBatch(orgs=[Org(id="a"), Org(id="b")])
    batch.memories += _memories("a", "a-big", 3000, rng, rare=3)
    for record in ("a-c1", "a-c2", "a-c3"):
        batch.memories += _memories("a", record, 30, rng, rare=1)
    batch.memories += _memories("b", "b-big", 200, rng, rare=5)
    batch.documents += _documents("a", 300, rng, rare=2) + _documents("b", 20, rng, rare=2)
    store.write(batch)
    store.close()
    return path


@pytest.fixture(params=["resident", "read each time"])
def resident(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of scoring in Python: an org's rows tokenised once and kept (orgs of up to
    ``_RESIDENT_SCOPE`` rows of a kind, as every org here), and the candidates' texts read at every search
    (larger orgs)."""
    if request.param != "resident":
        monkeypatch.setattr(sqlite_fulltext, "_RESIDENT_SCOPE", 0)
    return str(request.param)


@pytest.mark.parametrize("query", QUESTIONS)
def test_below_the_line_the_answers_are_bm25s(mixed: Path, query: str, resident: str) -> None:
    store = SQLiteStore(mixed)  # the default line (30,000 rows): every scope here lies below it
    try:
        searches: list[tuple[TextKind, list[str] | None]] = [
            ("memory", None), ("memory", ["a-big"]), ("memory", ["a-c1"]),
            ("memory", ["a-c1", "a-c2", "a-c3"]),  # several parents in a table 30 times their size: ranked in Python
            ("memory", ["a-c1", "a-c2", "a-big"]), ("section", None), ("section", ["a-d1"]),
            ("section", ["a-d0", "a-d1", "a-d7"]),  # likewise
            ("memory", ["b-big"]),  # org b's record: none of org a's
        ]  # fmt: skip
        for kind, parents in searches:
            for limit in (1, 10, 100):
                got = store.search_text(kind, query, org="a", limit=limit, parents=parents)
                assert got == _complete(mixed, kind, query, org="a", limit=limit, parents=parents), (kind, parents, limit)
    finally:
        store.close()


def test_the_complete_ranking_in_python_matches_bm25_to_the_bit(mixed: Path, resident: str) -> None:
    """The BM25 computed over candidates (what pruning scores with) is bm25()'s, for every matching row."""
    store = SQLiteStore(mixed)
    try:
        searches: list[tuple[TextKind, list[str] | None]] = [("memory", ["a-big"]), ("section", None)]
        for query in QUESTIONS:
            for kind, parents in searches:
                got = store._pruned(kind, query, org="a", limit=10_000, slots=_slots(store, kind, "a", parents), prune=False)
                assert got == _complete(mixed, kind, query, org="a", limit=10_000, parents=parents), (kind, query)
    finally:
        store.close()


def test_the_ranking_holds_when_the_known_pieces_start_again(mixed: Path, monkeypatch: pytest.MonkeyPatch, resident: str) -> None:
    """Tokenised pieces are kept up to a bound, then forgotten: with a bound of a few pieces every search
    starts again, and the answers are still bm25()'s (runs of digits are never learnt from the texts).
    So with the rows kept as tokens: a bound of a few tokens has them read again at every search."""
    monkeypatch.setattr(sqlite_fulltext, "_PIECES_KEPT", 3)
    monkeypatch.setattr(sqlite_fulltext, "_RESIDENT_TOKENS", 10)
    store = SQLiteStore(mixed)
    try:
        for query in QUESTIONS:
            for _ in range(2):  # the second time, the texts are remembered as learnt (until the pieces are dropped)
                got = store._pruned("memory", query, org="a", limit=10_000, slots=_slots(store, "memory", "a", ["a-big"]), prune=False)
                assert got == _complete(mixed, "memory", query, org="a", limit=10_000, parents=["a-big"]), query
    finally:
        store.close()


def _slots(store: SQLiteStore, kind: str, org: str, parents: list[str] | None) -> list[int] | None:
    return None if parents is None else store._slots(kind, org, parents)


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Org a: one record of 6,000 memories (8 holding a rare word) and 600 documents; org b holds the rare
    word too, in more rows than org a."""
    path = tmp_path_factory.mktemp("text") / "large.db"
    rng = random.Random(5)
    store = SQLiteStore(path)
    batch = WriteBatch(orgs=[Org(id="a"), Org(id="b")])
    batch.memories += _memories("a", "a-big", 6000, rng, rare=8)
    batch.memories += _memories("b", "b-big", 1500, rng, rare=300)
    batch.documents += _documents("a", 600, rng, rare=4) + _documents("b", 200, rng, rare=100)
    store.write(batch)
    store.close()
    return path


@pytest.mark.parametrize("kind, parents", [("memory", ["a-big"]), ("memory", None), ("section", None)])
def test_pruned_search_puts_the_rare_terms_rows_first(large: Path, kind: TextKind, parents: list[str] | None) -> None:
    store = SQLiteStore(large, text_prune_rows=1000)  # org a's scopes hold 4,800 to 6,000 rows: pruned
    try:
        query = f"Which {RARE} renewal discount?"
        got = store.search_text(kind, query, org="a", limit=10, parents=parents)
        complete = _complete(large, kind, query, org="a", limit=10_000, parents=parents)
        rare = 8 if kind == "memory" else 4
        assert {h.id for h in got[:rare]} == {h.id for h in complete[:rare]}  # the rows holding the rare word
        assert got[:rare] == complete[:rare]  # in the same order, with bm25()'s scores
        scores = {h.id: h.score for h in complete}
        assert all(h.score == scores[h.id] for h in got)  # every pruned hit scored exactly as bm25() scores it
        assert len({h.id for h in got} & {h.id for h in complete[:10]}) >= 7
        # a question with no rare word: still the complete ranking's best score first
        common = store.search_text(kind, "renewal discount pricing", org="a", limit=10, parents=parents)
        best = _complete(large, kind, "renewal discount pricing", org="a", limit=1, parents=parents)
        assert common and common[0].score == best[0].score
    finally:
        store.close()


@pytest.mark.parametrize("line", [1000, 30_000])
def test_another_orgs_rows_never_come_back(large: Path, line: int) -> None:
    store = SQLiteStore(large, text_prune_rows=line)  # pruned (1,000) or complete (30,000)
    try:
        for org in ("a", "b"):
            searches: list[tuple[TextKind, list[str] | None]] = [("memory", None), ("memory", [f"{org}-big"]), ("section", None)]
            for kind, parents in searches:
                hits = store.search_text(kind, f"{RARE} renewal", org=org, limit=200, parents=parents)
                assert hits, (kind, org)
                assert all(h.id.startswith(f"{org}-") for h in hits), (kind, org)
                owned = _complete(large, kind, f"{RARE} renewal", org=org, limit=100_000, parents=parents)
                assert {h.id for h in hits} <= {h.id for h in owned}, (kind, org)
            # org a asking for org b's record gets nothing
            assert store.search_text("memory", f"{RARE} renewal", org=org, limit=10, parents=["b-big" if org == "a" else "a-big"]) == []
    finally:
        store.close()


def test_a_large_org_is_ranked_as_in_a_file_of_its_own(large: Path, tmp_path: Path) -> None:
    """Org a of the large file (6,000 memories, past OWN_TEXT_ROWS) has full-text tables of its own, and is
    ranked by FTS5's bm25() over them, below the line and pruned above it: the very hits and scores it gets
    in a file holding it alone, while org b (1,500 memories) stays in the shared tables."""
    db = sqlite3.connect(large)
    try:
        assert _fts(db, "memory", "a") != "memories_fts" and _fts(db, "memory", "b") == "memories_fts"
    finally:
        db.close()
    alone = tmp_path / "alone.db"
    store = SQLiteStore(alone)
    rng = random.Random(5)  # the large file's org a: the same texts in the same order, so the same rowids
    memories = _memories("a", "a-big", 6000, rng, rare=8)
    _memories("b", "b-big", 1500, rng, rare=300)  # org b's, left out of this file
    store.write(WriteBatch(orgs=[Org(id="a")], memories=memories, documents=_documents("a", 600, rng, rare=4)))
    store.close()
    for line in (1000, 30_000):
        shared, own = SQLiteStore(large, text_prune_rows=line), SQLiteStore(alone, text_prune_rows=line)
        try:
            for query in [f"Which {RARE} renewal discount?", *QUESTIONS]:
                for kind, parents in (("memory", ["a-big"]), ("memory", None), ("section", None), ("section", ["a-d0", "a-d3"])):
                    got = shared.search_text(kind, query, org="a", limit=20, parents=parents)  # type: ignore[arg-type]
                    assert got == own.search_text(kind, query, org="a", limit=20, parents=parents), (line, kind, query)  # type: ignore[arg-type]
        finally:
            shared.close()
            own.close()


@pytest.mark.parametrize("line", [30_000, 1000])
def test_a_large_orgs_search_reads_its_own_tables_alone(large: Path, line: int) -> None:
    """A match reads a word's postings in the table it names: a large org's searches (org-wide and among
    parents, complete and pruned at line 1,000) name its own tables alone, never the shared ones another
    org's rows are in, so their cost does not follow what that org holds."""
    store = SQLiteStore(large, text_prune_rows=line)
    own = {_fts(store._db, kind, "a") for kind in ("memory", "section")}
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    try:
        for query in QUESTIONS:
            for kind, parents in (("memory", None), ("memory", ["a-big"]), ("section", None), ("section", ["a-d0", "a-d3"])):
                statements.clear()
                hits = store.search_text(kind, query, org="a", limit=10, parents=parents)  # type: ignore[arg-type]
                named = {re.sub(r"_(data|idx|docsize|content|config)$", "", m.group(0))
                         for s in statements for m in re.finditer(r"\b(?:memories|sections)_fts\w*", s)}  # fmt: skip
                assert named <= own, (kind, query, named)
                assert all(h.id.startswith("a-") for h in hits)
    finally:
        store._db.set_trace_callback(None)
        store.close()


def test_an_org_passing_the_line_gets_tables_of_its_own_with_the_same_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write that takes an org past OWN_TEXT_ROWS memories (or sections) gives it full-text tables of its
    own and moves its rows there, in the same transaction; its answers stay bm25()'s over its own rows, and
    the other org's are unchanged."""
    monkeypatch.setattr(sqlite_schema, "OWN_TEXT_ROWS", 300)
    rng = random.Random(23)
    path = tmp_path / "grows.db"
    store = SQLiteStore(path)
    try:
        store.write(WriteBatch(orgs=[Org(id="a"), Org(id="b")], memories=_memories("a", "a-r", 200, rng, rare=3) + _memories("b", "b-r", 100, rng, rare=20),
                               documents=_documents("a", 10, rng, rare=2) + _documents("b", 10, rng, rare=5)))  # fmt: skip
        searches = [(org, kind, parents, query) for org in ("a", "b") for kind, parents in
                    (("section", None), ("memory", None), ("memory", [f"{org}-r"])) for query in QUESTIONS]  # fmt: skip

        def answers() -> list[list[Hit]]:
            out = []
            for org, kind, parents, query in searches:
                got = store.search_text(kind, query, org=org, limit=10, parents=parents)  # type: ignore[arg-type]
                assert got == _complete(path, kind, query, org=org, limit=10, parents=parents), (org, kind, query)  # type: ignore[arg-type]
                out.append(got)
            return out

        before = answers()
        assert store._query("SELECT org FROM text_tables") == []
        store.write(WriteBatch(memories=_memories("a", "a-s", 150, rng)))  # 350 memories: past the line
        assert [org for (org,) in store._query("SELECT org FROM text_tables")] == ["a"]
        own = _fts(store._db, "memory", "a")
        assert store._query(f"SELECT count(*) FROM {own}")[0][0] == 350
        assert store._query("SELECT count(*) FROM memories_fts")[0][0] == 100  # org b's alone
        assert store._query(f"SELECT count(*) FROM {_fts(store._db, 'section', 'a')}")[0][0] == 80  # its sections moved too
        after = answers()
        assert after[len(after) // 2:] == before[len(before) // 2:]  # org b's answers unchanged
        store.write(WriteBatch(memories=_memories("a", "a-r", 200, rng, rare=200)))  # written again, in its own table
        answers()
    finally:
        store.close()


def test_a_write_refreshes_the_statistics(tmp_path: Path) -> None:
    """Document frequencies are kept while the index is unchanged; a write (this process's or another's) shows."""
    path = tmp_path / "fresh.db"
    rng = random.Random(3)
    store = SQLiteStore(path, text_prune_rows=500)
    other = SQLiteStore(path, text_prune_rows=500)
    try:
        store.write(WriteBatch(orgs=[Org(id="a")], memories=_memories("a", "a-big", 800, rng, rare=2)))
        query = f"{RARE} renewal"
        assert store.search_text("memory", query, org="a", limit=2) == _complete(path, "memory", query, org="a", limit=2)
        other.write(WriteBatch(memories=_memories("a", "a-new", 50, rng, rare=50)))  # another connection writes
        assert store.search_text("memory", query, org="a", limit=52) == _complete(path, "memory", query, org="a", limit=52)
        store.write(WriteBatch(memories=_memories("a", "a-more", 30, rng, rare=30)))  # and this one
        assert store.search_text("memory", query, org="a", limit=82) == _complete(path, "memory", query, org="a", limit=82)
    finally:
        store.close()
        other.close()


def test_a_small_orgs_rows_are_read_once_and_a_changed_text_is_read_again(tmp_path: Path) -> None:
    """A small org's rows are read and tokenised once (later searches read no text); its own write has the
    changed row read again, which then scores as what it now says; another org's write reads nothing."""
    path = tmp_path / "resident.db"
    rng = random.Random(7)
    store = SQLiteStore(path)
    try:
        store.write(WriteBatch(orgs=[Org(id="a"), Org(id="b")], memories=_memories("a", "a-1", 60, rng, rare=3) + _memories("b", "b-1", 40, rng)))
        query = f"{RARE} renewal discount"
        first = store.search_text("memory", query, org="a", limit=20)
        assert first == _complete(path, "memory", query, org="a", limit=20)
        whole = store._text._whole[("memories_fts", "a")]
        read = dict(whole.rows)
        assert len(read) == 60 and all(row is not None and row.org == "a" for row in read.values())  # org b's: never
        assert store.search_text("memory", query, org="a", limit=20) == first
        assert all(whole.rows[r] is row for r, row in read.items())  # nothing read again
        changed = Memory(id="a-1-m0", org="a", record="a-1", text=f"{RARE} {RARE} {RARE} now.", created_at=WHEN)
        store.write(WriteBatch(memories=[(changed, "changed")]))
        after = store.search_text("memory", query, org="a", limit=20)
        assert after == _complete(path, "memory", query, org="a", limit=20)
        assert after[0].id == "a-1-m0" and after[0].score > first[0].score  # its new text, three times the rare word
        again = {row.id: row for row in whole.rows.values() if row is not None}
        assert again["a-1-m0"] not in read.values()  # the changed row was read again, the others were not
        assert all(again[row.id] is row for row in read.values() if row is not None and row.id != "a-1-m0")
        store.write(WriteBatch(memories=_memories("b", "b-2", 5, rng, rare=5)))  # another org's write: nothing read
        kept = dict(whole.rows)
        assert store.search_text("memory", query, org="a", limit=20) == _complete(path, "memory", query, org="a", limit=20)
        assert all(whole.rows[r] is row for r, row in kept.items())
    finally:
        store.close()


def test_the_shortest_rows_are_ordered_by_their_token_count_across_varint_sizes(tmp_path: Path) -> None:
    """FTS5 records a row's size as a varint (one byte below 128 tokens, more above); the memories' search
    orders candidates by it in SQL, which must agree with the tokens counted."""
    tokens = [300, 7, 128, 16_384, 127, 129, 3, 16_383, 20_000, 128, 7]
    store = SQLiteStore(tmp_path / "sizes.db")
    try:
        memories = [(Memory(id=f"m{i}", org="a", record="r", text=" ".join(["ox"] * n), created_at=WHEN), f"h{i}")
                    for i, n in enumerate(tokens)]  # fmt: skip
        store.write(WriteBatch(orgs=[Org(id="a")], memories=memories))
        rowid = dict(store._query("SELECT id, rowid FROM memories", []))
        rowids = [rowid[f"m{i}"] for i in range(len(tokens))]
        by_tokens = sorted(rowids, key=lambda r: (tokens[rowids.index(r)], r))
        shortest = store._text._shortest  # noqa: SLF001 - the one ordering under test
        assert shortest(TABLES["memory"], rowids, len(rowids)) == by_tokens
        assert shortest(TABLES["memory"], rowids[::-1], 4) == by_tokens[:4]
        assert shortest(TABLES["memory"], [*rowids, 10**9], 2) == [10**9, by_tokens[0]]  # no size recorded: 0 tokens
    finally:
        store.close()


def test_a_small_org_sharing_the_file_searches_its_own_rows_alone(tmp_path: Path) -> None:
    """FTS5's index holds every org's rows: a match reads a word's postings across orgs before keeping the
    org's own, so its cost would grow with what other orgs hold (a timing channel). A small org's searches,
    org-wide and among parents, and its words' counts read the org's own rows instead: no statement
    matches the shared index, and the answers are the ones FTS5's bm25() gives over the org alone."""
    rng = random.Random(5)
    path = tmp_path / "shared.db"
    store = SQLiteStore(path)
    batch = WriteBatch(orgs=[Org(id="a"), Org(id="b")])
    batch.documents += _documents("a", 12, rng, rare=2) + _documents("b", 400, rng, rare=400)  # b: the rare word everywhere
    batch.memories += _memories("a", "a-r", 40, rng, rare=2) + _memories("b", "b-r", 2000, rng, rare=2000)
    store.write(batch)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    try:
        for query in QUESTIONS:
            for kind, parents in (("section", None), ("section", ["a-d0", "a-d3"]), ("memory", None), ("memory", ["a-r"])):
                statements.clear()
                hits = store.search_text(kind, query, org="a", limit=10, parents=parents)  # type: ignore[arg-type]
                shared = [s for s in statements if "MATCH" in s and ("sections_fts" in s or "memories_fts" in s)]
                assert not shared, (kind, query, parents)
                assert all(h.id.startswith("a-") for h in hits)
                expected = _complete(path, kind, query, org="a", limit=10, parents=parents)  # type: ignore[arg-type]
                assert [(h.id, round(h.score, 9)) for h in hits] == [(h.id, round(h.score, 9)) for h in expected], (kind, query)
        assert store.search_text("section", RARE, org="a", limit=10)  # the word both orgs hold is found in a's rows
    finally:
        store._db.set_trace_callback(None)
        store.close()


def test_small_orgs_read_whole_give_their_rows_back_past_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the bound on tokens kept, the orgs searched least recently give their sections back; an org
    searched again is read whole again, with the same answers."""
    rng = random.Random(9)
    path = tmp_path / "two-small.db"
    store = SQLiteStore(path)
    batch = WriteBatch(orgs=[Org(id="a"), Org(id="b")])
    batch.documents += _documents("a", 10, rng, rare=1) + _documents("b", 10, rng, rare=1)
    store.write(batch)
    monkeypatch.setattr(sqlite_fulltext, "_RESIDENT_TOKENS", 300)  # less than either org's rows hold
    try:
        for org in ("a", "b", "a", "b"):
            for query in QUESTIONS[:3]:
                hits = store.search_text("section", query, org=org, limit=10)
                expected = _complete(path, "section", query, org=org, limit=10)
                assert [(h.id, round(h.score, 9)) for h in hits] == [(h.id, round(h.score, 9)) for h in expected], (org, query)
            kept = store._text._whole
            assert list(kept) == [("sections_fts", org)]  # the other org gave its rows back
            assert {row.org for row in kept[("sections_fts", org)].rows.values() if row is not None} == {org}
    finally:
        store.close()


def test_a_small_orgs_rows_read_whole_follow_its_own_writes_alone(tmp_path: Path) -> None:
    """The rows read whole are kept while the org's generation stays: another org's writes leave them; the
    org's own writes have only the rows whose content changed read again (a memory written, a document
    replaced), and the answers stay bm25()'s over the org alone."""
    path = tmp_path / "writes.db"
    store = _two_orgs(path, random.Random(13), documents=[(6, 1), (6, 1)], memories=[(20, 2), (20, 2)])
    rng = random.Random(14)

    def answers() -> list[list[tuple[str, float]]]:
        out = []
        for kind, parents in (("section", None), ("memory", None), ("memory", ["a-r"])):
            for query in [*QUESTIONS, "kinkajou rules"]:
                got = store.search_text(kind, query, org="a", limit=10, parents=parents)  # type: ignore[arg-type]
                expected = _complete(path, kind, query, org="a", limit=10, parents=parents)  # type: ignore[arg-type]
                assert [(h.id, round(h.score, 9)) for h in got] == [(h.id, round(h.score, 9)) for h in expected], (kind, query)
                out.append([(h.id, round(h.score, 9)) for h in got])
        return out

    try:
        answers()
        sections, memories = (dict(store._text._whole[(f"{k}_fts", "a")].rows) for k in ("sections", "memories"))
        store.write(WriteBatch(documents=_documents("b", 8, rng, rare=8), memories=_memories("b", "b-r", 30, rng)))
        answers()
        assert store._text._whole[("sections_fts", "a")].rows == sections  # another org's writes: nothing read again
        assert all(store._text._whole[("memories_fts", "a")].rows[r] is row for r, row in memories.items())
        changed = Document(id="a-d0", org="a", title="Policy", sections=(Section(id="a-d0-s0", heading="Kinkajou", text="Kinkajou rules."),))
        added = Memory(id="a-r-new", org="a", record="a-r", text="The kinkajou rules changed.", created_at=WHEN)
        store.write(WriteBatch(documents=[(changed, "changed")], memories=[(added, "added")]))
        after = answers()
        assert any(hits and hits[0][0] == "a-d0-s0" for hits in after) and any(hits and hits[0][0] == "a-r-new" for hits in after)
        kept = store._text._whole[("sections_fts", "a")].rows
        unchanged = [r for r, row in sections.items() if row is not None and not row.id.startswith("a-d0-")]
        assert unchanged and all(kept[r] is sections[r] for r in unchanged)  # only the replaced document read again
        assert not any(row is not None and row.id.startswith("a-d0-s1") for row in kept.values())  # its old sections gone
    finally:
        store.close()


def test_an_org_without_its_row_has_its_changed_rows_read_again(tmp_path: Path) -> None:
    """Rows can be written for an org the file has no ``orgs`` row for (no generation to trust): its rows
    read whole are compared with their content hashes at every search, so a changed text is never stale."""
    rng = random.Random(17)
    path = tmp_path / "no-org-row.db"
    store = SQLiteStore(path)
    try:
        store.write(WriteBatch(orgs=[Org(id="b")], memories=_memories("a", "a-r", 10, rng, rare=1) + _memories("b", "b-r", 10, rng)))
        assert [h.id for h in store.search_text("memory", RARE, org="a", limit=5)] == ["a-r-m0"]
        changed = Memory(id="a-r-m0", org="a", record="a-r", text="Nothing rare here any more.", created_at=WHEN)
        store.write(WriteBatch(memories=[(changed, "changed")]))
        assert store.search_text("memory", RARE, org="a", limit=5) == _complete(path, "memory", RARE, org="a", limit=5) == []
        assert [h.id for h in store.search_text("memory", "rare here", org="a", limit=5)] == ["a-r-m0"]
    finally:
        store.close()


def _memory_answers_are_bm25s(store: SQLiteStore, path: Path, orgs: tuple[str, ...]) -> None:
    for org in orgs:
        for query in QUESTIONS:
            assert store.search_text("memory", query, org=org, limit=10) == _complete(path, "memory", query, org=org, limit=10), (org, query)


def test_a_write_of_many_batches_writes_the_batches_after_the_line_into_the_orgs_own_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An org is given its tables by the batch that takes it past the line, so the rest of a large load is
    written to them directly, not to the shared tables and then moved."""
    monkeypatch.setattr(sqlite_schema, "OWN_TEXT_ROWS", 300)
    rng = random.Random(31)
    path = tmp_path / "load.db"
    store = SQLiteStore(path)
    try:
        store.write(WriteBatch(orgs=[Org(id="a"), Org(id="b")], memories=_memories("b", "b-r", 50, rng, rare=5)))
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        store.write_many([WriteBatch(memories=_memories("a", f"a-{n}", count, rng, rare=2)) for n, count in enumerate((200, 150, 100))])
        store._db.set_trace_callback(None)
        made = next(i for i, sql in enumerate(statements) if sql.startswith("CREATE VIRTUAL TABLE memories_fts_1"))
        assert sum(sql.startswith("INSERT INTO memories_fts (") for sql in statements[:made]) == 350  # the first two batches
        assert not any(sql.startswith("INSERT INTO memories_fts (") for sql in statements[made:])
        assert sum(sql.startswith("INSERT INTO memories_fts_1 (rowid, org, text) VALUES") for sql in statements[made:]) == 100  # the third
        assert store._query("SELECT count(*) FROM memories_fts_1")[0][0] == 450
        assert store._query("SELECT DISTINCT org FROM memories_fts") == [("b",)]
        _memory_answers_are_bm25s(store, path, ("a", "b"))
    finally:
        store.close()


def test_an_org_alone_in_the_file_passing_the_line_takes_the_shared_tables_as_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no other org has memories or sections in the file, the org passing the line takes the shared
    tables, renamed (nothing copied), and new shared ones are made for the orgs that come later."""
    monkeypatch.setattr(sqlite_schema, "OWN_TEXT_ROWS", 100)
    rng = random.Random(29)
    path = tmp_path / "alone.db"
    store = SQLiteStore(path)
    try:
        store.write(WriteBatch(orgs=[Org(id="a")], memories=_memories("a", "a-r", 80, rng, rare=2), documents=_documents("a", 3, rng, rare=1)))
        root = store._query("SELECT rootpage FROM sqlite_master WHERE name = 'memories_fts_data'")
        store.write(WriteBatch(memories=_memories("a", "a-s", 40, rng)))  # 120 memories: past the line
        assert dict(store._query("SELECT org, number FROM text_tables")) == {"a": 1}
        assert store._query("SELECT rootpage FROM sqlite_master WHERE name = 'memories_fts_1_data'") == root  # renamed
        assert store._query("SELECT count(*) FROM memories_fts_1")[0][0] == 120
        assert store._query("SELECT count(*) FROM sections_fts_1")[0][0] == 24
        assert store._query("SELECT count(*) FROM memories_fts")[0][0] == 0  # the new shared tables, empty
        for query in QUESTIONS:
            got = store.search_text("memory", query, org="a", limit=10, parents=["a-r"])
            assert got == _complete(path, "memory", query, org="a", limit=10, parents=["a-r"]), query
        store.write(WriteBatch(orgs=[Org(id="b")], memories=_memories("b", "b-r", 30, rng, rare=3)))  # a new org: the shared tables
        assert store._query("SELECT DISTINCT org FROM memories_fts") == [("b",)]
        _memory_answers_are_bm25s(store, path, ("a", "b"))
    finally:
        store.close()


def test_a_file_of_schema_version_4_gives_its_large_orgs_tables_of_their_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Schema version 4 kept every org's full text in the shared tables; opening such a file gives each org
    past OWN_TEXT_ROWS tables of its own (its rows moved) and the same hits and scores for every org."""
    monkeypatch.setattr(sqlite_schema, "OWN_TEXT_ROWS", 250)
    path = tmp_path / "v4.db"
    store = _two_orgs(path, random.Random(21), documents=[(20, 2), (10, 5)], memories=[(300, 3), (100, 20)])
    searches = [(org, kind, parents, query) for org in ("a", "b") for kind, parents in
                (("section", None), ("memory", None), ("memory", [f"{org}-r"])) for query in QUESTIONS]  # fmt: skip
    before = [store.search_text(kind, query, org=org, limit=10, parents=parents) for org, kind, parents, query in searches]  # type: ignore[arg-type]
    store.close()
    db = sqlite3.connect(path)  # the file as version 4 left it: every org's rows in the shared tables
    db.executescript("""
        INSERT INTO memories_fts (rowid, org, text) SELECT rowid, org, text FROM memories_fts_1;
        INSERT INTO sections_fts (rowid, org, title, heading, text) SELECT rowid, org, title, heading, text FROM sections_fts_1;
        DROP TABLE memories_fts_1; DROP TABLE sections_fts_1; DROP TABLE text_tables;
        UPDATE meta SET value = '4' WHERE key = 'schema_version';
    """)
    db.close()
    store = SQLiteStore(path)
    try:
        assert dict(store._query("SELECT org, number FROM text_tables")) == {"a": 1}
        assert store._query("SELECT count(*) FROM memories_fts_1")[0][0] == 300
        assert store._query("SELECT DISTINCT org FROM memories_fts") == [("b",)]
        after = [store.search_text(kind, query, org=org, limit=10, parents=parents) for org, kind, parents, query in searches]  # type: ignore[arg-type]
        assert after == before and any(after)
    finally:
        store.close()


@pytest.mark.parametrize("count", [500, 680])
def test_an_orgs_restricted_sections_never_move_a_viewers_scores(tmp_path: Path, count: int) -> None:
    """An org alone in its file with documents only the legal role may see, full of the rare word: for a sales
    viewer the sections it may see score as in a file holding only them, org-wide and among parents. At 500
    documents (4,000 sections) the ranking is complete: the very hits of that file, once the hidden ones are
    set aside; at 680 (5,440 sections, past OWN_TEXT_ROWS: tables of its own) a viewer's search is pruned
    (FTS5's own ranking counts every row), and each hit still scores what it scores there."""
    from dossier.stores.base import Viewer

    rng = random.Random(23)
    documents = _documents("a", count, rng, rare=40)
    hidden = {d.id for d, _ in documents[:60]}  # the rare word's documents among them
    flooded = [(d.model_copy(update={"visible_to_roles": ("legal",)}) if d.id in hidden else d, h) for d, h in documents]
    full, copy = SQLiteStore(tmp_path / "full.db"), SQLiteStore(tmp_path / "copy.db")
    try:
        full.write(WriteBatch(orgs=[Org(id="a")], documents=flooded))
        copy.write(WriteBatch(orgs=[Org(id="a")], documents=[(d, h) for d, h in documents if d.id not in hidden]))
        complete = 8 * count <= sqlite_schema.OWN_TEXT_ROWS
        assert (_fts(full._db, "section", "a") == "sections_fts") == complete
        viewer = Viewer(roles=frozenset({"sales"}), record_ids=frozenset())
        moved = 0
        for query in [f"Which {RARE} renewal discount?", *QUESTIONS]:
            for parents in (None, ["a-d70", "a-d71", "a-d300"]):
                got = full.search_text("section", query, org="a", limit=40, parents=parents, viewer=viewer)
                assert not [h for h in got if h.parent in hidden], (query, parents)  # none takes a place
                want = copy.search_text("section", query, org="a", limit=40, parents=parents)
                scores = {h.id: h.score for h in want}
                assert all(h.score == scores[h.id] for h in got if h.id in scores), (query, parents)
                if complete or parents:
                    assert got == want, (query, parents)
                if want:  # pruned: the candidates are read among the visible rows, so the copy's best come back
                    best = {h.id for h in want[:10]}
                    assert len(got) == len(want), (query, parents)
                    assert len(best & {h.id for h in got}) >= len(best) // 2, (query, parents)
                blind = {h.id: h.score for h in full.search_text("section", query, org="a", limit=40, parents=parents)}
                moved += any(blind[i] != score for i, score in scores.items() if i in blind)
        assert moved  # the premise: without the viewer, the org's statistics (the rare word's rows too) move scores
    finally:
        full.close()
        copy.close()


def test_large_sets_of_slots_are_temporary_tables_written_once_and_the_last_few_kept(tmp_path: Path) -> None:
    """A viewer's searches test rows against the org's restricted slots (thousands of them) in every statement:
    a set past _SMALL_SET is written once to a temporary table and probed by its key; each set's table holds
    exactly its slots, the same set finds the same table, and only the last _SETS_KEPT stay."""
    store = SQLiteStore(tmp_path / "s.db")
    try:
        text = store._text
        sets = [frozenset(range(n, n + 3 * sqlite_fulltext._SMALL_SET + n)) for n in range(sqlite_fulltext._SETS_KEPT + 2)]
        for slots in sets:
            among, params = text._among(slots)
            assert not params and among.startswith("SELECT slot FROM temp.")
            assert [r[0] for r in store._query(f"SELECT slot FROM ({among}) ORDER BY slot", params)] == sorted(slots)
        assert text._among(sets[-1]) == (among, [])  # the same set: the same table, not written again
        tables = {r[0] for r in store._query("SELECT name FROM sqlite_temp_master WHERE name LIKE 'dossier_slots_%'", [])}
        assert len(tables) == sqlite_fulltext._SETS_KEPT
        small = frozenset({3, 5, 8})
        among, params = text._among(small)
        assert sorted(r[0] for r in store._query(f"SELECT * FROM ({among})", params)) == [3, 5, 8]
    finally:
        store.close()
