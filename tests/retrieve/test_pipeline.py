"""The pipeline's shape: its steps in order, and the layer numbers their modules' docstrings give."""

from __future__ import annotations

import re
import sys

from dossier.retrieve import PIPELINE


def test_sessions_are_steps_of_their_own() -> None:
    names = [step.__name__ for step in PIPELINE]
    assert names[0] == "restore_session" and names[1] == "plan"
    assert names[-2:] == ["keep_session", "report"]
    assert names.index("govern") < names.index("rerank") < names.index("select_sections") < names.index("pack")


def test_each_layer_docstring_names_its_place_in_the_pipeline() -> None:
    for place, step in enumerate(PIPELINE, start=1):
        doc = sys.modules[step.__module__].__doc__ or ""
        heading = re.match(r"Layers? ([\d, and]+),", doc)
        assert heading is not None, f"{step.__module__} does not start with 'Layer N,'"
        assert place in {int(n) for n in re.findall(r"\d+", heading.group(1))}, (step.__name__, heading.group(0))
