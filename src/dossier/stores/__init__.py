"""Storage backends behind one protocol (:class:`~dossier.stores.base.Store`), chosen by URL.

Importing this package is light (no numpy, no pydantic models): the service tables' module and a backend
are imported when one is opened, so a command that only reads keys or counts starts quickly.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, MissingExtra, redacted_url
from ..settings import HNSW_MIN_ROWS

if TYPE_CHECKING:
    from .base import Store

DEFAULT_URL = "sqlite:///dossier.db"


def store_from_url(url: str | None, *, hnsw_min_rows: int = HNSW_MIN_ROWS) -> Store:
    """``sqlite:///relative.db``, ``sqlite:////absolute.db``, ``sqlite://:memory:`` or ``postgresql://...``."""
    url = url or DEFAULT_URL
    if url.startswith("sqlite://"):
        from .sqlite import SQLiteStore

        path = url[len("sqlite://") :]
        if path in (":memory:", "/:memory:"):
            return SQLiteStore(":memory:", hnsw_min_rows=hnsw_min_rows)
        if not path.startswith("/") or path == "/":
            raise ConfigError(f"bad SQLite URL {url!r}: use sqlite:///relative/path.db or sqlite:////absolute/path.db")
        return SQLiteStore(Path(path[1:]), hnsw_min_rows=hnsw_min_rows)
    if url.startswith(("postgresql://", "postgres://")):
        try:
            import pgvector.psycopg  # noqa: F401
            import psycopg  # noqa: F401
            import psycopg_pool  # noqa: F401
        except ImportError as exc:
            raise MissingExtra("the PostgreSQL store", "postgres") from exc
        from .postgres import PostgresStore

        return PostgresStore("postgresql://" + url.split("://", 1)[1])
    raise ConfigError(f"unknown store URL {redacted_url(url)!r}: expected sqlite:///PATH or postgresql://...")
