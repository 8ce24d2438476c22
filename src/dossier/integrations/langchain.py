"""A LangChain retriever over dossier (``pip install "dossier-engine[langchain]"``).

    from dossier.integrations.langchain import DossierRetriever

    retriever = DossierRetriever(backend=client, record={"email": "jane@acme.com"})
    documents = retriever.invoke("What discount rules apply?")

``backend`` is a :class:`~dossier.Client` or :class:`~dossier.AsyncClient` (the key decides org and caller)
or an :class:`~dossier.Engine` (then ``org`` and ``caller`` are required). Each item of the response is one
``Document`` whose metadata holds ``source``, ``id``, ``score`` and ``section_path``, and the fields of its
kind (:mod:`dossier.integrations.hits`). ``invoke(question, record={...})`` asks about another record.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import MissingExtra
from ..schema import RetrieveResponse
from .hits import Hit, aretrieve, hits, request_for, retrieve

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # pragma: no cover - the [langchain] extra
    raise MissingExtra("dossier.integrations.langchain", "langchain") from exc

__all__ = ["DossierRetriever"]


class DossierRetriever(BaseRetriever):
    """One dossier retrieve call per question; its items as LangChain documents."""

    backend: Any
    """A dossier Engine, Client or AsyncClient."""
    record: dict[str, str] | None = None
    """The record the questions are about (``{"email": ...}``, ``{"id": ...}``, ...); None: org-wide."""
    org: str | None = None
    caller: str | None = None
    mode: str | None = None
    depth: str = "standard"
    budget: int | None = None
    """Bytes of packed context (the request's ``budget.totalTokens``); None: the default, 8000."""
    sources: dict[str, bool] | None = None
    filters: dict[str, list[str]] | None = None
    last_response: RetrieveResponse | None = None
    """The whole response of the latest call (routes, budget, trace when asked), for a closer look."""

    def _request(self, query: str, record: Mapping[str, Any] | None) -> dict[str, Any]:
        settings = {"mode": self.mode, "depth": self.depth, "sources": self.sources, "filters": self.filters,
                    "budget": None if self.budget is None else {"totalTokens": self.budget}}  # fmt: skip
        return request_for(query, settings, record if record is not None else self.record)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                record: Mapping[str, Any] | None = None) -> list[Document]:  # fmt: skip
        response = retrieve(self.backend, self._request(query, record), org=self.org, caller=self.caller)
        return self._documents(response)

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       record: Mapping[str, Any] | None = None) -> list[Document]:  # fmt: skip
        response = await aretrieve(self.backend, self._request(query, record), org=self.org, caller=self.caller)
        return self._documents(response)

    def _documents(self, response: RetrieveResponse) -> list[Document]:
        self.last_response = response
        return [_document(hit) for hit in hits(response)]


def _document(hit: Hit) -> Document:
    return Document(id=hit.key, page_content=hit.text, metadata=hit.metadata)
