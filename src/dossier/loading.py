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
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pydantic import BaseModel, ValidationError

from .bundle import ITEM_MODELS, Bundle, Document, Identifiers, Section, has_value, property_display
from .errors import BundleError, Problem, UsageError
from .identifiers import clip
from .providers.embeddings import Embedder
from .stores.base import ItemKind, Store, VectorKind, VectorWrite, WriteBatch, property_key

Progress = Callable[[int, int], None]  # (done, total) embeddings
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


def content_hash(item: BaseModel) -> str:
    return hashlib.sha256(item.model_dump_json().encode()).hexdigest()[:32]


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
    for list_name, model in ITEM_MODELS.items():
        items = raw.get(list_name)
        kind = _SINGULAR[list_name]
        if items is None:
            continue
        if not isinstance(items, list):
            problems.append(Problem(kind, None, f"'{list_name}' must be a list, not {_kind_name(items)}"))
            continue
        parsed[list_name] = []
        for position, item in enumerate(items):
            raw_id = item.get("id") if isinstance(item, Mapping) else None
            where = _named(raw_id) if raw_id not in (None, "") else f"#{position}"
            try:
                parsed[list_name].append(model.model_validate(item))
            except ValidationError as exc:
                problems.extend(Problem(kind, where, _message(err)) for err in exc.errors())
            else:
                for name in _unknown_fields(list_name, model, item):
                    _count(ignored.setdefault(list_name, {}), name)
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
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read bundle {path}: {exc.strerror or exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BundleError([Problem("bundle", None, f"{path} is not valid JSON: {exc}")]) from exc


# -- checking ------------------------------------------------------------------------------------------
def check_references(bundle: Bundle, store: Store) -> list[Problem]:
    """Duplicate ids and dangling references (memory on an unknown record, edge to an unknown
    record, caller of an unknown org, ...), resolved against the bundle and the store, per org."""
    problems: list[Problem] = []
    bundle_orgs = {o.id for o in bundle.orgs}
    for list_name in ITEM_MODELS:
        seen: set[tuple[str, str]] = set()
        for item in getattr(bundle, list_name):
            key = (getattr(item, "org", item.id), item.id)
            if key in seen:
                problems.append(Problem(_SINGULAR[list_name], _named(item.id), "duplicate id in this bundle"))
            seen.add(key)
    section_owner: dict[tuple[str, str], str] = {}
    for doc in bundle.documents:
        for s in doc.sections:
            owner = section_owner.setdefault((doc.org, s.id), doc.id)
            if owner != doc.id or sum(1 for x in doc.sections if x.id == s.id) > 1:
                problems.append(Problem("document", _named(doc.id), f"section id {clip(s.id)} is used twice"))

    known_orgs: dict[str, bool] = {}

    def org_exists(org: str) -> bool:
        if org not in known_orgs:
            known_orgs[org] = org in bundle_orgs or store.get_org(org=org) is not None
        return known_orgs[org]

    records_by_org: dict[str, set[str]] = defaultdict(set)
    for r in bundle.records:
        records_by_org[r.org].add(r.id)
    wanted: dict[str, set[str]] = defaultdict(set)
    refs: list[tuple[str, str, str, str, str]] = []  # kind, item id, org, field, record id
    for r in bundle.records:
        if r.merged_into:
            refs.append(("record", r.id, r.org, "merged_into", r.merged_into))
    for m in bundle.memories:
        refs.append(("memory", m.id, m.org, "record", m.record))
    for d in bundle.documents:
        if d.attached_record:
            refs.append(("document", d.id, d.org, "attached_record", d.attached_record))
    for e in bundle.edges:
        refs.append(("edge", e.id, e.org, "src", e.src))
        refs.append(("edge", e.id, e.org, "dst", e.dst))
    for _, _, org, _, record_id in refs:
        if record_id not in records_by_org[org]:
            wanted[org].add(record_id)
    stored = {org: set(store.content_hashes("record", sorted(ids), org=org)) for org, ids in wanted.items() if org_exists(org)}

    for kind, item_id, org, field_name, record_id in refs:
        if record_id not in records_by_org[org] and record_id not in stored.get(org, set()):
            problems.append(Problem(kind, _named(item_id), f"{field_name} refers to unknown record {clip(record_id)} in org {clip(org)}"))
    for list_name in ("callers", "records", "memories", "documents", "edges"):
        for item in getattr(bundle, list_name):
            if not org_exists(item.org):
                problems.append(Problem(_SINGULAR[list_name], _named(item.id), f"unknown org {clip(item.org)}"))
    return problems


# -- loading -------------------------------------------------------------------------------------------
def load_bundle(
    store: Store, embedder: Embedder, source: str | Path | Mapping[str, Any] | Bundle, *, progress: Progress | None = None
) -> LoadReport:
    started = time.perf_counter()
    bundle = source if isinstance(source, Bundle) else read_bundle(source)
    if not any(getattr(bundle, list_name) for list_name in ITEM_MODELS):
        skipped = f" (ignored: {', '.join(bundle._ignored_keys[:10])})" if bundle._ignored_keys else ""
        raise BundleError([Problem("bundle", None, f"nothing to load: no {', '.join(ITEM_MODELS)}{skipped}")])
    problems = check_references(bundle, store)
    if problems:
        raise BundleError(problems)
    report = LoadReport(ignored_keys=list(bundle._ignored_keys), ignored_fields=dict(bundle._ignored_fields))
    batch = WriteBatch()
    for list_name in ITEM_MODELS:
        kind = _SINGULAR[list_name]
        items = getattr(bundle, list_name)
        changed = _diff(store, kind, items, report)
        target = getattr(batch, list_name)
        if kind in ("org", "caller"):
            target.extend(item for item, _ in changed)
        else:
            target.extend(changed)
    pending = _vectors_to_compute(store, batch)
    texts = [slot[-1] for slot in pending]
    done = 0

    def step(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, len(texts))

    if progress:
        progress(0, len(texts))
    vectors = embedder.embed_documents(texts, progress=step)
    for (org, vector_kind, key, parent, digest, _), vector in zip(pending, vectors):
        batch.vectors.append(VectorWrite(org, vector_kind, key, parent, digest, vector))
    report.embedded = len(texts)
    if len(batch) or batch.vectors:
        store.write(batch)
    report.seconds = time.perf_counter() - started
    return report


def _diff(store: Store, kind: ItemKind, items: list[Any], report: LoadReport) -> list[tuple[Any, str]]:
    by_org: dict[str, list[Any]] = defaultdict(list)
    for item in items:
        by_org[item.id if kind == "org" else item.org].append(item)
    changed: list[tuple[Any, str]] = []
    name = kind + "s" if kind != "memory" else "memories"
    for org, group in by_org.items():
        stored = store.content_hashes(kind, [i.id for i in group], org=org)
        for item in group:
            digest = content_hash(item)
            if item.id not in stored:
                report.inserted[name] = report.inserted.get(name, 0) + 1
            elif stored[item.id] != digest:
                report.updated[name] = report.updated.get(name, 0) + 1
            else:
                report.unchanged[name] = report.unchanged.get(name, 0) + 1
                continue
            changed.append((item, digest))
    return changed


def _vectors_to_compute(store: Store, batch: WriteBatch) -> list[tuple[str, VectorKind, str, str, str, str]]:
    """(org, kind, key, parent, text hash, text) for every vector whose text is new or changed."""
    wanted: list[tuple[str, VectorKind, str, str, str]] = []  # org, kind, key, parent, text
    for record, _ in batch.records:
        if record.pending_deletion:
            continue  # its vectors are dropped (stores.write), so discovery never finds it
        for prop, value in record.properties.items():
            if has_value(value):
                wanted.append((record.org, "property", property_key(record.id, prop), record.id, property_text(prop, value)))
    for memory, _ in batch.memories:
        wanted.append((memory.org, "memory", memory.id, memory.record, memory.text))
    for document, _ in batch.documents:
        for s in document.sections:
            wanted.append((document.org, "section", s.id, document.id, section_text(document, s)))
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for org, kind, key, _, _ in wanted:
        groups[(org, kind)].append(key)
    stored = {g: store.vector_hashes(g[1], keys, org=g[0]) for g, keys in groups.items()}  # type: ignore[arg-type]
    out = []
    for org, kind, key, parent, text in wanted:
        digest = text_hash(text)
        if stored[(org, kind)].get(key) != digest:
            out.append((org, kind, key, parent, digest, text))
    return out


# -- markdown ------------------------------------------------------------------------------------------
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


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
        raise UsageError("the document needs a title: pass --title or start the file with '# Title'")
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
        base = f"{doc_id}--{slug(heading or 'introduction')}"
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

