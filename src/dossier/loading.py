"""Loading bundles and markdown documents: validate everything, embed what changed, write atomically.

A load is idempotent by id. Each item's content hash decides whether it is inserted, updated or left
alone; each vector's text hash decides whether it is recomputed. Nothing is written unless the whole
bundle is valid and every reference resolves (in the bundle or already in the store, same org). Keys
and fields the bundle model does not know are ignored and listed in the :class:`LoadReport`; a bundle
with nothing to load is refused. A record pending deletion has no property vectors, so discovery by
property never finds it.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import tempfile
import time
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from pydantic import BaseModel, ValidationError

from .bundle import ITEM_MODELS, Bundle, Document, Identifiers, Section, content_hash, has_value, property_display
from .bundle_source import BundleSource
from .errors import BundleError, InvalidRequest, Problem, UsageError
from .identifiers import NUL_MESSAGE, clip, nul_path
from .providers.embeddings import Embedder
from .stores.base import ItemKind, Store, VectorKind, VectorWrite, WriteBatch, property_key

Progress = Callable[[int, int], None]  # (done, total): texts of changed items embedded (or found current)
_SINGULAR: dict[str, ItemKind] = {
    "orgs": "org", "callers": "caller", "records": "record",
    "memories": "memory", "documents": "document", "edges": "edge",
}  # fmt: skip


@dataclass
class LoadReport:
    """What one load did, per kind (orgs, callers, records, memories, documents, edges)."""

    inserted: dict[str, int] = field(default_factory=dict)
    updated: dict[str, int] = field(default_factory=dict)
    unchanged: dict[str, int] = field(default_factory=dict)
    embedded: int = 0
    seconds: float = 0.0
    #: top-level keys of the bundle that were not loaded (not one of the lists above)
    ignored_keys: list[str] = field(default_factory=list)
    #: per list, the unknown fields that were ignored and on how many items (``identifiers.fax``)
    ignored_fields: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def total_inserted(self) -> int:
        return sum(self.inserted.values())

    @property
    def total_updated(self) -> int:
        return sum(self.updated.values())

    def ignored_lines(self) -> list[str]:
        """What the load ignored, one line per kind of thing, for a person to read."""
        lines = [f"ignored top-level keys: {', '.join(self.ignored_keys)}"] if self.ignored_keys else []
        for list_name, fields in self.ignored_fields.items():
            named = ", ".join(f"{name} ({count})" for name, count in fields.items())
            lines.append(f"ignored fields of {list_name}: {named}")
        return lines


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def section_text(document: Document, section: Section) -> str:
    """What a section's vector is computed from: where it sits, then what it says."""
    return f"{document.title}: {section.heading}\n{section.text}".strip()


def property_text(name: str, value: Any) -> str:
    """What a property's vector is computed from: ``name: value``, a list as ``name: v1, v2``."""
    return f"{name.replace('_', ' ')}: {property_display(value)}"


# -- parsing -------------------------------------------------------------------------------------------
_LISTED_NAMES = 100  # distinct ignored names listed per kind; the rest are counted under "(others)"
_NESTED: dict[str, tuple[str, type[BaseModel]]] = {"records": ("identifiers", Identifiers), "documents": ("sections", Section)}


def read_bundle(source: str | Path | Mapping[str, Any]) -> Bundle:
    """Parse and validate a bundle; every problem is collected (with its item id) before raising.

    Keys and fields the model does not know are left out and remembered on the bundle (``_ignored_keys``,
    ``_ignored_fields``), so that the load report can list them."""
    raw = _read_json(source) if isinstance(source, (str, Path)) else source
    if not isinstance(raw, Mapping):
        raise BundleError([Problem("bundle", None, "must be a JSON object with lists such as 'records'")])
    problems: list[Problem] = []
    parsed: dict[str, list[Any]] = {}
    ignored: dict[str, dict[str, int]] = {}
    for list_name in ITEM_MODELS:
        items = raw.get(list_name)
        kind = _SINGULAR[list_name]
        if items is None:
            continue
        if not isinstance(items, list):
            problems.append(Problem(kind, None, f"'{list_name}' must be a list, not {_kind_name(items)}"))
            continue
        parsed[list_name] = []
        for position, item in enumerate(items):
            valid = _validated(list_name, position, item, problems, ignored)
            if valid is not None:
                parsed[list_name].append(valid)
    if problems:
        raise BundleError(problems)
    bundle = Bundle(**parsed)
    bundle._ignored_keys = [clip(k, 60, quote=False) for k in raw if k not in ITEM_MODELS][:_LISTED_NAMES]
    bundle._ignored_fields = ignored
    return bundle


def _named(item_id: object) -> str:
    """An item id as a problem names it: at most 100 characters of it."""
    return clip(item_id, quote=False)


def _unknown_fields(list_name: str, model: type[BaseModel], item: Mapping[str, Any]) -> list[str]:
    names = [str(k) for k in item if k not in model.model_fields]
    nested, nested_model = _NESTED.get(list_name, ("", BaseModel))
    children = item.get(nested)
    for child in children if isinstance(children, list) else [children]:
        if isinstance(child, Mapping):
            names.extend(f"{nested}.{k}" for k in child if k not in nested_model.model_fields)
    return list(dict.fromkeys(names))


def _count(counts: dict[str, int], name: str) -> None:
    name = clip(name, 60, quote=False)
    if name not in counts and len(counts) >= _LISTED_NAMES:
        name = "(others)"
    counts[name] = counts.get(name, 0) + 1


_TYPE_MESSAGES = {
    "bool_type": "must be true or false", "string_type": "must be a string",
    "int_type": "must be a whole number", "float_type": "must be a number",
    "list_type": "must be a list", "tuple_type": "must be a list",
    "dict_type": "must be an object", "model_type": "must be an object",
}  # fmt: skip


def _kind_name(value: Any) -> str:
    names = {str: "a string", bool: "a boolean", int: "a number", float: "a number", list: "a list",
             dict: "an object", type(None): "null"}  # fmt: skip
    return names.get(type(value), f"a {type(value).__name__}")


def _message(err: Any) -> str:
    """One readable line for one validation error: where, what was wrong, never the whole input."""
    loc = clip(".".join(str(p) for p in err["loc"]) or "item", quote=False)
    kind = err["type"]
    if kind in _TYPE_MESSAGES:
        text = f"{_TYPE_MESSAGES[kind]}, not {_kind_name(err.get('input'))}"
    elif kind == "missing":
        text = "is required"
    else:
        text = str(err["msg"]).removeprefix("Value error, ")
    return f"{loc}: {text}"


def _read_json(path: str | Path) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a leading byte order mark is skipped
    except OSError as exc:
        raise UsageError(f"cannot read bundle {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise BundleError([Problem("bundle", None, f"{path} is not valid JSON: {exc}")]) from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:  # one line: what, then line, column and character
        raise BundleError([Problem("bundle", None, f"{path} is not valid JSON: {exc}")]) from exc


# -- checking ------------------------------------------------------------------------------------------
def check_references(bundle: Bundle, store: Store) -> list[Problem]:
    """Duplicate ids, section ids another document holds, dangling references (memory on an unknown
    record, edge to an unknown record, caller of an unknown org, ...) and merge cycles, resolved against
    the bundle and the store, per org."""
    scan = _Scan(store, LoadReport())
    for list_name in ITEM_MODELS:
        for position, item in enumerate(getattr(bundle, list_name)):
            scan.add(list_name, position, item)
    return scan.reference_problems()


class _Scan:
    """The first read of a load: every item validated, ids and references collected, each item's content
    hash compared with the store's (chunk by chunk), and the items to write remembered by position (one
    bit each). What it keeps per item is its id (duplicates), its section ids and merge target, and any
    reference it could not resolve yet."""

    def __init__(self, store: Store, report: LoadReport) -> None:
        self.store, self.report = store, report
        self.problems: list[Problem] = []  # shape problems (validation): reported before references
        self.ignored: dict[str, dict[str, int]] = {}
        self.ignored_keys: list[str] = []
        self.items = 0
        self.seen: dict[str, set[tuple[str, str]]] = {name: set() for name in ITEM_MODELS}
        self.duplicates: list[Problem] = []
        self.sections: dict[tuple[str, str], str] = {}  # (org, section id) -> document id
        self.section_problems: list[Problem] = []
        self.refs: list[tuple[str, str, str, str, str]] = []  # kind, item id, org, field, record id (unresolved)
        self.merges: dict[str, dict[str, str]] = defaultdict(dict)  # org -> record id -> merged_into
        self.bundle_orgs: set[str] = set()
        self.item_orgs: dict[str, list[tuple[str, str]]] = {}  # org not in the store -> (kind, item id), in order
        self.stored_orgs: dict[str, bool] = {}
        self.changed: dict[str, bytearray] = {name: bytearray() for name in ITEM_MODELS}  # bit per position
        self.slots = 0  # vector texts of the changed items (each may need embedding)
        self._pending: list[tuple[str, int, Any]] = []

    def add_raw(self, key: str, position: int | None, value: Any) -> None:
        """One entry of the source: an item of a list (validated here), or a key that holds no list."""
        if key not in ITEM_MODELS:
            if position is None and len(self.ignored_keys) < _LISTED_NAMES and clip(key, 60, quote=False) not in self.ignored_keys:
                self.ignored_keys.append(clip(key, 60, quote=False))
            return
        if position is None:
            if value is not None:
                self.problems.append(Problem(_SINGULAR[key], None, f"'{key}' must be a list, not {_kind_name(value)}"))
            return
        where = nul_path(value)
        if where is not None:  # no text (PostgreSQL cannot store it): refused alike on both stores
            raw_id = value.get("id") if isinstance(value, Mapping) else None
            named = _named(raw_id) if isinstance(raw_id, str) and raw_id and "\x00" not in raw_id else f"#{position}"
            self.problems.append(Problem(_SINGULAR[key], named, f"{where or 'item'}: {NUL_MESSAGE}"))
            return
        item = _validated(key, position, value, self.problems, self.ignored)
        if item is not None:
            self.add(key, position, item)

    def add(self, list_name: str, position: int, item: Any) -> None:
        self.items += 1
        kind = _SINGULAR[list_name]
        org = item.id if kind == "org" else item.org
        key = (org, item.id)
        if key in self.seen[list_name]:
            self.duplicates.append(Problem(kind, _named(item.id), "duplicate id in this bundle"))
        self.seen[list_name].add(key)
        if kind == "org":
            self.bundle_orgs.add(item.id)
        else:
            self._note_org(kind, item.id, org)
        if kind == "record" and item.merged_into:
            self._ref("record", item.id, org, "merged_into", item.merged_into)
            self.merges[org][item.id] = item.merged_into
        elif kind == "memory":
            self._ref("memory", item.id, org, "record", item.record)
        elif kind == "document":
            if item.attached_record:
                self._ref("document", item.id, org, "attached_record", item.attached_record)
            uses: dict[str, int] = {}
            for s in item.sections:
                uses[s.id] = uses.get(s.id, 0) + 1
            for section_id, n in uses.items():  # one problem per section id, however often it repeats
                owner = self.sections.setdefault((org, section_id), item.id)
                if n > 1:
                    used = "used twice" if n == 2 else f"used {n} times"
                elif owner != item.id:
                    used = f"also used by document {clip(owner)}"
                else:
                    continue
                self.section_problems.append(Problem("document", _named(item.id), f"section id {clip(section_id)} is {used}"))
        elif kind == "edge":
            self._ref("edge", item.id, org, "src", item.src)
            self._ref("edge", item.id, org, "dst", item.dst)
        self._pending.append((list_name, position, item))
        if len(self._pending) >= CHUNK:
            self.flush()

    def _ref(self, kind: str, item_id: str, org: str, field_name: str, record_id: str) -> None:
        if (org, record_id) not in self.seen["records"]:  # a record read earlier in the bundle resolves it now
            self.refs.append((kind, item_id, org, field_name, record_id))

    def _note_org(self, kind: str, item_id: str, org: str) -> None:
        if org not in self.stored_orgs:
            self.stored_orgs[org] = self.store.get_org(org=org) is not None
        if not self.stored_orgs[org]:
            self.item_orgs.setdefault(org, []).append((kind, item_id))

    def flush(self) -> None:
        """Compare the pending items' content hashes with the store's; remember the ones to write."""
        by_kind: dict[tuple[str, str], list[tuple[int, Any]]] = defaultdict(list)
        for list_name, position, item in self._pending:
            by_kind[(list_name, item.id if list_name == "orgs" else item.org)].append((position, item))
        self._pending = []
        if self.problems:
            return  # the load will be refused: no need to read the store
        report = self.report
        for (list_name, org), group in by_kind.items():
            name = "memories" if list_name == "memories" else list_name
            stored = self.store.content_hashes(_SINGULAR[list_name], [i.id for _, i in group], org=org)
            bits = self.changed[list_name]
            written: list[Any] = []
            for position, item in group:
                digest = content_hash(item)
                if item.id not in stored:
                    report.inserted[name] = report.inserted.get(name, 0) + 1
                elif stored[item.id] != digest:
                    report.updated[name] = report.updated.get(name, 0) + 1
                else:
                    report.unchanged[name] = report.unchanged.get(name, 0) + 1
                    continue
                if len(bits) <= position // 8:
                    bits.extend(bytes(position // 8 + 1 - len(bits) + len(bits) // 2))
                bits[position // 8] |= 1 << (position % 8)
                self.slots += len(_texts_of(list_name, item))
                written.append(item)
            if list_name == "documents":
                self._check_stored_sections(org, written, stored)

    def _check_stored_sections(self, org: str, documents: list[Document], stored: dict[str, str]) -> None:
        """A section id is unique per org: one that a stored document other than its own holds would fail
        the write. The store reads no section by id, but every stored section has a vector keyed by its id
        (written in the same transaction), so the section vectors say which ids are taken."""
        if not documents:
            return
        taken = set(self.store.vector_hashes("section", sorted({s.id for d in documents for s in d.sections}), org=org))
        if not taken:
            return
        replaced = [d.id for d in documents if d.id in stored]  # updated in place: it keeps its own ids
        holder = {s.id: d.id for d in self.store.get_documents(replaced, org=org) for s in d.sections} if replaced else {}
        for document in documents:
            for section_id in dict.fromkeys(s.id for s in document.sections):
                if section_id in taken and holder.get(section_id) != document.id:
                    other = f"document {clip(holder[section_id])}" if section_id in holder else "another document"
                    message = f"section id {clip(section_id)} is already used by {other} in org {clip(org)}"
                    self.section_problems.append(Problem("document", _named(document.id), message))

    def reference_problems(self) -> list[Problem]:
        self.flush()  # the last chunk's stored section ids (a no-op after load_bundle's own flush)
        problems = list(self.duplicates) + list(self.section_problems)
        records_by_org: dict[str, set[str]] = defaultdict(set)
        for org, record_id in self.seen["records"]:
            records_by_org[org].add(record_id)
        exists = {org: org in self.bundle_orgs or self.stored_orgs.get(org, False) for org in {r[2] for r in self.refs}}
        wanted: dict[str, set[str]] = defaultdict(set)
        for _, _, org, _, record_id in self.refs:
            if record_id not in records_by_org[org]:
                wanted[org].add(record_id)
        stored = {org: set(self.store.content_hashes("record", sorted(ids), org=org)) for org, ids in wanted.items() if exists[org]}
        for kind, item_id, org, field_name, record_id in self.refs:
            if record_id not in records_by_org[org] and record_id not in stored.get(org, set()):
                problems.append(Problem(kind, _named(item_id), f"{field_name} refers to unknown record {clip(record_id)} in org {clip(org)}"))
        for list_name in ("callers", "records", "memories", "documents", "edges"):
            kind = _SINGULAR[list_name]
            for org, items in self.item_orgs.items():
                if org not in self.bundle_orgs:
                    problems.extend(Problem(kind, _named(i), f"unknown org {clip(org)}") for k, i in items if k == kind)
        for org, merges in self.merges.items():
            problems.extend(self._merge_cycles(org, merges))
        return problems

    def _merge_cycles(self, org: str, merges: dict[str, str]) -> list[Problem]:
        """One problem per merge cycle the bundle would make (a record merged into itself, ``a`` into ``b``
        into ``a``), following each chain through the store where it leaves the bundle, which the
        bundle's records override. Resolution could never find the survivor of such a chain."""
        into: dict[str, str | None] = dict(merges)
        frontier = {t for t in merges.values() if t not in into and (org, t) not in self.seen["records"]}
        while frontier:  # a hop at a time: stored records that the chains reach
            found = self.store.get_records(sorted(frontier), org=org)
            into.update(dict.fromkeys(frontier))
            into.update((r.id, r.merged_into) for r in found)
            frontier = {r.merged_into for r in found if r.merged_into and r.merged_into not in into
                        and (org, r.merged_into) not in self.seen["records"]}  # fmt: skip
        problems: list[Problem] = []
        done: set[str] = set()  # records whose chain is walked already
        for start in merges:
            path: dict[str, None] = {}  # this walk, in order
            node: str | None = start
            while node is not None and node not in done and node not in path:
                path[node] = None
                node = into.get(node)
            done.update(path)
            if node is None or node not in path:
                continue  # the chain ends, or joins one walked before
            cycle = list(path)[list(path).index(node):]
            named = [i for i, r in enumerate(cycle) if r in merges]
            if not named:
                continue  # a cycle among stored records only: older than this bundle, not of its making
            cycle = cycle[named[0]:] + cycle[: named[0]]
            if len(cycle) == 1:
                message = "merged_into refers to the record itself"
            else:
                shown = " -> ".join(clip(r, 60) for r in cycle[:5]) + (" -> …" if len(cycle) > 5 else "")
                message = f"merged_into makes a cycle: {shown} -> {clip(cycle[0], 60)}"
            problems.append(Problem("record", _named(cycle[0]), message))
        return problems


def _validated(list_name: str, position: int, item: Any, problems: list[Problem], ignored: dict[str, dict[str, int]]) -> Any:
    """The item as its model, or None with its problems added; unknown fields are counted in ``ignored``."""
    model = ITEM_MODELS[list_name]
    raw_id = item.get("id") if isinstance(item, Mapping) else None
    where = _named(raw_id) if raw_id not in (None, "") else f"#{position}"
    try:
        parsed = model.model_validate(item)
    except ValidationError as exc:
        problems.extend(Problem(_SINGULAR[list_name], where, _message(err)) for err in exc.errors())
        return None
    for name in _unknown_fields(list_name, model, item):
        _count(ignored.setdefault(list_name, {}), name)
    return parsed


def _texts_of(list_name: str, item: Any) -> list[tuple[str, VectorKind, str, str, str]]:
    """(org, kind, key, parent, text) of each vector ``item`` has."""
    if list_name == "records":
        if item.pending_deletion:
            return []  # its vectors are dropped (stores.write), so discovery never finds it
        return [(item.org, "property", property_key(item.id, prop), item.id, property_text(prop, value))
                for prop, value in item.properties.items() if has_value(value)]  # fmt: skip
    if list_name == "memories":
        return [(item.org, "memory", item.id, item.record, item.text)]
    if list_name == "documents":
        return [(item.org, "section", s.id, item.id, section_text(item, s)) for s in item.sections]
    return []


# -- loading -------------------------------------------------------------------------------------------
CHUNK = 1000  # items per read of the store's hashes, per embedding run, per batch written
STAGED_IN_MEMORY = 20_000  # vectors a load keeps in memory before the rest wait in a temporary file


def load_bundle(
    store: Store, embedder: Embedder, source: str | Path | Mapping[str, Any] | Bundle, *, progress: Progress | None = None,
    before_write: Callable[[], None] | None = None, guard: bool = False,
) -> LoadReport:
    """Load a bundle in three reads of its source, holding one chunk of items at a time:

    1. check: validate every item, collect ids and references, compare content hashes with the store;
       refuse the bundle (nothing written) with every problem found;
    2. embed: for the items that changed, the texts whose vectors are missing or stale, in batches;
       the vectors wait on disk once there are many (``_Staged``);
    3. write: the changed items and the new vectors, streamed into one transaction (all or nothing).

    ``progress(done, total)`` follows step 2: texts of changed items done, of ``total``. ``before_write`` runs
    once the bundle passed every check, before anything is embedded or written; what it raises refuses the
    load (the service's permission checks, so that a broken write is told it is broken before anything else).
    ``guard``: the write of a caller without the admin role, refused inside the store's write when it reaches a
    record hidden by a deletion (:attr:`~dossier.stores.base.WriteBatch.guard`).
    """
    started = time.perf_counter()
    bundle = BundleSource(source)
    report = LoadReport()
    scan = _Scan(store, report)
    if bundle.validated:
        assert isinstance(source, Bundle)
        for list_name in ITEM_MODELS:
            for n, item in enumerate(getattr(source, list_name)):
                where = nul_path(item.model_dump(mode="json"))
                if where is not None:
                    scan.problems.append(Problem(_SINGULAR[list_name], f"#{n}", f"{where}: {NUL_MESSAGE}"))
                    continue
                scan.add(list_name, n, item)
        scan.ignored_keys, scan.ignored = list(source._ignored_keys), dict(source._ignored_fields)
    else:
        for key, position, value in bundle.entries():
            scan.add_raw(key, position, value)
    if scan.problems:
        raise BundleError(scan.problems)
    scan.flush()
    report.ignored_keys, report.ignored_fields = scan.ignored_keys, scan.ignored
    if not scan.items:
        skipped = f" (ignored: {', '.join(scan.ignored_keys[:10])})" if scan.ignored_keys else ""
        raise BundleError([Problem("bundle", None, f"nothing to load: no {', '.join(ITEM_MODELS)}{skipped}")])
    problems = scan.reference_problems()
    if problems:
        raise BundleError(problems)
    if before_write is not None:
        before_write()
    with _Staged() as staged:
        report.embedded = _embed(store, embedder, bundle, scan, staged, progress)
        if any(any(bits) for bits in scan.changed.values()) or len(staged):
            store.write_many(_batches(bundle, scan, staged, guard))
    report.seconds = time.perf_counter() - started
    return report


def _changed_items(bundle: BundleSource, scan: _Scan) -> Iterator[tuple[str, Any, str]]:
    """(list name, item, content hash) of each item to write, read again from the source."""
    for key, position, value in bundle.entries():
        if position is None or key not in ITEM_MODELS:
            continue
        bits = scan.changed[key]
        if position // 8 < len(bits) and bits[position // 8] >> (position % 8) & 1:
            item: Any = value if bundle.validated else ITEM_MODELS[key].model_validate(value)
            yield key, item, content_hash(item)


def _embed(store: Store, embedder: Embedder, bundle: BundleSource, scan: _Scan, staged: "_Staged",
           progress: Progress | None) -> int:  # fmt: skip
    """Embed the texts of changed items whose stored vector is missing or was made from another text."""
    total, done, embedded = scan.slots, 0, 0
    if progress:
        progress(0, total)
    if not total:
        return 0
    slots: list[tuple[str, VectorKind, str, str, str]] = []

    def flush() -> None:
        nonlocal done, embedded
        groups: dict[tuple[str, VectorKind], list[str]] = defaultdict(list)
        for org, kind, key, _, _ in slots:
            groups[(org, kind)].append(key)
        stored = {g: store.vector_hashes(g[1], keys, org=g[0]) for g, keys in groups.items()}
        wanted = [(org, kind, key, parent, text_hash(text), text) for org, kind, key, parent, text in slots
                  if stored[(org, kind)].get(key) != text_hash(text)]  # fmt: skip
        done += len(slots) - len(wanted)
        if wanted:
            base = done

            def step(n: int) -> None:
                nonlocal done
                done += n
                if progress:
                    progress(min(done, base + len(wanted)), total)

            vectors = embedder.embed_documents([w[-1] for w in wanted], progress=step)
            done = base + len(wanted)
            for (org, kind, key, parent, digest, _), vector in zip(wanted, vectors):
                staged.add(VectorWrite(org, kind, key, parent, digest, vector))
            embedded += len(wanted)
        elif progress:
            progress(done, total)
        slots.clear()

    for list_name, item, _ in _changed_items(bundle, scan):
        slots.extend(_texts_of(list_name, item))
        if len(slots) >= CHUNK:
            flush()
    if slots:
        flush()
    return embedded


def _batches(bundle: BundleSource, scan: _Scan, staged: "_Staged", guard: bool = False) -> Iterator[WriteBatch]:
    """The changed items, then the new vectors, a chunk at a time (written in one transaction)."""
    batch, size = WriteBatch(guard=guard), 0
    for list_name, item, digest in _changed_items(bundle, scan):
        target = getattr(batch, list_name)
        target.append(item if list_name in ("orgs", "callers") else (item, digest))
        size += 1 + (len(item.sections) if list_name == "documents" else 0)
        if size >= CHUNK:
            yield batch
            batch, size = WriteBatch(guard=guard), 0
    if size:
        yield batch
    for vectors in staged.chunks(CHUNK):
        yield WriteBatch(vectors=vectors)


class _Staged:
    """Vectors computed by a load, kept until its write: in memory, then in a temporary SQLite file once
    there are more than ``in_memory`` of them (a load's memory stays bounded however large the bundle)."""

    def __init__(self, in_memory: int | None = None) -> None:
        self.in_memory = STAGED_IN_MEMORY if in_memory is None else in_memory
        self._rows: list[VectorWrite] = []
        self._count = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._db: sqlite3.Connection | None = None

    def __enter__(self) -> "_Staged":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._db is not None:
            self._db.close()
        if self._dir is not None:
            self._dir.cleanup()

    def __len__(self) -> int:
        return self._count

    def add(self, v: VectorWrite) -> None:
        self._rows.append(v)
        self._count += 1
        if len(self._rows) > self.in_memory:
            self._spill()

    def _spill(self) -> None:
        if self._db is None:
            self._dir = tempfile.TemporaryDirectory(prefix="dossier-load-")
            self._db = sqlite3.connect(Path(self._dir.name) / "vectors.db")
            self._db.execute("PRAGMA journal_mode = OFF")
            self._db.execute("PRAGMA synchronous = OFF")
            self._db.execute(
                "CREATE TABLE staged (n INTEGER PRIMARY KEY, org TEXT, kind TEXT, key TEXT, parent TEXT, hash TEXT, vector BLOB)"
            )
        with self._db:
            self._db.executemany(
                "INSERT INTO staged (org, kind, key, parent, hash, vector) VALUES (?, ?, ?, ?, ?, ?)",
                [(v.org, v.kind, v.key, v.parent, v.text_hash, np.asarray(v.vector, dtype=np.float32).tobytes()) for v in self._rows],
            )
        self._rows = []

    def chunks(self, size: int) -> Iterator[list[VectorWrite]]:
        if self._db is not None:
            last = 0
            while True:
                rows = self._db.execute(
                    "SELECT n, org, kind, key, parent, hash, vector FROM staged WHERE n > ? ORDER BY n LIMIT ?", (last, size)
                ).fetchall()
                if not rows:
                    break
                last = rows[-1][0]
                yield [VectorWrite(o, k, key, p, h, np.frombuffer(b, dtype=np.float32)) for _, o, k, key, p, h, b in rows]
        for i in range(0, len(self._rows), size):
            yield self._rows[i : i + size]


# -- markdown ------------------------------------------------------------------------------------------
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def slug(text: str, *, fallback: str | None = None) -> str:
    """An id made of ``text``: its letters and digits in lower case, of any script, accents taken off
    ("Über uns" -> "uber-uns", "価格ガイド" kept), runs of anything else one "-". A text with neither gives
    ``fallback``, or where there is none "doc-" and a digest of the text, so that two titles of no letters
    never share an id (a document added under the id of another replaces it)."""
    made = re.sub(r"[\W_]+", "-", "".join(map(_unaccented, unicodedata.normalize("NFKC", text))).lower()).strip("-")
    if made:
        return made
    return fallback if fallback is not None else "doc-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _unaccented(char: str) -> str:
    """A Latin letter without its accents ("Ü" -> "U"); any other character as it is ("ガ" keeps its mark)."""
    parts = unicodedata.normalize("NFD", char)
    return parts[0] if len(parts) > 1 and parts[0].isascii() and all(map(unicodedata.combining, parts[1:])) else char


def document_from_markdown(
    text: str,
    *,
    org: str,
    title: str | None = None,
    doc_id: str | None = None,
    doc_type: str = "guideline",
    tags: Iterable[str] = (),
    visible_to_roles: Iterable[str] | None = None,
    attached_record: str | None = None,
    is_system: bool = False,
) -> Document:
    """Split markdown at headings into sections. A lone top-level ``# Title`` names the document.

    Section ids are ``<doc id>--<heading slug>`` (numbered when a heading repeats), so loading the same
    file again maps each section onto itself and re-embeds only sections whose text changed.
    """
    lines = text.splitlines()
    headings = [(i, m) for i, line in enumerate(lines) if (m := _HEADING.match(line))]
    if headings and len(headings[0][1].group(1)) == 1 and sum(len(m.group(1)) == 1 for _, m in headings) == 1:
        first_line, match = headings.pop(0)
        title = title or match.group(2)
        lines[first_line] = ""
    if not title:
        raise InvalidRequest("the document needs a title: give one (--title, or the title field) or start the markdown "
                             "with a lone '# Title' line", field="title")  # fmt: skip
    doc_id = doc_id or slug(title)
    chunks: list[tuple[str, list[str]]] = [("", [])]
    for line in lines:
        heading_match = _HEADING.match(line)
        if heading_match:
            chunks.append((heading_match.group(2), []))
        else:
            chunks[-1][1].append(line)
    sections: list[Section] = []
    used: dict[str, int] = {}
    taken: set[str] = set()
    for heading, body in chunks:
        body_text = "\n".join(body).strip()
        if not body_text and not heading:
            continue
        base = f"{doc_id}--{slug(heading or 'introduction', fallback='section')}"
        used[base] = used.get(base, 0) + 1
        section_id = base if used[base] == 1 else f"{base}-{used[base]}"
        while section_id in taken:  # "FAQ", "FAQ", "FAQ 2" must not give "faq-2" twice
            used[base] += 1
            section_id = f"{base}-{used[base]}"
        taken.add(section_id)
        sections.append(Section(id=section_id, heading=heading or "Introduction", text=body_text))
    if not sections:
        raise UsageError("the markdown file has no text")
    return Document(
        id=doc_id, org=org, title=title, doc_type=doc_type, tags=tuple(tags),
        visible_to_roles=None if visible_to_roles is None else tuple(visible_to_roles),
        attached_record=attached_record, is_system=is_system, sections=tuple(sections),
    )  # fmt: skip

