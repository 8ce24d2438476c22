"""Normalising record identifiers, shared by loading (what is stored) and resolving (what is asked).

Emails are lower-cased; phones reduced to digits; websites to their registrable domain; profile URLs
to ``host/path`` without scheme, ``www.``, query or trailing slash. Each normaliser raises
``ValueError`` with a short reason when the value cannot be an identifier of its kind; an identifier
longer than :data:`IDENTIFIER_MAX` characters is refused before it is read. An error never quotes more
than :data:`ECHO_MAX` characters of what it was given (:func:`clip`).
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

IdentifierKind = Literal["email", "phone", "website", "profile_url"]
IDENTIFIER_KINDS: tuple[IdentifierKind, ...] = ("email", "phone", "website", "profile_url")
#: The longest identifier accepted (characters, before normalising): URLs longer than this are not links.
IDENTIFIER_MAX = 2048
#: The most characters of a caller's input that an error message quotes.
ECHO_MAX = 100

_EMAIL = re.compile(r"^[^@\s]+@([a-z0-9-]+\.)+[a-z]{2,}$")
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
# Second-level labels under which registrations happen one level deeper (acme.co.uk).
_TWO_PART_SUFFIXES = frozenset(
    "co.uk org.uk ac.uk gov.uk ltd.uk plc.uk me.uk co.jp ne.jp or.jp com.au net.au org.au edu.au "
    "co.nz org.nz com.br com.mx com.ar com.cn com.hk com.sg com.tr co.za co.in net.in org.in co.kr "
    "com.tw co.il".split()
)
#: Mail providers whose domain says nothing about the employer; never used to group aliases.
FREEMAIL_DOMAINS = frozenset(
    "gmail.com googlemail.com yahoo.com hotmail.com outlook.com live.com icloud.com me.com aol.com "
    "proton.me protonmail.com gmx.de gmx.net web.de mail.com yandex.ru".split()
)


def clip(value: object, limit: int = ECHO_MAX, *, quote: bool = True) -> str:
    """``value`` for an error message (its ``repr`` when ``quote``), cut to ``limit`` characters with an
    ellipsis."""
    text = repr(value) if quote else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def normalize_email(value: str) -> str:
    email = value.strip().lower()
    if not _EMAIL.match(email):
        raise ValueError(f"not an email address: {clip(value)}")
    return email


def normalize_phone(value: str) -> str:
    digits = re.sub(r"\D", "", value)
    if not 6 <= len(digits) <= 15:
        raise ValueError(f"not a phone number (need 6-15 digits): {clip(value)}")
    return digits


def _host(value: str) -> tuple[str, str]:
    text = value.strip().lower()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    host = (parts.hostname or "").rstrip(".")
    labels = host.split(".")
    if len(labels) < 2 or not all(_LABEL.match(label) for label in labels) or labels[-1].isdigit():
        raise ValueError(f"not a website or URL: {clip(value)}")
    if host.startswith("www."):
        host = host[4:]
    return host, parts.path


def registrable_domain(host: str) -> str:
    labels = host.split(".")
    keep = 3 if ".".join(labels[-2:]) in _TWO_PART_SUFFIXES else 2
    return ".".join(labels[-keep:])


def normalize_website(value: str) -> str:
    host, _ = _host(value)
    return registrable_domain(host)


def normalize_profile_url(value: str) -> str:
    host, path = _host(value)
    path = path.rstrip("/")
    if not path:
        raise ValueError(f"a profile URL needs a path (e.g. linkedin.com/in/name): {clip(value)}")
    return host + path


NORMALIZERS = {
    "email": normalize_email,
    "phone": normalize_phone,
    "website": normalize_website,
    "profile_url": normalize_profile_url,
}


def normalize(kind: str, value: str) -> str:
    """Normalise ``value`` as an identifier of ``kind``; ``ValueError`` if it is not one."""
    if kind not in NORMALIZERS:
        raise ValueError(f"unknown identifier kind {clip(kind)}; expected one of {', '.join(IDENTIFIER_KINDS)}")
    if len(value) > IDENTIFIER_MAX:
        raise ValueError(f"at most {IDENTIFIER_MAX:,} characters (got {len(value):,}): {clip(value, 40)}")
    return NORMALIZERS[kind](value)


def email_domain(email: str) -> str | None:
    """The employer domain of a normalised email, or None for free-mail providers."""
    domain = registrable_domain(email.rsplit("@", 1)[1])
    return None if domain in FREEMAIL_DOMAINS else domain
