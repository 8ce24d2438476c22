"""A LlamaIndex retriever over dossier (``pip install "dossier-engine[llama-index]"``).

    from dossier.integrations.llama_index import DossierRetriever

    retriever = DossierRetriever(client, record={"email": "jane@acme.com"})
    nodes = retriever.retrieve("What discount rules apply?")

``backend`` is a :class:`~dossier.Client` or :class:`~dossier.AsyncClient` (the key decides org and caller)
or an :class:`~dossier.Engine` (then ``org`` and ``caller`` are required). Each item of the response is one
``NodeWithScore`` (a ``TextNode`` whose metadata holds ``source``, ``id``, ``score`` and ``section_path``, and
the fields of its kind; :mod:`dossier.integrations.hits`), scored with the item's score.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import MissingExtra
from ..schema import RetrieveResponse
from .hits import Hit, aretrieve, hits, request_for, retrieve

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:  # pragma: no cover - the [llama-index] extra
    raise MissingExtra("dossier.integrations.llama_index", "llama-index") from exc

__all__ = ["DossierRetriever"]


class DossierRetriever(BaseRetriever):
    """One dossier retrieve call per question; its items as LlamaIndex nodes."""

    def __init__(
        self,
        backend: Any,
        *,
        record: Mapping[str, str] | None = None,
        org: str | None = None,
        caller: str | None = None,
        mode: str | None = None,
        depth: str = "standard",
        budget: int | None = None,
        sources: Mapping[str, bool] | None = None,
        filters: Mapping[str, list[str]] | None = None,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        super().__init__(callback_manager=callback_manager)
        self.backend = backend
        self.record = dict(record) if isinstance(record, Mapping) else record  # anything else: refused per question
        self.org, self.caller = org, caller
        self.settings: dict[str, Any] = {
            "mode": mode, "depth": depth, "sources": dict(sources) if sources else None,
            "filters": dict(filters) if filters else None,
            "budget": None if budget is None else {"totalTokens": budget},
        }  # fmt: skip
        #: The whole response of the latest call (routes, budget, trace when asked), for a closer look.
        self.last_response: RetrieveResponse | None = None

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        request = request_for(query_bundle.query_str, self.settings, self.record)
        return self._nodes(retrieve(self.backend, request, org=self.org, caller=self.caller))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        request = request_for(query_bundle.query_str, self.settings, self.record)
        return self._nodes(await aretrieve(self.backend, request, org=self.org, caller=self.caller))

    def _nodes(self, response: RetrieveResponse) -> list[NodeWithScore]:
        self.last_response = response
        return [NodeWithScore(node=_node(hit), score=hit.score) for hit in hits(response)]


#: The metadata a model is shown with a node's text (LlamaIndex prepends it); the rest stays in ``metadata``.
SHOWN = ("source", "section_path")


def _node(hit: Hit) -> TextNode:
    hidden = [k for k in hit.metadata if k not in SHOWN or hit.metadata[k] is None]
    return TextNode(id_=hit.key, text=hit.text, metadata=hit.metadata, excluded_llm_metadata_keys=hidden,
                    excluded_embed_metadata_keys=list(hit.metadata))  # fmt: skip
