"""dossier: a self-hostable retrieval engine for AI agents.

    import dossier
    with dossier.open("sqlite:///dossier.db") as engine:
        engine.load_bundle("examples/sample-org.json")

The names below load on first use (PEP 562), so that ``import dossier`` (and the CLI's light commands)
do not pay for pydantic models, numpy and the engine until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    BundleError,
    ConfigError,
    DossierError,
    Forbidden,
    InvalidRequest,
    MissingExtra,
    NotFound,
    OrgRequired,
    Problem,
    ProviderError,
    ProviderTimeout,
    SchemaMismatch,
    StoreError,
    StoreUnavailable,
    Unauthorized,
    UsageError,
)
from .settings import Settings, Thresholds

if TYPE_CHECKING:
    from .bundle import Bundle, Caller, Document, Edge, Identifiers, Memory, Org, Record, Section
    from .client import AsyncClient, Client
    from .engine import Engine
    from .engine import open_engine as open
    from .loading import LoadReport
    from .schema import RetrieveRequest, RetrieveResponse

__version__ = "0.1.0"

#: name -> (module, attribute) of the names that load on first use
_LAZY = {
    **{name: (".bundle", name) for name in ("Bundle", "Caller", "Document", "Edge", "Identifiers", "Memory", "Org",
                                            "Record", "Section")},
    "AsyncClient": (".client", "AsyncClient"),
    "Client": (".client", "Client"),
    "Engine": (".engine", "Engine"),
    "open": (".engine", "open_engine"),
    "LoadReport": (".loading", "LoadReport"),
    "RetrieveRequest": (".schema", "RetrieveRequest"),
    "RetrieveResponse": (".schema", "RetrieveResponse"),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'dossier' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module, __name__), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AsyncClient",
    "Bundle",
    "BundleError",
    "Caller",
    "Client",
    "ConfigError",
    "Document",
    "DossierError",
    "Edge",
    "Engine",
    "Forbidden",
    "Identifiers",
    "InvalidRequest",
    "LoadReport",
    "Memory",
    "MissingExtra",
    "NotFound",
    "Org",
    "OrgRequired",
    "Problem",
    "ProviderError",
    "ProviderTimeout",
    "Record",
    "RetrieveRequest",
    "RetrieveResponse",
    "SchemaMismatch",
    "Section",
    "Settings",
    "StoreError",
    "StoreUnavailable",
    "Thresholds",
    "Unauthorized",
    "UsageError",
    "open",
]
