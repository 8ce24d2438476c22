"""The data model of a bundle (DESIGN.md section 3), as pydantic models.

Unknown fields, top-level or per item, are ignored so that bundles exported from other systems load.
Cross-item references are checked by :func:`dossier.loading.check_references`, not here.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .identifiers import normalize

PropertyValue = str | int | float | bool | None


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Org(_Item):
    id: str = Field(min_length=1)
    name: str | None = None


class Caller(_Item):
    id: str = Field(min_length=1)
    org: str = Field(min_length=1)
    roles: tuple[str, ...] = ()


class Identifiers(_Item):
    """A record's identifiers, stored normalised (see :mod:`dossier.identifiers`)."""

    email: str | None = None
    phone: str | None = None
    website: str | None = None
    profile_url: str | None = None

    @field_validator("email", "phone", "website", "profile_url", mode="before")
    @classmethod
    def _normalise(cls, value: object, info) -> object:  # type: ignore[no-untyped-def]
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise ValueError("must be a string")
        return normalize(info.field_name, value)


class Record(_Item):
    id: str = Field(min_length=1)
    org: str = Field(min_length=1)
    kind: Literal["contact", "company"]
    identifiers: Identifiers = Identifiers()
    properties: dict[str, PropertyValue] = Field(default_factory=dict)
    merged_into: str | None = None
    pending_deletion: bool = False


class Memory(_Item):
    id: str = Field(min_length=1)
    org: str = Field(min_length=1)
    record: str = Field(min_length=1)
    text: str = Field(min_length=1)
    created_at: datetime

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class Section(_Item):
    id: str = Field(min_length=1)
    heading: str = ""
    text: str = ""


class Document(_Item):
    id: str = Field(min_length=1)
    org: str = Field(min_length=1)
    title: str = Field(min_length=1)
    doc_type: str = "guideline"
    tags: tuple[str, ...] = ()
    visible_to_roles: tuple[str, ...] | None = None
    attached_record: str | None = None
    is_system: bool = False
    sections: tuple[Section, ...] = Field(min_length=1)


class Edge(_Item):
    id: str = Field(min_length=1)
    org: str = Field(min_length=1)
    src: str = Field(min_length=1)
    dst: str = Field(min_length=1)
    type: str = Field(min_length=1)
    active: bool = True
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    weight: float = 1.0
    dst_is_stub: bool = False


class Bundle(BaseModel):
    """Everything one load writes. Every list is optional."""

    model_config = ConfigDict(extra="ignore")

    orgs: list[Org] = Field(default_factory=list)
    callers: list[Caller] = Field(default_factory=list)
    records: list[Record] = Field(default_factory=list)
    memories: list[Memory] = Field(default_factory=list)
    documents: list[Document] = Field(default_factory=list)
    edges: list[Edge] = Field(default_factory=list)


#: Bundle list name -> item model, in load order (referenced kinds first).
ITEM_MODELS: dict[str, type[_Item]] = {
    "orgs": Org,
    "callers": Caller,
    "records": Record,
    "memories": Memory,
    "documents": Document,
    "edges": Edge,
}
