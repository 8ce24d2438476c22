"""The evaluation dataset format: a bundle (inline, or a path relative to the dataset file) plus
labelled questions. ``docs/evaluation.md`` documents it; ``dossier eval --schema`` prints its JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..bundle import Bundle
from ..errors import UsageError
from ..loading import read_bundle


class Gold(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[str] = Field(default_factory=list)
    sections: list[str] = Field(default_factory=list)
    memories: list[str] = Field(default_factory=list)
    properties: list[str] = Field(default_factory=list, description="record_id/property_name")
    edges: list[str] = Field(default_factory=list)
    records: list[str] = Field(default_factory=list, description="the record the question resolves to")


class Question(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    org: str
    caller: str
    record: dict[str, str] | None = None
    message: str
    category: str = "general"
    gold: Gold = Field(default_factory=Gold)
    forbidden: list[str] = Field(default_factory=list)
    answerable: bool = True
    request: dict[str, Any] = Field(default_factory=dict, description="extra request fields (mode, depth, budget...)")


class DatasetFile(BaseModel):
    """What a dataset file holds: ``bundle`` (path or inline object) and ``questions``."""

    model_config = ConfigDict(extra="ignore")

    name: str = "dataset"
    bundle: str | dict[str, Any]
    questions: list[Question]


class Dataset:
    def __init__(self, name: str, bundle: Bundle, questions: list[Question], raw_bundle: dict[str, Any]) -> None:
        self.name = name
        self.bundle = bundle
        self.questions = questions
        self.raw_bundle = raw_bundle


def load_dataset(path: str | Path) -> Dataset:
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read dataset {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"dataset {path} is not valid JSON: {exc}") from None
    try:
        parsed = DatasetFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"dataset {path}: {where}: {first['msg']}") from None
    if isinstance(parsed.bundle, str):
        bundle_path = (path.parent / parsed.bundle).resolve()
        try:
            raw_bundle = json.loads(bundle_path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"dataset {path}: cannot read its bundle {bundle_path}: {exc.strerror or exc}") from None
    else:
        raw_bundle = parsed.bundle
    ids = [q.id for q in parsed.questions]
    if not ids:
        raise UsageError(f"dataset {path}: it has no questions (a dataset is a bundle and questions about it)")
    if len(ids) != len(set(ids)):
        raise UsageError(f"dataset {path}: question ids repeat")
    return Dataset(parsed.name, read_bundle(raw_bundle), parsed.questions, raw_bundle)


def dataset_schema() -> dict[str, Any]:
    return DatasetFile.model_json_schema()
