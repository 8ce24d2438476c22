"""Full-text search over a large scope of the SQLite store: candidates chosen by the rarest terms, each
scored with BM25 exactly as FTS5's ``bm25()`` scores it.

FTS5's ``bm25()`` costs what the matches cost: it scores every row of the scope that holds any query term
(a row's length is a lookup per row) and, for each term's statistics, reads the term's whole doclist in
the table. Among 100,000 memories of one record a typical question matches some 27,000 of them. Here:

* the statistics (rows, their average length in tokens, each term's document frequency) are the org's
  own: where the org is alone in the table (its own tables, which an org of more than
  ``sqlite_schema.OWN_TEXT_ROWS`` rows of a kind has, or a file holding one org), FTS5's, read from its
  index; otherwise counted over the org's rows (their number, the average length of the first
  ``_LENGTH_SAMPLE`` of them, and for each term the matches whose slot is one of the org's), so that no
  other org's rows move a score. Either
  is kept per process for as long as the index is unchanged (its structure and averages records are
  compared before each search: one indexed read; any write to the table changes both);
* the candidates (``cap``, 500, or four times the hits asked for) are rows of the scope holding the
  rarest terms: every row holding the terms that together match at most ``cap`` rows of the table; then
  rows holding all the other terms together, then all but the commonest of them, and so on (terms
  weighing under a quarter of the rarest of them only add to the scores); for sections, rows holding
  them in the title or heading (weight 2) and in the text first, then in the title or heading. Where a
  step offers more rows than are still wanted, four times as many are read and the shortest kept (at
  equal terms a shorter row scores higher). Only the candidates' text is read and scored;
* a candidate's score is BM25 as ``fts5_aux.c`` computes it: k1 = 1.2, b = 0.75, a term's IDF
  ``ln((N - df + 0.5) / (df + 0.5))`` (at least 1e-6), its frequency in the row weighted by column (the
  store's weights), the row's length in tokens from FTS5's own record of it, the same arithmetic in the
  same order, so a row gets the very score the complete ranking gives it. A term's frequency is counted
  in the row's text, tokenised as FTS5 does (``porter unicode61``): the text is split where unicode61
  surely splits (ASCII punctuation, whitespace) and each piece is turned into tokens by FTS5 itself (a
  scratch table in the connection's temporary database), once per distinct piece per process (a run of
  ASCII digits is its own token and is not looked up); a text whose pieces were all learnt is
  remembered by a digest and not scanned for new pieces again. In ASCII text (most) the phrases are
  counted in all candidates' texts at once: each form of a term looked for as a plain string, a phrase
  of several tokens by a pattern of its pieces. The rows' scores are computed for all
  candidates at once (numpy, the same operations in the same order, so the same bits);
* an org holding few rows of the kind (``_RESIDENT_SCOPE``: the sample org, an evaluation set, most orgs
  of a file several share) has all its rows of the kind read and tokenised once, kept as their tokens'
  weighted counts and indexed by token while the org's generation stays (after its own writes, only the
  rows whose content hash changed are read again): its matches, word counts and scores come from them,
  never from a match of the index every org shares (whose cost would tell what other orgs hold);
* a search for a viewer (:class:`Seen`: the slots of the org's restricted documents, and of those among them
  the caller may see) scores with the statistics of the rows it may see: the org's, less the restricted
  documents' rows, plus the rows of those it may see (exact counts: the parts' rows and tokens from FTS5's
  sizes, each term's rows by a match tested against the slots, or among a small org's rows read whole;
  the restricted documents' part kept while the index is unchanged), so that a row it may not see never
  moves a score.

What pruning gives up: a row holding none of the terms that chose the candidates, or one not read
among them, is not ranked even if it would have scored into the top. Codes such as ``NW-EDU-40`` are
phrases (consecutive tokens), as in FTS5. With ``prune`` false the same scoring ranks every matching row
of the scope: FTS5's complete ranking, without its reads of the whole table (the store uses it for a few
parents' rows in a large table).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from bisect import bisect_right
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from .sqlite_schema import OWN_TEXT_ROWS, SLOT_BITS

_K1, _B = 1.2, 0.75  # FTS5's bm25() constants
#: ASCII punctuation and symbols, and whitespace: where unicode61 always ends a token. What lies between
#: (a "piece") is tokenised by FTS5 itself; most pieces are one ASCII word, one token.
_SEPARATORS = re.compile(r"[\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f\s]+")
_ASCII_PIECE = re.compile(r"[a-z0-9]+")  # a piece of lower-cased ASCII text
_PIECES_KEPT = 500_000  # tokenised pieces kept per process (the cache starts again past this)
_TEXTS_KEPT = 200_000  # digests of texts whose every piece is known, kept per process (likewise)
_SLOTS_PER_READ = 200  # parents' rowid ranges read by one statement (SQLite allows 500 terms in a compound)
_ARRAY = "json_group_array(%s)"
_SCOPES_KEPT = 10_000  # scope sizes kept per table while its index is unchanged
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")  # what a piece of lower-cased ASCII text is made of
_LOOK_AHEAD = 4  # rows read per candidate still wanted from a step of candidates, the shortest kept
_ORGS_KEPT = 256  # orgs whose own statistics are kept per table (in a table several orgs share)
_LENGTH_SAMPLE = 50_000  # an org's rows read for their average length (beyond it, the first ones estimate it)
#: an org with at most this many rows of a kind has its rows' tokens kept (_Resident); in a shared table,
#: read whole (_whole_org), which is what keeps every org there off the shared index
_RESIDENT_SCOPE = OWN_TEXT_ROWS
_RESIDENT_TOKENS = 1_000_000  # tokens kept per table that way (the rows start again past this)
_SMALL_SET = 200  # sets of slots up to this size go into a statement as a JSON list (past it: _among's tables)
_SETS_KEPT = 4  # large sets of slots kept as temporary tables per connection
_PARTS_KEPT = 256  # sets of slots whose statistics are kept per table while its index is unchanged (_part)

Query = Callable[[str, Sequence[Any]], list[tuple]]  # (sql, params) -> rows


@dataclass(frozen=True)
class _Table:
    kind: str  # the store's name for it: "memory" or "section"
    fts: str
    content: str  # the content table (ids, parents, org), read as ``c``
    parent: str
    texts: str  # the indexed columns' text, in order (the full-text row, FTS5's content table, is ``x``)
    weights: tuple[float, ...]  # bm25 column weights of those columns, as the store passes them
    heavy: str = ""  # an FTS5 column filter naming the columns weighted above 1 (a term there counts twice)
    light: str = ""  # and one naming the others
    own: bool = False  # one org's own table (``fts`` and the org's number; sqlite_schema.OWN_TEXT_ROWS)


TABLES = {
    # a memory's text is written to both tables at once; a section's title comes from its document
    "memory": _Table("memory", "memories_fts", "memories", "record", "c.text", (1.0,)),
    "section": _Table("section", "sections_fts", "sections", "document", "x.c1, x.c2, x.c3", (2.0, 2.0, 1.0), "{title heading}", "{text}"),
}


@dataclass
class _Statistics:
    key: tuple  # the FTS5 averages and structure records they were read with
    rows: int
    average_length: float
    df: dict[str, int] = field(default_factory=dict)  # term -> rows of the table holding its phrase
    sole: dict[str, bool] = field(default_factory=dict)  # org -> whether it is the only org in the table
    scopes: dict[tuple, int] = field(default_factory=dict)  # (org, most, slots) -> rows counted (scope_rows)
    whole: "_WholeOrg | None" = None  # a small org's rows read whole, as of its last search (_whole_org)
    tokens: int = 0  # the rows' lengths in tokens, summed
    parts: dict[frozenset[int], "_Part"] = field(default_factory=dict)  # slots -> their rows' statistics (_part)


@dataclass
class _Part:
    """The statistics of the rows of some parents' slots (a :class:`Seen`'s): how many, their tokens, and how
    many hold each term."""

    rows: int
    tokens: int
    df: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Seen:
    """Whose rows a search's statistics count: the org's, less those of its ``restricted`` parents' slots
    (documents some callers may not see), plus those of the ``shown`` ones (the restricted documents this
    caller may see, among them)."""

    restricted: frozenset[int]
    shown: frozenset[int]


@dataclass(frozen=True)
class _Row:
    """One full-text row as BM25 reads it: its id, parent and org, its length in tokens (FTS5's record of
    it), each token's frequency weighted by column, and each column's tokens in order (for phrases)."""

    id: str
    parent: str
    org: str
    length: int
    frequency: dict[str, float]
    columns: tuple[tuple[float, tuple[str, ...]], ...]


@dataclass
class _Resident:
    """The rows of one table already read and tokenised, kept while its index is unchanged (any write to the
    table changes the key, and they are read again as searches need them)."""

    key: tuple
    rows: dict[int, _Row | None] = field(default_factory=dict)  # rowid -> its row (None: not in the table)
    tokens: int = 0


@dataclass
class _WholeOrg:
    """Every row of a small org in a table it shares with other orgs, read and tokenised, kept while the
    org's generation stays (any write to the org moves it; another org's writes do not); when it moves, the
    rows whose version changed are read again, the others kept (PrunedText._whole_org)."""

    generation: int | None
    versions: dict[int, str]  # rowid -> the content hash it was read at (a section's: its document's)
    rows: dict[int, _Row | None]  # rowid -> its row
    postings: dict[str, set[int]]  # token -> the rows holding it
    tokens: int = 0

    def drop(self, rowid: int) -> None:
        self.versions.pop(rowid, None)
        row = self.rows.pop(rowid, None)
        if row is not None:
            self.tokens -= sum(len(tokens) for _, tokens in row.columns)
            for token in row.frequency:
                held = self.postings.get(token)
                if held is not None:
                    held.discard(rowid)
                    if not held:
                        del self.postings[token]


class PrunedText:
    """Pruned BM25 over the FTS5 tables of one SQLite connection (reads through ``query``, under the store's lock)."""

    def __init__(self, query: Query, number: Callable[[str], "int | None"], *, cap: int = 500) -> None:
        """``number``: an org's number in ``text_tables`` where it has full-text tables of its own, else None."""
        self._query = query
        self._number = number
        self._tables: dict[tuple[str, int], _Table] = {}  # (kind, org's number) -> that org's own table
        self.cap = cap
        self._statistics: dict[str, _Statistics] = {}  # fts table -> statistics of the whole table
        self._org_statistics: OrderedDict[tuple[str, str], _Statistics] = OrderedDict()  # (fts, org) -> the org's
        self._resident: OrderedDict[str, _Resident] = OrderedDict()  # fts table -> the rows read so far (_score_resident)
        self._whole: OrderedDict[tuple[str, str], _WholeOrg] = OrderedDict()  # (fts, org) -> its rows, see _whole_org
        self._pieces: dict[str, tuple[str, ...]] = {}  # piece of text -> its FTS5 tokens
        self._surface: dict[str, dict[str, int]] = {}  # token -> the known pieces holding it (and how often)
        self._learnt: set[bytes] = set()  # digests of texts whose every piece is in ``_pieces``
        self._scratch = False  # the temporary tokenising table exists on this connection
        self._sets: OrderedDict[frozenset[int], str] = OrderedDict()  # large sets of slots -> their temporary table
        self._set_number = 0
        self._hidden: OrderedDict[tuple[int, frozenset[int]], tuple[frozenset[int], frozenset[int]]] = OrderedDict()

    def _table(self, kind: str, org: str) -> _Table:
        """The full-text table of ``kind`` that holds ``org``'s rows: its own, or the one orgs share."""
        number = self._number(org)
        if number is None:
            return TABLES[kind]
        table = self._tables.get((kind, number))
        if table is None:
            base = TABLES[kind]
            table = self._tables[(kind, number)] = replace(base, fts=f"{base.fts}_{number}", own=True)
        return table

    # -- sizes ---------------------------------------------------------------------------------------
    def scope_rows(self, kind: str, most: int, *, org: str, slots: Sequence[int] | None) -> int:
        """Rows in the scope (the org's rows of ``kind``, or the rows of ``slots``), counted up to ``most``
        (at most ``most`` index entries are read; kept while the table's index is unchanged)."""
        table = self._table(kind, org)
        stats = self._read_statistics(table, [])
        key = (org, most, None if slots is None else tuple(slots))
        if key in stats.scopes:
            return stats.scopes[key]
        if slots is None:
            sql = f"SELECT count(*) FROM (SELECT 1 FROM {table.content} WHERE org = ? LIMIT ?)"
            counted = int(self._query(sql, [org, most])[0][0])
        else:
            counted = 0
            for slot in slots:
                first, last = slot << SLOT_BITS, ((slot + 1) << SLOT_BITS) - 1
                sql = f"SELECT count(*) FROM (SELECT 1 FROM {table.content} WHERE rowid BETWEEN ? AND ? LIMIT ?)"
                counted += int(self._query(sql, [first, last, most - counted])[0][0])
                if counted >= most:
                    break
        if len(stats.scopes) > _SCOPES_KEPT:
            stats.scopes.clear()
        stats.scopes[key] = counted
        return counted

    def index_key(self, kind: str, *, org: str) -> tuple:
        """The structure and averages records of the full-text table holding ``org``'s rows of ``kind``: any write
        to the table (a document written rewrites its sections' rows) changes them."""
        return self._read_statistics(self._table(kind, org), []).key

    def table_rows(self, kind: str, *, org: str) -> int:
        """Rows in the full-text table of ``kind`` holding ``org``'s rows (every org's in a shared one): FTS5's
        own count, one read."""
        return self._read_statistics(self._table(kind, org), []).rows

    # -- search ------------------------------------------------------------------------------------
    def search(
        self, kind: str, found: list[str], *, org: str, limit: int, slots: Sequence[int] | None, prune: bool = True,
        seen: Seen | None = None,
    ) -> list[tuple[str, str, float]]:
        """(id, parent, score) of the best ``limit`` rows of the scope (the org's, or ``slots``') holding any of
        the terms ``found``, best first, ties by id. With ``prune`` false every matching row of the scope is
        scored (the complete ranking, as FTS5's bm25() gives it). With ``seen``, the search is that of a copy
        of the org holding only the rows it counts: their statistics (:meth:`_seen_stats`), and the rows of
        the restricted parents it does not show are never candidates, so none is read, scored or returned
        (what the caller may not see neither takes a place nor costs a read beyond the index's)."""
        table = self._table(kind, org)
        hidden = self.hidden_of(seen) if seen is not None else frozenset()
        if hidden and slots is not None:
            slots = [s for s in slots if s not in hidden]
            if not slots:
                return []
        stats = self._org_stats(table, found, org)
        # a viewer's search of a larger org (pruned, see SQLiteStore._search_text) keeps the rows it read too:
        # the same candidates, such as the many sections it may not see, come back search after search
        resident = stats.rows <= _RESIDENT_SCOPE or seen is not None
        if seen is not None:
            stats = self._seen_stats(table, stats, found, seen, org=org)
        if stats.rows <= 0:
            return []
        matching = sorted((t for t in found if stats.df[t] > 0), key=lambda t: (stats.df[t], t))
        if not matching:
            return []
        postings = None if prune or stats.whole is None else stats.whole.postings
        if prune:
            rowids = self._candidates(table, matching, stats, org=org, slots=slots, want=max(self.cap, 4 * int(limit)),
                                      hidden=hidden)  # fmt: skip
        elif postings is not None:  # the org's rows holding a term's first token (in the slots): a superset of the match
            held = {r for term in matching for r in postings.get(self._tokens(term)[0], ())}
            if slots is not None:
                within = set(slots)
                held = {r for r in held if r >> SLOT_BITS in within}
            rowids = sorted(r for r in held if r >> SLOT_BITS not in hidden)
        else:
            rowids = self._rows(table, _any(matching), org=org, slots=slots, limit=None, hidden=hidden)
        scored = self._score(table, found, stats, rowids, org=org, resident=resident)
        if postings is not None:  # the rows holding none of the phrases (a phrase's first token alone) score 0
            scored = [row for row in scored if row[2] > 0.0]
        scored.sort(key=lambda row: (-row[2], row[0]))
        return scored[: int(limit)]

    def _candidates(
        self, table: _Table, matching: list[str], stats: _Statistics, *, org: str, slots: Sequence[int] | None, want: int,
        hidden: frozenset[int] = frozenset(),
    ) -> list[int]:
        """Rowids of the scope's rows holding the rarest terms (see the module's docstring), at most ``want``,
        none in the ``hidden`` slots."""
        df = stats.df
        rare: list[str] = []
        matched = 0
        for term in matching:  # rarest first; together they match at most ``cap`` rows of the table
            if matched + df[term] > self.cap:
                break
            rare.append(term)
            matched += df[term]
        out: dict[int, None] = {}
        if rare:
            out.update(dict.fromkeys(self._rows(table, _any(rare), org=org, slots=slots, limit=want, hidden=hidden)))
        # then rows holding all the common terms together, then all but the commonest, ...: a row lacking only
        # low-IDF terms scores above one lacking a rarer term. Terms weighing under a quarter of the rarest
        # common one (a word in half the rows weighs nearly nothing) only add to the scores: requiring them
        # would prefer rows that hold them over shorter rows that score higher.
        common = matching[len(rare):]
        idf = {t: _idf(stats.rows, df[t]) for t in common}
        common = [t for t in common if idf[t] >= idf[common[0]] / 4] if common else []
        for size in range(len(common), 0, -1):
            if len(out) >= want:
                break
            together = " AND ".join(_phrase(t) for t in common[:size])
            # rows holding them in a heavier column (a section's title or heading) first
            heavy = [f"{table.heavy} : ({together}) AND {table.light} : ({together})", f"{table.heavy} : ({together})"]
            for match in (heavy if table.heavy else []) + [together]:
                if len(out) >= want:
                    break
                needed = want - len(out)
                rows = self._rows(table, match, org=org, slots=slots, limit=_LOOK_AHEAD * needed, skip=out, hidden=hidden)
                out.update(dict.fromkeys(rows if len(rows) <= needed else self._shortest(table, rows, needed)))
        return list(out)

    def _shortest(self, table: _Table, rowids: list[int], count: int) -> list[int]:
        """The ``count`` shortest rows among ``rowids`` (in tokens; ties by rowid): holding the same terms,
        a shorter row scores higher."""
        if len(table.weights) == 1:
            # one column: its size is one varint, and minimal varints order as their values do when
            # ordered by length, then bytes; SQLite sorts them (a row without a size counts as 0 tokens)
            sql = (f"SELECT {_ARRAY % 'id'} FROM (SELECT id FROM {table.fts}_docsize "
                   f"WHERE id IN (SELECT value FROM json_each(?)) ORDER BY length(sz), sz, id)")
            ordered = json.loads(self._query(sql, [json.dumps(rowids)])[0][0])
            if len(ordered) < len(rowids):
                sized = set(ordered)
                ordered = sorted(r for r in rowids if r not in sized) + ordered
            return ordered[:count]
        sql = f"SELECT {_ARRAY % 'id'}, {_ARRAY % 'hex(sz)'} FROM {table.fts}_docsize WHERE id IN (SELECT value FROM json_each(?))"
        ids, sizes = (json.loads(v) for v in self._query(sql, [json.dumps(rowids)])[0])
        length = dict(zip(ids, map(_size, map(bytes.fromhex, sizes))))
        return sorted(rowids, key=lambda r: (length.get(r, 0), r))[:count]

    def _sole(self, table: _Table, org: str) -> bool:
        """Whether ``org`` is the only org with rows in ``table`` (two reads of the org index's ends)."""
        if table.own:
            return True
        low, high = self._query(f"SELECT (SELECT min(org) FROM {table.content}), (SELECT max(org) FROM {table.content})", [])[0]
        return bool(low == high == org)

    def _rows(
        self, table: _Table, match: str, *, org: str, slots: Sequence[int] | None, limit: int | None,
        skip: dict[int, None] | None = None, hidden: frozenset[int] = frozenset(),
    ) -> list[int]:
        """Rowids of the scope's rows matching ``match`` (the first ``limit`` besides those in ``skip``), none in
        the ``hidden`` slots (passed over in the index: they take none of the ``limit``). ``slots`` must hold
        no hidden one."""
        fts = table.fts
        fetch = -1 if limit is None else int(limit) + len(skip or ())
        params: list[Any]
        # a hidden slot's rows are passed over as the match reads them, before the LIMIT counts them
        unseen, unseen_params = "", []  # type: str, list[Any]
        if hidden and slots is None:
            among, unseen_params = self._among(hidden)
            unseen = f" AND ({fts}.rowid >> {SLOT_BITS}) NOT IN ({among})"
        if slots is None and self._sole(table, org):  # no other org's rows to pass over (scored rows are checked again)
            sql, params = f"SELECT rowid FROM {fts} WHERE {fts} MATCH ?{unseen} LIMIT ?", [match, *unseen_params, fetch]
        elif slots is None:
            sql = (
                f"SELECT f.rowid AS rowid FROM {fts} f CROSS JOIN {table.content} c ON c.rowid = f.rowid "
                f"WHERE {fts} MATCH ?{unseen.replace(fts + '.rowid', 'f.rowid')} AND c.org = ? LIMIT ?"
            )
            params = [match, *unseen_params, org, fetch]
        else:  # one FTS5 cursor per slot, each reading that parent's rowid range alone
            rows: list[int] = []
            for start in range(0, len(slots), _SLOTS_PER_READ):
                chunk = slots[start : start + _SLOTS_PER_READ]
                parts = [f"SELECT rowid FROM {fts} WHERE {fts} MATCH ? AND rowid BETWEEN ? AND ?"] * len(chunk)
                params = [v for s in chunk for v in (match, s << SLOT_BITS, ((s + 1) << SLOT_BITS) - 1)]
                sql = f"SELECT {_ARRAY % 'rowid'} FROM (" + " UNION ALL ".join(parts) + " LIMIT ?)"
                rows += json.loads(self._query(sql, [*params, fetch - len(rows) if fetch >= 0 else -1])[0][0])
                if fetch >= 0 and len(rows) >= fetch:
                    break
            return rows if not skip else [r for r in rows if r not in skip]
        rows = json.loads(self._query(f"SELECT {_ARRAY % 'rowid'} FROM ({sql})", params)[0][0])
        return rows if not skip else [r for r in rows if r not in skip]

    def _score(
        self, table: _Table, found: list[str], stats: _Statistics, rowids: list[int], *, org: str, resident: bool
    ) -> list[tuple[str, str, float]]:
        """(id, parent, BM25) of the org's rows among ``rowids``, scored as FTS5's bm25() scores them with
        ``stats``; ``resident``: the org holds few rows of the kind (:meth:`_score_resident`)."""
        if resident:
            return self._score_resident(table, found, stats, rowids, org=org)
        idf = [_idf(stats.rows, stats.df[term]) for term in found]  # in the order of the query's phrases
        read = self._read(table, rowids, ("c.id", f"c.{table.parent}", "hex(d.sz)"), org=org)
        ids, parents, sizes, texts_of = read[0], read[1], read[2], read[3:]
        weights, count, rows = table.weights, len(found), len(ids)
        frequencies = _Frequencies(self, [self._tokens(t) for t in found], [t or "" for column in texts_of for t in column])
        freqs = [0.0] * (rows * count)  # row r's frequency of phrase i at r * count + i
        # ASCII texts (most): every whole piece that is a form of a phrase, found in them all at once (scan)
        plain: list[tuple[int, float]] = []  # (row, column weight) of each text scanned
        texts: list[str] = []
        for column, weight in enumerate(weights):
            for r, text in enumerate(texts_of[column]):
                if not text:
                    continue
                if text.isascii() and "\x00" not in text:
                    plain.append((r * count, weight))
                    texts.append(text)
                else:
                    frequencies.add(text, weight, freqs, r * count)
        if plain:
            frequencies.scan(texts, plain, freqs)
        lengths = [_size(bytes.fromhex(s)) for s in sizes]
        return list(zip(ids, parents, _bm25(freqs, rows, idf, lengths, stats.average_length)))

    def _score_resident(
        self, table: _Table, found: list[str], stats: _Statistics, rowids: list[int], *, org: str
    ) -> list[tuple[str, str, float]]:
        """:meth:`_score` for an org holding few rows of the kind (the sample org, an evaluation set, most orgs
        of a shared file): each row is read and tokenised once (in a shared file, with all the org's rows:
        :meth:`_whole_org`; an org alone in its table keeps the rows it read while the index is unchanged),
        then every search scores it from its token counts, without reading or scanning its text again. The
        same frequencies (whole numbers times the column weights: exact in any order), the same arithmetic."""
        whole = stats.whole  # the org's rows read whole (refreshed by this search's _org_stats), unless a row
        if whole is not None and all(r in whole.rows for r in rowids):  # written since came with the candidates
            held = whole.rows
        else:
            resident = self._resident.get(table.fts)
            if resident is None or resident.key != stats.key or resident.tokens > _RESIDENT_TOKENS:
                resident = self._resident[table.fts] = _Resident(stats.key)
            self._resident.move_to_end(table.fts)
            missing = [r for r in rowids if r not in resident.rows]
            if missing:
                self._read_rows(table, missing, resident)
                # one bound for every table's rows (viewers' searches keep them for large orgs' own tables too):
                # past it, the tables searched least recently give theirs back
                while sum(r.tokens for r in self._resident.values()) > _RESIDENT_TOKENS and len(self._resident) > 1:
                    self._resident.popitem(last=False)
            held = resident.rows
        rows = [row for r in rowids if (row := held[r]) is not None and row.org == org]
        phrases = [self._tokens(term) for term in found]
        freqs = [
            (row.frequency.get(phrase[0], 0.0) if len(phrase) == 1 else
             sum(weight * _occurrences(tokens, phrase) for weight, tokens in row.columns) if phrase else 0.0)
            for row in rows for phrase in phrases
        ]  # fmt: skip
        idf = [_idf(stats.rows, stats.df[term]) for term in found]
        scores = _bm25(freqs, len(rows), idf, [row.length for row in rows], stats.average_length)
        return [(row.id, row.parent, score) for row, score in zip(rows, scores)]

    def _read(self, table: _Table, rowids: list[int], fields: tuple[str, ...], *, org: str | None = None) -> list[list[Any]]:
        """``fields`` of the rows ``rowids`` (of their content row ``c`` and FTS5 size row ``d``), then their
        indexed texts column by column: one list per field, in one row of JSON arrays, not a row per
        candidate (thousands of tuples a search would wake the garbage collector, which then walks the whole
        process). With ``org``, that org's rows alone."""
        content = "" if table.texts.startswith("c.") else f" JOIN {table.fts}_content x ON x.id = c.rowid"
        columns = [_ARRAY % c for c in (*fields, *table.texts.split(", "))]
        owned = " AND +c.org = ?" if org is not None else ""  # by rowid, not the org index
        return [json.loads(v) for v in self._query(
            f"SELECT {', '.join(columns)} FROM {table.content} c JOIN {table.fts}_docsize d ON d.id = c.rowid{content} "
            f"WHERE c.rowid IN (SELECT value FROM json_each(?)){owned}",
            [json.dumps(rowids), *([org] if org is not None else [])],
        )[0]]  # fmt: skip

    def token_sequence(self, pieces: list[str]) -> tuple[str, ...]:
        """The FTS5 tokens of a text's ``pieces`` in order (a piece not learnt is digits: its own token, see
        :meth:`learn`)."""
        known = self._pieces
        return tuple(t for piece in pieces for t in (known[piece] if piece in known else (piece,)))

    def _read_rows(self, table: _Table, rowids: list[int], resident: _Resident) -> None:
        """Read, tokenise and keep the rows ``rowids`` of ``table`` (any org's: each is scored for its own)."""
        read = self._read(table, rowids, ("c.rowid", "c.id", f"c.{table.parent}", "c.org", "hex(d.sz)"))
        texts_of = read[5:]
        self.learn([t or "" for column in texts_of for t in column])
        for r, (rowid, item, parent, org, size) in enumerate(zip(*read[:5])):
            columns_read: list[tuple[float, tuple[str, ...]]] = []
            frequency: dict[str, float] = {}
            for weight, column in zip(table.weights, texts_of):
                tokens = self.token_sequence(_pieces(column[r] or ""))
                for token in tokens:
                    frequency[token] = frequency.get(token, 0.0) + weight
                columns_read.append((weight, tokens))
                resident.tokens += len(tokens)
            resident.rows[rowid] = _Row(item, parent, org, _size(bytes.fromhex(size)), frequency, tuple(columns_read))
        for rowid in rowids:
            resident.rows.setdefault(rowid, None)  # no content or size row: not in the table

    # -- statistics --------------------------------------------------------------------------------
    def sole(self, kind: str, org: str) -> bool:
        """Whether ``org`` is the only org with rows of ``kind`` (then FTS5's own statistics are the org's;
        kept while the table's index is unchanged)."""
        table = self._table(kind, org)
        return self._sole_now(table, self._read_statistics(table, []), org)

    def _sole_now(self, table: _Table, whole: _Statistics, org: str) -> bool:
        if table.own:
            return True
        if org not in whole.sole:
            if len(whole.sole) > _ORGS_KEPT:
                whole.sole.clear()
            whole.sole[org] = self._sole(table, org)
        return whole.sole[org]

    def _org_stats(self, table: _Table, found: list[str], org: str) -> _Statistics:
        """BM25's statistics over ``org``'s own rows: how many, their average length, each term's document
        frequency. An org's scores never depend on what another org holds (its rows would otherwise weigh
        in every term's IDF and in the average length, and the order of this org's hits would tell
        something of the other's texts). When the org is the only one in the table they are FTS5's own
        (one read); otherwise they are counted over the org's rows, kept while the index is unchanged."""
        whole = self._read_statistics(table, [])
        if self._sole_now(table, whole, org):
            self._count(table, whole, found)
            return whole
        key = (table.fts, org)
        stats = self._org_statistics.get(key)
        if stats is None or stats.key != whole.key:
            rows = int(self._query(f"SELECT count(*) FROM {table.content} WHERE org = ?", [org])[0][0])
            # the average length over the org's first _LENGTH_SAMPLE rows (all of them in most orgs)
            sizes = json.loads(self._query(
                f"SELECT {_ARRAY % 'hex(d.sz)'} FROM (SELECT rowid FROM {table.content} WHERE org = ? LIMIT ?) c "
                f"JOIN {table.fts}_docsize d ON d.id = c.rowid",
                [org, _LENGTH_SAMPLE],
            )[0][0])  # fmt: skip
            tokens = sum(_size(bytes.fromhex(v)) for v in sizes)
            average = float(tokens) / float(len(sizes)) if sizes else 1.0
            stats = _Statistics(whole.key, rows, average, tokens=tokens if len(sizes) == rows else round(average * rows))
            self._org_statistics[key] = stats
            while len(self._org_statistics) > _ORGS_KEPT:
                self._org_statistics.popitem(last=False)
        self._org_statistics.move_to_end(key)
        stats.whole = self._whole_org(table, org) if stats.rows <= _RESIDENT_SCOPE else None
        if stats.whole is None:
            self._count(table, stats, found, org=org)
        else:
            self._count_in(stats, found, stats.whole)
        return stats

    # -- a small org sharing the table -------------------------------------------------------------
    # The shared FTS5 tables hold the rows of every org of at most OWN_TEXT_ROWS rows of a kind: a match there
    # reads a term's postings across orgs, then keeps the org's rows, so its cost would grow with how many rows
    # of other orgs hold the word (an org could time another's vocabulary: bench/text_isolation.py). A small
    # org's rows are read whole instead, tokenised and indexed by token here; its matches and document
    # frequencies are found among them alone. They are kept while the org's generation stays; when the org
    # writes, only its rows whose content hash changed (a memory written, a document replaced) are read again.
    _VERSIONS = {
        "section": "SELECT json_group_array(json_array(s.rowid, d.hash)) FROM sections s "
                   "JOIN documents d ON d.org = s.org AND d.id = s.document WHERE s.org = ?",
        "memory": "SELECT json_group_array(json_array(rowid, hash)) FROM memories WHERE org = ?",
    }

    def _whole_org(self, table: _Table, org: str) -> _WholeOrg:
        """Every row of ``org`` in ``table``, read and indexed by token, current as of the org's generation
        (read first: a write landing meanwhile has its rows read at the next search)."""
        found = self._query("SELECT generation FROM orgs WHERE id = ?", [org])
        generation = int(found[0][0]) if found else None  # no org row: no generation to trust, compare every time
        key = (table.fts, org)
        whole = self._whole.get(key)
        if whole is not None and generation is not None and whole.generation == generation:
            self._whole.move_to_end(key)
            return whole
        versions = {int(r): str(v) for r, v in json.loads(self._query(self._VERSIONS[table.kind], [org])[0][0])}
        if whole is None:
            whole = self._whole[key] = _WholeOrg(generation, {}, {}, {})
        for rowid in [r for r, v in whole.versions.items() if versions.get(r) != v]:
            whole.drop(rowid)  # deleted, or written again
        fresh = [r for r in versions if r not in whole.versions]
        if fresh:
            read = _Resident(key=())
            self._read_rows(table, fresh, read)
            for rowid in fresh:
                row = read.rows[rowid]
                whole.rows[rowid] = row
                whole.versions[rowid] = versions[rowid]
                if row is not None and row.org == org:
                    for token in row.frequency:
                        whole.postings.setdefault(token, set()).add(rowid)
            whole.tokens += read.tokens
        whole.generation = generation
        self._whole.move_to_end(key)
        # past the bound, the orgs searched least recently give their rows back (read again when searched)
        while sum(w.tokens for w in self._whole.values()) > _RESIDENT_TOKENS and len(self._whole) > 1:
            self._whole.popitem(last=False)
        return whole

    def _count_in(self, stats: _Statistics, found: list[str], whole: _WholeOrg) -> None:
        """:meth:`_count` among a small org's rows read whole: the rows holding each term's phrase."""
        for term in found:
            if term not in stats.df:
                stats.df[term] = len(self._holding(whole, term))

    def _holding(self, whole: _WholeOrg, term: str) -> list[int]:
        """The rowids of a small org's rows (read whole) holding ``term``'s phrase."""
        phrase = self._tokens(term)
        if not phrase:
            return []
        if len(phrase) == 1:
            return list(whole.postings.get(phrase[0], ()))
        return [r for r in whole.postings.get(phrase[0], ()) if (row := whole.rows[r]) is not None
                and any(_occurrences(tokens, phrase) for _, tokens in row.columns)]  # fmt: skip

    # -- what a caller may see ---------------------------------------------------------------------
    def _seen_stats(self, table: _Table, stats: _Statistics, found: list[str], seen: Seen, *, org: str) -> _Statistics:
        """The statistics of the rows ``seen`` counts: the org's, less its restricted parents' rows, plus the
        rows of the restricted parents the caller may see. The parts are exact counts (kept with the org's
        statistics while the index is unchanged), so the scores are those of an org holding only these rows."""
        if not seen.restricted:
            return stats
        less = self._part(table, stats, found, seen.restricted, org=org)
        more = self._part(table, stats, found, seen.shown, org=org, kept=seen.restricted) if seen.shown else _Part(0, 0)
        rows, tokens = stats.rows - less.rows + more.rows, stats.tokens - less.tokens + more.tokens
        df = {t: stats.df[t] - less.df[t] + more.df.get(t, 0) for t in found}
        return _Statistics(stats.key, rows, float(tokens) / float(rows) if rows else 1.0, df, tokens=tokens, whole=stats.whole)

    def _part(
        self, table: _Table, stats: _Statistics, found: list[str], slots: frozenset[int], *, org: str,
        kept: frozenset[int] | None = None,
    ) -> _Part:
        """The statistics of the org's rows in ``slots``: from its rows read whole where the org is small,
        otherwise their FTS5 sizes (a rowid range per slot) and a match per term tested against the slots.
        Past ``_PARTS_KEPT`` sets the others are dropped, the part of ``kept`` (every viewer's) kept."""
        part = stats.parts.get(slots)
        whole = stats.whole
        if part is None:
            if len(stats.parts) >= _PARTS_KEPT:
                stats.parts = {k: v for k, v in stats.parts.items() if k == kept}
            if whole is not None:
                held = [row for rowid, row in whole.rows.items()
                        if row is not None and row.org == org and rowid >> SLOT_BITS in slots]
                part = _Part(len(held), sum(row.length for row in held))
            else:
                ordered, sizes = sorted(slots), []
                for start in range(0, len(ordered), _SLOTS_PER_READ):  # a slot's rows are one parent's, of one org
                    chunk = ordered[start : start + _SLOTS_PER_READ]
                    ranges = " UNION ALL ".join([f"SELECT sz FROM {table.fts}_docsize WHERE id BETWEEN ? AND ?"] * len(chunk))
                    params = [v for slot in chunk for v in (slot << SLOT_BITS, ((slot + 1) << SLOT_BITS) - 1)]
                    sizes += json.loads(self._query(f"SELECT {_ARRAY % 'hex(sz)'} FROM ({ranges})", params)[0][0])
                part = _Part(len(sizes), sum(_size(bytes.fromhex(v)) for v in sizes))
            stats.parts[slots] = part
        missing = [t for t in found if t not in part.df]
        if missing and whole is not None:
            for term in missing:
                part.df[term] = sum(1 for r in self._holding(whole, term) if r >> SLOT_BITS in slots)
        elif missing:
            among, listed = self._among(slots)
            sql = f"SELECT count(*) FROM {table.fts} WHERE {table.fts} MATCH ? AND (rowid >> {SLOT_BITS}) IN ({among})"
            for term in missing:
                part.df[term] = int(self._query(sql, [_phrase(term), *listed])[0][0]) if self._tokens(term) else 0
        return part

    def _read_statistics(self, table: _Table, found: list[str]) -> _Statistics:
        records = dict(self._query(f"SELECT id, block FROM {table.fts}_data WHERE id IN (1, 10)", []))
        key = (records.get(1), records.get(10))
        stats = self._statistics.get(table.fts)
        if stats is None or stats.key != key:
            averages = _varints(records.get(1) or b"")
            rows, tokens = (averages[0], sum(averages[1:])) if averages else (0, 0)
            stats = _Statistics(key, rows, float(tokens) / float(rows) if rows else 1.0, tokens=tokens)
            self._statistics[table.fts] = stats
        self._count(table, stats, found)
        return stats

    def _count(self, table: _Table, stats: _Statistics, found: list[str], *, org: str | None = None) -> None:
        """Each term's document frequency in the whole table (or among ``org``'s rows), counted once while
        the index is unchanged."""
        sql, scope = f"SELECT count(*) FROM {table.fts} WHERE {table.fts} MATCH ?", []
        if org is not None:
            # a row's slot (its parent's, see sqlite_schema) names its org: the org's slots are read once into
            # a temporary index, and each match is tested there, with no read of the content table
            sql += f" AND (rowid >> {SLOT_BITS}) IN (SELECT slot FROM parent_slots WHERE org = ? AND kind = ?)"
            scope = [org, table.kind]
        for term in found:
            if term not in stats.df and not self._tokens(term):
                stats.df[term] = 0  # no token: FTS5's phrase is empty and matches nothing
            elif term not in stats.df:
                stats.df[term] = int(self._query(sql, [_phrase(term), *scope])[0][0])

    # -- tokens ------------------------------------------------------------------------------------
    def _tokens(self, term: str) -> tuple[str, ...]:
        """The FTS5 tokens of a query term (its phrase)."""
        split = _pieces(term)
        self._tokenise([p for p in split if p not in self._pieces])
        return tuple(t for p in split for t in self._pieces[p])

    def learn(self, texts: list[str]) -> None:
        """Tokenise every piece of ``texts`` not yet known but runs of ASCII digits (each its own token, and
        often unique: an order number, a date). A text once learnt is remembered (a 128-bit digest of it)
        and not scanned again while its pieces are kept: a record's rows come back as candidates call
        after call."""
        if len(self._pieces) > _PIECES_KEPT:  # start again (before this query's pieces are looked up)
            self._pieces.clear()
            self._surface.clear()
            self._learnt.clear()
        if len(self._learnt) > _TEXTS_KEPT:
            self._learnt.clear()
        learnt = self._learnt
        fresh = {digest: text for text in texts if (digest := _digest(text)) not in learnt}
        if not fresh:
            return
        text = "\n".join(fresh.values())
        if text.isascii():  # pieces are runs of letters and digits
            pieces = set(_ASCII_PIECE.findall(text.lower()))
        else:
            pieces = set(_pieces(text))
        self._tokenise([p for p in pieces - self._pieces.keys() if not _digits(p)])
        learnt.update(fresh)

    def hidden_of(self, seen: Seen) -> frozenset[int]:
        """The restricted slots ``seen`` does not show: one set object per (restricted set, shown set), so that
        :meth:`_among` finds its table (and the SQLite store its ids of documents) without hashing a new set of many slots at every search."""
        if not seen.shown:
            return seen.restricted
        key = (id(seen.restricted), seen.shown)
        kept = self._hidden.get(key)
        if kept is None or kept[0] is not seen.restricted:
            kept = self._hidden[key] = (seen.restricted, seen.restricted - seen.shown)
            while len(self._hidden) > _SETS_KEPT:
                self._hidden.popitem(last=False)
        self._hidden.move_to_end(key)
        return kept[1]

    def _among(self, slots: frozenset[int]) -> tuple[str, list[Any]]:
        """SQL for ``slots`` on the right of ``IN``, and its parameters: a JSON list for a few; for many (an org's
        restricted documents) a temporary table of them, written once and kept for the last ``_SETS_KEPT`` sets,
        which SQLite probes by its key instead of parsing the list and indexing it again for every statement."""
        if len(slots) <= _SMALL_SET:
            return "SELECT value FROM json_each(?)", [json.dumps(sorted(slots))]
        name = self._sets.get(slots)
        if name is None:
            self._set_number += 1
            name = self._sets[slots] = f"temp.dossier_slots_{self._set_number}"
            self._query(f"CREATE TABLE {name} (slot INTEGER PRIMARY KEY)", [])
            self._query(f"INSERT INTO {name} SELECT value FROM json_each(?)", [json.dumps(sorted(slots))])
            while len(self._sets) > _SETS_KEPT:
                self._query(f"DROP TABLE IF EXISTS {self._sets.popitem(last=False)[1]}", [])
        self._sets.move_to_end(slots)
        return f"SELECT slot FROM {name}", []

    def _tokenise(self, pieces: list[str]) -> None:
        """Learn the FTS5 tokens of ``pieces`` (``porter unicode61``, by FTS5 itself)."""
        todo = [p for p in pieces if not _digits(p)]
        learnt: list[tuple[str, tuple[str, ...]]] = [(p, (p,)) for p in pieces if _digits(p)]  # digits: themselves
        if todo and not self._scratch:
            self._query(
                "CREATE VIRTUAL TABLE IF NOT EXISTS temp.dossier_tokens "
                "USING fts5 (piece, content = '', tokenize = 'porter unicode61')", [],
            )  # fmt: skip
            self._query("CREATE VIRTUAL TABLE IF NOT EXISTS temp.dossier_token_list USING fts5vocab (temp, dossier_tokens, instance)", [])
            self._scratch = True
        for start in range(0, len(todo), 5_000):
            chunk = todo[start : start + 5_000]
            values = ", ".join("(?, ?)" for _ in chunk)
            self._query(f"INSERT INTO temp.dossier_tokens (rowid, piece) VALUES {values}", [v for i, p in enumerate(chunk) for v in (i, p)])
            found: dict[int, list[tuple[int, str]]] = {}
            for doc, offset, term in self._query("SELECT doc, offset, term FROM temp.dossier_token_list", []):
                found.setdefault(int(doc), []).append((int(offset), str(term)))
            self._query("INSERT INTO temp.dossier_tokens (dossier_tokens) VALUES ('delete-all')", [])
            learnt += [(piece, tuple(t for _, t in sorted(found.get(i, [])))) for i, piece in enumerate(chunk)]
        for piece, tokens in learnt:
            self._pieces[piece] = tokens
            for token, n in Counter(tokens).items():
                self._surface.setdefault(token, {})[piece] = n


class _Frequencies:
    """Counts, for one query's phrases, their occurrences in texts as FTS5 counts its instances."""

    def __init__(self, search: PrunedText, phrases: list[tuple[str, ...]], texts: list[str]) -> None:
        search.learn(texts)
        self._search = search
        self._multi = [(i, p) for i, p in enumerate(phrases) if len(p) > 1]
        # In ASCII text every piece is one token: a phrase of several tokens is one of the pieces holding its
        # first token, then separators, then one holding its second, and so on (every piece of the texts is
        # known once they are learnt; a run of digits is its own token). No pattern for a phrase with a token
        # that no piece holds: no text holds the phrase.
        self.phrases: list[tuple[int, re.Pattern[str]]] = []
        for i, phrase in self._multi:
            forms = [sorted({*search._surface.get(t, {}), *((t,) if _digits(t) else ())}) for t in phrase]
            if all(forms):
                alternatives = ["(?:" + "|".join(map(re.escape, f)) + ")" for f in forms]
                self.phrases.append((i, re.compile("[^a-z0-9\x00]+".join(alternatives) + "(?![a-z0-9])")))
        # a piece holding a single-token phrase -> [(phrase, occurrences in the piece)]
        self.where: dict[str, list[tuple[int, int]]] = {}
        for i, phrase in enumerate(phrases):
            if len(phrase) == 1:
                surface = search._surface.get(phrase[0], {})
                if _digits(phrase[0]):  # its own piece, learnt or not (see learn)
                    surface = {**surface, phrase[0]: 1}
                for piece, n in surface.items():
                    self.where.setdefault(piece, []).append((i, n))
        self.forms = sorted((p for p in self.where if p.isascii()), key=lambda p: (-len(p), p))
        self._pattern: re.Pattern[str] | None = None  # compiled when add() first needs it (scan does not)

    @property
    def pattern(self) -> re.Pattern[str] | None:
        """In ASCII text a piece is a run of letters and digits: whole pieces found by one regular expression."""
        if self._pattern is None and self.forms:
            self._pattern = re.compile(r"(?<![a-z0-9])(?:" + "|".join(map(re.escape, self.forms)) + r")(?![a-z0-9])")
        return self._pattern

    def scan(self, texts: list[str], plain: list[tuple[int, float]], freq: list[float]) -> None:
        """Add the phrases' occurrences in the ASCII ``texts`` (text t weighted ``plain[t][1]``, its phrases at
        ``freq[plain[t][0] + phrase]``), in all of them joined at once (a NUL between two texts). A form of a
        single-token phrase is looked for as a plain string and counts where no letter or digit touches it (a
        whole piece); a phrase of several tokens by its pattern, every occurrence, overlapping ones too, as
        FTS5 counts its instances. The counts :meth:`add` finds text by text: whole pieces do not overlap, and
        the counts are whole numbers, so the order they are added in changes no bit."""
        joined = "\x00".join(texts).lower()
        starts, at = [], 0
        for text in texts:
            starts.append(at)
            at += len(text) + 1
        end, word = len(joined), _WORD_CHARS
        for form in self.forms:
            size, found = len(form), joined.find(form)
            while found >= 0:
                after = found + size
                if (found == 0 or joined[found - 1] not in word) and (after == end or joined[after] not in word):
                    base, weight = plain[bisect_right(starts, found) - 1]
                    for i, n in self.where[form]:
                        freq[base + i] += weight * n
                found = joined.find(form, found + 1)
        for i, pattern in self.phrases:
            match = pattern.search(joined)
            while match is not None:
                at = match.start()
                if at == 0 or joined[at - 1] not in word:
                    base, weight = plain[bisect_right(starts, at) - 1]
                    freq[base + i] += weight
                match = pattern.search(joined, at + 1)

    def add(self, text: str, weight: float, freq: list[float], base: int = 0) -> None:
        """Add ``weight`` times each phrase's occurrences in ``text`` to ``freq[base + phrase]``."""
        where = self.where
        split: list[str] | None = None
        if text.isascii():
            if self.pattern is not None:
                for piece in self.pattern.findall(text.lower()):
                    for i, n in where[piece]:
                        freq[base + i] += weight * n
        else:
            split = _pieces(text)
            for piece in split:
                for i, n in where.get(piece, ()):
                    freq[base + i] += weight * n
        if self._multi:
            self.add_phrases(split if split is not None else _pieces(text), weight, freq, base)

    def add_phrases(self, pieces: list[str], weight: float, freq: list[float], base: int = 0) -> None:
        """Add ``weight`` times each phrase of several tokens found in a text (its ``pieces``): consecutive
        tokens (an unlearnt piece is digits, its own token: see learn)."""
        tokens = self._search.token_sequence(pieces)
        for i, phrase in self._multi:
            freq[base + i] += weight * _occurrences(tokens, phrase)


def _pieces(text: str) -> list[str]:
    """The pieces of ``text`` between sure separators; ASCII letters lower-cased (unicode61 folds them)."""
    if text.isascii():
        return [p for p in _SEPARATORS.split(text.lower()) if p]
    return [p.lower() if p.isascii() else p for p in _SEPARATORS.split(text) if p]


def _bm25(freqs: list[float], rows: int, idf: list[float], lengths: list[int], average: float) -> list[float]:
    """bm25() of ``rows`` rows: row r's weighted frequency of phrase i at ``freqs[r * len(idf) + i]``. The same
    operations in the same order as FTS5, a row at a time in each array's lanes (a phrase absent from a row
    adds exactly 0.0), so the same bits."""
    import numpy as np  # here, not at the top: the store commands of the CLI open a store without numpy

    k1, b = _K1, _B
    norm = k1 * (1 - b + b * np.array(lengths, dtype=np.float64) / average)
    matrix = np.array(freqs, dtype=np.float64).reshape(rows, len(idf))
    scores = np.zeros(rows, dtype=np.float64)
    for i in range(len(idf)):
        f = matrix[:, i]
        scores = scores + idf[i] * ((f * (k1 + 1.0)) / (f + norm))
    return scores.tolist()


def _occurrences(tokens: tuple[str, ...], phrase: tuple[str, ...]) -> int:
    """How often ``phrase`` (two or more tokens) occurs in ``tokens`` as consecutive tokens (overlaps count)."""
    first, size = phrase[0], len(phrase)
    return sum(1 for at in range(len(tokens) - size + 1) if tokens[at] == first and tokens[at : at + size] == phrase)


def _digits(piece: str) -> bool:
    """A run of ASCII digits: unicode61 keeps it whole and porter leaves it as it is, so it is its own token."""
    return piece.isascii() and piece.isdigit()


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _phrase(term: str) -> str:
    return '"' + term.replace('"', "") + '"'


def _any(terms: Sequence[str]) -> str:
    return " OR ".join(_phrase(t) for t in terms)


def _idf(rows: int, hits: int) -> float:
    """bm25()'s inverse document frequency of a phrase that ``hits`` of the table's ``rows`` hold."""
    value = math.log((rows - hits + 0.5) / (hits + 0.5))
    return value if value > 0.0 else 1e-6


def _size(sizes: bytes) -> int:
    """A row's length in tokens, from FTS5's record of its columns' sizes (a varint each)."""
    return sum(sizes) if sizes.isascii() else sum(_varints(sizes))  # one byte per column below 128 tokens


def _varints(blob: bytes) -> list[int]:
    """The SQLite varints of an FTS5 record (the averages record, a row's column sizes)."""
    out, i, size = [], 0, len(blob)
    while i < size:
        value = 0
        for n in range(9):
            byte = blob[i]
            i += 1
            if n == 8:
                value = (value << 8) | byte
                break
            value = (value << 7) | (byte & 0x7F)
            if byte < 0x80:
                break
        out.append(value)
    return out
