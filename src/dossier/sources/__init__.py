"""The four sources (and external ones), one module each. A source's ``recall`` returns candidate
items for its own part of the response; failures it can survive are reported with ``call.fail``.

The interface (:class:`Source`, :class:`Skipped`, :class:`Failed`) lives on the floor below the layers
(:mod:`dossier.pipeline.steps`); a source imports no layer."""

from __future__ import annotations

from ..pipeline.steps import Failed, Skipped, Source

__all__ = ["Failed", "Skipped", "Source"]
