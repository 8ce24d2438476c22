"""Layer 5, recall: ask every planned source for candidates; a failing source is reported, not fatal."""

from __future__ import annotations

from typing import cast

from ..schema import SourceName, item_key
from ..pipeline.call import Call
from ..pipeline.steps import Failed, Skipped


def recall(call: Call) -> None:
    assert call.plan is not None
    _prefetch(call)
    try:
        _recall(call)
    finally:
        for future in call.prefetched.values():  # a source that did not take its prefetched read
            future.cancel()
        call.prefetched.clear()


def _prefetch(call: Call) -> None:
    """Let planned sources start their store reads in the background (a failure here is not reported:
    the source then reads in the foreground, where a failure is)."""
    assert call.plan is not None
    for source in call.steps.sources:
        if call.plan.sources.get(source.name):
            try:
                source.prefetch(call)
            except Exception:  # noqa: BLE001, S110 - the foreground read reports it
                pass


def _recall(call: Call) -> None:
    assert call.plan is not None
    for source in call.steps.sources:
        # Engine.sources is a tuple of concrete classes whose ``name`` class attributes are inferred as plain
        # ``str``; each is one of the SourceName literals (the Source protocol says so).
        name = cast(SourceName, source.name)
        result = call.results[name]
        if not call.plan.sources.get(name):
            call.decide(name, detail={"skipped": "not requested"})
            continue
        call.decide(name, ran=True)
        result.status = "empty"
        try:
            found = source.recall(call)
        except Skipped as reason:
            result.status = "skipped"
            call.decide(name, ran=False, detail={"skipped": str(reason)})
            continue
        except Failed:
            result.status = "error"
            call.degrade(name, "failed")  # the source reported its failure with call.fail
            continue
        except Exception as exc:  # noqa: BLE001 - one source failing never sinks the call
            call.fail(name, exc)
            continue
        call.candidates[name] = found
        if name != "documents":  # the documents source notes its candidates itself, with how each was found
            for item in found:
                call.note(name, item_key(item), "recall", "kept", getattr(item, "tier", None), getattr(item, "score", None))
