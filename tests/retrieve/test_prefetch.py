"""Prefetching: on a store that reads concurrently, a call starts its section searches and its graph walk
on background threads while the record's own sources recall. The response must not depend on it, and a
failure in a background read is reported exactly as in the foreground."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

import dossier
from tests.retrieve.faults import FaultyStore, kind_is

QUESTIONS = Path(__file__).resolve().parents[2] / "examples" / "eval" / "sample-questions.json"


def _requests() -> list[dict[str, Any]]:
    questions = json.loads(QUESTIONS.read_text(encoding="utf-8"))["questions"]
    return [q for q in questions if q.get("record") and q.get("message")][:25]


def _answers(engine: dossier.Engine) -> list[str]:
    out = []
    for q in _requests():
        response = engine.retrieve({"record": q["record"], "message": q["message"]}, org=q["org"], caller=q["caller"])
        data = response.model_dump(mode="json", exclude={"call_id"})
        for timing in ("elapsed_ms", "layers", "steps"):  # how long each layer took differs from call to call
            data["route"]["deadline"]["detail"].pop(timing, None)
        out.append(json.dumps(data))
    return out


def test_prefetched_and_sequential_calls_answer_the_same(fresh_engine: dossier.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    store = fresh_engine.store
    threads: set[str] = set()
    search = store.search_vectors

    def watched(*args: Any, **kwargs: Any) -> Any:
        threads.add(threading.current_thread().name)
        return search(*args, **kwargs)

    monkeypatch.setattr(store, "search_vectors", watched)
    concurrent = _answers(fresh_engine)
    background = {name for name in threads if name.startswith("dossier-prefetch")}
    assert bool(background) == store.concurrent_reads  # PostgreSQL prefetches; SQLite reads in the foreground
    monkeypatch.setattr(store, "concurrent_reads", False, raising=False)
    threads.clear()
    assert _answers(fresh_engine) == concurrent
    assert not {name for name in threads if name.startswith("dossier-prefetch")}


@pytest.mark.parametrize(
    "fault, source, reported",
    [
        ({"search_text": kind_is("section")}, "documents", "full-text search failed"),
        ({"search_vectors": kind_is("section", parents=False)}, "documents", "vector search failed"),
        ({"edges_around": lambda *a, **k: True}, "graph", "InjectedFault"),
    ],
)
def test_a_failing_background_read_is_reported_like_a_foreground_one(
    fresh_engine: dossier.Engine, fault: dict, source: str, reported: str
) -> None:
    fresh_engine.store = FaultyStore(fresh_engine.store, fault)  # type: ignore[assignment]
    response = fresh_engine.retrieve(
        {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "What discount rules apply to a three-year prepay?"},
        org="northwind", caller="ana",
    )  # fmt: skip
    assert reported in (response.sources[source].error or "")
    assert response.partial


def _watch_embedding(engine: dossier.Engine, monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    """The threads each way of running the model ran on: ``all`` (every core), ``beside`` (one core)."""
    embedder = engine.embedder
    threads: dict[str, set[str]] = {"all": set(), "beside": set()}
    for way, name in (("all", "embed_query"), ("beside", "embed_query_beside")):
        inner = getattr(embedder, name)

        def embedded(text: str, inner: Any = inner, way: str = way) -> Any:
            threads[way].add(threading.current_thread().name)
            return inner(text)

        monkeypatch.setattr(embedder, name, embedded)
    return threads


def test_the_query_is_embedded_ahead_while_the_full_text_searches_run_and_the_answers_are_the_same(
    fresh_engine: dossier.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = fresh_engine.store
    threads: dict[str, set[str]] = {"memory": set(), "section": set()}
    search = store.search_text

    def searched(kind: str, *args: Any, **kwargs: Any) -> Any:
        threads[kind].add(threading.current_thread().name)
        return search(kind, *args, **kwargs)

    monkeypatch.setattr(store, "search_text", searched)
    model = _watch_embedding(fresh_engine, monkeypatch)
    ahead = _answers(fresh_engine)
    # PostgreSQL: the call's thread embeds the question on every core while the server searches; SQLite: the
    # sample org's searches are short, so the question is embedded after them, on every core too
    assert model["all"] and not model["beside"]
    # the sections' full-text search: PostgreSQL in the background, SQLite on the call's own thread (in
    # prefetch, before the question is embedded); the memories' on the call's thread on both
    assert any(name.startswith("dossier-prefetch") for name in threads["section"]) == store.concurrent_reads
    assert threads["memory"] and not any(name.startswith("dossier-prefetch") for name in threads["memory"])
    monkeypatch.setattr(fresh_engine, "embed_ahead", lambda *args, **kwargs: None)
    monkeypatch.setattr(fresh_engine, "while_embedding", lambda *args, **kwargs: None)
    monkeypatch.setattr(store, "concurrent_reads", False, raising=False)
    for seen in (*threads.values(), *model.values()):
        seen.clear()
    assert _answers(fresh_engine) == ahead
    assert not any(name.startswith("dossier-prefetch") for seen in (*threads.values(), *model.values()) for name in seen)


def test_a_record_with_a_long_full_text_search_on_sqlite_is_embedded_on_one_core_beside_it(
    fresh_engine: dossier.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dossier.sources import context_helpers

    request = {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "What pricing did we discuss?"}
    store = fresh_engine.store
    held = store.text_scope_rows("memory", org="northwind", most=1_000, parents=["rec-jane"])
    assert 0 < held < context_helpers.LONG_TEXT_SCOPE
    model = _watch_embedding(fresh_engine, monkeypatch)
    short = fresh_engine.retrieve(request, org="northwind", caller="ana")
    assert model["all"] and not model["beside"]  # a short search, then the model on every core
    monkeypatch.setattr(context_helpers, "LONG_TEXT_SCOPE", held)  # the record's search now counts as long
    model["all"].clear()
    long = fresh_engine.retrieve({**request, "message": "What pricing did we discuss with her?"}, org="northwind",
                                 caller="ana")  # fmt: skip
    if store.concurrent_reads:  # PostgreSQL searches in the background whatever the size: the call's thread embeds
        assert model["all"] and not model["beside"]
    else:
        assert model["beside"] and all(name.startswith("dossier-prefetch") for name in model["beside"])
    assert short.items("memories") and long.items("memories")


def test_a_failing_full_text_memory_search_started_ahead_is_reported_like_a_foreground_one(
    fresh_engine: dossier.Engine,
) -> None:
    fresh_engine.store = FaultyStore(fresh_engine.store, {"search_text": kind_is("memory")})  # type: ignore[assignment]
    response = fresh_engine.retrieve(
        {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "What pricing did we discuss?"},
        org="northwind", caller="ana",
    )  # fmt: skip
    assert "full-text memory search failed" in (response.sources["memories"].error or "")
    assert response.partial and response.items("memories")  # the vector search's memories stand


def test_the_record_s_reads_that_need_no_vector_run_while_its_question_embeds_and_change_no_answer(
    fresh_engine: dossier.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite, where the record's full-text search is long (the question embedded beside it), the recent
    memories and the rows of the search's hits are read before the memories' vector search waits for the
    vector, and recall reads only the candidates still missing; the answers are the same."""
    from dossier.sources import context_helpers

    store = fresh_engine.store
    log: list[tuple[str, int]] = []  # (the store method, ids asked: get_memories only)
    for name in ("recent_memories", "get_memories", "search_vectors", "search_vectors_many"):
        inner = getattr(store, name)

        def watched(*args: Any, inner: Any = inner, name: str = name, **kwargs: Any) -> Any:
            if name != "search_vectors" or args[0] == "memory":
                log.append((name, len(args[0]) if name == "get_memories" else 0))
            return inner(*args, **kwargs)

        monkeypatch.setattr(store, name, watched)

    def first_reads() -> list[str]:
        """The store methods of the first call's memory reads, up to its first memory vector search."""
        names = [name for name, _ in log]
        return names[: min(names.index(n) for n in ("search_vectors", "search_vectors_many") if n in names)]

    short = _answers(fresh_engine)
    assert first_reads() == ["recent_memories"]  # recall reads the recent tier, then searches by the vector
    read_short = sum(n for name, n in log if name == "get_memories")
    monkeypatch.setattr(context_helpers, "LONG_TEXT_SCOPE", 1)  # every record's search now counts as long
    log.clear()
    assert _answers(fresh_engine) == short
    if store.concurrent_reads:  # PostgreSQL searches the record's memories in recall, as before
        assert first_reads() == ["recent_memories"]
    else:
        assert first_reads() == ["recent_memories", "get_memories"]
        # the rows read ahead are not read again: as many ids asked in all as before, in more reads
        assert sum(n for name, n in log if name == "get_memories") == read_short


def test_a_failing_read_of_the_recent_memories_made_while_the_question_embeds_is_reported_as_before(
    fresh_engine: dossier.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dossier.sources import context_helpers

    request = {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "What pricing did we discuss?"}
    fresh_engine.store = FaultyStore(fresh_engine.store, {"recent_memories": lambda *a, **k: True})  # type: ignore[assignment]
    before = fresh_engine.retrieve(request, org="northwind", caller="ana")
    monkeypatch.setattr(context_helpers, "LONG_TEXT_SCOPE", 1)
    ahead = fresh_engine.retrieve({**request, "message": "What pricing did we discuss with her?"}, org="northwind",
                                  caller="ana")  # fmt: skip
    for response in (before, ahead):
        assert response.sources["memories"].status == "error" and "InjectedFault" in (response.sources["memories"].error or "")
        assert response.partial and response.items("properties")  # the other sources stand


def test_on_sqlite_the_graph_walk_runs_before_the_first_search_that_waits_for_the_question_s_vector(
    fresh_engine: dossier.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk needs no vector: on a store that reads on the call's thread it is made in prefetch, where a
    question embedded ahead is still running, and no source waits for the vector before recall."""
    store = fresh_engine.store
    log: list[str] = []
    for name in ("edges_around", "search_vectors", "search_vectors_many"):
        inner = getattr(store, name)

        def watched(*args: Any, inner: Any = inner, name: str = name, **kwargs: Any) -> Any:
            log.append(f"{name}:{threading.current_thread().name}")
            return inner(*args, **kwargs)

        monkeypatch.setattr(store, name, watched)
    response = fresh_engine.retrieve(
        {"mode": "brief", "record": {"email": "jane@acme.com"}, "message": "What discount rules apply to a three-year prepay?"},
        org="northwind", caller="ana",
    )  # fmt: skip
    assert response.items("graph") and response.items("documents")
    walk = next(i for i, entry in enumerate(log) if entry.startswith("edges_around"))
    if store.concurrent_reads:  # PostgreSQL: the walk and the section vector search in the background
        assert log[walk].split(":")[1].startswith("dossier-prefetch")
    else:
        assert log[walk].split(":")[1] == threading.current_thread().name
        assert walk == 0  # before any vector search: the walk ran in prefetch
