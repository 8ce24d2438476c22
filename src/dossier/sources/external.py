"""External sources: opt-in, per call. A registry of named adapters; one real adapter posts the
resolved record and the question to an HTTP JSON endpoint and reads items back.

Endpoint contract: ``POST`` with ``{"org", "record": {"id", "kind"} | null, "message"}``; the answer is
``{"items": [{"id": str, "text": str, "score": float?}, ...]}``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import ProviderError, ProviderTimeout
from ..pipeline.source_io import Found, SourceQuery, SourceTools, recalled
from ..schema import ExternalItem, SourceName
from . import Failed, Skipped
from .context_helpers import guarded


class ExternalAdapter(Protocol):
    name: str

    def fetch(self, *, org: str, record: dict[str, Any] | None, message: str, timeout: float) -> list[ExternalItem]: ...


@dataclass
class HttpJsonSource:
    """An HTTP JSON endpoint as an external source (stdlib only; no extra needed)."""

    name: str
    url: str
    headers: tuple[tuple[str, str], ...] = ()
    max_items: int = 20

    def fetch(self, *, org: str, record: dict[str, Any] | None, message: str, timeout: float) -> list[ExternalItem]:
        body = json.dumps({"org": org, "record": record, "message": message}).encode()
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json", **dict(self.headers)}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - configured URL
                payload = json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            raise ProviderError(f"{self.name}: HTTP {exc.code}", status_code=exc.code, body=exc.read()[:500].decode("utf-8", "replace")) from exc
        except TimeoutError as exc:
            raise ProviderTimeout(f"{self.name}: no answer within {timeout:g} s") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ProviderError(f"{self.name}: unreachable ({type(exc).__name__})") from exc
        items = payload.get("items") if isinstance(payload, dict) else None
        if not isinstance(items, list):
            raise ProviderError(f"{self.name}: answer has no 'items' list")
        out = []
        for i, raw in enumerate(items[: self.max_items]):
            if isinstance(raw, dict) and isinstance(raw.get("text"), str):
                score = raw.get("score")
                item_id = raw.get("id")  # an item without one is named by its place: "#3"
                out.append(ExternalItem(id=str(item_id) if item_id is not None else f"#{i}", source=self.name, text=raw["text"],
                                        score=float(score) if isinstance(score, (int, float)) else None))  # fmt: skip
        return out


class ExternalSource:
    """Asks every registered adapter; one failing adapter is reported and the others still count."""

    name: SourceName = "external"

    def prefetch(self, query: SourceQuery, tools: SourceTools) -> dict[str, Future[Any]]:
        """Nothing to start ahead: this source's reads are quick, or depend on each other."""
        return {}

    def __init__(self, adapters: dict[str, ExternalAdapter]) -> None:
        self.adapters = adapters

    def recall(self, query: SourceQuery, tools: SourceTools) -> Found:
        return recalled(lambda found: self._recall(query, found), trace=query.trace)

    def _recall(self, query: SourceQuery, found: Found) -> list[Any]:
        if not self.adapters:
            raise Skipped("no external source is registered")
        record = None
        if query.record is not None:
            record = {"id": query.record.id, "kind": query.record.kind, "tombstone": query.tombstone}
        items: list[ExternalItem] = []
        failures = 0
        for name, adapter in sorted(self.adapters.items()):
            got = guarded(
                found, "external",
                lambda: adapter.fetch(org=query.org, record=record, message=query.message,
                                      timeout=query.settings.external_timeout),
                what=f"external source {name}",
            )  # fmt: skip
            if got is None:
                failures += 1
            else:
                items.extend(got)
        if failures == len(self.adapters):
            raise Failed()
        return _unique(items)


def _unique(items: list[ExternalItem]) -> list[ExternalItem]:
    """``items`` with each key (``source/id``) once: an item whose key an earlier one of its source holds gets
    its place after it (``id#2``), so that neither is lost where items are told apart by key (a session's
    pages: what was packed leaves by key)."""
    seen: set[tuple[str, str]] = set()
    out: list[ExternalItem] = []
    for n, item in enumerate(items):
        key, m = (item.source, item.id), n
        while key in seen:  # a renamed id may be one the source sent itself
            key = (item.source, f"{item.id}#{m}")
            m += len(items)
        if key[1] != item.id:
            item = item.model_copy(update={"id": key[1]})
        seen.add(key)
        out.append(item)
    return out
