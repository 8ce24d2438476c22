"""One frozen settings object: every threshold, share, cap, flag and timeout dossier uses.

Similarity thresholds are claims about a corpus *and* an embedding model, so they live in
:class:`Thresholds`, keyed by the embedder's model id (``THRESHOLDS``). ``docs/thresholds.md`` records
how the shipped defaults were chosen; ``dossier calibrate`` measures them for your own corpus.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

#: From this many vectors of an org and kind, the SQLite store answers an org-wide vector search with its
#: ANN index (exact numpy search below). Measured on the 2-core machine: an exact search of 50,000 vectors
#: costs about 3.5 ms, of 100,000 about 7 ms, one ANN search about 2 ms; at 1M memories and 100,000 sections
#: the ANN index for sections took brief p95 from 157-166 ms to 112-128 ms at recall@10 0.983
#: (docs/scaling.md). PostgreSQL's own line is ``exact_below``. Here, not in the stores: the CLI
#: reads settings without importing a store.
HNSW_MIN_ROWS = 50_000


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    """Score floors that depend on the embedding model (cosine similarity unless noted)."""

    property_discovery: float = 0.5  # discover records by property meaning
    memory_semantic: float = 0.5  # tier-2 memories
    clear_winner: float = 0.55  # top section score that skips the selector...
    clear_winner_margin: float = 0.12  # ...when it leads the second by this much
    selector_floor: float = 0.45  # heuristic selector: a pick must score at least this
    fallback_low: float = 0.30  # best non-system candidate, low confidence
    supplementary: float = 0.65  # unpicked candidates returned as supplementary
    fallback_last: float = 0.40  # last resort when nothing else came back
    sibling_ratio: float = 0.80  # a more specific sibling must score this share of the pick
    lexical_weight: float = 0.0  # heuristic selector: weight of the (normalised) full-text score


#: Defaults per embedding model id. Unknown models get the class defaults (and a calibration hint).
THRESHOLDS: Mapping[str, Thresholds] = MappingProxyType(
    {
        # Measured on examples/eval (calibrated on each half, checked on the other): docs/thresholds.md
        "all-MiniLM-L6-v2": Thresholds(memory_semantic=0.30, selector_floor=0.55, fallback_low=0.25),
    }
)


@dataclass(frozen=True, kw_only=True)
class Shares:
    """Default split of the byte budget; shares of empty sources go to the others."""

    memories: float = 0.35
    documents: float = 0.30
    external: float = 0.20
    properties: float = 0.10
    graph: float = 0.05

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class ServiceSettings:
    """Layer 10 (sessions, billing) and the limits of the HTTP and MCP front ends (docs/service.md)."""

    session_idle_seconds: float = 3600.0  # an expand session expires after this long unused
    # billing: units charged up front per call, by depth, plus a surcharge when synthesis is asked for;
    # refunded when the call throws. An expand page costs what a fast call costs.
    cost_fast: int = 1
    cost_standard: int = 2
    cost_deep: int = 5
    cost_expand: int = 1
    cost_synthesis: int = 5
    # request bodies over these many bytes are refused with 413 before they are parsed
    max_retrieve_bytes: int = 1 << 20  # 1 MiB: POST /v1/retrieve, /v1/feedback, the MCP endpoint
    max_item_bytes: int = 5 << 20  # 5 MiB: POST /v1/records, /v1/memories, /v1/documents
    max_bundle_bytes: int = 20 << 20  # 20 MiB: POST /v1/bundles
    call_threads: int = 2  # threads per server process running retrieve calls (CPU-bound, one GIL)
    # the longest deadline a call over HTTP or MCP gets: a request's longer deadline_ms is lowered to
    # this (route.deadline.detail.requested_ms says what was asked)
    max_deadline_ms: int = 30_000


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything tunable. Per-call values merge over these with :meth:`replace`."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    shares: Shares = field(default_factory=Shares)
    # resolve
    max_aliases: int = 20
    # recall
    recent_memories: int = 25
    semantic_memories: int = 10
    semantic_memories_enabled: bool = True
    semantic_memory_orgs: frozenset[str] | None = None  # allowlist of orgs for tier 2; None = every org
    discovered_records: int = 10
    document_candidates: int = 30  # per retriever, before fusion
    rrf_k: int = 60
    # Memory tier 2 fuses meaning and words; on conversations words weigh more (measured on LoCoMo
    # with a split by conversation: docs/evaluation.md).
    memory_rrf_k: int = 10
    memory_text_weight: float = 2.0
    # A multi-part question's document search adds this times the vector of the memory the memory ranker
    # rates best (0: off); chosen on the training sets' questions (docs/evaluation.md).
    memory_informed_weight: float = 0.8
    graph_max_hops: int = 3
    graph_max_edges: int = 50
    include_stub_edges: bool = False
    # select
    max_picks: int = 3
    first_pick_relevance: int = 3
    other_pick_relevance: int = 4
    max_supplementary: int = 3
    # learned rankers: an org's own models (``dossier calibrate --write``); None = the shipped ones
    rankers: Mapping[str, Any] | None = None
    memory_candidates: int = 100  # tier 2: per retriever, before the memory ranker
    # understand
    filter_confidence: float = 0.7
    # budget
    default_budget_bytes: int = 8000
    max_budget_bytes: int = 50_000
    max_fetch_ids: int = 20
    # storage
    hnsw_min_rows: int = HNSW_MIN_ROWS  # SQLite: exact numpy search below this many vectors per org and kind
    embed_batch_size: int = 16
    # a call's deadline (milliseconds) when the request gives no deadline_ms (docs/retrieve.md, Deadline)
    deadline_ms: int = 10_000
    # timeouts (seconds)
    filter_timeout: float = 5.0
    external_timeout: float = 3.0
    # service: sessions, billing, front-end limits
    service: ServiceSettings = field(default_factory=ServiceSettings)

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)

    def merged(self, overrides: Mapping[str, Any]) -> "Settings":
        """These settings with ``overrides`` (a JSON-like mapping; ``thresholds`` may be partial)."""
        changes = dict(overrides)
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            from .errors import ConfigError

            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        for group in ("thresholds", "shares", "service"):
            if group in changes:
                part = getattr(self, group)
                _check(changes[group], part, group)
                changes[group] = dataclasses.replace(part, **changes[group])
        _check({k: v for k, v in changes.items() if k not in ("thresholds", "shares", "service")}, self, "")
        if changes.get("semantic_memory_orgs") is not None:
            changes["semantic_memory_orgs"] = frozenset(changes["semantic_memory_orgs"])
        return dataclasses.replace(self, **changes)

    @classmethod
    def for_model(cls, model_id: str, **changes: Any) -> "Settings":
        """Settings with the thresholds measured for ``model_id`` (class defaults if unknown)."""
        return cls(thresholds=THRESHOLDS.get(model_id, Thresholds()), **changes)


def _check(changes: Any, current: Any, group: str) -> None:
    """Refuse (``ConfigError``) a value whose type is not the setting's: a number for a number (finite, not a
    boolean; an int where the setting is one), a boolean for a boolean, a mapping for ``rankers`` and a
    list of org ids for ``semantic_memory_orgs`` (either may be null). A stored setting of the wrong type
    would otherwise fail every later call of its org."""
    from .errors import ConfigError

    if not isinstance(changes, Mapping):
        raise ConfigError(f"setting {group}: must be an object of settings, not {type(changes).__name__}")
    declared = {f.name: str(f.type) for f in dataclasses.fields(current)}  # the annotation, as written
    for name, value in changes.items():
        where = f"{group}.{name}" if group else name
        if name not in declared:
            raise ConfigError(f"unknown setting: {where}")
        kind = declared[name]
        if name == "rankers":
            ok = value is None or isinstance(value, Mapping)
        elif name == "semantic_memory_orgs":  # stored as JSON: a list of org ids
            ok = value is None or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value))
        elif kind == "bool":
            ok = isinstance(value, bool)
        elif kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind == "float":  # an int is a float setting's value too (and finite, however large)
            ok = not isinstance(value, bool) and (isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)))
        else:
            ok = True
        if not ok:
            raise ConfigError(f"setting {where}: {value!r:.40} is not a valid value (a {kind})")

