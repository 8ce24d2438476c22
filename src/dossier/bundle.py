"""The data model of a bundle (DESIGN.md section 3), as pydantic models.

Unknown fields, top-level or per item, are ignored so that bundles exported from other systems load
(:func:`dossier.loading.read_bundle` lists them in the load report). Cross-item references are checked
by :func:`dossier.loading.check_references`, not here.

Input is taken as it is written, never coerced: a boolean is ``true`` or ``false`` (not ``"yes"``), a
number is a JSON number (not ``"0.5"``). Every identifier and text has a length limit (the ``*_MAX``
constants below, documented in docs/bundles.md).
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from datetime import date, datetime, timezone
from typing import Annotated, Any, Literal, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, StrictBool, StrictFloat, ValidationInfo,
                      field_validator)

from .identifiers import clip, normalize

#: Ids of orgs, callers, records, memories, documents, sections and edges, and references to them.
ID_MAX = 200
#: Short labels: org names, roles, tags, document types, edge types, property names.
LABEL_MAX = 200
#: A document's title and a section's heading.
TITLE_MAX = 1_000
#: One string property value (or one element of a list value); a list value's elements.
PROPERTY_TEXT_MAX = 10_000
PROPERTY_LIST_MAX = 1_000
#: Properties of one record; roles of a caller, tags and roles of a document.
PROPERTIES_MAX = 1_000
LABELS_MAX = 100
#: A memory's text and a section's text.
MEMORY_TEXT_MAX = 100_000
#: A section's text: PostgreSQL's full-text vector of a text holds at most 1 MiB, and 500,000 characters of
#: distinct words make about 0.7 MiB of it (1,000,000 made 1.3 MiB: refused there, stored by SQLite)
SECTION_TEXT_MAX = 500_000

#: One scalar property value; a date is an ISO string (``"2026-03-01"``).
Scalar = Union[str, int, float, bool, None]
ACCEPTED_VALUES = "a string, number, boolean or null, or a list of those (dates as ISO strings)"
_INT_LIMIT = 2**63  # integers beyond 64 bits do not survive every JSON reader


def _kind_of(value: object) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def _scalar(value: object, *, in_list: bool = False) -> Scalar:
    if isinstance(value, (datetime, date)):  # from Python callers; stored as the ISO string
        return value.isoformat()
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if len(value) > PROPERTY_TEXT_MAX:
            raise ValueError(f"a string of {len(value):,} characters; at most {PROPERTY_TEXT_MAX:,}")
        return value
    if isinstance(value, int):
        if not -_INT_LIMIT <= value < _INT_LIMIT:
            raise ValueError("an integer beyond 64 bits; send it as a string")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a number that JSON can hold")
        return value
    where = "a list holding " if in_list else ""
    raise ValueError(f"got {where}{_kind_of(value)}; a property value is {ACCEPTED_VALUES}")


def property_value(value: object) -> object:
    """One property value as stored: a scalar, or a list of scalars (tuples become lists)."""
    if isinstance(value, (list, tuple)):
        if len(value) > PROPERTY_LIST_MAX:
            raise ValueError(f"a list of {len(value):,} values; at most {PROPERTY_LIST_MAX:,}")
        return [_scalar(v, in_list=True) for v in value]
    return _scalar(value)


PropertyValue = Annotated[Union[Scalar, list[Scalar]], BeforeValidator(property_value)]


def property_values(value: Any) -> list[Any]:
    """The non-empty values of a property, one per element of a list: what is embedded, masked, shown."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if v is not None and v != ""]


def has_value(value: Any) -> bool:
    """Whether a property has anything to embed (null, ``""`` and ``[]`` do not)."""
    return bool(property_values(value))


def property_display(value: Any) -> str:
    """A property value as text: a list as ``v1, v2``."""
    return ", ".join(str(v) for v in property_values(value)) if isinstance(value, list) else str(value)


def plain_id(value: str) -> str:
    """An id with no control or format character (a bidirectional override such as U+202E, a zero-width
    space): such a character makes an id display as another one, in the inspector and in any log."""
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cf"):
            raise ValueError(f"an id holds no control or format character (it holds U+{ord(char):04X}): such a "
                             "character can make it display as another id")  # fmt: skip
    return value


Id = Annotated[str, Field(min_length=1, max_length=ID_MAX), AfterValidator(plain_id)]
Label = Annotated[str, Field(max_length=LABEL_MAX)]
Labels = Annotated[tuple[Label, ...], Field(max_length=LABELS_MAX)]


def content_hash(item: BaseModel) -> str:
    """What a store keeps of an item as loaded, to tell a changed item from one loaded again as it was: the
    first 32 hex digits of the SHA-256 of its JSON (every field, normalised values included)."""
    return hashlib.sha256(item.model_dump_json().encode()).hexdigest()[:32]


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    @property
    def content_hash(self) -> str:
        """This item's :func:`content_hash`."""
        return content_hash(self)


class Org(_Item):
    id: Id
    name: Label | None = None


class Caller(_Item):
    id: Id
    org: Id
    roles: Labels = ()


class Identifiers(_Item):
    """A record's identifiers, stored normalised (see :mod:`dossier.identifiers`)."""

    email: str | None = None
    phone: str | None = None
    website: str | None = None
    profile_url: str | None = None

    @field_validator("email", "phone", "website", "profile_url", mode="before")
    @classmethod
    def _normalise(cls, value: object, info: ValidationInfo) -> object:
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise ValueError(f"must be a string, not {_kind_of(value)}")
        assert info.field_name is not None  # a field validator is always about its field
        return normalize(info.field_name, value)


class Record(_Item):
    id: Id
    org: Id
    kind: Literal["contact", "company"]
    identifiers: Identifiers = Identifiers()
    properties: dict[str, PropertyValue] = Field(default_factory=dict)
    merged_into: Id | None = None
    pending_deletion: StrictBool = False

    @field_validator("properties", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value  # pydantic reports it
        if len(value) > PROPERTIES_MAX:
            raise ValueError(f"{len(value):,} properties; at most {PROPERTIES_MAX:,}")
        for name in value:
            if not isinstance(name, str) or not 1 <= len(name) <= LABEL_MAX:
                got = f"{len(name):,} characters" if isinstance(name, str) else f"a {type(name).__name__}"
                raise ValueError(f"a property name is a string of 1-{LABEL_MAX} characters, not {got}: {clip(name, 60)}")
        return value


class Memory(_Item):
    id: Id
    org: Id
    record: Id
    text: str = Field(min_length=1, max_length=MEMORY_TEXT_MAX)
    created_at: datetime

    @field_validator("created_at", mode="before")
    @classmethod
    def _not_a_number(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # no coercion: a number is no date
            raise ValueError("a date and time is an ISO 8601 string (2026-01-31T09:00:00Z), not a number")
        return value

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        try:
            return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
        except OverflowError:  # 0001-01-01T00:00:00+14:00 is before the first day a date can hold, in UTC
            raise ValueError("the date and time is out of range once in UTC (years 1 to 9999)") from None


class Section(_Item):
    id: Id
    heading: str = Field(default="", max_length=TITLE_MAX)
    text: str = Field(default="", max_length=SECTION_TEXT_MAX)


class Document(_Item):
    id: Id
    org: Id
    title: str = Field(min_length=1, max_length=TITLE_MAX)
    doc_type: Label = "guideline"
    tags: Labels = ()
    visible_to_roles: Labels | None = None
    attached_record: Id | None = None
    is_system: StrictBool = False
    sections: tuple[Section, ...] = Field(min_length=1)

    @field_validator("visible_to_roles")
    @classmethod
    def _names_a_role(cls, roles: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if roles is not None and not roles:  # no caller has no role: the document would be seen by nobody
            raise ValueError("names no role: null lets the whole org see the document, or list the roles that may")
        return roles


class Edge(_Item):
    id: Id
    org: Id
    src: Id
    dst: Id
    type: Label = Field(min_length=1)
    active: StrictBool = True
    confidence: StrictFloat = Field(default=1.0, ge=0.0, le=1.0)
    weight: StrictFloat = Field(default=1.0, allow_inf_nan=False)
    dst_is_stub: StrictBool = False


class Bundle(BaseModel):
    """Everything one load writes. Every list is optional.

    ``_ignored_keys`` and ``_ignored_fields`` are what :func:`dossier.loading.read_bundle` left out: the
    top-level keys that are not lists of items, and per list the unknown fields with how many items had
    each."""

    model_config = ConfigDict(extra="ignore")
    _ignored_keys: list[str] = PrivateAttr(default_factory=list)
    _ignored_fields: dict[str, dict[str, int]] = PrivateAttr(default_factory=dict)

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
