"""The storage seam: a small ``Store`` protocol that SQLite and PostgreSQL both implement.

Every read and write is scoped to one org. Reads take ``org`` as a required keyword argument, so a
call without it does not type-check, and every implementation refuses an empty org at run time
(:class:`~dossier.errors.OrgRequired`). Layers and sources talk to storage only through this protocol.

``Store`` is the union of three narrower protocols, each with its own part of the contract suite
(``tests/stores/``): :class:`StoreReader` (reads by id, identifier and relation), :class:`StoreSearcher`
(full-text and vector search) and :class:`StoreWriter` (writes and the hashes a load compares). The
service's tables have a protocol of their own (:class:`~dossier.stores.service_base.ServiceStore`).

Kinds of searchable things:

* ``section``  -- a document section; full text over title, heading and text; vector per section.
* ``memory``   -- a memory; full text over its text; vector per memory.
* ``property`` -- one property value of one record; vector only (``name: value``).

A :class:`Hit` names what matched: its ``id`` (section id, memory id, or property key ``record_id/name``
from :func:`property_key`), its ``parent`` (document id, record id, record id) and a ``score`` where
higher is better (cosine similarity for vectors, negated BM25 for full text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Callable, Generic, Hashable, Iterable, Literal, Protocol, Sequence, TypeAlias, TypeVar,
                    runtime_checkable)

from ..errors import Forbidden, OrgRequired, UsageError

if TYPE_CHECKING:  # annotations only: importing the protocol loads neither numpy nor the bundle's models
    import numpy as np

    from ..bundle import Caller, Document, Edge, Memory, Org, Record
    from ..identifiers import IdentifierKind

VectorKind = Literal["section", "memory", "property"]
TextKind = Literal["section", "memory"]
ItemKind = Literal["org", "caller", "record", "memory", "document", "edge"]
VECTOR_KINDS: tuple[VectorKind, ...] = ("section", "memory", "property")
K = TypeVar("K", bound=Hashable)
#: a document ``d`` some callers of its org may not see, as SQL (both stores): a system document, one visible to
#: some roles only, or a note attached to a record; the rest are visible to every caller of the org
RESTRICTED_SQL = "(d.is_system OR d.visible_to_roles IS NOT NULL OR d.attached_record IS NOT NULL)"


@dataclass(frozen=True, slots=True)
class Hit:
    id: str
    parent: str
    score: float


@dataclass(frozen=True)
class GuardReads:
    """The reads :func:`write_guard` makes, on the write's own transaction, of one org."""

    #: record id -> (pending_deletion, merged_into), holding those rows against a concurrent change where the
    #: store can (PostgreSQL: FOR SHARE)
    records: Callable[[list[str]], dict[str, tuple[bool, str | None]]]
    memory_owners: Callable[[list[str]], dict[str, str]]  # stored memory id -> its record
    attached: Callable[[list[str]], dict[str, str | None]]  # stored document id -> its attached record
    holders: Callable[[str, str], list[str]]  # (identifier kind, normalised value) -> ids of the records holding it


def write_guard(batch: WriteBatch, reads: GuardReads) -> None:
    """Refuse a guarded batch (``batch.guard``: a caller without the admin role) that reaches a record hidden by
    a deletion (one it writes, merges into, or adds a memory or a note to, or a stored memory or note it would
    rewrite), or gives another record an identifier a live record holds. Made inside the write's transaction,
    after the service made the same checks before it, so that what another process committed between the two
    counts (a deletion, a record created with the same email). What is refused, and how, is what the service
    says (docs/service.md)."""
    if not batch.guard:
        return
    named = {r.id for r, _ in batch.records} | {r.merged_into for r, _ in batch.records if r.merged_into}
    named |= {m.record for m, _ in batch.memories} | {d.attached_record for d, _ in batch.documents if d.attached_record}
    owners = reads.memory_owners(sorted({m.id for m, _ in batch.memories}))
    notes = {doc: rec for doc, rec in reads.attached(sorted({d.id for d, _ in batch.documents})).items() if rec}
    wanted = [(r.id, kind, value) for r, _ in batch.records if not r.merged_into
              for kind, value in r.identifiers.model_dump().items() if value]  # fmt: skip
    holders = {(kind, value): reads.holders(kind, value) for _, kind, value in wanted}
    rows: dict[str, tuple[bool, str | None]] = {}
    ahead = sorted(named | set(owners.values()) | set(notes.values()) | {h for ids in holders.values() for h in ids})
    while ahead:  # the merge chains, a hop at a time
        rows.update(reads.records(ahead))
        ahead = sorted({into for _, into in rows.values() if into and into not in rows} - set(ahead))

    def end(record_id: str) -> tuple[str, bool]:
        """The record ``record_id`` is merged into at last, and whether a deletion hides it on the way."""
        seen: set[str] = set()
        at = record_id
        while at in rows and at not in seen:
            pending, into = rows[at]
            if pending:
                return at, True
            seen.add(at)
            if into is None:
                break
            at = into
        return at, False

    for memory_id, owner in sorted(owners.items()):  # the owner is not named: the caller may not know it
        if end(owner)[1]:
            raise Forbidden(f"memory {memory_id!r} exists and this caller may not change it")
    for document_id, record_id in sorted(notes.items()):
        if end(record_id)[1]:
            raise Forbidden(f"document {document_id!r} exists and this caller may not see it, so cannot replace it")
    for record_id in sorted(named):
        if record_id in rows and rows[record_id][0]:
            raise UsageError(f"record {record_id!r} is pending deletion: nothing can be added to it")
        if end(record_id)[1]:
            raise UsageError(f"record {record_id!r} is merged into a record pending deletion: nothing can be added to it")
    given: dict[tuple[str, str], str] = {}
    for record_id, kind, value in wanted:
        other = given.setdefault((kind, value), record_id)
        if other != record_id:
            raise Forbidden(f"{kind} {value!r} is given to two records in one request ({other!r} and {record_id!r}): "
                            "only the admin role does that")  # fmt: skip
        if record_id in holders[(kind, value)]:
            continue  # the record holds it already: not given to it now
        for holder in holders[(kind, value)]:
            survivor, hidden = end(holder)
            if not hidden and survivor != record_id:
                raise Forbidden(f"{kind} {value!r} already names record {holder!r}: only the admin role gives it to "
                                "another record (or merge the two, merged_into)")  # fmt: skip


def merge_cycle(merged_into: Callable[[str], str | None], start: str, *, most: int = 10_000) -> list[str] | None:
    """The merge cycle the record ``start`` is on, in order from it (``merged_into`` reads a record's target, None
    when it has none or is not there), or None. A store's write checks the records it merges before it commits,
    so that two loads merging ``a`` into ``b`` and ``b`` into ``a`` at once cannot both land (each passed the
    loader's own check, made before either wrote)."""
    path, at = [start], {start: 0}
    node = start
    while len(path) <= most:
        target = merged_into(node)
        if target is None:
            return None
        if target in at:
            return path[at[target]:]
        at[target] = len(path)
        path.append(target)
        node = target
    return None


def merge_cycle_error(org: str, cycle: list[str]) -> str:
    """What a store's write says when its merges would close ``cycle``."""
    from ..identifiers import clip

    shown = " -> ".join(clip(r, 60) for r in cycle[:5]) + (" -> ..." if len(cycle) > 5 else "")
    return (f"merged_into makes a cycle in org {clip(org, 60)} with records written meanwhile: {shown} -> "
            f"{clip(cycle[0], 60)} (another load merged them the other way); nothing was written")


@dataclass(frozen=True, slots=True)
class DocumentAccess:
    """Who may see a document that not everyone of its org may (:meth:`StoreReader.restricted_documents`):
    what the visibility rule reads of it, without its sections."""

    id: str
    org: str
    is_system: bool
    visible_to_roles: tuple[str, ...] | None
    attached_record: str | None


@dataclass(frozen=True, slots=True)
class Viewer:
    """A caller as the visibility rule sees it: its roles and the records its call is about (the record, its
    merged-away records and aliases). A full-text search over sections given a viewer counts its word
    statistics (how many sections, their average length, how many hold each word) over the sections this
    viewer may see, so that what it may not see never moves a score (:meth:`StoreSearcher.search_text`)."""

    roles: frozenset[str]
    record_ids: frozenset[str]

    def may_see(self, access: DocumentAccess) -> bool:
        """The visibility rule (``pipeline.visibility.verdict``) on a restricted document of the viewer's org."""
        return self.allows(access.is_system, access.visible_to_roles, access.attached_record)

    def allows(self, is_system: bool, roles: Sequence[str] | None, attached_record: str | None) -> bool:
        """:meth:`may_see` on a document's access fields (``is_system``, ``visible_to_roles``, ``attached_record``)."""
        if is_system:
            return False
        if roles is not None and self.roles.isdisjoint(roles):
            return False
        return attached_record is None or attached_record in self.record_ids


#: a restricted document as :class:`RestrictedIndex` keeps it: the store's key for it, then its access fields
#: (``is_system``, ``visible_to_roles``, ``attached_record``)
Restricted: TypeAlias = "tuple[K, bool, Sequence[str] | None, str | None]"


class RestrictedIndex(Generic[K]):
    """An org's restricted documents (:data:`Restricted`), each with a key of the store's choosing (the SQLite
    store's row slot, the PostgreSQL store's document id), grouped so that what a viewer may see among them
    costs what it may see: the documents attached to no record are judged for every viewer, those attached to a
    record only for the viewers whose call is about it."""

    def __init__(self, rows: Iterable[Restricted[K]]) -> None:
        self._unattached: list[Restricted[K]] = []
        self._attached: dict[str, list[Restricted[K]]] = {}
        keys = []
        for row in rows:
            keys.append(row[0])
            if row[3] is None:
                self._unattached.append(row)
            else:
                self._attached.setdefault(row[3], []).append(row)
        self.keys: frozenset[K] = frozenset(keys)
        self._shown: dict[tuple[frozenset[str], frozenset[str]], frozenset[K]] = {}

    def shown(self, viewer: Viewer) -> frozenset[K]:
        """The keys of the restricted documents ``viewer`` may see."""
        cache_key = (viewer.roles, frozenset(viewer.record_ids & self._attached.keys()))
        found = self._shown.get(cache_key)
        if found is None:
            rows = [*self._unattached, *(row for r in sorted(cache_key[1]) for row in self._attached[r])]
            found = frozenset(key for key, system, roles, attached in rows if viewer.allows(system, roles, attached))
            if len(self._shown) >= _SHOWN_KEPT:
                self._shown.clear()
            self._shown[cache_key] = found
        return found


_SHOWN_KEPT = 1_024  # viewers' answers a RestrictedIndex keeps


def shown_records(store: Any, ids: Sequence[str], *, org: str) -> set[str]:
    """Those of ``ids`` that exist and are not hidden by a deletion: neither pending deletion themselves nor
    merged (directly or not) into a record that is (it is hidden with what was merged into it). ``store``
    is a :class:`Store`; the chains are read a hop at a time."""
    rows = {r.id: r for r in store.get_records(list(ids), org=org)}
    ahead = {r.merged_into for r in rows.values() if r.merged_into} - set(rows)
    while ahead:
        found = store.get_records(sorted(ahead), org=org)
        rows.update((r.id, r) for r in found)
        ahead = {r.merged_into for r in found if r.merged_into} - set(rows)

    def shown(record_id: str) -> bool:
        row, seen = rows.get(record_id), set()
        if row is None:
            return False
        while row is not None and row.id not in seen:
            if row.pending_deletion:
                return False
            seen.add(row.id)
            row = rows.get(row.merged_into or "")
        return True

    return {i for i in ids if shown(i)}


@dataclass(frozen=True, slots=True)
class EdgeHop:
    edge: Edge
    hops: int


#: A store's read of one hop: the walkable edges touching ``frontier``, best first (confidence, weight
#: descending, then id), at most ``fetch`` of them, and whether that is all of them.
HopReader: TypeAlias = "Callable[[list[str], int], tuple[list[Edge], bool]]"


def walk_edges(record_ids: Sequence[str], *, max_hops: int, limit: int, read_hop: HopReader,
               shown: Callable[[list[str]], set[str]] | None = None) -> list[EdgeHop]:  # fmt: skip
    """Breadth first, hop by hop, as every store walks: an edge is reached at the first hop that touches
    one of its ends, and every edge of hop h ranks before those of hop h + 1. A hop reads at most
    ``limit`` + the edges already seen: when that read is cut short, ``limit`` new edges of this hop are in
    hand, later hops cannot place, and the walk ends (a hub record with thousands of edges costs one
    bounded read, not a walk through all of its neighbours).

    ``shown`` (:func:`shown_records` of the store) is asked, once per hop, which of the new ends the walk may
    pass: an edge with an end hidden by a deletion is dropped and the walk goes no further through that end
    (``read_hop`` drops those pending deletion themselves; this catches what is merged into them)."""
    if not record_ids or max_hops < 1 or limit <= 0:
        return []
    seen: dict[str, EdgeHop] = {}
    visited = set(record_ids)
    passable, hidden = set(record_ids), set[str]()
    frontier = sorted(visited)
    for hop in range(1, max_hops + 1):
        if not frontier or len(seen) >= limit:
            break
        fetch = limit + len(seen)
        while True:
            edges, complete = read_hop(frontier, fetch)
            if shown is None:
                break
            ends = sorted({end for edge in edges for end in (edge.src, edge.dst)} - passable - hidden)
            passed = shown(ends) if ends else set()
            passable |= passed
            hidden |= set(ends) - passed
            read = len(edges)
            edges = [edge for edge in edges if edge.src in passable and edge.dst in passable]
            # a cut read that hidden ends thinned below what this hop may place reads further, as the stores do
            # for ends pending deletion themselves
            if complete or read == len(edges) or len([e for e in edges if e.id not in seen]) >= limit - len(seen):
                break
            fetch *= 4
        room = limit - len(seen)
        next_frontier: set[str] = set()
        for edge in edges:
            if edge.id in seen:
                continue
            if not complete and room <= 0:
                break
            seen[edge.id] = EdgeHop(edge, hop)
            room -= 1
            next_frontier.update(end for end in (edge.src, edge.dst) if end not in visited)
        if not complete:
            break
        visited |= next_frontier
        frontier = sorted(next_frontier)
    ordered = sorted(seen.values(), key=lambda h: (h.hops, -h.edge.confidence, -h.edge.weight, h.edge.id))
    return ordered[:limit]


@dataclass(frozen=True, slots=True)
class VectorWrite:
    """One embedding to store: ``key`` is the section id, memory id, or ``record_id/property``."""

    org: str
    kind: VectorKind
    key: str
    parent: str
    text_hash: str
    vector: np.ndarray


@dataclass
class WriteBatch:
    """Items to upsert (each with its content hash) and vectors to store, for one or more orgs.

    ``write`` applies a batch in one transaction: all of it or nothing. Upserting a document replaces
    its sections (and drops vectors of sections it no longer has); upserting a record drops the vectors
    of properties it no longer has.
    """

    orgs: list[Org] = field(default_factory=list)
    callers: list[Caller] = field(default_factory=list)
    records: list[tuple[Record, str]] = field(default_factory=list)
    memories: list[tuple[Memory, str]] = field(default_factory=list)
    documents: list[tuple[Document, str]] = field(default_factory=list)
    edges: list[tuple[Edge, str]] = field(default_factory=list)
    vectors: list[VectorWrite] = field(default_factory=list)
    #: the write of a caller without the admin role: refused whole (:func:`write_guard`) when it reaches a
    #: record hidden by a deletion, checked inside the write, so that a deletion committed meanwhile counts
    guard: bool = False

    def __len__(self) -> int:
        return sum(len(x) for x in (self.orgs, self.callers, self.records, self.memories, self.documents, self.edges))


def property_key(record_id: str, name: str) -> str:
    return f"{record_id}/{name}"


def require_org(org: str | None, operation: str) -> str:
    """Refuse an empty org at run time (the type checker already refuses a missing one)."""
    if not isinstance(org, str) or not org:
        raise OrgRequired(operation)
    return org


def text_scope_asked(kind: str, org: str | None, most: int, parents: Sequence[str] | None) -> bool:
    """Check a ``text_scope_rows`` call (the org, the kind); False when its count is 0 without a read."""
    require_org(org, "text_scope_rows")
    if kind not in ("section", "memory"):
        raise ValueError(f"no full-text search over {kind!r}")
    return most > 0 and (parents is None or bool(parents))


@runtime_checkable
class StoreReader(Protocol):
    """Reads by id, by identifier and by relation, all scoped to one org: what resolving a record, recalling
    its own memories and edges, and checking visibility against fresh rows need."""

    def get_settings(self, *, org: str) -> dict | None:
        """``org``'s own settings, or None."""

    def get_result(self, call_id: str, *, org: str) -> dict | None:
        """The stored result of ``call_id`` in ``org``, or None."""

    # -- reads by id -------------------------------------------------------------------------------
    def get_org(self, *, org: str) -> Org | None: ...

    def get_caller(self, caller_id: str, *, org: str) -> Caller | None: ...

    def get_records(self, ids: Sequence[str], *, org: str) -> list[Record]:
        """Records of ``ids`` in ``org`` (missing ids are skipped), in the order asked."""

    def get_memories(self, ids: Sequence[str], *, org: str) -> list[Memory]: ...

    def get_documents(self, ids: Sequence[str], *, org: str) -> list[Document]:
        """Documents with their sections in order (missing ids are skipped), in the order asked."""

    def find_documents(
        self, *, org: str, doc_types: Sequence[str] = (), tags: Sequence[str] = (), limit: int
    ) -> list[Document]:
        """Documents of any of ``doc_types`` (if given) carrying any of ``tags`` (if given), by id."""

    def document_ids(
        self, *, org: str, doc_types: Sequence[str] = (), tags: Sequence[str] = (), limit: int | None = None,
        roles: Sequence[str] | None = None, record_ids: Sequence[str] = (),
    ) -> list[str]:
        """The ids of the documents :meth:`find_documents` finds (every document of ``org`` without filters),
        sorted, the first ``limit`` (None: all). With ``roles``, only those a caller with these roles may see
        in a call about ``record_ids`` (not system, visible to one of the roles or to the whole org, attached
        to none or one of the records): the visibility rule as a query, for listing; whoever reads the
        documents still judges them by :func:`dossier.pipeline.visibility.verdict`."""

    def restricted_documents(self, *, org: str, ids: Sequence[str] | None = None) -> list[DocumentAccess]:
        """The documents of ``org`` (among ``ids``, when given) some of its callers may not see (system
        documents, documents visible to some roles only or attached to a record), by id: the rest are visible
        to every caller of the org."""

    # -- records -----------------------------------------------------------------------------------
    def find_records(self, kind: IdentifierKind, value: str, *, org: str) -> list[Record]:
        """Records whose ``kind`` identifier equals the normalised ``value``."""

    def records_by_domain(self, domain: str, *, org: str, limit: int) -> list[Record]:
        """Records whose website or (non free-mail) email domain is ``domain``, by id."""

    def merged_from(self, record_id: str, *, org: str) -> list[str]:
        """Ids of records merged (directly or transitively) into ``record_id``."""

    # -- a record's own memories and edges ---------------------------------------------------------
    def recent_memories(self, record_ids: Sequence[str], *, org: str, limit: int) -> list[Memory]:
        """The ``limit`` newest memories across ``record_ids``, newest first (ties by id)."""

    def edges_around(
        self,
        record_ids: Sequence[str],
        *,
        org: str,
        max_hops: int,
        limit: int,
        include_inactive: bool = False,
        include_stubs: bool = False,
    ) -> list[EdgeHop]:
        """Edges reachable from ``record_ids`` within ``max_hops`` (each with its smallest hop count),
        ordered by hops, then confidence and weight descending, then id."""

    def counts(self, *, org: str) -> dict[str, int]:
        """Number of stored items per kind in ``org``."""


@runtime_checkable
class StoreSearcher(Protocol):
    """Ranked search within one org, by words and by meaning (see :class:`Hit` for what a hit names)."""

    #: True when reads from several threads run at once; the engine then starts a call's section
    #: searches in the background while the record's own sources recall (``Engine.background``)
    concurrent_reads: bool

    def search_text(
        self, kind: TextKind, query: str, *, org: str, limit: int, parents: Sequence[str] | None = None,
        viewer: Viewer | None = None,
    ) -> list[Hit]:
        """Full-text search; ``query`` is plain words (the store builds its own query syntax). With ``viewer``
        (sections), the search is that of a copy of the org holding only the sections of documents that viewer
        may see (the org's unrestricted documents and the restricted ones the rule lets it see): the hits are
        among them alone, so a section it may not see takes no place, and the scores' word statistics count
        them alone. The caller still judges every hit (governance re-reads the documents)."""

    def text_scope_rows(self, kind: TextKind, *, org: str, most: int, parents: Sequence[str] | None = None) -> int:
        """How many rows a full-text search of ``kind`` in this scope (the org's, or ``parents``') covers,
        counted up to ``most``: what the search will cost, known before it runs."""

    def search_vectors(
        self, kind: VectorKind, vector: np.ndarray, *, org: str, limit: int, parents: Sequence[str] | None = None,
        viewer: Viewer | None = None,
    ) -> list[Hit]:
        """Nearest neighbours by cosine similarity, optionally only among children of ``parents``. With
        ``viewer`` (sections), the sections of documents that viewer may not see take no place wherever the
        store can leave them out (SQLite: always; PostgreSQL: in its exact scans, not in an HNSW scan, whose
        hits may still hold them). The caller judges every hit either way."""

    def search_vectors_many(
        self, kind: VectorKind, vectors: Sequence[np.ndarray], *, org: str, limit: int, parents: Sequence[str] | None = None,
        viewer: Viewer | None = None,
    ) -> list[list[Hit]]:
        """:meth:`search_vectors` for each of ``vectors``, the same hits, in one pass where the store can
        (the memories source asks with the question's vector and its adapted one)."""

    def stored_vectors(self, kind: VectorKind, keys: Sequence[str], *, org: str) -> dict[str, np.ndarray]:
        """The stored vector (float32) of each of ``keys`` of ``kind`` that ``org`` holds; missing keys are
        skipped. The documents source reads a memory's this way instead of embedding its text again."""


@runtime_checkable
class StoreWriter(Protocol):
    """Loading and keeping: atomic writes, and the hashes a load compares to skip what did not change."""

    def bind_embedder(self, model_id: str, dimensions: int) -> None:
        """Record the embedding model on first use; raise SchemaMismatch if vectors were made by another."""

    def write(self, batch: WriteBatch) -> None:
        """Apply ``batch`` atomically (see :class:`WriteBatch`)."""

    def write_many(self, batches: Iterable[WriteBatch]) -> None:
        """Apply every batch of ``batches``, in order, in one transaction: all of them or nothing. The
        batches are drawn while the transaction is open (a load streams its bundle into it)."""

    def content_hashes(self, kind: ItemKind, ids: Sequence[str], *, org: str) -> dict[str, str]:
        """Stored content hash of each of ``ids`` that exists in ``org``."""

    def vector_hashes(self, kind: VectorKind, keys: Sequence[str], *, org: str) -> dict[str, str]:
        """Hash of the text each stored vector of ``keys`` was computed from."""

    def put_settings(self, settings: dict, *, org: str) -> None:
        """Store ``org``'s own settings (a JSON object, e.g. calibrated thresholds), replacing any."""

    def update_settings(self, change: Callable[[dict | None], dict], *, org: str) -> dict:
        """Store ``change(stored)`` as ``org``'s own settings, ``stored`` being what is stored now (None:
        nothing, or a row that cannot be read), read and written in one transaction that holds the org's settings against every other
        update (another handle's or process's waits for it), so that two updates never both read the row
        one of them then replaces. ``change`` raising stores nothing. Returns what was stored."""

    def put_result(self, call_id: str, result: dict, *, org: str) -> None:
        """Store the result of a call's deferred work (a JSON object), replacing any for ``call_id``."""


@runtime_checkable
class Store(StoreReader, StoreSearcher, StoreWriter, Protocol):
    """What every storage backend provides: a reader, a searcher and a writer on one database. All reads
    take ``org``; none can be called without it. Code that needs only one part takes that part's protocol."""

    url: str

    def close(self) -> None:
        """Release connections and caches."""
