"""The inspector: a static page at ``/inspect`` of ``dossier serve`` that shows why an agent got what it got.

The page (``static/``: HTML, CSS and JavaScript, no CDN, no build step) asks for an API key, which it keeps
in the tab's ``sessionStorage`` only, and calls ``POST /v1/retrieve`` with ``trace: true`` as that key's
caller; ``/inspect?call=ID`` reads ``GET /v1/calls/ID``. It shows only what those responses hold: the page
itself is public and grants nothing, every byte of data comes through the key-checked API.

Every asset is served with a Content-Security-Policy that allows only this origin (no inline script or
style, no framing, no form posts), and the script writes response text with ``textContent`` only.
"""

from __future__ import annotations

import functools
from importlib.resources import files
from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

#: The files of the page and their media types (nothing else under /inspect is served).
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "inspector.css": "text/css; charset=utf-8",
    "inspector.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
#: Only this origin: no inline script or style, no other host, no framing, no form submissions.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",  # a call id in the address stays on this page
    "Cache-Control": "no-store",
}


@functools.cache
def asset(name: str) -> bytes:
    """One file of the page, read from the installed package."""
    return (files(__name__) / "static" / name).read_bytes()


def _serve(name: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(_: Request) -> Response:
        return Response(asset(name), media_type=ASSETS[name], headers=HEADERS)

    return endpoint


def routes() -> list[Route]:
    """``/inspect`` (and ``/inspect/``) for the page, ``/inspect/<file>`` for its script and style sheet."""
    page = _serve("index.html")
    out = [Route("/inspect", page, methods=["GET"], include_in_schema=False),
           Route("/inspect/", page, methods=["GET"], include_in_schema=False)]  # fmt: skip
    out += [Route(f"/inspect/{name}", _serve(name), methods=["GET"], include_in_schema=False)
            for name in ASSETS if name != "index.html"]  # fmt: skip
    return out
