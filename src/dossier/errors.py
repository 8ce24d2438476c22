"""Every error dossier raises, in one tree.

    DossierError
    ├── UsageError                the caller's mistake; the message says what to change
    │   ├── OrgRequired           a store read or write without an org
    │   ├── InvalidRequest        a retrieve request that does not validate (names the field)
    │   ├── BundleError           a bundle that cannot load; ``problems`` lists each, with its item id
    │   ├── Unauthorized          no API key, or one that is unknown or revoked (HTTP 401)
    │   └── Forbidden             a call id, session or item of another org (HTTP 403)
    ├── ConfigError               the installation or configuration is wrong
    │   └── MissingExtra          an adapter's optional dependency is absent; names the extra
    ├── NotFound                  an org, caller, record or document that does not exist
    ├── StoreError                the storage backend failed
    │   ├── StoreUnavailable      cannot open or reach the store
    │   └── SchemaMismatch        the store was written by an incompatible schema or embedder
    └── ProviderError             an embedding / chat / rerank provider failed (status_code, body)
        └── ProviderTimeout       the provider did not answer in time

Driver exceptions are translated at the boundary: ``raise StoreUnavailable(...) from exc``. A store URL
in a message or a report goes through :func:`redacted_url` first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PASSWORD_PARAMETER = re.compile(r"(password\s*=\s*)('[^']*'|[^\s&]+)", re.IGNORECASE)


def redacted_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages, logs and reports: a URL's
    ``user:password@`` up to its last ``@`` (a password that is not percent-encoded may hold ``@``, ``:``
    or ``/``; where a later part holds an ``@`` more is hidden than needed, never less) and a
    ``password=`` parameter (of a URL's query or a libpq ``key=value`` string)."""
    url = _PASSWORD_PARAMETER.sub(r"\1***", url)
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        user, colon, _ = rest.rpartition("@")[0].partition(":")
        if colon:
            return f"{scheme}://{user}:***@{rest.rpartition('@')[2]}"
    return url


class DossierError(Exception):
    """Root of every error dossier raises on purpose."""


class UsageError(DossierError):
    """The caller asked for something that cannot be done as asked."""


class OrgRequired(UsageError):
    """A store operation was called without an org; every read and write is org-scoped."""

    def __init__(self, operation: str) -> None:
        super().__init__(f"{operation}: an org is required (every store read is scoped to one org)")
        self.operation = operation


class InvalidRequest(UsageError):
    """A retrieve request failed validation; ``field`` names the offending field."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a bundle: where (kind and item id) and what."""

    kind: str
    item_id: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.kind} {self.item_id}" if self.item_id else self.kind
        return f"{where}: {self.message}"


class BundleError(UsageError):
    """A bundle has problems; nothing of it was stored."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        first = "; ".join(str(p) for p in self.problems[:3])
        more = f" (and {len(self.problems) - 3} more)" if len(self.problems) > 3 else ""
        super().__init__(f"bundle has {len(self.problems)} problem(s): {first}{more}")


class Unauthorized(UsageError):
    """The service was called without an API key, or with one that is unknown or revoked."""


class Forbidden(UsageError):
    """The caller's key belongs to another org than the call, session or item it reaches for."""


class ConfigError(DossierError):
    """dossier is installed or configured in a way that cannot work."""


class MissingExtra(ConfigError):
    """An optional adapter was asked for but its dependencies are not installed."""

    def __init__(self, what: str, extra: str) -> None:
        super().__init__(f'{what} needs the "{extra}" extra: pip install "dossier-engine[{extra}]"')
        self.extra = extra


class NotFound(DossierError):
    """The named org, caller, record or document does not exist (in this org)."""


class StoreError(DossierError):
    """The storage backend failed."""


class StoreUnavailable(StoreError):
    """The store cannot be opened or reached."""


class SchemaMismatch(StoreError):
    """The store's schema version or embedding model does not match this dossier."""


class ProviderError(DossierError):
    """A model provider (embeddings, chat, rerank) failed."""

    def __init__(self, message: str, *, status_code: int | None = None, body: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class ProviderTimeout(ProviderError):
    """A model provider did not answer within its timeout."""


def http_status(error: DossierError) -> int:
    """The HTTP status ``error`` is answered with, the one mapping the HTTP API and the service's audit of
    refusals share: a 4xx is the caller's (a refusal), a 5xx a fault of the store, a model provider or dossier."""
    return next((status for kind, status in _STATUS if isinstance(error, kind)), 500)


#: the first class ``error`` is an instance of gives its status (subclasses before the classes they extend)
_STATUS: tuple[tuple[type[DossierError], int], ...] = (
    (Unauthorized, 401), (Forbidden, 403), (NotFound, 404), (UsageError, 422), (StoreError, 503), (ProviderError, 502),
)
