"""dossier: a self-hostable retrieval engine for AI agents.

    import dossier
    with dossier.open("sqlite:///dossier.db") as engine:
        engine.load_bundle("examples/sample-org.json")
"""

from .bundle import Bundle, Caller, Document, Edge, Identifiers, Memory, Org, Record, Section
from .engine import Engine
from .engine import open_engine as open
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
from .loading import LoadReport
from .schema import RetrieveRequest, RetrieveResponse
from .settings import Settings, Thresholds

__version__ = "0.1.0"

__all__ = [
    "Bundle",
    "BundleError",
    "Caller",
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
