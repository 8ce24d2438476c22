"""The inspector's files over HTTP: served by ``dossier serve`` without a key, from the installed package,
with a policy that lets the page load nothing but its own files and talk to nothing but this origin."""

from __future__ import annotations

import re

import httpx
import pytest

from dossier.inspector import ASSETS, CSP

from .conftest import Served


@pytest.mark.parametrize("path", ["/inspect", "/inspect/", "/inspect?call=abc"])
def test_the_page_is_served_without_a_key_with_a_self_only_policy(served: Served, path: str) -> None:
    response = httpx.get(served.url + path, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    policy = response.headers["content-security-policy"]
    assert policy == CSP and "script-src 'self'" in policy and "'unsafe-inline'" not in policy
    assert "frame-ancestors 'none'" in policy and "connect-src 'self'" in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    page = response.text
    assert 'src="/inspect/inspector.js"' in page and 'href="/inspect/inspector.css"' in page
    assert not re.search(r"<script(?![^>]*\bsrc=)", page), "no inline script"
    assert not re.search(r"\sstyle=|\son[a-z]+=", page), "no inline style or handler"
    assert not re.search(r"(src|href)=\"(https?:)?//", page), "nothing from another host"


def test_the_script_and_style_come_from_the_package(served: Served) -> None:
    for name, media in ASSETS.items():
        if name == "index.html":
            continue
        response = httpx.get(f"{served.url}/inspect/{name}", timeout=30)
        assert response.status_code == 200 and response.headers["content-type"] == media
        assert response.headers["content-security-policy"] == CSP
    script = httpx.get(f"{served.url}/inspect/inspector.js", timeout=30).text
    assert "sessionStorage" in script and "localStorage" not in script
    assert "innerHTML" not in script and "outerHTML" not in script and "insertAdjacentHTML" not in script
    assert "eval(" not in script and "document.write" not in script
    assert not re.search(r"https?://", script), "the script talks to its own origin only"


def test_nothing_else_under_inspect_is_served(served: Served) -> None:
    for path in ("/inspect/../http.py", "/inspect/__init__.py", "/inspect/static/index.html", "/inspect/x.js"):
        assert httpx.get(served.url + path, timeout=30).status_code == 404, path


def test_the_page_grants_nothing_the_api_is_still_keyed(served: Served) -> None:
    assert httpx.post(f"{served.url}/v1/retrieve", json={"message": "x"}, timeout=30).status_code == 401
    assert httpx.get(f"{served.url}/v1/calls/abc", timeout=30).status_code == 401
