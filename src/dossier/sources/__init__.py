"""The four sources (and external ones), one module each. A source is given a
:class:`~dossier.pipeline.source_io.SourceQuery` and :class:`~dossier.pipeline.source_io.SourceTools`, never
the call, and returns a :class:`~dossier.pipeline.source_io.Found`: its candidate items for its own part of
the response and the events it wants recorded (failures it survived among them); the recall layer writes them
into the call.

The interface (:class:`Source`, :class:`Skipped`, :class:`Failed`) lives on the floor below the layers
(:mod:`dossier.pipeline.steps`); a source imports no layer."""

from __future__ import annotations

from ..pipeline.steps import Failed, Skipped, Source

__all__ = ["Failed", "Skipped", "Source"]
