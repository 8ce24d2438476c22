"""Layer 10, synthesize (opt-in): an answer drawn only from the packed context, with citations.

The model sees exactly the items the caller gets, in the same order and as the same lines
(:func:`~dossier.layers.budget.packed_text`; one budget feeds both), each behind a label: ``[P#]``
properties, ``[M#]`` memories, ``[D#]`` document sections, ``[G#]`` graph edges, ``[X#]`` external.
Personal data is masked before the prompt (:mod:`dossier.providers.pii`) and restored in the answer.
The reply is JSON (``answer``, ``reasoning``, ``confidence``, ``sources_used``); the labels it cites
are mapped back to the ids of the returned items (``sources_used``, ``citations``).

``deferred: true`` returns the context at once with ``synthesis.pending``; the answer is completed in
the background and fetched with :meth:`dossier.Engine.result` (``dossier result CALL_ID``). A failure
returns ``answer: null`` with the error, and the context is returned in full either way.

Under the call's deadline (:mod:`dossier.deadline`) synthesis is waited for until its end time. One
that has not answered by then gives ``answer: null`` with a timeout error (``route.synthesize``:
``synthesis_timeout``); its request is not thrown away: it goes on, with its own timeout, and its
answer is kept as a deferred one is (``pending: true`` in the response, fetched by ``call_id``), so
what the call already paid for is not lost.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from threading import Event, Lock
from typing import Any, Callable, Mapping

from pydantic import BaseModel, Field

from ..deadline import Deadline, Pending, current_deadline, start_step, within
from ..errors import NotFound, ProviderTimeout
from ..providers.llm import ChatModel, Message, Meter, metered
from ..providers.pii import Masker
from ..schema import SOURCE_NAMES, PropertyItem, SourceName, SourceResult, Synthesis, item_key
from .budget import packed_text
from ..pipeline.call import Call, public_error
from ..pipeline.visibility import drawn_on, still_shown
from .model_steps import TITLES

LABELS: dict[SourceName, str] = {"properties": "P", "memories": "M", "documents": "D", "graph": "G", "external": "X"}
NO_MODEL = "synthesis needs a chat model: set DOSSIER_LLM=openai:<model>"
NO_MESSAGE = "synthesis needs a message: the question to answer"
EMPTY_ANSWER = "The retrieved context is empty, so it does not answer this question."
#: A result still pending in the store this many seconds after it started (or was queued, until it starts)
#: was lost: the process running it stopped (killed, or crashed) before it could store an answer or a failure.
#: A synthesis takes at most its step's timeout (60 s) for each of its three attempts; a closed engine stores a
#: failure at once.
LOST_AFTER = 900.0
LOST = ("synthesis lost: no answer was stored within 15 minutes, so the process that ran it stopped before it "
        "answered; ask again")
WITHHELD = ("answer withheld: something it drew on is no longer visible to this caller (a record deleted or merged "
            "into a deleted one, a memory removed, or a document's or the caller's roles changed since the call)")
_CITATION = re.compile(r"\[([PMDGX]\d+)\]")

INSTRUCTIONS = f"""{TITLES["synthesize"]}
You answer a question about a customer for a colleague, using ONLY the numbered context below: the
customer record's properties [P#], memories of past interactions [M#], sections of the organisation's
documents [D#], relationships [G#] and external data [X#]. Do not use anything you know from elsewhere.
Cite every statement with the label(s) of the item(s) it comes from, in square brackets, e.g. [M2] or
[D1][D3].
If the context does not contain the answer, say so plainly (for example "The context does not say
what discount was agreed.") and give a confidence of at most 0.2; answer the parts it does cover.
Placeholders such as <EMAIL_1> or <VALUE_2> stand for personal data: copy them exactly, never guess
what they stand for.
Reply with JSON only, in this shape:
{{"answer": "...", "reasoning": "how the cited items support the answer", "confidence": 0.0,
"sources_used": ["M2", "D1"]}}
confidence is from 0 (not answered) to 1 (fully and directly answered by the context)."""


class SynthesisOutput(BaseModel):
    answer: str
    reasoning: str = ""
    confidence: float = Field(ge=0.0, le=1.0)
    sources_used: list[str] = Field(default_factory=list)


def labelled_context(results: Mapping[SourceName, SourceResult]) -> tuple[str, dict[str, str]]:
    """The packed context with a label before each item, and label -> item id. Without the labels the
    lines are exactly :func:`~dossier.layers.budget.packed_context` of the response."""
    lines: list[str] = []
    labels: dict[str, str] = {}
    for source in SOURCE_NAMES:
        for n, item in enumerate(results[source].items, start=1):
            label = f"{LABELS[source]}{n}"
            labels[label] = item_key(item)
            lines.append(f"[{label}] {packed_text(item)}")
    return "\n".join(lines), labels


@dataclass
class SynthesisJob:
    """Everything synthesis needs, captured from the call (so that it can run after the call returned)."""

    llm: ChatModel
    question: str
    context: str
    labels: dict[str, str]
    masker: Masker
    timed_out: bool = False  # the model did not answer in time (or was not asked: no time, circuit open)

    @classmethod
    def of(cls, call: Call, llm: ChatModel) -> "SynthesisJob":
        context, labels = labelled_context(call.results)
        res = call.resolution
        records = [] if res.record is None or res.tombstone else [res.record, *res.aliases]
        # properties of records found by discovery are personal data too
        extra = [(i.name, i.value) for s in SOURCE_NAMES for i in call.results[s].items if isinstance(i, PropertyItem)]
        masker = Masker.for_records(records, extra)
        return cls(llm=llm, question=call.message, context=context, labels=labels, masker=masker)

    def messages(self) -> list[Message]:
        """Instructions, then the context, then the question (last, so the prefix can be cached)."""
        user = f"Context:\n{self.masker.mask(self.context)}\n\nQuestion: {self.masker.mask(self.question)}"
        return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": user}]

    def run(self) -> Synthesis:
        if not self.labels:
            return Synthesis(answer=EMPTY_ANSWER, reasoning="No item was retrieved for this question.", confidence=0.0)
        try:
            out = self.llm.complete(self.messages(), output=SynthesisOutput, step="synthesize")
        except ProviderTimeout as exc:  # its own timeout, or not asked (the model URL's circuit is open)
            self.timed_out = True
            return Synthesis(answer=None, error=f"synthesis timed out: {exc}")
        except Exception as exc:  # noqa: BLE001 - reported in the synthesis, never raised
            return Synthesis(answer=None, error=f"synthesis failed: {public_error(exc)}")
        cited = [m.group(1) for m in _CITATION.finditer(out.answer)]
        cited += [label.strip().strip("[]").upper() for label in out.sources_used]
        citations = {label: self.labels[label] for label in dict.fromkeys(cited) if label in self.labels}
        return Synthesis(
            answer=self.masker.unmask(out.answer),
            reasoning=self.masker.unmask(out.reasoning),
            confidence=out.confidence,
            sources_used=list(dict.fromkeys(citations.values())),
            citations=citations,
            unknown_citations=[label for label in dict.fromkeys(cited) if label not in self.labels],
        )


def synthesize(call: Call) -> None:
    if not call.request.synthesize:
        return
    llm = call.steps.llm
    call.decide("synthesize", ran=llm is not None, backend=getattr(llm, "name", None))
    if llm is None:
        call.decide("synthesize", fallback_reason="no_model")
        _refuse(call, NO_MODEL)
        return
    if not call.message:
        _refuse(call, NO_MESSAGE)
        return
    job = SynthesisJob.of(call, llm)
    call.decide("synthesize", detail={"items": len(job.labels), "deferred": call.request.deferred})
    if call.request.deferred:
        call.steps.defer(call.call_id, job.run, org=call.org, caller=call.caller.id, drawn=drawn_on(call))
        call.synthesis = Synthesis(pending=True)
        return
    deadline = current_deadline()
    call.synthesis = job.run() if deadline is None else _by_deadline(call, job, deadline)
    call.decide("synthesize", detail={"masked": len(job.masker.masked)})
    if call.synthesis.error:
        call.decide("synthesize", fallback_reason="synthesis_timeout" if job.timed_out else "synthesis_error")
    if call.synthesis.pending:
        call.decide("synthesize", detail={"continues_in_background": True})


def _refuse(call: Call, error: str) -> None:
    """A synthesis refused before it starts. A deferred call's refusal is kept as its answer would have
    been, so that fetching the result by call id (``Engine.result``, ``dossier result``) returns it."""
    call.synthesis = Synthesis(error=error)
    if call.request.deferred:
        refusal = call.synthesis.model_copy()
        call.steps.defer(call.call_id, lambda: refusal, org=call.org, caller=call.caller.id)


def _by_deadline(call: Call, job: SynthesisJob, deadline: Deadline) -> Synthesis:
    """Synthesis on a thread of its own, waited for until its end time. Its request keeps its own
    timeout (it is not cut at the deadline): when it answers late, the answer is kept under the call id."""
    meter = call.meter

    def work() -> Synthesis:
        own = Meter()
        with within(None), metered(own):
            synthesis = job.run()
        if synthesis.error:  # a failure comes back as a value: tell the deadline's timings how it ended
            sent = bool(own.calls)  # a timeout with nothing sent: the model URL's circuit is open
            deadline.mark("synthesize", "error" if not job.timed_out else "timeout" if sent else "circuit_open")
        for model_call in own.calls:  # counted on the call too, when it answers in time
            meter.record(model_call)
        synthesis.usage = own.summary()
        return synthesis

    pending: Pending[Synthesis] = start_step("synthesize", work)
    try:
        synthesis = pending.result()
    except ProviderTimeout as exc:
        job.timed_out = True
        if not pending.ran:  # never started: no time was left
            return Synthesis(answer=None, error=f"synthesis timed out: {exc}")
        call.steps.keep_late(call.call_id, pending, org=call.org, caller=call.caller.id, drawn=drawn_on(call))
        return Synthesis(answer=None, pending=True, error=(
            f"synthesis timed out: no answer by the call's deadline ({deadline.ms} ms); it goes on in the "
            "background, and its answer can be fetched with the call_id like a deferred one"))  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - reported in the synthesis, never raised
        return Synthesis(answer=None, error=f"synthesis failed: {public_error(exc)}")
    synthesis.usage = None  # a synchronous synthesis is counted in route["model"]
    return synthesis



@dataclass
class _Deferred:
    org: str
    caller: str
    drawn: dict[str, list[str]] = field(default_factory=dict)
    future: Future[Synthesis] | None = None
    synthesis: Synthesis | None = None
    done: Event = field(default_factory=Event)


class DeferredResults:
    """The background syntheses of one engine, by call id: kept in memory (the last ``keep``) and in
    the store (``put_result``), so that another process (``dossier result``) can fetch them too. A
    result belongs to the org and caller of its call; anyone else is told it does not exist."""

    def __init__(self, store: Callable[[], Any], *, workers: int = 2, keep: int = 1024) -> None:
        self._store = store
        self._workers = workers
        self._keep = keep
        self._entries: OrderedDict[str, _Deferred] = OrderedDict()
        self._lock = Lock()
        self._finishing = Lock()  # a result and the failure written at close never overwrite each other
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, call_id: str, work: Callable[[], Synthesis], *, org: str, caller: str,
               drawn: dict[str, list[str]] | None = None) -> None:  # fmt: skip
        """Run ``work`` as the result of ``call_id``; ``drawn``: what its answer may repeat
        (:func:`~dossier.pipeline.visibility.drawn_on`), checked again whenever the answer is served."""
        entry = _Deferred(org=org, caller=caller, drawn=drawn or {})
        self._persist(call_id, entry, Synthesis(pending=True))
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="dossier-synthesis")
            self._entries[call_id] = entry
            while len(self._entries) > self._keep:
                self._entries.popitem(last=False)
            entry.future = self._pool.submit(self._run, call_id, entry, work)

    def _run(self, call_id: str, entry: _Deferred, work: Callable[[], Synthesis]) -> Synthesis:
        self._persist(call_id, entry, Synthesis(pending=True))  # started now: what LOST_AFTER counts from
        meter = Meter()
        try:
            with metered(meter):
                synthesis = work()
        except Exception as exc:  # noqa: BLE001 - a background failure is a result, never lost
            synthesis = Synthesis(answer=None, error=f"synthesis failed: {public_error(exc)}")
        synthesis.usage = meter.summary()
        self._finish(call_id, entry, synthesis)
        return synthesis

    def adopt(self, call_id: str, pending: Pending[Synthesis], *, org: str, caller: str,
              drawn: dict[str, list[str]] | None = None) -> None:  # fmt: skip
        """Keep, as the result of ``call_id``, a synthesis still running after its call returned."""
        entry = _Deferred(org=org, caller=caller, drawn=drawn or {})
        self._persist(call_id, entry, Synthesis(pending=True))
        with self._lock:
            self._entries[call_id] = entry
            while len(self._entries) > self._keep:
                self._entries.popitem(last=False)

        def finished(value: Synthesis | None, error: BaseException | None) -> None:
            if value is None:
                value = Synthesis(answer=None, error=f"synthesis failed: {type(error).__name__}: {error}")
            self._finish(call_id, entry, value)

        pending.then(finished)

    def _finish(self, call_id: str, entry: _Deferred, synthesis: Synthesis) -> None:
        with self._finishing:
            entry.synthesis = synthesis
            self._persist(call_id, entry, synthesis)
        entry.done.set()

    def _persist(self, call_id: str, entry: _Deferred, synthesis: Synthesis) -> None:
        try:
            self._store().put_result(call_id, {"caller": entry.caller, "synthesis": synthesis.model_dump(mode="json"),
                                               "drawn": entry.drawn, "at": time.time()}, org=entry.org)  # fmt: skip
        except Exception:  # noqa: BLE001 - the result stays in memory; this engine can still serve it
            pass

    def get(self, call_id: str, *, org: str, caller: str, wait: float = 0.0) -> Synthesis:
        """The synthesis of ``call_id`` (``pending`` while it runs), waiting up to ``wait`` seconds."""
        deadline = time.monotonic() + max(wait, 0.0)
        with self._lock:
            entry = self._entries.get(call_id)
        if entry is not None:
            if entry.org != org or entry.caller != caller:
                raise NotFound(f"no result for call {call_id!r}")
            if not entry.done.is_set() and wait > 0:
                entry.done.wait(wait)
            return self._screened(entry.synthesis or Synthesis(pending=True), entry.drawn, org=org, caller=caller)
        while True:
            stored = self._store().get_result(call_id, org=org)
            if stored is None or stored.get("caller") != caller:
                raise NotFound(f"no result for call {call_id!r}")
            synthesis = Synthesis.model_validate(stored["synthesis"])
            if synthesis.pending and time.time() - float(stored.get("at") or time.time()) > LOST_AFTER:
                return Synthesis(answer=None, error=LOST)  # the process running it stopped without storing an end
            if not synthesis.pending or time.monotonic() >= deadline:
                return self._screened(synthesis, stored.get("drawn"), org=org, caller=caller)
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))

    def _screened(self, synthesis: Synthesis, drawn: dict[str, list[str]] | None, *, org: str, caller: str) -> Synthesis:
        """``synthesis``, unless it holds an answer drawn on something the caller may no longer see (a record
        deleted or merged into a deleted one since the call, a memory removed, a document whose roles changed,
        the caller's own roles changed): then the answer is withheld, and nothing says which item it was. A
        result stored without what it drew on cannot be checked and is withheld too (fail closed)."""
        if synthesis.answer is None and synthesis.reasoning is None and not synthesis.citations:
            return synthesis  # pending, failed or refused: nothing drawn from the items
        if drawn is not None and still_shown(self._store(), drawn, org=org, caller=caller):
            return synthesis
        return Synthesis(answer=None, error=WITHHELD, usage=synthesis.usage)

    def close(self) -> None:
        """Finish the deferred syntheses still running (their results are stored), then stop the workers.
        A synthesis kept after its call's deadline is not waited for (it runs on the step's own thread):
        it is stored as failed, so that no reader waits for it forever, unless it still answers in time
        to be stored after all."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        with self._lock:
            entries = list(self._entries.items())
        for call_id, entry in entries:
            with self._finishing:
                if entry.synthesis is None:
                    self._persist(call_id, entry, Synthesis(answer=None, error="synthesis timed out: it had not "
                                                            "answered when the engine that ran it was closed"))  # fmt: skip
