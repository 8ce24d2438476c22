"""Retrievers for agent frameworks, over an :class:`~dossier.Engine` or a :class:`~dossier.Client`.

* :mod:`dossier.integrations.langchain`: ``DossierRetriever``, a langchain-core ``BaseRetriever``
  (``pip install "dossier-engine[langchain]"``).
* :mod:`dossier.integrations.llama_index`: ``DossierRetriever``, a llama-index-core retriever
  (``pip install "dossier-engine[llama-index]"``).

The question is the call's ``message``; the record, mode, depth, budget, sources and filters are set on the
retriever. Each item of the response becomes one document, in the response's order (source by source), with
``source``, ``id``, ``score`` and ``section_path`` (``"Title > Heading"`` for document sections) in its
metadata, and the fields of its kind besides (:func:`dossier.integrations.hits.hits`).
"""
