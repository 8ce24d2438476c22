"""Layer 9, budget: one byte budget, shared by the sources, feeding the caller and any model alike.

Sizes are UTF-8 bytes of each item's packed line (:func:`packed_text`), a tokenizer-free upper bound.
Shares of sources with nothing to pack go to the others; after the first pass, bytes a source left
unused go to sources that still had items waiting. An item that would overflow is cut (and marked
``truncated``) only when a useful part fits; otherwise it is dropped and counted, never lost silently.
"""

from __future__ import annotations

from typing import Any

from ..bundle import property_display
from ..schema import SOURCE_NAMES, EdgeItem, ExternalItem, MemoryItem, PropertyItem, SectionItem, SourceName, item_key
from ..pipeline.call import Call

MIN_CUT_BYTES = 160  # below this, a cut item says too little to be worth its bytes
ELLIPSIS = " …"


def packed_text(item: Any) -> str:
    """The line an item contributes to the packed context."""
    if isinstance(item, MemoryItem):
        return f"{item.created_at:%Y-%m-%d} {item.text}"
    if isinstance(item, PropertyItem):
        return f"{item.record_id}.{item.name}: {property_display(item.value)}"
    if isinstance(item, SectionItem):
        return f"{item.title} > {item.heading}\n{item.text}"
    if isinstance(item, EdgeItem):
        return f"{item.src} -[{item.type}]-> {item.dst} (confidence {item.confidence:g}, {item.hops} hop{'s' * (item.hops > 1)})"
    if isinstance(item, ExternalItem):
        return f"{item.source}: {item.text}"
    raise TypeError(f"cannot pack {type(item).__name__}")


def size(item: Any) -> int:
    """Bytes ``item`` takes in the packed context: its line and the newline that ends it."""
    return len(packed_text(item).encode("utf-8")) + 1


def packed_context(response: Any) -> str:
    """The packed context of a response, exactly as budgeted: what the caller got, and what a model
    would see (one budget). Sources in contract order, items in packed order, one line each."""
    return "".join(packed_text(item) + "\n" for s in SOURCE_NAMES for item in response.sources[s].items)


def _cut(item: Any, room: int) -> Any | None:
    """A copy of ``item`` whose text is shortened so that it packs into ``room`` bytes, or None."""
    if not hasattr(item, "text") or room < MIN_CUT_BYTES:
        return None
    empty = item.model_copy(update={"text": ""})
    keep = room - size(empty) - len(ELLIPSIS.encode())
    if keep <= 0:
        return None
    text = item.text.encode("utf-8")[:keep].decode("utf-8", "ignore").rstrip()
    return item.model_copy(update={"text": text + ELLIPSIS, "truncated": True})


def shares(call: Call, active: list[SourceName]) -> dict[SourceName, int]:
    """Bytes per active source: requested (or default) shares, renormalised over active sources."""
    total = call.request.budget.totalTokens
    weights = call.settings.shares.as_dict()
    if call.request.budget.shares:
        weights.update(call.request.budget.shares.items())  # as pairs: SourceName keys into a dict[str, float]
    mass = sum(weights[s] for s in active)
    if mass <= 0:
        return {s: total // max(len(active), 1) for s in active}
    return {s: int(total * weights[s] / mass) for s in active}


def pack(call: Call) -> None:
    total = call.request.budget.totalTokens
    active = [s for s in SOURCE_NAMES if call.candidates[s]]
    allowance = shares(call, active)
    call.decide("budget", ran=True, detail={"shares": dict(allowance)})
    packed: dict[SourceName, list[tuple[Any, Any]]] = {s: [] for s in SOURCE_NAMES}  # (candidate, item packed for it)
    used: dict[SourceName, int] = {s: 0 for s in SOURCE_NAMES}
    waiting: dict[SourceName, list[Any]] = {}
    sizes: dict[int, int] = {}  # id(candidate) -> size: a candidate left waiting is sized once, not once per pass
    for source in active:
        waiting[source] = _fill(call.candidates[source], allowance[source], packed[source], used, source, sizes)
    # Bytes left unused go to sources that still have items waiting, in proportion to their shares;
    # what is still left then goes to the smallest sources first (their items are the shortest).
    for proportional in (True, False):
        spare = total - sum(used.values())
        hungry = [s for s in waiting if waiting[s]]
        mass = sum(allowance[s] for s in hungry) or 1
        for source in sorted(hungry, key=lambda s: -allowance[s] if proportional else allowance[s]):
            spare = total - sum(used.values())
            room = int(spare * allowance[source] / mass) if proportional else spare
            if room <= 0:
                continue
            before = used[source]
            waiting[source] = _fill(waiting[source], room, packed[source], used, source, sizes, offset=before)
    for source in SOURCE_NAMES:
        result = call.results[source]
        # in the sources' own order (best first, nearest first), whichever pass packed an item: a later pass
        # appends what an earlier one could not fit, and a pass skips an item to pack a smaller one after it
        rank = {id(c): i for i, c in enumerate(call.candidates[source])}
        result.items = [item for _, item in sorted(packed[source], key=lambda pair: rank[id(pair[0])])]
        result.bytes_used = used[source]
        result.dropped = len(waiting.get(source, []))
        if not call.request.trace:  # the notes below are read by the trace alone
            continue
        for item in waiting.get(source, []):
            call.note(source, item_key(item), "budget", "dropped", "over_budget", getattr(item, "score", None))
        for item in result.items:
            call.note(source, item_key(item), "budget", "kept", "truncated" if getattr(item, "truncated", False) else None)
    call.shares = dict(allowance.items())  # as pairs: call.shares is dict[str, int]


def _fill(items: list[Any], room: int, out: list[tuple[Any, Any]], used: dict[SourceName, int], source: SourceName,
          sizes: dict[int, int], offset: int = 0) -> list[Any]:  # fmt: skip
    """Pack ``items`` into ``room`` bytes (beyond ``offset`` already used), adding (candidate, item packed:
    itself or a cut copy) to ``out``; return what did not fit. ``sizes`` keeps each item's size by ``id``
    (the candidates stay alive while the call packs)."""
    left: list[Any] = []
    spent = 0
    for item in items:
        need = sizes.get(id(item))
        if need is None:
            need = sizes[id(item)] = size(item)
        if spent + need <= room:
            out.append((item, item))
            spent += need
            continue
        cut = _cut(item, room - spent)
        if cut is not None:
            out.append((item, cut))
            spent += size(cut)
        else:
            left.append(item)
    used[source] = offset + spent
    return left

