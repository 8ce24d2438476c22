"""The contract of the retrieve call (DESIGN.md section 1): request, response, items, statuses.

Field names are part of the contract; ``dossier schema`` prints the JSON Schema of both models. A
request is strict: unknown fields are refused, booleans and numbers are never read from strings
(``"true"``, ``"8000"``), and every string has a length limit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

from .bundle import ID_MAX, LABEL_MAX, LABELS_MAX, PropertyValue
from .identifiers import IDENTIFIER_MAX, normalize

Mode = Literal["brief", "scout", "fetch", "filter", "expand"]
Depth = Literal["fast", "standard", "deep"]
SourceName = Literal["properties", "memories", "documents", "graph", "external"]
SOURCE_NAMES: tuple[SourceName, ...] = ("properties", "memories", "documents", "graph", "external")
Status = Literal["ok", "empty", "error", "skipped"]
MAX_BUDGET = 50_000
MAX_FETCH = 20
MAX_MESSAGE = 4000  # characters of the question, and of each rephrasing in ``augmentation``
MAX_AUGMENTATION = 10
MIN_DEADLINE_MS = 100  # a call's deadline: at least this...
MAX_DEADLINE_MS = 120_000  # ...and at most this (a service may lower it further: docs/service.md)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# -- request ---------------------------------------------------------------------------------------
class RecordRef(_Strict):
    """Who the question is about: exactly one identifier."""

    id: str | None = Field(default=None, min_length=1, max_length=ID_MAX)
    email: str | None = Field(default=None, max_length=IDENTIFIER_MAX)
    phone: str | None = Field(default=None, max_length=IDENTIFIER_MAX)
    website: str | None = Field(default=None, max_length=IDENTIFIER_MAX)
    profile_url: str | None = Field(default=None, max_length=IDENTIFIER_MAX)

    @field_validator("email", "phone", "website", "profile_url")
    @classmethod
    def _normalise(cls, value: str | None, info: Any) -> str | None:
        return None if value is None else normalize(info.field_name, value)

    @model_validator(mode="after")
    def _exactly_one(self) -> "RecordRef":
        given = [k for k, v in self.model_dump().items() if v is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of id, email, phone, website, profile_url")
        return self

    @property
    def identifier(self) -> tuple[str, str]:
        return next((k, v) for k, v in self.model_dump().items() if v is not None)


class SourceFlags(_Strict):
    """Explicit switches; ``None`` keeps the mode's default, ``False`` always wins."""

    properties: StrictBool | None = None
    memories: StrictBool | None = None
    documents: StrictBool | None = None
    graph: StrictBool | None = None
    external: StrictBool | None = None


class Budget(_Strict):
    totalTokens: StrictInt = Field(default=8000, ge=1, le=MAX_BUDGET, description="UTF-8 bytes of packed context")
    shares: dict[SourceName, Annotated[StrictFloat, Field(ge=0.0, le=1.0, allow_inf_nan=False)]] | None = None


Label = Annotated[str, Field(max_length=LABEL_MAX)]


class Filters(_Strict):
    doc_types: list[Label] = Field(default_factory=list, max_length=LABELS_MAX)
    tags: list[Label] = Field(default_factory=list, max_length=LABELS_MAX)

    @property
    def empty(self) -> bool:
        return not self.doc_types and not self.tags


class RetrieveRequest(_Strict):
    mode: Mode | None = None
    record: RecordRef | None = None
    message: str | None = Field(default=None, max_length=MAX_MESSAGE)
    sources: SourceFlags = Field(default_factory=SourceFlags)
    depth: Depth = "standard"
    budget: Budget = Field(default_factory=Budget)
    filters: Filters | None = None
    infer_filters: StrictBool = True
    augmentation: list[Annotated[str, Field(max_length=MAX_MESSAGE)]] | None = Field(default=None, max_length=MAX_AUGMENTATION)
    fetch: list[Annotated[str, Field(min_length=1, max_length=ID_MAX)]] | None = Field(default=None, max_length=MAX_FETCH)
    continuation: str | None = Field(default=None, max_length=ID_MAX)
    synthesize: StrictBool = False
    deferred: StrictBool = False
    trace: StrictBool = False
    deadline_ms: StrictInt | None = Field(
        default=None, ge=MIN_DEADLINE_MS, le=MAX_DEADLINE_MS,
        description="milliseconds the call may take; model steps that cannot finish in time fall back "
        "(default Settings.deadline_ms, 10000)",
    )  # fmt: skip

    @field_validator("augmentation", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


# -- response items ----------------------------------------------------------------------------------
class MemoryItem(BaseModel):
    kind: Literal["memory"] = "memory"
    id: str
    record_id: str
    text: str
    created_at: datetime
    tier: Literal["recent", "semantic"]
    score: float | None = None
    truncated: bool = False


class PropertyItem(BaseModel):
    kind: Literal["property"] = "property"
    record_id: str
    name: str
    value: PropertyValue
    matched: bool | None = None  # discovery: this property is why the record was found
    score: float | None = None
    truncated: bool = False


class SectionItem(BaseModel):
    kind: Literal["section"] = "section"
    document_id: str
    section_id: str
    title: str
    heading: str
    text: str
    score: float | None = None
    confidence: Literal["high", "low", "supplementary"] = "high"
    relevance: int | None = None  # 1-5, from the learned ranker's probability (None when it did not run)
    truncated: bool = False


class EdgeItem(BaseModel):
    kind: Literal["edge"] = "edge"
    id: str
    src: str
    dst: str
    type: str
    confidence: float
    weight: float
    hops: int


class ExternalItem(BaseModel):
    kind: Literal["external"] = "external"
    id: str
    source: str
    text: str
    score: float | None = None
    truncated: bool = False


Item = Annotated[Union[MemoryItem, PropertyItem, SectionItem, EdgeItem, ExternalItem], Field(discriminator="kind")]


# -- response ----------------------------------------------------------------------------------------
class ResolvedRecord(BaseModel):
    id: str
    kind: Literal["contact", "company"]
    aliases: list[str] = Field(default_factory=list)
    merged_from: list[str] = Field(default_factory=list)
    tombstone: bool = False


class SourceResult(BaseModel):
    status: Status = "skipped"
    items: list[Item] = Field(default_factory=list)
    bytes_used: int = 0
    dropped: int = 0
    error: str | None = None


class Route(BaseModel):
    """What actually ran for one source (or layer)."""

    ran: bool = False
    backend: str | None = None
    requested_depth: Depth | None = None
    effective_depth: Depth | None = None
    fallback_reason: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


class BudgetReport(BaseModel):
    total_bytes: int
    share: dict[str, int]
    used: dict[str, int]
    dropped: dict[str, int]


class Synthesis(BaseModel):
    """An answer from the packed context (``answer`` is None when there is none: see ``error``).

    ``sources_used`` are the ids of the returned items the answer cites; ``citations`` maps each label
    cited in the answer (``M2``, ``D1``, ...) to its item id; ``unknown_citations`` are labels the model
    cited that name no item. ``pending`` is true while a deferred synthesis runs (fetch it with
    ``Engine.result(call_id)``); ``usage`` is a deferred synthesis's model cost (a synchronous one is
    counted in ``route["model"]``)."""

    answer: str | None = None
    reasoning: str | None = None
    confidence: float | None = None
    sources_used: list[str] = Field(default_factory=list)
    error: str | None = None
    citations: dict[str, str] = Field(default_factory=dict)
    unknown_citations: list[str] = Field(default_factory=list)
    pending: bool = False
    usage: dict[str, Any] | None = None


class TraceEntry(BaseModel):
    """One layer's decision about one candidate item the caller may see (``docs/retrieve.md``, Trace)."""

    source: SourceName
    id: str
    layer: str
    decision: Literal["kept", "dropped"]
    reason: str | None = None
    score: float | None = None


class RetrieveResponse(BaseModel):
    call_id: str
    mode: Mode
    record: ResolvedRecord | None = None
    sources: dict[SourceName, SourceResult]
    partial: bool = False
    route: dict[str, Route] = Field(default_factory=dict)
    budget: BudgetReport
    synthesis: Synthesis | None = None
    continuation: str | None = None
    trace: list[TraceEntry] | None = None
    withheld: dict[str, dict[str, int]] | None = Field(
        default=None,
        description="with trace: items the caller may not see, dropped per layer and reason, as counts only",
    )

    def items(self, source: SourceName) -> list[Any]:
        return list(self.sources[source].items)


def item_key(item: Any) -> str:
    """The id an item is known by in traces and evaluations (sections by section id)."""
    if isinstance(item, SectionItem):
        return item.section_id
    if isinstance(item, PropertyItem):
        return f"{item.record_id}/{item.name}"
    if isinstance(item, ExternalItem):
        return f"{item.source}/{item.id}"
    return str(item.id)
