"""Normalising record identifiers, shared by loading (what is stored) and resolving (what is asked).

Emails are lower-cased; phones reduced to digits; websites to their registrable domain; profile URLs
to ``host/path`` without scheme, ``www.``, query or trailing slash. Each normaliser raises
``ValueError`` with a short reason when the value cannot be an identifier of its kind; an identifier
longer than :data:`IDENTIFIER_MAX` characters is refused before it is read. An error never quotes more
than :data:`ECHO_MAX` characters of what it was given (:func:`clip`).
"""

from __future__ import annotations

import re
from typing import Any, Literal, Mapping
from urllib.parse import urlsplit

IdentifierKind = Literal["email", "phone", "website", "profile_url"]
IDENTIFIER_KINDS: tuple[IdentifierKind, ...] = ("email", "phone", "website", "profile_url")
#: The longest identifier accepted (characters, before normalising): URLs longer than this are not links.
IDENTIFIER_MAX = 2048
#: the longest host name, label (between dots) and email address a standard allows (RFC 1035, RFC 5321)
HOST_MAX, LABEL_MAX, EMAIL_MAX = 253, 63, 254
#: The most characters of a caller's input that an error message quotes.
ECHO_MAX = 100

_EMAIL = re.compile(r"^[^@\s]+@([a-z0-9-]+\.)+[a-z]{2,}$")
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
# Second-level labels under which registrations happen one level deeper (acme.co.uk).
_TWO_PART_SUFFIXES = frozenset(
    "co.uk org.uk ac.uk gov.uk ltd.uk plc.uk me.uk co.jp ne.jp or.jp com.au net.au org.au edu.au "
    "co.nz org.nz com.br com.mx com.ar com.cn com.hk com.sg com.tr co.za co.in net.in org.in co.kr "
    "com.tw co.il "
    # hosts under which unrelated sites each have their own name (acme.github.io is not github.io)
    "github.io gitlab.io blogspot.com wordpress.com herokuapp.com netlify.app vercel.app pages.dev web.app "
    "firebaseapp.com appspot.com azurewebsites.net cloudfront.net wixsite.com myshopify.com substack.com "
    "notion.site squarespace.com glitch.me fly.dev onrender.com".split()
)
#: Mail providers whose domain says nothing about the employer; never used to group aliases. Not a complete
#: list (none can be): an email's domain groups aliases only where a record of the org has it as its website
#: (layers/resolve.py), so people who share a provider missing here are still not one another's aliases.
FREEMAIL_DOMAINS = frozenset(
    "gmail.com googlemail.com yahoo.com yahoo.co.uk yahoo.fr yahoo.de yahoo.co.jp yahoo.com.br ymail.com "
    "rocketmail.com hotmail.com hotmail.co.uk hotmail.fr hotmail.de hotmail.it hotmail.es outlook.com "
    "outlook.fr outlook.de live.com live.co.uk live.fr msn.com passport.com icloud.com me.com mac.com "
    "aol.com aim.com proton.me protonmail.com protonmail.ch pm.me tutanota.com tuta.io fastmail.com "
    "fastmail.fm hey.com zoho.com zohomail.com gmx.de gmx.net gmx.com gmx.at gmx.ch web.de t-online.de "
    "freenet.de mail.com email.com usa.com yandex.ru yandex.com ya.ru mail.ru inbox.ru list.ru bk.ru "
    "rambler.ru qq.com 163.com 126.com yeah.net sina.com sohu.com aliyun.com naver.com daum.net "
    "hanmail.net comcast.net verizon.net att.net sbcglobal.net cox.net charter.net earthlink.net "
    "btinternet.com sky.com virginmedia.com talktalk.net orange.fr wanadoo.fr free.fr laposte.net sfr.fr "
    "libero.it virgilio.it tiscali.it alice.it seznam.cz wp.pl o2.pl onet.pl interia.pl bigpond.com "
    "optusnet.com.au shaw.ca rogers.com sympatico.ca rediffmail.com uol.com.br bol.com.br terra.com.br "
    "hushmail.com mailbox.org posteo.de duck.com".split()
)


def clip(value: object, limit: int = ECHO_MAX, *, quote: bool = True) -> str:
    """``value`` for an error message (its ``repr`` when ``quote``), cut to ``limit`` characters with an
    ellipsis."""
    text = repr(value) if quote else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def nul_path(value: Any) -> str | None:
    """Where in ``value`` (strings, and lists and mappings of them) a string or a key holds a NUL character,
    as a dotted path ("" for ``value`` itself), or None. Such a string is no text: PostgreSQL cannot store
    it, so both stores refuse it where it comes in."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return ".".join(at)
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if isinstance(key, str) and "\x00" in key:
                    return ".".join((*at, clip(key, 40, quote=False)))
                stack.append((child, (*at, str(key))))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, (*at, str(n))) for n, child in enumerate(item))
    return None


NUL_MESSAGE = "a NUL character (\\u0000) is not text"


def normalize_email(value: str) -> str:
    email = value.strip().lower()
    if not _EMAIL.match(email):
        raise ValueError(f"not an email address: {clip(value)}")
    if len(email) > EMAIL_MAX or max(map(len, email.rsplit("@", 1)[1].split("."))) > LABEL_MAX:
        raise ValueError(f"not an email address (at most {EMAIL_MAX} characters, {LABEL_MAX} between the dots of its "
                         f"domain): {clip(value)}")  # fmt: skip
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
    if len(host) > HOST_MAX or max(map(len, labels)) > LABEL_MAX:
        raise ValueError(f"not a website or URL (a host name has at most {HOST_MAX} characters, {LABEL_MAX} between "
                         f"dots): {clip(value)}")  # fmt: skip
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
