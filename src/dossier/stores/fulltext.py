"""Turning a question into full-text search terms, shared by the SQLite and PostgreSQL stores.

Words are lower-cased, stop words dropped, duplicates removed. Codes such as ``NW-EDU-40`` or
``ERR-SYNC-409`` stay one term, searched as a phrase, so only the exact code matches.
"""

from __future__ import annotations

import re

_TERM = re.compile(r"\w+(?:[-_./]\w+)*")
STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more most my
    myself no nor not now of off on once only or other our ours ourselves out over own same she should so
    some such than that the their theirs them themselves then there these they this those through to too
    under until up very was we were what when where which while who whom why will with would you your
    yours yourself yourselves us also get got may might must shall tell say said know let lets ok please
    whats whos hows""".split()
)
MAX_TERMS = 24


def terms(query: str) -> list[str]:
    """The distinct search terms of ``query``, in order of first appearance."""
    seen: dict[str, None] = {}
    for match in _TERM.finditer(query.lower()):
        term = match.group(0).strip("-_./")
        if term and term not in STOP_WORDS and (len(term) > 1 or term.isdigit()):
            seen.setdefault(term, None)
    return list(seen)[:MAX_TERMS]


def codes(query: str) -> list[str]:
    """Terms that look like codes (a letter-digit mix or a hyphenated number): SKUs, error codes."""
    return [t for t in terms(query) if any(c.isdigit() for c in t) and (any(c.isalpha() for c in t) or "-" in t)]


def fts5_query(query: str) -> str | None:
    """An FTS5 MATCH expression: each term quoted (codes become phrases), joined with OR."""
    found = terms(query)
    if not found:
        return None
    return " OR ".join('"' + t.replace('"', "") + '"' for t in found)
