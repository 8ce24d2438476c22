"""What happened during a call that the response must tell, recorded as it happens and read once.

Layers never rewrite what an earlier layer decided (the plan is frozen once planned), and no layer writes
a route: each appends events to ``call.events`` (a :class:`Decision` for what a route shows, a
:class:`Fallback` when a model step fell back, :class:`Degraded` for a failure the call survives), and
``report`` builds the routes and ``partial`` from them, in one place (layers/report.py). How long
each layer and model step took is recorded by the call's :class:`~dossier.deadline.Deadline` (model steps
run on threads of their own, and it is the one thread-safe record of them); report folds it into
``route["deadline"]`` in the same place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Fallback:
    """A model step of a deep call failed (or ran out of time) and its heuristic ran instead: the
    call goes on at standard depth for that step."""

    step: str  # filters | rephrase | rerank | select
    reason: str  # deep_timeout | deep_error
    fallback: str  # what ran instead ("rules", "no rephrasings", "fused order", "heuristic")
    error: str  # what went wrong, as the documents source's error says

    @property
    def text(self) -> str:
        """How ``route.documents.detail.deep_fallbacks`` and ``route.understand.detail.deep_fallbacks`` say it."""
        return f"{self.reason}: {self.fallback}"


@dataclass(frozen=True)
class Degraded:
    """Something failed that the call survived (a source, a fallback, the session): the response is ``partial``."""

    where: str  # a source or a layer
    error: str


@dataclass(frozen=True)
class Decision:
    """What a layer or source decided that ``route[route]`` shows: Route fields (``ran``, ``backend``,
    ``fallback_reason``), ``detail`` keys set, and ``append`` keys whose lists grow by one entry. The
    first decision about a route opens it (routes are listed in that order)."""

    route: str
    fields: dict[str, Any] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    append: dict[str, Any] = field(default_factory=dict)


Event = Fallback | Degraded | Decision
