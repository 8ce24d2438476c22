"""Nearest-neighbour search of the SQLite store: exact below a size, the persisted ANN index above it.

* **Among parents** (a record's memories, a document's sections): the parents' rows are read through the
  ``(org, kind, parent)`` index and searched exactly, each parent's block cached for the org's current
  generation (any write to the org bumps it), so a call costs what the record holds. When the parents
  hold ``ann_min_rows`` rows or more and at least a sixteenth of the org's, the org's ANN index is asked
  for more neighbours than wanted and those of other parents are dropped (the share decides how many
  more); if that still finds too few, the exact search runs after all.
* **Org-wide**: exact (one matrix of the org's rows, per generation) below ``hnsw_min_rows`` rows, the
  ANN index above.

ANN answers are rescored exactly (the index's copies of the stored vectors, the same float32 values, against
the question; a score that is no number, a copy damaged in its file, makes the search exact and the index
built again) and ordered by score then
key, as exact answers are; which rows they hold is approximate (recall is measured in bench/). Only the
hits that can rescore into the best ``limit`` are rescored: the first ``limit`` by the index's distance
and any within float32 rounding of the last of them (``_RESCORE_SLACK``), not every row a parents'
search asked for to have enough of its own.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .ann import AnnIndexes
from .vector_index import VectorIndex, exact_search_blocks, similarities

Found = list[tuple[str, str, float]]  # (key, parent, similarity), best first
_MAX_FETCH = 8192  # neighbours asked of the ANN index for a parents' search before it falls back to exact
_MIN_SHARE = 16  # parents holding less than 1/16 of the org's rows are searched exactly
_MAX_COUNTS = 1_000_000  # row counts kept per process (per parent: a few hundred bytes each)
_MAX_LABELS = 300_000  # ANN labels whose key and parent are kept per process (about 200 bytes each)
#: How far past the ``limit``-th hit (cosine distance) an ANN hit is still rescored. The index's distance
#: and the stored vector's exact score agree to about 1e-6 (float32 sums in another order); a hit beyond
#: this margin cannot rescore into the best ``limit``, so its vector is not fetched.
_RESCORE_SLACK = 1e-4
_MASKS_KEPT = 8  # masks of hidden rows kept (SQLiteVectors._mask)


class SQLiteVectors:
    def __init__(
        self,
        query: Callable[[str, Sequence[Any]], list[tuple]],
        lock: threading.RLock,
        ann: AnnIndexes,
        *,
        hnsw_min_rows: int,
        ann_min_rows: int,
        cache_bytes: int,
    ) -> None:
        self._query = query
        self._lock = lock
        self.ann = ann
        self.hnsw_min_rows = hnsw_min_rows
        self.ann_min_rows = ann_min_rows
        self.cache_bytes = cache_bytes  # bound of the per-parent vector blocks (LRU)
        self._indexes: dict[tuple[str, str], VectorIndex] = {}
        self._masks: OrderedDict[tuple[int, int], tuple[VectorIndex, frozenset[str], np.ndarray]] = OrderedDict()
        # (org, kind, parent) -> (keys, parents, matrix), valid for _generations[org]
        self._blocks: OrderedDict[tuple[str, str, str], tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
        self._rows: dict[tuple[str, str, str | None], int] = {}  # (org, kind, parent or None for all) -> rows
        # (org, kind) -> (the index's log position, {ANN label (a rowid): (key, parent)}), valid for
        # _generations[org] and while the index's log position stays (any change to the rows moves it)
        self._labels: dict[tuple[str, str], tuple[int, dict[int, tuple[str, str]]]] = {}
        self._label_count = 0
        self._generations: dict[str, int] = {}
        self._block_bytes = 0

    def close(self) -> None:
        self._indexes.clear()
        self._blocks.clear()
        self._rows.clear()
        self._labels.clear()
        self._label_count = 0
        self._block_bytes = 0
        self.ann.close()

    def search(self, kind: str, org: str, vector: np.ndarray, limit: int, parents: Sequence[str] | None,
               hidden: frozenset[str] | None = None) -> Found:  # fmt: skip
        return self.search_many(kind, org, [vector], limit, parents, hidden)[0]

    def search_many(self, kind: str, org: str, vectors: Sequence[np.ndarray], limit: int,
                    parents: Sequence[str] | None, hidden: frozenset[str] | None = None) -> list[Found]:  # fmt: skip
        """:meth:`search` for each of ``vectors``, the same answers; an ANN index is searched for all of
        them at once. ``hidden``: parents whose rows take no place (masked in an exact search, passed over in
        the ANN index's, which is asked for more while they fill its nearest)."""
        if hidden and parents is not None:
            parents = [p for p in parents if p not in hidden]
        if limit <= 0 or (parents is not None and not parents):
            return [[] for _ in vectors]
        queries = [np.asarray(v, dtype=np.float32) for v in vectors]
        with self._lock:
            self._current(org)
            if parents is None:
                rows = self._count(org, kind, None)
                if rows >= self.hnsw_min_rows and limit * 4 < rows:  # a quarter of the rows or more: a scan is exact and as cheap
                    ann = self._trusted_ann_search(kind, org, queries, limit, None, 1.0, hidden)
                    if ann is not None:
                        return [found or [] for found in ann]
                index = self._index(kind, org)
                exclude = self._mask(index, hidden) if hidden else None
                return [index.search(q, limit, exclude) for q in queries]
            answers: list[Found | None] = [None] * len(queries)
            held = sum(self._count(org, kind, p) for p in set(parents))
            if held >= self.ann_min_rows and limit * 4 < held and held * _MIN_SHARE >= self._count(org, kind, None):
                ann = self._trusted_ann_search(kind, org, queries, limit, set(parents),
                                               held / max(1, self._count(org, kind, None)), hidden)  # fmt: skip
                answers = ann if ann is not None else answers
            if all(found is not None for found in answers):
                return [found or [] for found in answers]
            keys, owners, blocks = self._vectors_of(kind, org, parents)
        return [found if found is not None else exact_search_blocks(keys, owners, blocks, q, limit)
                for found, q in zip(answers, queries)]  # fmt: skip

    def after_write(self, org: str, kind: str) -> None:
        """Keep the ANN index of (org, kind) in step with a write just committed (see AnnIndexes)."""
        self.ann.after_write(org, kind, build_from=min(self.ann_min_rows, self.hnsw_min_rows))

    # -- the ANN index --------------------------------------------------------------------------------
    def _trusted_ann_search(self, kind: str, org: str, queries: list[np.ndarray], limit: int, parents: set[str] | None,
                            share: float, hidden: frozenset[str] | None) -> list[Found | None] | None:  # fmt: skip
        """:meth:`_ann_search`, or None (search exactly) where the index scored a hit with no number: its file
        was damaged where the checks made on opening it do not read. The index is dropped and built again."""
        found = self._ann_search(kind, org, queries, limit, parents, share, hidden)
        if all(math.isfinite(score) for hits in found if hits for _, _, score in hits):
            return found
        if not all(np.isfinite(q).all() for q in queries):  # the question's own vector has no number: not the file
            return found
        self.ann.discard(org, kind)
        return None

    def _ann_search(self, kind: str, org: str, queries: list[np.ndarray], limit: int, parents: set[str] | None,
                    share: float, hidden: frozenset[str] | None = None) -> list[Found | None]:  # fmt: skip
        """Each query's best ``limit`` rows by the ANN index (None: too few among ``parents``), none of a
        ``hidden`` parent (the index is asked for more while they fill its nearest)."""
        index = self.ann.get(org, kind)
        size = len(index)
        fetch = min(size, limit if parents is None and not hidden else max(2 * limit, math.ceil(2 * limit / share)))
        scored = index.nearest_many(queries, fetch)
        first = [[label for _, label in pairs] for pairs in scored]
        # the keys and parents of all of them in one read, and the vectors of every query's hits in one
        rows = self._rows_of(org, kind, list(dict.fromkeys(label for labels in first for label in labels)), index.seq)
        hits = [self._ann_hits(kind, org, index, q, labels, rows, fetch, limit, parents, hidden) for q, labels in zip(queries, first)]
        hits = [_rescored(found, {label: d for d, label in pairs}, limit) for found, pairs in zip(hits, scored)]
        wanted = list(dict.fromkeys(h[0] for found in hits if found for h in found))
        at = {label: i for i, label in enumerate(wanted)}
        vectors = index.vectors(wanted)
        out: list[Found | None] = []
        for query, found in zip(queries, hits):
            if not found:
                out.append(None if found is None else [])
                continue
            sims = similarities(vectors[[at[h[0]] for h in found]], query)
            order = sorted(range(len(found)), key=lambda i: (-float(sims[i]), found[i][1]))[:limit]
            out.append([(found[i][1], found[i][2], float(sims[i])) for i in order])
        return out

    def _ann_hits(self, kind: str, org: str, index: Any, query: np.ndarray, labels: list[int],
                  rows: dict[int, tuple[str, str]], fetch: int, limit: int,
                  parents: set[str] | None, hidden: frozenset[str] | None = None) -> list[tuple[int, str, str]] | None:  # fmt: skip
        """(label, key, parent) of the rows of (org, kind) among ``parents`` (and of no ``hidden`` parent) from
        the ANN index's ``labels`` nearest ``query`` (``fetch`` of them asked; ``rows``: their keys and
        parents, read), asking for more while too few are left (None: still too few among ``parents``)."""
        size = len(index)
        while True:
            # rows deleted since, or of another org or kind, are not in ``rows`` and drop out
            hits = [(label, *rows[label]) for label in labels if label in rows and (parents is None or rows[label][1] in parents)
                    and not (hidden and rows[label][1] in hidden)]  # fmt: skip
            if len(hits) >= limit or fetch >= size:
                return hits
            if parents is not None and fetch >= _MAX_FETCH:
                return None
            fetch = min(size, fetch * 4)
            labels = index.nearest(query, fetch)
            rows = self._rows_of(org, kind, labels, index.seq)

    def _rows_of(self, org: str, kind: str, labels: list[int], seq: int) -> dict[int, tuple[str, str]]:
        """Key and parent of each label that is a row of (org, kind), read from the database once while
        neither the org's generation nor the index's log position ``seq`` moves (a rowid freed by a delete
        and taken by an insert moves the log, so a label never keeps another row's key)."""
        cached = self._labels.get((org, kind))
        if cached is None or cached[0] != seq:
            self._label_count -= len(cached[1]) if cached else 0
            cached = self._labels[(org, kind)] = (seq, {})
        known = cached[1]
        out = {label: known[label] for label in labels if label in known}
        missing = [label for label in labels if label not in out]
        for chunk in _chunks(missing):
            for rowid, key, parent in self._query(
                # by rowid (the unary + keeps the planner from scanning the org's rows in the parent index)
                f"SELECT rowid, key, parent FROM vectors WHERE rowid IN ({','.join('?' * len(chunk))}) AND +org = ? AND +kind = ?",
                [*chunk, org, kind],
            ):
                out[rowid] = (key, parent)
        if missing:
            if self._label_count + len(missing) > _MAX_LABELS:
                for _, table in self._labels.values():
                    table.clear()
                self._label_count = 0
            for label in missing:
                if label in out:
                    known[label] = out[label]
                    self._label_count += 1
        return out

    # -- exact search, and what it caches per generation -------------------------------------------------
    def _current(self, org: str) -> int:
        """The org's generation; the caches of an org whose generation moved are dropped first."""
        rows = self._query("SELECT generation FROM orgs WHERE id = ?", (org,))
        generation = rows[0][0] if rows else -1
        if generation < 0 or self._generations.get(org) != generation:
            for block in [k for k in self._blocks if k[0] == org]:
                self._block_bytes -= _block_size(self._blocks.pop(block))
            for counted in [k for k in self._rows if k[0] == org]:
                del self._rows[counted]
            for labelled in [k for k in self._labels if k[0] == org]:
                self._label_count -= len(self._labels.pop(labelled)[1])
            self._generations[org] = generation
        return generation

    def _count(self, org: str, kind: str, parent: str | None) -> int:
        """Rows of ``kind`` in ``org`` (of ``parent``, when given), counted once per generation."""
        key = (org, kind, parent)
        if key not in self._rows:
            if parent is None:
                sql, params = "SELECT count(*) FROM vectors WHERE org = ? AND kind = ?", [org, kind]
            else:
                sql, params = "SELECT count(*) FROM vectors WHERE org = ? AND kind = ? AND parent = ?", [org, kind, parent]
            if len(self._rows) > _MAX_COUNTS:
                self._rows.clear()
            self._rows[key] = int(self._query(sql, params)[0][0])
        return self._rows[key]

    def _vectors_of(self, kind: str, org: str, parents: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """The vectors of ``parents``: keys, parents and matrix blocks, in the order SQLite used to return them
        (each chunk of 500 parents in sorted order, each parent's rows by rowid), each parent's block cached
        for the org's current generation, so a record's vectors are read from SQLite once, not on every call."""
        blocks = self._blocks
        order = [p for chunk in _chunks(list(parents)) for p in sorted(set(chunk))]
        missing = sorted({p for p in order if (org, kind, p) not in blocks})
        fresh: dict[str, list[tuple]] = {p: [] for p in missing}
        for chunk in _chunks(missing):
            for row in self._query(
                f"SELECT key, parent, embedding FROM vectors WHERE org = ? AND kind = ? "
                f"AND parent IN ({','.join('?' * len(chunk))}) ORDER BY parent, rowid",
                [org, kind, *chunk],
            ):
                fresh[row[1]].append(row)
        found = []
        for p in order:
            block = blocks.get((org, kind, p))
            if block is None:
                block = matrix_of(fresh[p])
                blocks[(org, kind, p)] = block
                self._rows[(org, kind, p)] = len(block[0])
                self._block_bytes += _block_size(block)
            else:
                blocks.move_to_end((org, kind, p))
            found.append(block)
        while self._block_bytes > self.cache_bytes and len(blocks) > len(order):
            _, dropped = blocks.popitem(last=False)
            self._block_bytes -= _block_size(dropped)
        nonempty = [b for b in found if len(b[0])]
        if not nonempty:
            return matrix_of([])[0], matrix_of([])[1], []
        keys = np.concatenate([b[0] for b in nonempty])
        owners = np.concatenate([b[1] for b in nonempty])
        return keys, owners, [b[2] for b in nonempty]

    def _mask(self, index: VectorIndex, hidden: frozenset[str]) -> np.ndarray:
        """Which rows of ``index`` belong to a ``hidden`` parent: worked out once per index and set of parents
        (the last few kept), so a search pays one pass of numpy over it, not a set lookup per row."""
        key = (id(index), id(hidden))
        kept = self._masks.get(key)
        if kept is None or kept[0] is not index or kept[1] is not hidden:
            mask = np.fromiter((p in hidden for p in index.parents), dtype=bool, count=len(index.parents))
            kept = self._masks[key] = (index, hidden, mask)
            while len(self._masks) > _MASKS_KEPT:
                self._masks.popitem(last=False)
        self._masks.move_to_end(key)
        return kept[2]

    def _index(self, kind: str, org: str) -> VectorIndex:
        generation = self._generations.get(org, -1)
        index = self._indexes.get((org, kind))
        if index is None or index.generation != generation or generation < 0:
            keys, parents, matrix = matrix_of(
                self._query("SELECT key, parent, embedding FROM vectors WHERE org = ? AND kind = ?", (org, kind))
            )
            index = VectorIndex(keys, parents, matrix, generation)
            self._indexes[(org, kind)] = index
        return index


def matrix_of(rows: list[tuple] | list[sqlite3.Row]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = np.array([r[0] for r in rows], dtype=object)
    parents = np.array([r[1] for r in rows], dtype=object)
    if not rows:
        return keys, parents, np.zeros((0, 1), dtype=np.float32)
    matrix = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32).reshape(len(rows), -1)
    return keys, parents, matrix


def _block_size(block: tuple[np.ndarray, np.ndarray, np.ndarray]) -> int:
    return block[2].nbytes + 128 * len(block[0])  # the matrix, plus the key strings and array slots, roughly


def _chunks(values: list, size: int = 500) -> Iterator[list]:
    for i in range(0, len(values), size):
        yield values[i : i + size]


def _rescored(found: list[tuple[int, str, str]] | None, distance: dict[int, float],
              limit: int) -> list[tuple[int, str, str]] | None:  # fmt: skip
    """The hits among ``found`` (nearest first, as the ANN index ordered them) that rescoring can put in the
    best ``limit``: the first ``limit`` and any other within ``_RESCORE_SLACK`` of the last of them by the
    index's distance (the stored vectors' exact scores differ from it by float32 rounding alone). A hit
    whose distance is not known (found by a later, wider search) keeps them all."""
    if not found or len(found) <= limit or any(h[0] not in distance for h in found):
        return found
    edge = distance[found[limit - 1][0]] + _RESCORE_SLACK
    return found[:limit] + [h for h in found[limit:] if distance[h[0]] <= edge]
