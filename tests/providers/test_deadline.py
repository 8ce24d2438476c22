"""The call deadline's machinery (``dossier.deadline``) and the chat client under it: a step is waited for
until its end time and no longer, a request is given only the time left, retries happen only when they fit,
and a model URL that keeps timing out is not asked during its cool-down (``dossier.providers.circuit``).

The slow model answers after 30 s, so a step bounded at a second or two coming back well before that
cannot flake."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest
from pydantic import BaseModel

import dossier
from dossier.deadline import Deadline, run_step, start_step, within
from dossier.providers.circuit import CircuitBreaker, breaker_for, reset_breakers
from dossier.providers.llm import Meter, OpenAIChat, metered
from tests.scripted_llm import Reply, ScriptedLLM, scripted, scripted_server  # noqa: F401 - fixtures

pytest.importorskip("openai")

SLOW = 30.0  # seconds the hanging model takes
SYSTEM = {"role": "system", "content": "# Section selection\nReply with JSON."}


class Answer(BaseModel):
    value: int


@pytest.fixture(autouse=True)
def fresh_breakers() -> Iterator[None]:
    reset_breakers()
    yield
    reset_breakers()


def ask(llm: OpenAIChat) -> Answer:
    return llm.complete([SYSTEM, {"role": "user", "content": "Question: what?"}], output=Answer, step="select")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the deadline ---------------------------------------------------------------------------------------
def test_step_end_times_leave_room_for_synthesis() -> None:
    with_synthesis = Deadline.plan(10.0, synthesis=True)
    assert with_synthesis.ends == {"filters": 2.94, "rephrase": 2.94, "rerank": 4.41, "select": 5.88, "synthesize": 9.8}
    without = Deadline.plan(10.0, synthesis=False)
    assert without.ends["select"] == without.ends["synthesize"] == 9.8 and without.ends["filters"] == 4.9
    tight = Deadline.plan(0.5, synthesis=False)  # the reserve is at most a fifth of the deadline
    assert tight.ends["select"] == 0.4


def test_without_a_deadline_a_step_runs_in_place() -> None:
    caller = threading.get_ident()
    assert run_step("select", threading.get_ident) == caller


def test_a_step_is_waited_for_until_its_end_time_and_what_it_makes_later_is_kept() -> None:
    release = threading.Event()
    late: list[object] = []
    deadline = Deadline.plan(1.0, synthesis=False)
    with within(deadline):
        started = time.monotonic()
        pending = start_step("select", lambda: release.wait(SLOW) and "picked")
        with pytest.raises(dossier.ProviderTimeout, match="did not finish by its end time"):
            pending.result()
        assert time.monotonic() - started < SLOW / 2
        pending.then(lambda value, error: late.append(value))
        release.set()
    for _ in range(100):
        if late:
            break
        time.sleep(0.02)
    assert late == ["picked"]
    report = deadline.report()
    assert report["missed"] == ["select"] and report["steps"]["select"]["outcome"] == "timeout"
    assert report["steps"]["select"]["end_ms"] == 800.0


def test_steps_started_together_run_at_the_same_time() -> None:
    both = threading.Barrier(2, timeout=SLOW)  # each waits for the other: only concurrent steps get past it
    deadline = Deadline.plan(20.0, synthesis=False)
    with within(deadline):
        filters, rephrase = start_step("filters", both.wait), start_step("rephrase", both.wait)
        assert {filters.result(), rephrase.result()} == {0, 1}
    assert {s: t["outcome"] for s, t in deadline.report()["steps"].items()} == {"filters": "ok", "rephrase": "ok"}


def test_no_time_left_means_no_request(scripted: ScriptedLLM) -> None:
    deadline = Deadline.plan(1.0, synthesis=False, started=time.monotonic() - 5)
    with within(deadline), pytest.raises(dossier.ProviderTimeout, match="no time was left"):
        run_step("select", lambda: ask(scripted.llm()))
    assert scripted.requests == [] and deadline.report()["steps"]["select"]["outcome"] == "no_time"


# -- the chat client under a deadline ---------------------------------------------------------------------
def test_a_request_is_given_only_the_time_left(scripted: ScriptedLLM) -> None:
    scripted.on("select", Reply({"value": 1}, delay=SLOW))
    meter = Meter()
    started = time.monotonic()
    with metered(meter), within(Deadline.plan(1.5, synthesis=False)), pytest.raises(dossier.ProviderTimeout):
        ask(scripted.llm())  # its own timeout is 15 s
    assert time.monotonic() - started < SLOW / 2
    assert [c.error for c in meter.calls] == ["timeout"] and len(scripted.bodies("select")) == 1


def test_a_retry_that_would_end_past_the_deadline_is_not_made(scripted: ScriptedLLM) -> None:
    scripted.on("select", Reply(status=503, headers={"retry-after-ms": "20000"}), Reply({"value": 2}))
    with within(Deadline.plan(2.0, synthesis=False)), pytest.raises(dossier.ProviderError) as caught:
        ask(scripted.llm(retries={"select": 3}))
    assert caught.value.status_code == 503 and len(scripted.bodies("select")) == 1


def test_a_retry_that_fits_is_made(scripted: ScriptedLLM) -> None:
    scripted.on("select", Reply(status=429), Reply(status=500), Reply({"value": 3}))  # retry-after-ms: 10
    meter = Meter()
    with metered(meter), within(Deadline.plan(10.0, synthesis=False)):
        assert ask(scripted.llm(retries={"select": 2})).value == 3
    assert len(scripted.bodies("select")) == 3
    assert [c.error for c in meter.calls] == ["http_429", "http_500", None]  # each attempt counted


# -- the circuit breaker ----------------------------------------------------------------------------------
def test_the_breaker_opens_after_timeouts_in_a_row_and_closes_on_an_answer() -> None:
    clock = Clock()
    breaker = CircuitBreaker("http://model/v1", threshold=3, cool_down=30.0, min_wait=1.0, clock=clock)
    breaker.timed_out(0.3)  # a request cut short by a tight deadline says nothing about the model
    assert breaker.status()["timeouts_in_a_row"] == 0
    breaker.timed_out(5.0)
    breaker.answered()  # an answer in between: not "in a row"
    for _ in range(3):
        assert breaker.allow()
        breaker.timed_out(5.0)
    assert not breaker.allow() and breaker.status()["state"] == "open" and breaker.status()["retry_in_s"] == 30.0
    assert "3 timeouts in a row" in breaker.describe()
    clock.now += 29.9
    assert not breaker.allow()
    clock.now += 0.2
    assert breaker.status()["state"] == "half_open"
    assert breaker.allow() and not breaker.allow()  # one trial request at a time
    breaker.timed_out(0.2)  # the trial timed out: open again, however short it was
    assert breaker.status()["state"] == "open" and not breaker.allow()
    clock.now += 30.1
    assert breaker.allow()
    breaker.answered()
    assert breaker.status() == {"state": "closed", "timeouts_in_a_row": 0, "threshold": 3, "cool_down_s": 30.0}
    assert breaker.allow() and breaker.allow()


def test_breakers_are_per_url() -> None:
    assert breaker_for("http://a/v1") is breaker_for("http://a/v1") is not breaker_for("http://b/v1")


def test_a_model_that_keeps_timing_out_is_not_asked_during_its_cool_down(scripted: ScriptedLLM) -> None:
    clock = Clock()
    breaker = CircuitBreaker(scripted.base_url, threshold=2, cool_down=30.0, min_wait=0.2, clock=clock)
    llm = scripted.llm(timeouts={"select": 0.3}, breaker=breaker)
    scripted.on("select", Reply({"value": 1}, delay=SLOW))
    for _ in range(2):
        with pytest.raises(dossier.ProviderTimeout, match="did not answer"):
            ask(llm)
    assert len(scripted.bodies("select")) == 2
    started = time.monotonic()
    deadline = Deadline.plan(5.0, synthesis=False)
    with within(deadline), pytest.raises(dossier.ProviderTimeout, match="not asked: 2 timeouts in a row"):
        run_step("select", lambda: ask(llm))
    assert time.monotonic() - started < SLOW / 2 and len(scripted.bodies("select")) == 2  # nothing was sent
    assert deadline.report()["steps"]["select"]["outcome"] == "circuit_open"
    clock.now += 30.0  # the cool-down is over: one request goes through, and an answer closes the breaker
    scripted.on("select", {"value": 4})
    assert ask(llm).value == 4 and breaker.status()["state"] == "closed"
