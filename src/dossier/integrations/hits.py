"""What the framework adapters share: one retrieve call over an Engine or a Client, and its items as hits."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import InvalidRequest, UsageError
from ..schema import EdgeItem, ExternalItem, MemoryItem, PropertyItem, RetrieveResponse, SectionItem, item_key

#: How a section path is joined, as the CLI prints it.
PATH_SEPARATOR = " > "


@dataclass(frozen=True)
class Hit:
    """One item of a response, as a framework document: its text, metadata and score."""

    key: str  # "<source>:<id>", unique within a response
    text: str
    score: float | None
    metadata: dict[str, Any]


def request_for(message: str, settings: Mapping[str, Any], record: Mapping[str, Any] | None) -> dict[str, Any]:
    """The retrieve request of one question: the retriever's settings, the message, the record if any. A
    retriever asks questions: a question that is not text, a record that is not an object of identifiers,
    and the modes that take no question (``fetch`` needs document ids, ``expand`` a continuation) are
    refused with :class:`~dossier.errors.InvalidRequest`."""
    if not isinstance(message, str):
        raise InvalidRequest(f"message: a retriever's question is text, not {type(message).__name__}", field="message")
    if record is not None and not isinstance(record, Mapping):
        raise InvalidRequest(f"record: an object of one identifier, such as {{'email': ...}}, not {type(record).__name__}",
                             field="record")  # fmt: skip
    request = {k: v for k, v in settings.items() if v is not None}
    if request.get("mode") in ("fetch", "expand"):
        raise InvalidRequest(f"mode: a retriever asks questions; {request['mode']!r} takes none (use brief, scout or "
                             "filter, or the engine or client for fetch and expand)", field="mode")  # fmt: skip
    request["message"] = message
    if record is not None:
        request["record"] = dict(record)
    return request


def retrieve(backend: Any, request: Mapping[str, Any], *, org: str | None, caller: str | None) -> RetrieveResponse:
    """One call through an Engine (as ``caller`` of ``org``) or a Client (as its key's caller)."""
    from ..client import AsyncClient, Client
    from ..engine import Engine

    if isinstance(backend, Engine):
        if not org or not caller:
            raise UsageError("a retriever over an Engine needs org= and caller= (a Client's key names them)")
        return backend.retrieve(request, org=org, caller=caller)
    if isinstance(backend, Client):
        _no_identity(org, caller)
        return backend.retrieve(request)
    if isinstance(backend, AsyncClient):
        raise UsageError("an AsyncClient answers async calls only: use the retriever's async method, or a Client")
    raise UsageError(f"a retriever needs a dossier Engine, Client or AsyncClient, not {type(backend).__name__}")


async def aretrieve(backend: Any, request: Mapping[str, Any], *, org: str | None, caller: str | None) -> RetrieveResponse:
    """:func:`retrieve` for async frameworks: an AsyncClient is awaited, an Engine or Client runs on a thread."""
    from ..client import AsyncClient

    if isinstance(backend, AsyncClient):
        _no_identity(org, caller)
        return await backend.retrieve(request)
    return await asyncio.to_thread(retrieve, backend, request, org=org, caller=caller)


def _no_identity(org: str | None, caller: str | None) -> None:
    if org or caller:
        raise UsageError("over a Client the API key decides the org and the caller: leave org= and caller= out")


def hits(response: RetrieveResponse) -> list[Hit]:
    """Every item of ``response``, source by source in the response's order."""
    out: list[Hit] = []
    record = response.record.id if response.record else None
    for source, result in response.sources.items():
        for item in result.items:
            key = item_key(item)
            metadata: dict[str, Any] = {"source": source, "id": key, "score": getattr(item, "score", None),
                                        "section_path": None, "kind": item.kind, "call_id": response.call_id,
                                        "record": record}  # fmt: skip
            metadata.update(_fields(item))
            out.append(Hit(key=f"{source}:{key}", text=_text(item), score=metadata["score"], metadata=metadata))
    return out


def _text(item: Any) -> str:
    if isinstance(item, PropertyItem):
        value = item.value if isinstance(item.value, str) else json.dumps(item.value, ensure_ascii=False)
        return f"{item.name}: {value}"
    if isinstance(item, EdgeItem):
        return f"{item.src} {item.type} {item.dst}"
    return str(item.text)


def _fields(item: Any) -> dict[str, Any]:
    """The fields of an item's kind, flat (str, number, bool or None): what a framework's metadata holds well."""
    if isinstance(item, SectionItem):
        return {"section_path": PATH_SEPARATOR.join(p for p in (item.title, item.heading) if p),
                "document_id": item.document_id, "section_id": item.section_id, "title": item.title,
                "heading": item.heading, "confidence": item.confidence, "relevance": item.relevance,
                "truncated": item.truncated}  # fmt: skip
    if isinstance(item, MemoryItem):
        return {"record_id": item.record_id, "tier": item.tier, "created_at": item.created_at.isoformat(),
                "truncated": item.truncated}  # fmt: skip
    if isinstance(item, PropertyItem):
        return {"record_id": item.record_id, "name": item.name, "matched": item.matched, "truncated": item.truncated}
    if isinstance(item, EdgeItem):
        return {"src": item.src, "dst": item.dst, "type": item.type, "confidence": item.confidence,
                "weight": item.weight, "hops": item.hops}  # fmt: skip
    if isinstance(item, ExternalItem):
        return {"external_source": item.source, "truncated": item.truncated}
    return {}
