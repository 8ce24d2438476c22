"""Masking personal data before a prompt leaves the process, and restoring it in the answer.

What is masked (DESIGN.md section 5 explains why there is no NER model here):

* **known values**: the resolved records' identifiers (email, phone, website, profile URL) and their
  property values (strings of 3+ characters, numbers of 6+ digits, and each word of a ``*name*``
  property; each element of a list value on its own), matched case-insensitively as whole words; phones also with other separators;
* **patterns**: email addresses, phone numbers (7-15 digits with separators, never dates), card-like
  digit runs, IBANs and IPv4 addresses, wherever they occur.

Each distinct string becomes a placeholder such as ``<EMAIL_1>`` (the same string always gets the same
placeholder), and :meth:`Masker.unmask` puts the exact original text back: mask then unmask is the
identity. Person names that are not property values are not detected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..bundle import Record, property_values

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("EMAIL", re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}(?![\w-])")),
    ("IBAN", re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b")),
    ("CARD", re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")),
    ("PHONE", re.compile(r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{1,4}\)[\s.-]?)?\d{2,4}(?:[\s.-]\d{2,5}){1,4}(?![\w-])")),
    ("IP", re.compile(r"\b(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)\b")),
)
_DATE = re.compile(r"^\d{4}[-./]\d{1,2}[-./]\d{1,2}$|^\d{1,2}[-./]\d{1,2}[-./]\d{2,4}$")
_DATE_INSIDE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}:\d{2}")
_PLACEHOLDER = re.compile(r"<(?:EMAIL|PHONE|CARD|IBAN|IP|URL|VALUE)_\d+>")


def _plausible(kind: str, text: str) -> bool:
    digits = sum(ch.isdigit() for ch in text)
    if kind == "PHONE":
        return 7 <= digits <= 15 and not _DATE.match(text.strip()) and not _DATE_INSIDE.search(text)
    if kind == "CARD":
        return 13 <= digits <= 19
    return True


def _known_pattern(kind: str, value: str) -> re.Pattern[str]:
    """A case-insensitive whole-word pattern for one known value (phones with any separators)."""
    if kind == "PHONE":
        digits = re.sub(r"\D", "", value)
        national = digits[-10:] if len(digits) > 10 else digits
        body = r"[\s().-]*".join(national)
        return re.compile(rf"(?<![\w+])(?:\+?\d{{1,3}}[\s().-]*)?{body}(?!\d)")
    return re.compile(rf"(?<!\w){re.escape(value)}(?!\w)", re.IGNORECASE)


@dataclass
class Masker:
    """Replaces personal data with placeholders; :meth:`unmask` restores it."""

    known: list[tuple[str, re.Pattern[str]]] = field(default_factory=list)
    _forward: dict[str, str] = field(default_factory=dict)  # original text -> placeholder
    _back: dict[str, str] = field(default_factory=dict)  # placeholder -> original text
    _counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def for_records(cls, records: Iterable[Record], extra: Iterable[tuple[str, Any]] = ()) -> "Masker":
        """A masker that knows ``records``' identifiers and property values (plus ``extra`` (name, value))."""
        values: dict[tuple[str, str], None] = {}

        def add(kind: str, value: Any, shortest: int = 3) -> None:
            if isinstance(value, bool) or value is None:
                return
            if isinstance(value, (int, float)):
                text = str(value)
                if sum(ch.isdigit() for ch in text) >= 6:
                    values[("VALUE", text)] = None
                return
            text = str(value).strip()
            if len(text) >= shortest:
                values[(kind, text)] = None

        def add_property(name: str, value: Any) -> None:
            for one in property_values(value):  # each element of a list value on its own
                add("VALUE", one)
                if "name" in name.lower() and isinstance(one, str):
                    for word in re.findall(r"[^\W\d_][\w'-]*", one):
                        add("VALUE", word, shortest=2)  # "Li" of "Li Wei"

        for record in records:
            ids = record.identifiers
            if ids.email:
                add("EMAIL", ids.email)
            if ids.phone:
                values[("PHONE", ids.phone)] = None
            for url in (ids.website, ids.profile_url):
                if url:
                    add("URL", url)
            for name, value in record.properties.items():
                add_property(name, value)
        for name, value in extra:
            add_property(name, value)
        # Longer values first, so "jane@acme.com" wins over "acme.com" where both match.
        ordered = sorted(values, key=lambda kv: (-len(kv[1]), kv))
        return cls(known=[(kind, _known_pattern(kind, value)) for kind, value in ordered])

    def _placeholder(self, kind: str, original: str) -> str:
        if original not in self._forward:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            placeholder = f"<{kind}_{self._counts[kind]}>"
            self._forward[original] = placeholder
            self._back[placeholder] = original
        return self._forward[original]

    def spans(self, text: str) -> list[tuple[int, int, str]]:
        """Non-overlapping (start, end, kind) of personal data in ``text``: known values first, then
        patterns; among overlaps the earlier, then longer, span wins."""
        found: list[tuple[int, int, str, int]] = []
        for priority, (kind, pattern) in enumerate(self.known):
            found.extend((m.start(), m.end(), kind, priority) for m in pattern.finditer(text) if m.end() > m.start())
        base = len(self.known)
        for offset, (kind, pattern) in enumerate(_PATTERNS):
            for m in pattern.finditer(text):
                if _plausible(kind, m.group()):
                    found.append((m.start(), m.end(), kind, base + offset))
        found.sort(key=lambda s: (s[0], -(s[1] - s[0]), s[3]))
        out: list[tuple[int, int, str]] = []
        end = 0
        for start, stop, kind, _ in found:
            if start >= end and not _PLACEHOLDER.fullmatch(text[start:stop]):
                out.append((start, stop, kind))
                end = stop
        return out

    def mask(self, text: str) -> str:
        parts: list[str] = []
        last = 0
        for start, stop, kind in self.spans(text):
            parts.append(text[last:start])
            parts.append(self._placeholder(kind, text[start:stop]))
            last = stop
        parts.append(text[last:])
        return "".join(parts)

    def unmask(self, text: str) -> str:
        return _PLACEHOLDER.sub(lambda m: self._back.get(m.group(), m.group()), text)

    @property
    def masked(self) -> dict[str, str]:
        """Placeholder -> original, for everything masked so far."""
        return dict(self._back)
