"""Full-text search over the ``tsvector`` side tables, ranked the way BM25 ranks: rare words weigh more.

PostgreSQL's ``ts_rank`` weighs every query word alike and ranks every row that matches any of them; on
a large org a question with a common word ("price" in two thirds of the sections) then ranks tens of
thousands of rows, at some microseconds each. So, per query:

* each term (a word, or a code such as ``NW-EDU-40`` as a phrase, see :mod:`dossier.stores.fulltext`)
  gets an inverse document frequency from its document frequency in the org (BM25's
  ``ln((N - df + 0.5) / (df + 0.5))``, at least 1e-6 as in SQLite's FTS5), and a row's score is BM25 as
  FTS5's ``bm25()`` computes it (k1 = 1.2, b = 0.75): the term's frequency in the row, read off the
  lexeme's positions in its ``tsvector`` (an occurrence in a section's title or heading counts twice),
  saturated and normalised by the row's length against the org's average length (estimated from a
  sample); the two stores then rank alike up to their stemmers and tokenisers;
* document frequencies (corpus statistics, which FTS5 keeps in its index and GIN does not expose) come
  from one read of the org's first ``sample`` rows, which counts the rows holding each lexeme: exact
  when that is the whole org; otherwise a lexeme held by at least ``_MIN_SAMPLED`` sampled rows gets its
  frequency scaled up from the sample, and a rarer term is counted through the GIN index (a bounded
  read, since it is rare). They are kept for ``ttl`` seconds per (org, kind) and dropped at once when
  this process writes to the org;
* the match is pruned by IDF: the rarest terms, as many as together match at most ``cap`` rows (and at
  least the rarest one that matches at all), select the candidates, at most ``cap`` of them; the other
  terms only add to their scores. Only when fewer than ``limit`` rows match the rare terms are rows
  matching the others ranked too, again at most ``cap`` of them (words that common carry little
  evidence: their IDF is near zero). An org with fewer than ``cap`` rows of a kind, and any search among
  given parents (a record's memories), gets the complete ranking;
* a search over sections for a viewer (a caller's roles and the records its call is about) counts its
  statistics over what that viewer may see: the sample is of the org's unrestricted documents' rows (every
  caller of the org may see them), and the rows of the restricted documents the viewer may see are
  counted exactly and added (the org's restricted documents are read once per ``ttl``, and the viewer's
  share judged by the rule from them); a section it may not see never moves a score;
* each org's rows are its own partition of the table, with its own GIN index (schema version 5), and
  the store runs these statements unprepared, each planned for its org's partition: a match reads no
  other org's postings, and what other orgs hold never changes how long an org's searches take.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .base import RESTRICTED_SQL, RestrictedIndex, Viewer

_K1, _B = 1.2, 0.75  # FTS5's bm25() constants
#: BM25 of row ``s`` (its ``length`` in tokens is stored beside its ``tsvector``), given the average row
#: length (%b), for the terms' lexemes (%b text[]) with their IDFs (%b float8[]). A term's frequency counts each occurrence in a section's title or heading (weight A) twice,
#: one in its text (B) or in a memory once, as the SQLite store's bm25() column weights do.
_BM25 = (
    "(SELECT coalesce(sum(q.idf * q.f * ({k1} + 1) / (q.f + {k1} * (1 - {b} + {b} * s.length / %b))), 0) "
    "FROM (SELECT k.idf, sum(CASE w WHEN 'A' THEN 2.0 ELSE 1.0 END) AS f FROM unnest(s.tsv) u "
    "JOIN unnest(%b::text[], %b::float8[]) WITH ORDINALITY AS k(lexeme, idf, n) ON k.lexeme = u.lexeme "
    "CROSS JOIN unnest(u.weights) w GROUP BY k.n, k.idf) q)"
)
_MIN_SAMPLED = 5  # sampled rows holding a lexeme for its document frequency to be estimated from the sample
_SAMPLES = 256  # (org, kind) samples kept per process
_TABLES = {"section": ("sections", "document"), "memory": ("memories", "record")}  # content table, parent column

Query = Callable[[str, str, Sequence[Any]], list[tuple]]  # (org, sql, params) -> rows


class TextSearch:
    def __init__(self, query: Query, *, cap: int = 500, ttl: float = 300.0, sample: int = 5_000) -> None:
        self._query = query
        self.cap = cap
        self.sample = sample
        self.ttl = ttl
        self._samples: OrderedDict[tuple[str, str], _Sample] = OrderedDict()  # (org, kind) -> statistics
        self._lexeme: dict[str, str | None] = {}  # term -> its lexeme (the english configuration does not change)
        self._df: dict[tuple[str, str, str], tuple[int, float]] = {}  # (org, kind, term) -> (df, when counted)
        self._restricted: OrderedDict[str, tuple[RestrictedIndex[str], float]] = OrderedDict()  # org -> its restricted documents
        self._shown: OrderedDict[tuple[str, frozenset[str]], _Shown] = OrderedDict()  # (org, documents) -> their rows' statistics
        #: org -> how many times this process wrote to it: what was read before a write ends is not kept after it
        self._epochs: dict[str, int] = {}

    def forget(self, orgs: set[str]) -> None:
        """Drop the statistics of ``orgs`` (this process just wrote to them)."""
        for org in orgs:
            self._epochs[org] = self._epochs.get(org, 0) + 1
        for key in [k for k in self._samples if k[0] in orgs]:
            del self._samples[key]
        self._df = {k: v for k, v in self._df.items() if k[0] not in orgs}
        for org in orgs:
            self._restricted.pop(org, None)
        for shown in [k for k in self._shown if k[0] in orgs]:
            del self._shown[shown]

    def search(
        self, kind: str, found: list[str], *, org: str, limit: int, parents: Sequence[str] | None, viewer: Viewer | None = None
    ) -> list[tuple]:
        """(id, parent, score) of the best ``limit`` rows of ``kind`` matching any of the terms ``found``; with
        ``viewer`` (sections), among the sections it may see alone (the org's unrestricted documents' and the
        restricted ones it may see, as the database holds them now), scored with their statistics."""
        table, parent = _TABLES[kind]
        lexeme = self._lexemes(org, found)
        shown = self.shown(org, viewer) if kind == "section" and viewer is not None else None
        rows, avg_length, df = self._statistics(org, kind, found, lexeme, shown)
        idf = {t: max(1e-6, math.log((max(rows, df[t]) - df[t] + 0.5) / (df[t] + 0.5))) for t in found}
        # terms in half the rows or more have no weight (BM25's IDF floor) and are left out of the score
        scored = [t for t in found if idf[t] > 1e-6 and lexeme[t]] or [t for t in found if lexeme[t]][:1]
        score = _BM25.format(k1=_K1, b=_B)
        weighted = [avg_length, [lexeme[t] for t in scored], [idf[t] for t in scored]]
        scope, scope_params = "org = %b", [org]  # type: str, list[Any]
        if shown is not None:  # a viewer's search is a copy of the org holding what it may see: nothing else takes a place
            scope += (f" AND ({parent} = ANY(%b::text[]) OR NOT EXISTS (SELECT 1 FROM documents d "
                      f"WHERE d.org = %b AND d.id = {parent} AND {RESTRICTED_SQL}))")  # fmt: skip
            scope_params += [sorted(shown), org]
        rare: list[str] = []
        if parents is not None:  # a few parents' rows come from the (org, parent) index: match every term
            scope += f" AND {parent} = ANY(%b::text[])"
            scope_params.append(list(dict.fromkeys(parents)))
            rare = list(found)
        else:
            matched = 0
            for term in sorted(found, key=lambda t: (df[t], t)):  # rarest first, at least one that matches
                if matched and matched + df[term] > self.cap:
                    break
                rare.append(term)
                matched += df[term]
        common = [t for t in found if t not in rare]
        # among parents, their rows come from the (org, parent) index and are filtered by the query (OFFSET 0
        # fences the filter off, or the planner intersects with a GIN scan of every row holding a common word)
        fts = f"{table}_fts" if parents is None else f"(SELECT * FROM {table}_fts WHERE {scope} OFFSET 0) p"
        fts_params = [] if parents is None else scope_params
        if parents is not None and kind == "memory":  # the record index covers the rows that fit it (not ``wide``),
            # a second one the long memories (schema version 6)
            columns = "org, id, record, tsv, length"  # what the record index covers: read from it alone
            fts = (f"((SELECT {columns} FROM {table}_fts WHERE {scope} AND NOT wide OFFSET 0) UNION ALL "
                   f"(SELECT {columns} FROM {table}_fts WHERE {scope} AND wide OFFSET 0)) p")  # fmt: skip
            fts_params = [*scope_params, *scope_params]
        cap = self.cap if parents is None else 2**31 - 1  # a few parents' rows are all ranked
        # hits leave the store only if the content table (row-level security) agrees they are the org's
        visible = f"WHERE EXISTS (SELECT 1 FROM {table} c WHERE c.org = %b AND c.id = r.id) ORDER BY score DESC, id"
        # past ``shortlist`` candidates, PostgreSQL's own ts_rank (C, a few microseconds a row) picks which of
        # them BM25 scores (a subquery per row, ~15 microseconds); a search among parents scores them all
        shortlist = max(3 * int(limit), 100) if parents is None else cap

        def candidates(match: str, match_params: list[Any], ranked: list[str]) -> tuple[str, list[Any]]:
            return (
                f"(SELECT * FROM (SELECT * FROM {fts} WHERE {scope} AND {match} LIMIT %b) c "
                f"ORDER BY ts_rank(c.tsv, {_any(ranked)}) DESC, c.id LIMIT %b)",
                [*fts_params, *scope_params, *match_params, cap, *ranked, shortlist],
            )

        shortlisted, params = candidates(f"tsv @@ ({_any(rare)})", rare, rare)
        out = self._query(
            org,
            f"SELECT * FROM (SELECT id, {parent}, {score} AS score FROM {shortlisted} s ORDER BY score DESC, id LIMIT %b) r {visible}",
            [*weighted, *params, int(limit), org],
        )
        if common and len(out) < limit:
            shortlisted, params = candidates(f"tsv @@ ({_any(common)}) AND NOT tsv @@ ({_any(rare)})", [*common, *rare], common)
            out += self._query(
                org,
                f"SELECT * FROM (SELECT id, {parent}, {score} AS score FROM {shortlisted} s ORDER BY score DESC, id LIMIT %b) r {visible}",
                [*weighted, *params, int(limit) - len(out), org],
            )
            out.sort(key=lambda row: (-row[2], row[0]))
        return out

    def _lexemes(self, org: str, found: list[str]) -> dict[str, str | None]:
        """Each term's lexeme (its first token's, for a code: the whole hyphenated code), None for a stop word."""
        missing = [t for t in found if t not in self._lexeme]
        if missing:
            rows = self._query(
                org,
                "SELECT t, (SELECT lexeme FROM unnest(to_tsvector('english', t)) u WHERE 1 = ANY(u.positions)) "
                "FROM unnest(%b::text[]) t",
                [missing],
            )
            if len(self._lexeme) > 100_000:
                self._lexeme.clear()
            self._lexeme.update((term, lex) for term, lex in rows)
        return {t: self._lexeme.get(t) for t in found}

    def shown(self, org: str, viewer: Viewer) -> frozenset[str] | None:
        """The restricted documents of ``org`` that ``viewer`` may see (None: the org restricts none)."""
        now, epoch = time.monotonic(), self._epochs.get(org, 0)
        kept = self._restricted.get(org)
        if kept is None or now - kept[1] > self.ttl:
            rows = self._query(
                org,
                f"SELECT d.id, d.is_system, d.visible_to_roles, d.attached_record FROM documents d WHERE d.org = %b "
                f"AND {RESTRICTED_SQL}",
                [org],
            )  # fmt: skip
            kept = (RestrictedIndex((str(r[0]), bool(r[1]), r[2], r[3]) for r in rows), now)
            if self._epochs.get(org, 0) == epoch:  # no write of this process ended meanwhile
                self._restricted[org] = kept
                while len(self._restricted) > _SAMPLES:
                    self._restricted.popitem(last=False)
        if org in self._restricted:
            self._restricted.move_to_end(org)
        return kept[0].shown(viewer) if kept[0].keys else None

    def _shown_statistics(self, org: str, documents: frozenset[str], lexemes: list[str]) -> "_Shown":
        """How many sections ``documents`` hold, their tokens, and how many hold each of ``lexemes`` (exact;
        kept for ``ttl`` seconds, dropped when this process writes to the org)."""
        key, now, epoch = (org, documents), time.monotonic(), self._epochs.get(org, 0)
        shown = self._shown.get(key)
        if shown is None or now - shown.when > self.ttl:
            rows, tokens = self._query(
                org, "SELECT count(*), coalesce(sum(length), 0) FROM sections_fts WHERE org = %b AND document = ANY(%b::text[])",
                [org, sorted(documents)],
            )[0]  # fmt: skip
            shown = _Shown(int(rows), int(tokens), {}, now)
            if self._epochs.get(org, 0) == epoch:
                self._shown[key] = shown
                while len(self._shown) > _SAMPLES:
                    self._shown.popitem(last=False)
        if key in self._shown:
            self._shown.move_to_end(key)
        missing = sorted({lex for lex in lexemes if lex not in shown.lexemes})
        if missing:
            counted = dict(self._query(
                org,
                "SELECT u.lexeme, count(*) FROM sections_fts f, unnest(f.tsv) u WHERE f.org = %b "
                "AND f.document = ANY(%b::text[]) AND u.lexeme = ANY(%b::text[]) GROUP BY u.lexeme",
                [org, sorted(documents), missing],
            ))  # fmt: skip
            fresh = {lex: int(counted.get(lex, 0)) for lex in missing}
            if self._epochs.get(org, 0) == epoch:
                shown.lexemes.update(fresh)
            else:  # read across a write: for this search alone
                shown = _Shown(shown.rows, shown.tokens, {**shown.lexemes, **fresh}, shown.when)
        return shown

    def _statistics(
        self, org: str, kind: str, found: list[str], lexeme: dict[str, str | None], shown: frozenset[str] | None = None
    ) -> tuple[int, float, dict[str, int]]:
        """Rows of ``kind`` in the org, their average length in tokens, and each term's document frequency;
        with ``shown`` (the restricted documents a viewer may see), those of the org's unrestricted sections
        plus those of ``shown``'s."""
        public = shown is not None
        stats = self._sample(org, kind, public=public)
        now = time.monotonic()
        df: dict[str, int] = {}
        rarer: list[str] = []
        kinds = f"{kind} public" if public else kind  # the statistics' cache key
        epoch = self._epochs.get(org, 0)
        for term in found:
            lex = lexeme[term]
            hits = stats.lexemes.get(lex, 0) if lex is not None else 0
            if lex is None or stats.complete:
                df[term] = hits  # a stop word; or the sample is the whole org, so its counts are exact
            elif hits >= _MIN_SAMPLED:
                df[term] = round(stats.rows * hits / stats.size)
            elif now - self._df.get((org, kinds, term), (0, -math.inf))[1] <= self.ttl:
                df[term] = self._df[(org, kinds, term)][0]
            else:
                rarer.append(term)
        if rarer:  # rare in the sample, so rare in the org: counted through the GIN index, a bounded read
            bound = max(self.cap, 4 * _MIN_SAMPLED * stats.rows // max(stats.size, 1))
            table, _ = _TABLES[kind]
            counted = self._query(
                org,
                f"SELECT t, (SELECT count(*) FROM (SELECT 1 FROM {table}_fts f WHERE org = %b "
                f"AND tsv @@ phraseto_tsquery('english', t){_PUBLIC if public else ''} LIMIT %b) s) FROM unnest(%b::text[]) t",
                [org, bound, rarer],
            )
            if len(self._df) > 100_000:  # bounded, as the lexeme cache is
                self._df.clear()
            for term, n in counted:
                df[term] = int(n)
                if self._epochs.get(org, 0) == epoch:
                    self._df[(org, kinds, term)] = (int(n), now)
        if not public:
            return max(stats.rows, 1), max(stats.average_length, 1.0), df
        rows, tokens = stats.rows, stats.tokens
        if shown:  # the restricted documents the viewer may see: counted exactly
            extra = self._shown_statistics(org, shown, [lex for lex in lexeme.values() if lex is not None])
            rows, tokens = rows + extra.rows, tokens + extra.tokens
            for term in found:
                lex = lexeme[term]
                df[term] = df[term] + (extra.lexemes.get(lex, 0) if lex is not None else 0)
        return max(rows, 1), max(float(tokens) / float(rows) if rows else 1.0, 1.0), df

    def _sample(self, org: str, kind: str, *, public: bool = False) -> "_Sample":
        """The org's row count and, from its first ``sample`` rows, their average length and how many of
        them hold each lexeme; kept for ``ttl`` seconds (and for at most ``_SAMPLES`` orgs and kinds). With
        ``public``, of the sections of documents every caller of the org may see."""
        key, now, epoch = (org, f"{kind} public" if public else kind), time.monotonic(), self._epochs.get(org, 0)
        cached = self._samples.get(key)
        if cached is not None and now - cached.when <= self.ttl:
            self._samples.move_to_end(key)
            return cached
        table, _ = _TABLES[kind]
        only = _PUBLIC if public else ""
        rows = self._query(
            org,
            f"WITH s AS MATERIALIZED (SELECT tsv, length FROM {table}_fts f WHERE org = %b{only} LIMIT %b) "
            f"SELECT NULL, (SELECT count(*) FROM {table}_fts f WHERE org = %b{only}), count(*), sum(length) FROM s "
            "UNION ALL SELECT u.lexeme, count(*), NULL, NULL FROM s, unnest(s.tsv) u GROUP BY u.lexeme",
            [org, self.sample, org],
        )
        total, size, tokens = next((int(r[1]), int(r[2]), int(r[3] or 0)) for r in rows if r[0] is None)
        average = float(tokens) / float(size) if size else 1.0
        sample = _Sample(total, size, average if tokens else 1.0, {r[0]: int(r[1]) for r in rows if r[0] is not None}, now,
                         tokens if size >= total else round(average * total))  # fmt: skip
        if self._epochs.get(org, 0) == epoch:  # read after this process's last write to the org ended
            self._samples[key] = sample
            while len(self._samples) > _SAMPLES:
                self._samples.popitem(last=False)
        return sample


@dataclass(frozen=True)
class _Sample:
    rows: int  # of this kind in the org
    size: int  # rows sampled
    average_length: float
    lexemes: dict[str, int]  # lexeme -> sampled rows holding it
    when: float
    tokens: int  # the rows' lengths summed (estimated from the sample when it is not the whole org)

    @property
    def complete(self) -> bool:
        return self.size >= self.rows


@dataclass
class _Shown:
    """The statistics of some restricted documents' sections (exact): what a viewer who may see them adds."""

    rows: int
    tokens: int
    lexemes: dict[str, int]  # lexeme -> rows holding it
    when: float


#: a full-text row ``f`` of a section of a document every caller of its org may see
_PUBLIC = f" AND NOT EXISTS (SELECT 1 FROM documents d WHERE d.org = f.org AND d.id = f.document AND {RESTRICTED_SQL})"


def _any(found: Sequence[str]) -> str:
    return " || ".join(["phraseto_tsquery('english', %b)"] * len(found))
