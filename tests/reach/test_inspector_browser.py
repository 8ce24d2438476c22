"""The inspector in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by
selenium; nothing downloads a browser), against a real ``dossier serve`` over the sample organisation.

The example call is typed into the page and run; the four sources, the budget bars and the evidence funnel
must render, with the numbers of the API's own response. A screenshot of the page after the call is saved
under ``$DOSSIER_TEST_ARTIFACTS`` (else the test's temporary directory) and its path printed.

In CI (``CI=true``) a missing browser fails the test (``.ci/run`` installs it with apt); elsewhere the test
is skipped, saying what to install.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from .conftest import BRIEF, Served

FOUR = ("properties", "memories", "documents", "graph")
INSTALL = "apt-get install -y chromium chromium-driver"


def _browser() -> tuple[str, str]:
    """The system Chromium and its driver, or a skip (a failure in CI) naming what to install."""
    chromium = os.environ.get("DOSSIER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("DOSSIER_CHROMEDRIVER") or shutil.which("chromedriver")
    problem = None
    try:
        import selenium  # noqa: F401
    except ImportError:
        problem = 'selenium is not installed (pip install -e ".[dev]")'
    if problem is None and not (chromium and driver):
        problem = f"no system Chromium and chromedriver on PATH (Debian: {INSTALL})"
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the inspector's browser test cannot run in CI: {problem}")
        pytest.skip(problem)
    assert chromium and driver
    return chromium, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver = _browser()
    os.environ["SE_OFFLINE"] = "true"  # selenium never looks for (or downloads) a driver or browser of its own
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,1400", "--lang=en-US"):  # fmt: skip
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = webdriver.Chrome(service=DriverService(executable_path=driver), options=options)
    session.set_script_timeout(60)
    try:
        yield session
    finally:
        session.quit()


def artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DOSSIER_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def state(browser: Any) -> str:
    return str(browser.find_element("tag name", "body").get_attribute("data-state"))


def wait_done(browser: Any) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 90).until(lambda b: state(b) in ("done", "error"))
    if state(browser) == "error":
        raise AssertionError(f"the page shows an error: {browser.find_element('id', 'error').text}")


def run_call(browser: Any, served: Served, caller: str, *, kind: str, value: str, message: str, budget: int) -> None:
    from selenium.webdriver.support.ui import Select

    browser.get(f"{served.url}/inspect")
    key = browser.find_element("id", "key")
    key.clear()
    key.send_keys(served.keys[caller])
    Select(browser.find_element("id", "record-kind")).select_by_value(kind)
    for field, text in (("record-value", value), ("message", message), ("budget", str(budget))):
        browser.find_element("id", field).clear()
        browser.find_element("id", field).send_keys(text)
    Select(browser.find_element("id", "mode")).select_by_value("brief")
    Select(browser.find_element("id", "depth")).select_by_value("standard")
    browser.find_element("id", "run").click()
    wait_done(browser)


def api_response(served: Served, caller: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{served.url}/v1/retrieve", json={**body, "trace": True},
                          headers={"Authorization": f"Bearer {served.keys[caller]}"}, timeout=60)  # fmt: skip
    assert response.status_code == 200, response.text
    return dict(response.json())


def funnel(response: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Per layer, (kept, dropped) as the page should count them: the trace, plus the withheld counts."""
    kept: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    for entry in response["trace"] or []:
        (kept if entry["decision"] == "kept" else dropped)[entry["layer"]] += 1
    for layer, reasons in (response["withheld"] or {}).items():
        dropped[layer] += sum(reasons.values())
    return {layer: (kept[layer], dropped[layer]) for layer in set(kept) | set(dropped)}


def console_errors(browser: Any) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_the_example_call_renders_sources_budget_and_funnel(browser: Any, served: Served, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    run_call(browser, served, "ana", kind="email", value=BRIEF["record"]["email"], message=BRIEF["message"],
             budget=BRIEF["budget"]["totalTokens"])  # fmt: skip
    expected = api_response(served, "ana", BRIEF)  # the same request, straight to the API
    find = browser.find_element
    find_all = browser.find_elements

    # the resolved record, its merges and aliases (with why)
    record = find("id", "record").text
    assert expected["record"]["id"] == "rec-jane" and "rec-jane" in record
    for alias in expected["record"]["aliases"] + expected["record"]["merged_from"]:
        assert alias in record
    assert "company domain" in record

    # the four sources: status, counts and route, as the response says
    cards = {c.get_attribute("data-source"): c for c in find_all("css selector", "#sources .card")}
    assert set(FOUR) <= set(cards)
    for name in FOUR:
        source = expected["sources"][name]
        assert source["status"] == "ok" and cards[name].get_attribute("data-status") == "ok"
        assert f"items\n{len(source['items'])}" in cards[name].text
        assert f"bytes used\n{source['bytes_used']}" in cards[name].text
    documents_route = expected["route"]["documents"]
    assert f"backend\n{documents_route['backend']}" in cards["documents"].text
    assert f"effective depth\n{documents_route['effective_depth']}" in cards["documents"].text

    # the budget as bars: one row per source, its numbers the response's, the used bar drawn
    rows = {r.get_attribute("data-source"): r for r in find_all("css selector", "#budget-section .bar-row")}
    assert set(FOUR) <= set(rows)
    for name in FOUR:
        row = rows[name]
        assert int(row.get_attribute("data-used")) == expected["budget"]["used"][name] > 0
        assert int(row.get_attribute("data-share")) == expected["budget"]["share"][name]
        assert int(row.get_attribute("data-dropped")) == expected["budget"]["dropped"][name]
        assert row.find_element("css selector", ".bar.used").size["width"] > 0
        assert row.find_element("css selector", ".bar.share").size["width"] > 0
    memories = rows["memories"]  # more than its share: the bar says so
    if expected["budget"]["used"]["memories"] > expected["budget"]["share"]["memories"]:
        assert "over" in memories.find_element("css selector", ".bar.used").get_attribute("class")

    # the evidence funnel: per layer, kept and dropped, with the withheld counts
    layers = {r.get_attribute("data-layer"): r for r in find_all("css selector", "#funnel tbody tr")}
    counts = funnel(expected)
    # (the searches leave out what ana may not see, so governance drops nothing here: no govern row)
    assert {"recall", "select", "budget"} <= set(layers) == set(counts)
    for layer, (kept, dropped) in counts.items():
        assert int(layers[layer].get_attribute("data-kept")) == kept, layer
        assert int(layers[layer].get_attribute("data-dropped")) == dropped, layer
    assert expected["withheld"], "the example has candidates dropped before governance cleared them"
    for layer, reasons in expected["withheld"].items():
        for reason, count in reasons.items():
            assert f"{reason} (withheld) ×{count}" in layers[layer].text

    # the items: section paths, tiers, scores
    items = find("id", "items").text
    for section in expected["sources"]["documents"]["items"]:
        assert f"{section['title']} › {section['heading']}" in items
    assert "recent" in items and "semantic" in items

    # the key lives in this tab's session storage, and nowhere else
    stored = browser.execute_script("return [sessionStorage.length, localStorage.length, document.cookie]")
    assert stored == [1, 0, ""]
    assert console_errors(browser) == []  # no CSP violation, no failed load

    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, min(int(height) + 40, 12000))
    shot = artifacts(tmp_path) / "inspector-example-call.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    with capsys.disabled():  # the path shows in the run's output, passed or not
        print(f"\ninspector screenshot: {shot}")
    browser.set_window_size(1280, 1400)


def test_an_earlier_call_opens_by_its_id(browser: Any, served: Served) -> None:
    run_call(browser, served, "ana", kind="email", value=BRIEF["record"]["email"], message=BRIEF["message"],
             budget=BRIEF["budget"]["totalTokens"])  # fmt: skip
    link = browser.find_element("css selector", "#summary a").get_attribute("href")
    call_id = link.split("?call=", 1)[1]
    browser.get(link)  # the key is still in the tab's session storage
    wait_done(browser)
    shown = browser.find_element("id", "call").text
    stored = httpx.get(f"{served.url}/v1/calls/{call_id}", headers={"Authorization": f"Bearer {served.keys['ana']}"},
                       timeout=30).json()  # fmt: skip
    assert call_id in shown and "ana" in shown and f"units\n{stored['summary']['units']}" in shown
    table = browser.find_element("css selector", "[data-shape=sources]").text
    for name in FOUR:
        shape = stored["summary"]["shape"]["sources"][name]
        assert f"{name} {shape['status']} {shape['items']} {shape['bytes']} {shape['dropped']}" in table
    # another org's key sees none of it: the page shows the API's refusal
    browser.execute_script(f"sessionStorage.setItem('dossier.inspector.key', {json.dumps(served.keys['zoe'])})")
    browser.get(link)
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 60).until(lambda b: state(b) in ("done", "error"))
    assert state(browser) == "error" and "HTTP 404" in browser.find_element("id", "error").text
    assert browser.find_element("id", "call").is_displayed() is False


@pytest.mark.parametrize("not_a_call", ["..", "call-1/feedback", "x?wait=30"])
def test_a_call_id_that_would_name_another_route_is_refused_on_the_page(browser: Any, served: Served, not_a_call: str) -> None:
    from urllib.parse import quote

    from selenium.webdriver.support.ui import WebDriverWait

    browser.execute_script(f"sessionStorage.setItem('dossier.inspector.key', {json.dumps(served.keys['ana'])})")
    browser.get(f"{served.url}/inspect?call={quote(not_a_call, safe='')}")
    WebDriverWait(browser, 60).until(lambda b: state(b) in ("done", "error"))
    assert state(browser) == "error" and "That is not a call id" in browser.find_element("id", "error").text


def test_response_text_is_shown_as_text_never_as_html(browser: Any, served: Served) -> None:
    payload = '<img src="/nope" id="injected"><b id="bold">Erin</b> asked about <script>window.hit=1</script>pricing'
    written = httpx.post(f"{served.url}/v1/memories", json={"record": "rec-erin", "text": payload},
                         headers={"Authorization": f"Bearer {served.keys['admin']}"}, timeout=60)  # fmt: skip
    assert written.status_code == 200, written.text
    run_call(browser, served, "ana", kind="email", value="erin@hooli.com", message="What did Erin ask about?",
             budget=8000)  # fmt: skip
    assert payload in browser.find_element("id", "items").text
    assert browser.find_elements("id", "injected") == [] and browser.find_elements("id", "bold") == []
    assert browser.execute_script("return window.hit === undefined")


def test_a_tombstone_shows_as_one(browser: Any, served: Served) -> None:
    run_call(browser, served, "ana", kind="email", value="george@vandelay.com", message="Any open issues?", budget=4000)
    record = browser.find_element("id", "record")
    assert "tombstone" in record.find_element("css selector", ".badge.tombstone").text
    assert "pending deletion" in record.text
    cards = {c.get_attribute("data-source"): c.get_attribute("data-status")
             for c in browser.find_elements("css selector", "#sources .card")}  # fmt: skip
    per_source: defaultdict[str, str] = defaultdict(str, cards)
    assert per_source["memories"] in ("empty", "skipped") and per_source["properties"] in ("empty", "skipped")


def test_fetch_and_the_next_page_of_a_call_that_did_not_fit(browser: Any, served: Served) -> None:
    from selenium.webdriver.support.ui import Select

    browser.get(f"{served.url}/inspect")
    key = browser.find_element("id", "key")
    key.clear()
    key.send_keys(served.keys["ana"])
    Select(browser.find_element("id", "mode")).select_by_value("fetch")
    browser.find_element("id", "fetch").send_keys("doc-refund")
    budget = browser.find_element("id", "budget")
    budget.clear()
    budget.send_keys("600")
    browser.find_element("id", "run").click()
    wait_done(browser)
    expected = api_response(served, "ana", {"fetch": ["doc-refund"], "budget": {"totalTokens": 600}})
    shown = browser.find_element("id", "items").text
    assert expected["sources"]["documents"]["items"] and expected["continuation"]
    for item in expected["sources"]["documents"]["items"]:
        assert item["section_id"] in shown
    pages = 0
    while browser.find_elements("id", "next-page"):  # every page of the session, through the page's button
        browser.find_element("id", "next-page").click()
        wait_done(browser)
        assert "expand" in browser.find_element("id", "summary").text
        pages += 1
        assert pages < 20
    assert pages >= 1
