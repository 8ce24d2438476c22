"""Persisted approximate nearest-neighbour indexes of the embedded store: one HNSW graph (usearch) per
org and kind of vector, in a file beside the database.

* **Labels are rowids** of the ``vectors`` table, so an index holds no ids: a hit's key and parent are
  read from the database (which re-checks its org and kind), and a memory that moves to another record
  changes nothing in the index.
* **Every change is logged.** Once an (org, kind) has an index (a row of ``vector_indexes``), triggers
  append each vector inserted, deleted or changed to ``vector_log`` (``sqlite_schema``, migration 4),
  whichever process or connection wrote it. An index knows the log position it reflects; before each
  search one indexed read compares that with the log, and whatever changed since is applied. Staleness
  is detected, never assumed.
* **Saved, then memory-mapped.** The file is opened as a view (mmap), so a new process answers at once
  instead of rebuilding the graph (11 to 15 minutes at 1M vectors on a 2-core machine). A view cannot
  change; rows changed since the file was written are kept beside it (the labels of the file they
  replace are skipped, their current vectors are searched exactly). A writer folds them into a new file
  once ``compact_after`` have gathered (written aside, then named in the sidecar, which is replaced
  atomically), records the file's log position in ``vector_indexes.saved_seq`` and drops the log up to it.
* **Trusted only when it checks out.** The sidecar names the database (``meta.store_id``), org, kind,
  dimensions, log position, row count and the file's size and digest. A file that is missing,
  unreadable, of another database, older than the log that is kept, or whose rows differ from the
  database's (count, sampled vectors) is rebuilt from the database.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import numpy as np

from .vector_index import similarities

_log = logging.getLogger(__name__)
_STALE_PARTIAL = 3600.0  # seconds after which a partial index file is taken for one a killed process left
_RETRY_SAVE = 300.0  # seconds after a file could not be written before a compaction tries to write one again

#: HNSW parameters. ``EF_SEARCH`` 200: at 1M memories (bench/scale.py) 64 gave recall@10 0.963 against
#: exact search (a text repeated a dozen times makes a cluster of identical vectors the search can miss);
#: PostgreSQL's store uses 200 for the same reason (docs/scaling.md). ``EXPANSION_ADD`` 64 is pgvector's
#: ef_construction default: 128 built about 3x slower here for no recall the bench could see.
CONNECTIVITY, EXPANSION_ADD, EF_SEARCH = 16, 64, 200
_DIGEST_BYTES = 1 << 16  # the head and tail of an index file that its sidecar's digest covers
_SAMPLE = 4  # rows at each end of the (org, kind) whose stored vectors an opened file must hold exactly
_PARALLEL_FROM = 20_000  # rows added at once from which all cores build (one core builds the same graph every time)
_BUILD_CHUNK = 50_000  # rows read from the database per step of a build


class AnnIndex:
    """An HNSW graph of rows as of log position ``file_seq``, plus the rows changed since (up to ``seq``)."""

    def __init__(self, base: Any, *, seq: int, path: Path | None) -> None:
        self.base = base  # usearch Index: a view of ``path``, or built in memory
        self.file_seq = self.seq = seq
        self.path = path
        self.replaced: set[int] = set()  # labels of ``base`` whose row was deleted or changed since
        self.extra: dict[int, np.ndarray] = {}  # current vectors of rows changed since ``base``
        self._extra: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def changes(self) -> int:
        return len(self.replaced) + len(self.extra)

    def __len__(self) -> int:
        return int(self.base.size) - len(self.replaced) + len(self.extra)

    def apply(self, rows: list[tuple[int, bytes | None]], seq: int) -> None:
        """Rows changed since ``self.seq`` (their current vector, or None when deleted), as of ``seq``."""
        for label, blob in rows:
            if label in self.base:
                self.replaced.add(label)
            if blob is None:
                self.extra.pop(label, None)
            else:
                self.extra[label] = np.frombuffer(blob, dtype=np.float32)
        self.seq = max(self.seq, seq)
        self._extra = None

    def nearest(self, query: np.ndarray, count: int) -> list[int]:
        """Labels of about the ``count`` rows nearest ``query``, nearest first (approximate)."""
        return [label for _, label in self._nearest(query, count, None)]

    def nearest_many(self, queries: list[np.ndarray], count: int) -> list[list[tuple[float, int]]]:
        """(cosine distance, label) of about the ``count`` rows nearest each query, nearest first (ties by
        label): the graph is searched for all of them at once, one thread per query up to the cores there
        are (two memory searches a call: 1.6 ms instead of 2.8)."""
        if len(queries) < 2 or count <= 0:
            return [self._nearest(q, count, None) for q in queries]
        ask = min(int(self.base.size), count + min(len(self.replaced), count))
        if ask <= 0:
            return [self._nearest(q, count, None) for q in queries]
        batch = self.base.search(np.stack(queries), ask, threads=min(len(queries), os.cpu_count() or 1))
        return [self._nearest(q, count, batch[i]) for i, q in enumerate(queries)]

    def _nearest(self, query: np.ndarray, count: int, first: Any) -> list[tuple[float, int]]:
        """(distance, label) of :meth:`nearest`, its first search's ``matches`` already made (None: not yet)."""
        if count <= 0:
            return []
        found: list[tuple[float, int]] = []
        size = int(self.base.size)
        ask = min(size, count + min(len(self.replaced), count))
        while ask > 0:
            matches = first if first is not None else self.base.search(query, ask, threads=1)
            first = None
            keys, distances = matches.keys.tolist(), matches.distances.tolist()
            kept = list(zip(distances, keys))
            if self.replaced:
                kept = [(d, k) for d, k in kept if k not in self.replaced]
            if len(kept) >= count or ask >= size or len(keys) < ask:
                found = kept
                break
            ask = min(size, ask * 2)
        if self.extra:
            labels, matrix = self._extra_rows()
            sims = similarities(matrix, query)
            top = np.argsort(-sims)[:count]
            found.extend((1.0 - float(sims[i]), int(labels[i])) for i in top)
        found.sort()
        return found[:count]

    def vectors(self, labels: list[int]) -> np.ndarray:
        """The stored vectors of ``labels`` (each one this index holds), as rows."""
        out = []
        from_base = [label for label in labels if label not in self.extra]
        got = dict(zip(from_base, self.base.get(np.array(from_base, dtype=np.uint64)))) if from_base else {}
        for label in labels:
            out.append(self.extra[label] if label in self.extra else got[label])
        return np.stack(out).astype(np.float32, copy=False) if out else np.zeros((0, 1), np.float32)

    def merged(self) -> Any:
        """A mutable index holding the current rows (the file loaded into memory, changes applied); None when
        the file can no longer be read (another process's compaction replaced and removed it)."""
        try:
            index = self.base if self.path is None else restore(self.path, view=False)
        except (OSError, RuntimeError, ValueError):
            index = None
        if index is None:
            return None
        gone = [label for label in self.replaced if label in index]
        if gone:
            index.remove(np.array(gone, dtype=np.uint64))
        if self.extra:
            labels, matrix = self._extra_rows()
            index.add(labels, matrix, threads=build_threads(len(labels)))
        return index

    def _extra_rows(self) -> tuple[np.ndarray, np.ndarray]:
        if self._extra is None:
            labels = np.array(list(self.extra), dtype=np.uint64)
            self._extra = labels, np.stack(list(self.extra.values())).astype(np.float32, copy=False)
        return self._extra


def _usearch() -> Any:
    """usearch's ``Index``. onnxruntime (the local embedder's runtime) is imported first when installed:
    loading it after usearch's compiled module crashes the process (onnxruntime 1.32, usearch 2.26 wheels)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        pass
    from usearch.index import Index

    return Index


def new_index(ndim: int) -> Any:
    Index = _usearch()
    return Index(ndim=ndim, metric="cos", dtype="f32", connectivity=CONNECTIVITY, expansion_add=EXPANSION_ADD,
                 expansion_search=EF_SEARCH)  # fmt: skip


def build_threads(rows: int) -> int:
    """Threads for adding ``rows`` rows (0: all cores). A parallel build is not deterministic."""
    return 0 if rows >= _PARALLEL_FROM else 1


def restore(path: Path, *, view: bool = True) -> Any:
    """The index saved at ``path``: memory-mapped (``view``, read-only) or loaded; None if unreadable."""
    index: Any = _usearch().restore(str(path), view=view)
    if index is not None:
        index.expansion_search = EF_SEARCH  # not kept in the file
    return index


class AnnIndexes:
    """The ANN indexes of one SQLite store: opened, checked, caught up, built and saved on demand.

    Reads and writes go through the store's connection under the store's lock (``db``, ``lock``).
    ``directory`` holds the files (None for an in-memory store: indexes live in memory only).
    """

    def __init__(
        self,
        db: sqlite3.Connection,
        lock: threading.RLock,
        directory: Path | None,
        *,
        compact_after: int = 5_000,
    ) -> None:
        self._db = db
        self._lock = lock
        self.directory = directory
        self.compact_after = compact_after
        self._open: dict[tuple[str, str], AnnIndex] = {}
        self._store_id: str | None = None
        self._unsaved: dict[tuple[str, str], float] = {}  # when a file could not be written, per (org, kind)
        self.builds = 0  # indexes built from the database by this process (tests read it)

    def close(self) -> None:
        self._open.clear()

    # -- the index of one (org, kind), current ------------------------------------------------------
    def get(self, org: str, kind: str) -> AnnIndex:
        """The index of ``org``'s ``kind`` vectors with every logged change applied (opened or built)."""
        with self._lock:
            index = self._open.get((org, kind))
            state = self._state(org, kind)
            if index is not None and state is not None:
                saved_seq, last_seq = state
                if saved_seq > index.seq:  # compacted elsewhere and the log behind it dropped: reopen the file
                    index = None
                elif last_seq > index.seq and not self._catch_up(org, kind, index):
                    index = None  # compacted between the look above and the catch-up's snapshot: reopen too
            if index is None or state is None:
                index = self._load(org, kind) or self._build(org, kind)
                self._open[(org, kind)] = index
            return index

    def discard(self, org: str, kind: str) -> None:
        """Forget the index of (org, kind) and remove its file, so that the next search builds it again."""
        with self._lock:
            self._open.pop((org, kind), None)
            paths = self._paths(org, kind)
            if paths is not None:
                old = _previous_file(paths[0])
                with suppress(OSError):
                    paths[0].unlink()
                if old is not None:
                    with suppress(OSError):
                        old.unlink()
            _log.warning("the ANN index of %s/%s gave a score that is no number: it is built again", org, kind)

    def registered(self, org: str, kind: str) -> bool:
        return self._state(org, kind) is not None

    def _state(self, org: str, kind: str) -> tuple[int, int] | None:
        row = self._db.execute(
            "SELECT saved_seq, coalesce((SELECT max(seq) FROM vector_log WHERE org = ? AND kind = ?), 0) "
            "FROM vector_indexes WHERE org = ? AND kind = ?",
            (org, kind, org, kind),
        ).fetchone()
        return (int(row[0]), int(row[1])) if row else None

    def _catch_up(self, org: str, kind: str, index: AnnIndex) -> bool:
        """Apply the logged changes since ``index.seq``; False (nothing applied) where a compaction has dropped
        part of that log since: the index cannot be brought up to date from it."""
        with self._snapshot() as db:
            saved = db.execute("SELECT saved_seq FROM vector_indexes WHERE org = ? AND kind = ?", (org, kind)).fetchone()
            if saved is not None and int(saved[0]) > index.seq:
                return False
            seq = db.execute("SELECT coalesce(max(seq), 0) FROM vector_log").fetchone()[0]
            rows = db.execute(
                "SELECT l.vector, v.embedding FROM (SELECT DISTINCT vector FROM vector_log "
                "WHERE org = ? AND kind = ? AND seq > ? AND seq <= ?) l "
                "LEFT JOIN vectors v ON v.rowid = l.vector AND v.org = ? AND v.kind = ?",
                (org, kind, index.seq, seq, org, kind),
            ).fetchall()
        index.apply([(int(label), blob) for label, blob in rows], int(seq))
        return True

    # -- files ---------------------------------------------------------------------------------------
    def _paths(self, org: str, kind: str) -> tuple[Path, str] | None:
        if self.directory is None:
            return None
        stem = f"{hashlib.sha256(org.encode()).hexdigest()[:20]}-{kind}"
        return self.directory / f"{stem}.json", stem

    def _load(self, org: str, kind: str) -> AnnIndex | None:
        """The saved index of (org, kind) if it is there and checks out against the database, else None."""
        paths = self._paths(org, kind)
        state = self._state(org, kind)
        if paths is None or state is None:
            return None
        sidecar, _ = paths
        try:
            meta = json.loads(sidecar.read_text(encoding="utf-8"))
            path = sidecar.parent / meta["file"]
            if (meta["store_id"], meta["org"], meta["kind"]) != (self.store_id, org, kind) or meta["seq"] < state[0]:
                return None
            if meta["seq"] > self._db.execute("SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'vector_log'").fetchone()[0]:
                return None  # written after the log this database holds: not this database's history
            if path.stat().st_size != meta["size"] or _digest(path) != meta["digest"]:
                return None
            base = restore(path)
            if base is None or int(base.size) != meta["rows"] or int(base.ndim) != meta["ndim"]:
                return None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError):
            return None
        index = AnnIndex(base, seq=int(meta["seq"]), path=path)
        if not self._catch_up(org, kind, index):
            return None
        return index if self._matches(org, kind, index) else None

    def _matches(self, org: str, kind: str, index: AnnIndex) -> bool:
        """The index holds as many rows as the database, and the rows sampled at both ends exactly."""
        count = self._db.execute("SELECT count(*) FROM vectors WHERE org = ? AND kind = ?", (org, kind)).fetchone()[0]
        if len(index) != count:
            return False
        for order in ("", " DESC"):
            for label, blob in self._db.execute(
                f"SELECT rowid, embedding FROM vectors WHERE org = ? AND kind = ? ORDER BY key{order} LIMIT ?",
                (org, kind, _SAMPLE),
            ):
                if label in index.extra:
                    continue
                if label in index.replaced or label not in index.base:
                    return False
                if index.base.get(label).tobytes() != blob:
                    return False
        return True

    def _save(self, org: str, kind: str, base: Any, seq: int) -> Path | None:
        """Write ``base`` as the file of (org, kind) at log position ``seq``; drop the log it covers. Where the
        file cannot be written (a folder that cannot be written, a full disk), the index serves from memory and
        the log is kept (the next process builds again): a search never fails for want of its file."""
        paths = self._paths(org, kind)
        path = old = None
        if paths is not None:
            sidecar, stem = paths
            path = sidecar.parent / f"{stem}-{seq}.usearch"
            old = _previous_file(sidecar)
            try:
                self._write_file(org, kind, base, seq, sidecar, path)
            except (OSError, RuntimeError) as exc:  # usearch reports a failed write as a RuntimeError
                for leftover in (_partial(path), _partial(sidecar)):
                    with suppress(OSError):  # a partial file filling a full disk goes; none there is fine
                        leftover.unlink()
                _log.warning("the ANN index of %s/%s cannot be saved beside the database (%s): it serves from memory",
                             org, kind, type(exc).__name__)  # fmt: skip
                self._unsaved[(org, kind)] = time.monotonic()
                return None
            self._unsaved.pop((org, kind), None)
        with self._write() as db:
            db.execute("UPDATE vector_indexes SET saved_seq = max(saved_seq, ?) WHERE org = ? AND kind = ?", (seq, org, kind))
            db.execute("DELETE FROM vector_log WHERE org = ? AND kind = ? AND seq <= ?", (org, kind, seq))
        if old is not None and old != path:  # only now: until saved_seq moved, other processes trusted it
            old.unlink(missing_ok=True)
        if paths is not None and path is not None:
            _sweep(paths[0].parent, paths[1], keep=path, seq=seq)
        return path

    def _write_file(self, org: str, kind: str, base: Any, seq: int, sidecar: Path, path: Path) -> None:
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        partial = _partial(path)
        base.save(str(partial))
        _fsync(partial)
        os.replace(partial, path)
        meta = {"store_id": self.store_id, "org": org, "kind": kind, "seq": seq, "rows": int(base.size),
                "ndim": int(base.ndim), "file": path.name, "size": path.stat().st_size, "digest": _digest(path)}  # fmt: skip
        partial = _partial(sidecar)
        partial.write_text(json.dumps(meta), encoding="utf-8")
        _fsync(partial)
        os.replace(partial, sidecar)

    # -- building and compacting ---------------------------------------------------------------------
    def _build(self, org: str, kind: str) -> AnnIndex:
        """Register (org, kind) (its changes are logged from now on), then build from a snapshot and save."""
        with self._write() as db:
            db.execute("INSERT OR IGNORE INTO vector_indexes (org, kind) VALUES (?, ?)", (org, kind))
        with self._snapshot() as db:  # read a chunk at a time: the build holds the graph, not the rows twice
            # the log's position as of this snapshot: its last number ever given, which a compaction that
            # dropped every entry leaves in place (the highest entry left would be 0, below the saved file's,
            # and every later search would take the index for stale and build it again)
            seq = int(db.execute(
                "SELECT max(coalesce((SELECT max(seq) FROM vector_log), 0), "
                "coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'vector_log'), 0))"
            ).fetchone()[0])  # fmt: skip
            total = db.execute("SELECT count(*) FROM vectors WHERE org = ? AND kind = ?", (org, kind)).fetchone()[0]
            ndim = db.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()
            base: Any = None
            rows = db.execute("SELECT rowid, embedding FROM vectors WHERE org = ? AND kind = ?", (org, kind))
            while chunk := rows.fetchmany(_BUILD_CHUNK):
                dims = len(chunk[0][1]) // 4
                if base is None:
                    base = new_index(dims)
                labels = np.fromiter((r[0] for r in chunk), dtype=np.uint64, count=len(chunk))
                matrix = np.frombuffer(b"".join(r[1] for r in chunk), dtype=np.float32).reshape(len(chunk), dims)
                base.add(labels, matrix, threads=build_threads(total))
        if base is None:  # no rows yet: an empty index of the store's dimensions
            base = new_index(int(str(ndim[0]).rsplit(":", 1)[1]) if ndim else 1)
        self.builds += 1
        path = self._save(org, kind, base, seq)
        if path is not None:  # answer from the file (mapped), as every later process will
            base = restore(path)
        index = AnnIndex(base, seq=seq, path=path)
        self._catch_up(org, kind, index)
        return index

    def after_write(self, org: str, kind: str, *, build_from: int) -> None:
        """After a write touching (org, kind): build its index once it holds ``build_from`` vectors, and
        fold logged changes into a new file once ``compact_after`` of them have gathered."""
        with self._lock:
            state = self._state(org, kind)
            if state is None:
                count = self._db.execute(
                    "SELECT count(*) FROM (SELECT 1 FROM vectors WHERE org = ? AND kind = ? LIMIT ?)", (org, kind, build_from)
                ).fetchone()[0]
                if count >= build_from:
                    self._open[(org, kind)] = self._build(org, kind)
                return
            pending = self._db.execute(
                "SELECT count(*) FROM (SELECT 1 FROM vector_log WHERE org = ? AND kind = ? AND seq > ? LIMIT ?)",
                (org, kind, state[0], self.compact_after),
            ).fetchone()[0]
            failed = self._unsaved.get((org, kind))
            if failed is not None and time.monotonic() - failed < _RETRY_SAVE:
                return  # no file can be written just now: the index in memory follows the log, nothing to fold into
            if pending >= self.compact_after:
                self.compact(org, kind)

    def compact(self, org: str, kind: str) -> None:
        """Fold the changes since the file into a new file (or rebuild, when a fifth of it changed)."""
        with self._lock:
            index = self.get(org, kind)
            if index.changes == 0 and index.path is not None:
                return
            if len(index.replaced) * 5 > int(index.base.size):
                self._open.pop((org, kind), None)
                self._open[(org, kind)] = self._build(org, kind)
                return
            merged = index.merged()
            if merged is None:  # its file went (another process compacted meanwhile): build from the database
                self._open.pop((org, kind), None)
                self._open[(org, kind)] = self._build(org, kind)
                return
            path = self._save(org, kind, merged, index.seq)
            if path is not None:
                merged = restore(path)
            self._open[(org, kind)] = AnnIndex(merged, seq=index.seq, path=path)

    # -- plumbing --------------------------------------------------------------------------------------
    @property
    def store_id(self) -> str:
        if self._store_id is None:
            self._store_id = str(self._db.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()[0])
        return self._store_id

    def _snapshot(self) -> "_Txn":
        return _Txn(self._db, self._lock, "BEGIN")

    def _write(self) -> "_Txn":
        return _Txn(self._db, self._lock, "BEGIN IMMEDIATE")


class _Txn:
    """One transaction on the store's connection: a read snapshot (``BEGIN``) or a write."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock, begin: str) -> None:
        self._db, self._lock, self._begin = db, lock, begin

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            self._db.execute(self._begin)
        except BaseException:
            self._lock.release()
            raise
        return self._db

    def __exit__(self, kind: object, *exc: object) -> None:
        try:
            self._db.execute("ROLLBACK" if kind is not None else "COMMIT")
        finally:
            self._lock.release()


def _digest(path: Path) -> str:
    """sha256 of the file's first and last 64 KiB and its size (a truncated or rewritten file differs)."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(_DIGEST_BYTES))
        if size > _DIGEST_BYTES:
            f.seek(max(_DIGEST_BYTES, size - _DIGEST_BYTES))
            h.update(f.read(_DIGEST_BYTES))
    return h.hexdigest()


def _partial(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: a name of this process's own, so that two
    processes saving at the same log position never write one file."""
    return path.with_name(f"{path.name}.{os.getpid()}.partial")


def _sweep(directory: Path, stem: str, *, keep: Path, seq: int) -> None:
    """Remove what earlier saves of ``stem`` left behind, an hour old: files of an older log position (a process
    killed between writing its file and removing the one before it) and partial files (a process killed while
    writing). A process that still maps an older file keeps reading it: a removed file stays readable
    to whoever has it open."""
    now = time.time()
    for leftover in [*directory.glob(f"{stem}-*"), *directory.glob(f"{stem}.json.*.partial")]:
        try:
            if leftover.name.endswith(".partial"):
                if now - leftover.stat().st_mtime > _STALE_PARTIAL:
                    leftover.unlink()
            elif (leftover.suffix == ".usearch" and leftover != keep and int(leftover.stem.rsplit("-", 1)[1]) < seq
                  and now - leftover.stat().st_mtime > _STALE_PARTIAL):  # fmt: skip
                # an hour old too: another process may have just written it and be about to open it
                leftover.unlink()
        except (OSError, ValueError, IndexError):
            continue


def _previous_file(sidecar: Path) -> Path | None:
    try:
        return sidecar.parent / json.loads(sidecar.read_text(encoding="utf-8"))["file"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

