"""The four sources (and external ones), one module each. A source's ``recall`` returns candidate
items for its own part of the response; failures it can survive are reported with ``call.fail``."""

from __future__ import annotations

from typing import Any, Protocol

from ..layers.context import Call
from ..schema import SourceName


class Skipped(Exception):
    """Raised by a source that has nothing to do for this call (e.g. no record); the reason is reported."""


class Failed(Exception):
    """Raised by a source whose failure it already reported with ``call.fail``; marks it ``error``."""


class Source(Protocol):
    name: SourceName

    def recall(self, call: Call) -> list[Any]: ...
