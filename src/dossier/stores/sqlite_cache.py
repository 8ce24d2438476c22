"""Documents and memories read from the embedded store, kept per process while their org's generation
stays.

Every brief call reads the documents of its section candidates again (the governance layer judges
visibility on fresh rows): a few dozen documents with all their sections, rebuilt as models each time,
about a tenth of a small org's call. The memories source reads its candidates (a hundred or two on a
large record), many of them the same call after call. Any write to an org moves its generation
(``orgs.generation``, in the write's own transaction, whichever process writes), so an item kept under
the generation read at the start of a read is the row that read would return. The generation is read
*before* the items: a write landing between the two reads is then seen as a newer generation by the next
read, which drops what this one kept (read the other way round, an old row could be kept under the new
generation).

Entries are keyed by (org, id): an item of one org is never returned for another's. Items are frozen
models, so one call cannot change what another is handed. The bounds are on the text kept (a document's
sections, a memory's text), in characters, and on the number of items, least recently used items going
first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Generic, Sequence, TypeVar

if TYPE_CHECKING:
    from ..bundle import Document, Memory

#: characters of text kept per store handle and kind of item (ids, headings and models take about as much again)
CHARS_KEPT = 8_000_000
#: items kept per store handle and kind: each is a few objects the garbage collector walks in every full
#: collection, so a cache of many small items would make those pauses longer
ITEMS_KEPT = 20_000

Item = TypeVar("Item", "Document", "Memory")


def document_chars(document: Document) -> int:
    return sum(len(s.text) + len(s.heading) for s in document.sections) + len(document.title)


def memory_chars(memory: Memory) -> int:
    return len(memory.text)


class GenerationCache(Generic[Item]):
    """Items by (org, id), valid for the generation they were read at (see the module's docstring).
    Callers hold the store's lock around :meth:`get` (reads and this cache belong to one connection)."""

    def __init__(self, generation: Callable[[str], int | None], size: Callable[[Item], int], limit: int = CHARS_KEPT,
                 items: int = ITEMS_KEPT) -> None:  # fmt: skip
        self._generation = generation  # org -> its generation now (None: no such org)
        self._size: Callable[[Item], int] = size
        self._limit = limit
        self._most = items
        self._items: OrderedDict[tuple[str, str], tuple[Item, int]] = OrderedDict()  # -> (it, its size)
        self._generations: dict[str, int] = {}  # org -> the generation its kept items were read at
        self._chars = 0

    def get(self, ids: Sequence[str], *, org: str, read: Callable[[list[str]], list[Item]]) -> list[Item]:
        """The items ``ids`` of ``org`` that exist (each once, in the order asked), those not kept read
        through ``read``."""
        wanted = list(dict.fromkeys(ids))
        generation = self._generation(org)
        if generation is None:  # no org row: nothing to validate against, nothing kept
            read_now = {item.id: item for item in read(wanted)}
            return [read_now[i] for i in wanted if i in read_now]
        if self._generations.get(org) != generation:
            self._drop(org)
            self._generations[org] = generation
        found: dict[str, Item] = {}
        missing = []
        for item_id in wanted:
            kept = self._items.get((org, item_id))
            if kept is None:
                missing.append(item_id)
            else:
                self._items.move_to_end((org, item_id))
                found[item_id] = kept[0]
        if missing:
            for item in read(missing):
                found[item.id] = item
                self._keep(org, item)
        return [found[i] for i in wanted if i in found]

    def _keep(self, org: str, item: Item) -> None:
        size = self._size(item)
        if size > self._limit:
            return
        key = (org, item.id)
        if key in self._items:
            self._chars -= self._items.pop(key)[1]
        self._items[key] = (item, size)
        self._chars += size
        while self._chars > self._limit or len(self._items) > self._most:
            _, (_, dropped) = self._items.popitem(last=False)
            self._chars -= dropped

    def _drop(self, org: str) -> None:
        for key in [k for k in self._items if k[0] == org]:
            self._chars -= self._items.pop(key)[1]

    def clear(self) -> None:
        self._items.clear()
        self._generations.clear()
        self._chars = 0
