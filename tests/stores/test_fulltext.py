"""Questions become safe full-text queries: stop words dropped, codes kept whole, syntax neutralised."""

from __future__ import annotations

import pytest

from dossier.stores.fulltext import MAX_TERMS, fts5_query, terms


@pytest.mark.parametrize(
    "query, expected",
    [
        ("What pricing did we discuss?", ["pricing", "discuss"]),
        ("What is NW-EDU-40 about?", ["nw-edu-40"]),
        ("ERR-SYNC-409 again, err-sync-409 twice!", ["err-sync-409", "twice"]),
        ("file v2.3.1 and foo_bar", ["file", "v2.3.1", "foo_bar"]),
        ("what is the", []),
        ("", []),
        ('"quoted" (paren) star* col:name', ["quoted", "paren", "star", "col", "name"]),
        ("Über Größe", ["über", "größe"]),
        ("a 7 b", ["7"]),
    ],
)
def test_terms(query: str, expected: list[str]) -> None:
    assert terms(query) == expected


def test_fts5_query_quotes_every_term() -> None:
    assert fts5_query("Discount NW-EDU-40 or refunds") == '"discount" OR "nw-edu-40" OR "refunds"'
    assert fts5_query("the of and") is None


def test_terms_are_capped() -> None:
    assert len(terms(" ".join(f"word{i}" for i in range(100)))) == MAX_TERMS
