"""The LangChain and LlamaIndex retrievers, with the real langchain-core and llama-index-core, over an
Engine and over a Client talking to a real ``dossier serve``: one document per item of the library's own
response, carrying its source, id, score and section path."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

import dossier
from dossier.integrations.hits import hits

from .conftest import BRIEF, Served

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from langchain_core.retrievers import BaseRetriever as LangChainRetriever  # noqa: E402
from llama_index.core.retrievers import BaseRetriever as LlamaRetriever  # noqa: E402
from llama_index.core.schema import MetadataMode  # noqa: E402

from dossier.integrations import langchain, llama_index  # noqa: E402

QUESTION = BRIEF["message"]
JANE = BRIEF["record"]


def expected(engine: dossier.Engine, record: dict[str, str] = JANE, **extra: Any) -> list[tuple[str, str, Any, Any]]:
    """(source, id, score, section path) of every item the library returns for the question."""
    response = engine.retrieve({"message": QUESTION, "record": record, "depth": "standard", **extra},
                               org="northwind", caller="ana")  # fmt: skip
    return [(h.metadata["source"], h.metadata["id"], h.score, h.metadata["section_path"]) for h in hits(response)]


def described(metadata: list[dict[str, Any]]) -> list[tuple[str, str, Any, Any]]:
    return [(m["source"], m["id"], m["score"], m["section_path"]) for m in metadata]


def check_sections(metadata: list[dict[str, Any]], texts: list[str], response: dossier.RetrieveResponse) -> None:
    sections = {s.section_id: s for s in response.sources["documents"].items}
    assert sections, "the example question has a document section to show"
    for meta, text in zip(metadata, texts):
        if meta["source"] == "documents":
            section = sections[meta["id"]]
            assert meta["section_path"] == f"{section.title} > {section.heading}"
            assert (meta["document_id"], meta["score"], text) == (section.document_id, section.score, section.text)
        else:
            assert meta["section_path"] is None
    assert {m["source"] for m in metadata} == {s for s, r in response.sources.items() if r.items}


def same(got: list[tuple[str, str, Any, Any]], want: list[tuple[str, str, Any, Any]]) -> bool:
    """The same items in the same order, their scores equal but for float noise (another process embedded the query)."""
    assert [(s, i, p) for s, i, _, p in got] == [(s, i, p) for s, i, _, p in want]
    assert [g[2] for g in got] == pytest.approx([w[2] for w in want], abs=1e-4)
    return True


def test_langchain_over_an_engine(engine_of: Callable[[str], dossier.Engine], served: Served) -> None:
    engine = engine_of(served.store_url)
    retriever = langchain.DossierRetriever(backend=engine, org="northwind", caller="ana", record=JANE)
    assert isinstance(retriever, LangChainRetriever)
    documents = retriever.invoke(QUESTION)
    assert described([d.metadata for d in documents]) == expected(engine)
    assert [d.id for d in documents] == [f"{d.metadata['source']}:{d.metadata['id']}" for d in documents]
    assert retriever.last_response is not None
    check_sections([d.metadata for d in documents], [d.page_content for d in documents], retriever.last_response)
    other = retriever.invoke(QUESTION, record={"email": "marta@globex.com"})  # another record for one call
    assert retriever.last_response.record is not None and retriever.last_response.record.id == "rec-marta"
    assert described([d.metadata for d in other]) == expected(engine, {"email": "marta@globex.com"})
    only_documents = langchain.DossierRetriever(backend=engine, org="northwind", caller="ana", record=JANE,
                                                sources={"properties": False, "memories": False, "graph": False},
                                                budget=2000)  # fmt: skip
    assert {d.metadata["source"] for d in only_documents.invoke(QUESTION)} == {"documents"}


def test_langchain_over_a_client_gives_what_the_engine_gives(served: Served,
                                                             engine_of: Callable[[str], dossier.Engine]) -> None:  # fmt: skip
    engine = engine_of(served.store_url)
    with dossier.Client(served.url, served.keys["ana"]) as client:
        retriever = langchain.DossierRetriever(backend=client, record=JANE)
        documents = retriever.invoke(QUESTION)
    assert same(described([d.metadata for d in documents]), expected(engine))
    assert retriever.last_response is not None
    check_sections([d.metadata for d in documents], [d.page_content for d in documents], retriever.last_response)

    async def run() -> list[Any]:
        async with dossier.AsyncClient(served.url, served.keys["ana"]) as aclient:
            return list(await langchain.DossierRetriever(backend=aclient, record=JANE).ainvoke(QUESTION))

    assert same(described([d.metadata for d in asyncio.run(run())]), expected(engine))


def test_llama_index_over_an_engine_and_a_client(served: Served, engine_of: Callable[[str], dossier.Engine]) -> None:
    engine = engine_of(served.store_url)
    retriever = llama_index.DossierRetriever(engine, org="northwind", caller="ana", record=JANE)
    assert isinstance(retriever, LlamaRetriever)
    nodes = retriever.retrieve(QUESTION)
    assert described([n.node.metadata for n in nodes]) == expected(engine)
    assert [n.score for n in nodes] == [n.node.metadata["score"] for n in nodes]
    assert retriever.last_response is not None
    check_sections([n.node.metadata for n in nodes], [n.node.get_content() for n in nodes], retriever.last_response)
    section = next(n.node for n in nodes if n.node.metadata["source"] == "documents")
    shown = section.get_content(MetadataMode.LLM)  # what a model sees: the path, not the call's bookkeeping
    assert f"section_path: {section.metadata['section_path']}" in shown and "call_id" not in shown
    with dossier.Client(served.url, served.keys["ana"]) as client:
        remote = llama_index.DossierRetriever(client, record=JANE).retrieve(QUESTION)
    assert same(described([n.node.metadata for n in remote]), expected(engine))

    async def run() -> list[Any]:
        async with dossier.AsyncClient(served.url, served.keys["ana"]) as aclient:
            return list(await llama_index.DossierRetriever(aclient, record=JANE).aretrieve(QUESTION))

    assert same(described([n.node.metadata for n in asyncio.run(run())]), expected(engine))


def test_the_retrievers_refuse_a_backend_used_wrongly(served: Served, engine_of: Callable[[str], dossier.Engine]) -> None:
    engine = engine_of(served.store_url)
    with pytest.raises(dossier.UsageError, match="org= and caller="):
        langchain.DossierRetriever(backend=engine, record=JANE).invoke(QUESTION)
    with pytest.raises(dossier.UsageError, match="org= and caller="):
        llama_index.DossierRetriever(engine, caller="ana").retrieve(QUESTION)
    with dossier.Client(served.url, served.keys["ana"]) as client:
        with pytest.raises(dossier.UsageError, match="the API key decides"):
            langchain.DossierRetriever(backend=client, org="southwind").invoke(QUESTION)
    aclient = dossier.AsyncClient(served.url, served.keys["ana"])
    with pytest.raises(dossier.UsageError, match="async"):
        llama_index.DossierRetriever(aclient).retrieve(QUESTION)
    asyncio.run(aclient.aclose())
    with pytest.raises(dossier.UsageError, match="Engine, Client or AsyncClient"):
        langchain.DossierRetriever(backend="http://127.0.0.1:8000").invoke(QUESTION)
    with dossier.Client(served.url, "dk_nope_nope") as bad:
        with pytest.raises(dossier.Unauthorized):
            llama_index.DossierRetriever(bad).retrieve(QUESTION)


def test_the_retrievers_refuse_what_is_no_question(served: Served, engine_of: Callable[[str], dossier.Engine]) -> None:
    engine = engine_of(served.store_url)
    ask = dict(backend=engine, org="northwind", caller="ana")
    with pytest.raises(dossier.InvalidRequest, match="question is text, not NoneType"):
        langchain.DossierRetriever(**ask).invoke(None)  # type: ignore[arg-type]
    with pytest.raises(dossier.InvalidRequest, match="an object of one identifier"):
        llama_index.DossierRetriever(engine, org="northwind", caller="ana", record="jane@acme.com").retrieve(QUESTION)  # type: ignore[arg-type]
    for mode in ("fetch", "expand"):
        with pytest.raises(dossier.InvalidRequest, match=f"mode: a retriever asks questions; '{mode}' takes none"):
            langchain.DossierRetriever(**ask, mode=mode).invoke(QUESTION)
