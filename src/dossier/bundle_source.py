"""Where a load reads a bundle from: a JSON file (streamed one item at a time), a parsed mapping, or a
:class:`~dossier.bundle.Bundle`. A load reads its source more than once (check, embed, write), holding
one chunk of items at a time, so a bundle far larger than memory loads in bounded memory.

A file is parsed incrementally (ijson): its top-level object's lists are read item by item, and the
values of keys that are not item lists are skipped without being built. A leading UTF-8 byte order mark
is skipped, as editors on Windows write one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator, Mapping

from .bundle import ITEM_MODELS, Bundle
from .errors import BundleError, Problem, UsageError
from .identifiers import clip

#: one entry of a source: (top-level key, position in its list or None when the key holds no list, value)
Entry = tuple[str, int | None, Any]


class BundleSource:
    """A bundle to read, again and again: ``entries()`` yields every item of every list in order."""

    def __init__(self, source: str | Path | Mapping[str, Any] | Bundle) -> None:
        self._source = source
        #: items are already validated models (a Bundle), not raw JSON values
        self.validated = isinstance(source, Bundle)
        self._stamp: tuple[int, int, int] | None = None
        if isinstance(source, (str, Path)):
            path = Path(source)
            try:
                with path.open("rb"):
                    pass
                self._stamp = _stamp(path)
            except OSError as exc:
                raise UsageError(f"cannot read bundle {source}: {exc.strerror or exc}") from exc
        elif not isinstance(source, (Mapping, Bundle)):
            raise BundleError([Problem("bundle", None, "must be a JSON object with lists such as 'records'")])

    @property
    def name(self) -> str:
        return str(self._source) if isinstance(self._source, (str, Path)) else "bundle"

    def entries(self) -> Iterator[Entry]:
        source = self._source
        if isinstance(source, Bundle):
            for list_name in ITEM_MODELS:
                yield from ((list_name, i, item) for i, item in enumerate(getattr(source, list_name)))
        elif isinstance(source, Mapping):
            for key, value in source.items():
                if isinstance(value, list) and key in ITEM_MODELS:
                    yield from ((key, i, item) for i, item in enumerate(value))
                else:
                    yield key, None, value
        else:
            # a load reads the file three times (check, embed, write): each read must be of the file checked
            self._unchanged(Path(source))
            yield from _file_entries(Path(source))
            self._unchanged(Path(source))

    def _unchanged(self, path: Path) -> None:
        try:
            now = _stamp(path)
        except OSError as exc:
            raise UsageError(f"cannot read bundle {path}: {exc.strerror or exc}") from exc
        if now != self._stamp:
            raise BundleError([Problem("bundle", None, "the file changed while it was being loaded (its size or "
                                       "modification time moved): nothing was written; load it again")])  # fmt: skip


def _stamp(path: Path) -> tuple[int, int, int]:
    """What tells one state of a file from another: its size, modification time (ns) and inode."""
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns, stat.st_ino


def _file_entries(path: Path) -> Iterator[Entry]:
    import ijson

    try:
        at = _lone_surrogate(path)
        if at is not None:  # yajl would read it as "?", and two ids that differ there would be one
            raise BundleError([Problem("bundle", None, f"{path} holds a lone surrogate escape (\\ud800-\\udfff) at byte "
                                                       f"{at}: it is not text")])  # fmt: skip
        with path.open("rb") as f:
            if f.read(len(_BOM)) != _BOM:
                f.seek(0)
            events = ijson.basic_parse(f, use_float=True)
            first, _ = next(events, ("end", None))
            positions: dict[str, int] = {}
            if first != "start_map":
                raise BundleError([Problem("bundle", None, "must be a JSON object with lists such as 'records'")])
            for event, key in events:
                if event == "end_map":
                    for _ in events:  # anything after the object is an error, as json.load says
                        pass
                    return
                event, value = next(events)
                if key not in ITEM_MODELS:
                    _skip(event, events)
                    yield key, None, None  # the key is listed as ignored; its value is never built
                elif event != "start_array":
                    yield key, None, _build(event, value, events)
                else:
                    position = positions.get(key, 0)  # a key given twice goes on numbering its items
                    for event, value in events:
                        if event == "end_array":
                            break
                        yield key, position, _build(event, value, events)
                        position += 1
                    positions[key] = position
    except (ijson.JSONError, UnicodeDecodeError) as exc:
        raise BundleError([Problem("bundle", None, f"{path} is not valid JSON: {_parse_error(exc)}")]) from exc
    except OSError as exc:
        raise UsageError(f"cannot read bundle {path}: {exc.strerror or exc}") from exc


_BOM = b"\xef\xbb\xbf"  # UTF-8 byte order mark
#: A \uD800-\uDFFF escape, and whether it is a high (\uD800-\uDBFF) or a low one.
_SURROGATE = re.compile(rb"\\u[dD]([89abAB]|[c-fC-F])[0-9a-fA-F]{2}")


def _lone_surrogate(path: Path) -> int | None:
    """The byte offset of the first surrogate escape of ``path`` that is not half of a pair (a high one followed
    at once by a low one), or None; an escaped backslash before a ``u`` is no escape. The file is mapped, not read."""
    import mmap

    with path.open("rb") as f:
        if path.stat().st_size == 0:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            waiting: int | None = None  # a high escape whose low one must come next
            for m in _SURROGATE.finditer(data):  # type: ignore[call-overload]
                start, slashes = m.start(), 0
                while start - slashes > 0 and data[start - slashes - 1] == 0x5C:  # backslashes just before it
                    slashes += 1
                if slashes % 2 == 1:  # "\\" then "u...": an escaped backslash, not an escape
                    continue
                high = m.group(1) in b"89abAB"
                if waiting is not None:
                    if not high and start == waiting + 6:
                        waiting = None
                        continue
                    return waiting
                if not high:
                    return start
                waiting = start
            return waiting


def _parse_error(exc: Exception) -> str:
    """What a JSON parser said was wrong, in one line. yajl (ijson's C backend) appends two lines of
    context with a caret and no offset, and gives bytes where the text is not UTF-8: only its first line
    is kept. A position the parser does give (the pure-Python backend's "at 17", a decode error's byte)
    stays in that line."""
    detail = exc if isinstance(exc, UnicodeDecodeError) or not exc.args else exc.args[0]
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", "replace")
    first = next((line.strip() for line in str(detail).splitlines() if line.strip()), type(exc).__name__)
    if first == "parse error: premature EOF":
        first = "the file ends before the JSON does (premature end of file)"
    return clip(first.rstrip("."), 200, quote=False)


def _build(event: str, value: Any, events: Iterator[tuple[str, Any]]) -> Any:
    from ijson.common import ObjectBuilder

    builder = ObjectBuilder()
    builder.event(event, value)
    if event in ("start_map", "start_array"):
        depth = 1
        for event, value in events:
            builder.event(event, value)
            if event in ("start_map", "start_array"):
                depth += 1
            elif event in ("end_map", "end_array"):
                depth -= 1
                if depth == 0:
                    break
    return builder.value


def _skip(event: str, events: Iterator[tuple[str, Any]]) -> None:
    if event in ("start_map", "start_array"):
        depth = 1
        for event, _ in events:
            if event in ("start_map", "start_array"):
                depth += 1
            elif event in ("end_map", "end_array"):
                depth -= 1
                if depth == 0:
                    return
