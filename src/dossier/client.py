"""A client for ``dossier serve``: the HTTP API as the library's own typed objects, sync and async (httpx).

    with dossier.Client("http://127.0.0.1:8000", api_key) as client:
        response = client.retrieve({"record": {"email": "jane@acme.com"}, "message": "What discount rules apply?"})

    async with dossier.AsyncClient("http://127.0.0.1:8000", api_key) as client:
        response = await client.retrieve(...)

Each method returns what the library returns for the same work: ``retrieve`` a
:class:`~dossier.schema.RetrieveResponse`, ``result`` a :class:`~dossier.schema.Synthesis`, ``load_bundle`` a
:class:`~dossier.loading.LoadReport`, ``remember`` a :class:`~dossier.bundle.Memory`, ``add_document`` a
:class:`~dossier.bundle.Document` and ``feedback`` the stored :class:`~dossier.stores.service_base.Feedback`.
The key decides the org and the caller, as on every front end of the service.

Errors are those of :mod:`dossier.errors`: a request that does not validate raises
:class:`~dossier.errors.InvalidRequest` before anything is sent, and an HTTP error maps onto the same tree:
401 :class:`~dossier.errors.Unauthorized`, 403 :class:`~dossier.errors.Forbidden`, 404
:class:`~dossier.errors.NotFound`, 422 :class:`~dossier.errors.InvalidRequest` (a refused bundle:
:class:`~dossier.errors.BundleError` with its problems), 405 and 413 :class:`~dossier.errors.UsageError`, 502
:class:`~dossier.errors.ProviderError`, 503 :class:`~dossier.errors.StoreUnavailable`. A server that cannot be
reached or does not answer within ``timeout`` (the whole answer, not each read) is
:class:`~dossier.errors.StoreUnavailable` as well (the service is the store, seen from here); an answer that is
not the service's (a 2xx whose body is not the JSON asked for) is :class:`~dossier.errors.StoreError`, and a
redirect, which the client does not follow, :class:`~dossier.errors.UsageError`. No message quotes the key, and
a URL's password is hidden.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Generic, Mapping, TypeVar
from urllib.parse import quote

from pydantic import TypeAdapter, ValidationError

from .bundle import Bundle, Document, Memory
from .errors import (
    BundleError,
    DossierError,
    Forbidden,
    InvalidRequest,
    MissingExtra,
    NotFound,
    Problem,
    ProviderError,
    StoreError,
    StoreUnavailable,
    Unauthorized,
    UsageError,
    redacted_url,
)
from .loading import LoadReport, document_from_markdown, slug
from .retrieve import parse_request
from .schema import RecordRef, RetrieveRequest, RetrieveResponse, Synthesis
from .service import FeedbackRequest, NewDocument, NewMemory, _validate
from .stores.service_base import Feedback

try:
    import httpx
except ImportError as exc:  # pragma: no cover - the [client] extra (also in [server] and [dev])
    raise MissingExtra("dossier.Client", "client") from exc

T = TypeVar("T")
#: Seconds a request may take by default (a deep call with synthesis can take a while).
DEFAULT_TIMEOUT = 120.0
#: what a wrong-shaped answer raises while it is read into the library's types (pydantic's ValidationError is a
#: ValueError; a missing key, a list where an object belongs, a date that is not one, JSON nested too deeply)
_MALFORMED = (LookupError, TypeError, AttributeError, ValueError, ArithmeticError, RecursionError)
_FEEDBACK = TypeAdapter(Feedback)
_REPORT = TypeAdapter(LoadReport)


@dataclass(frozen=True)
class _Call(Generic[T]):
    """One HTTP request and how its JSON answer becomes the value a method returns."""

    method: str
    path: str
    parse: Callable[[Any], T]
    body: Any = None
    raw: bytes | None = None
    params: Mapping[str, Any] | None = None
    #: the MCP tool called: ``parse`` gets the text of its answer
    tool: str | None = None


class _Base:
    """What the sync and async clients share: the requests, the answers' parsing, the error mapping."""

    def __init__(self, url: str, api_key: str, timeout: float | None) -> None:
        shown = redacted_url(str(url))
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise UsageError(f"the service URL must start with http:// or https://, not {shown[:40]!r}")
        try:
            userinfo = httpx.URL(url).userinfo
        except httpx.InvalidURL as exc:  # its words may quote the URL: not where it holds a password
            raise UsageError(f"invalid service URL {shown[:80]!r}" + ("" if "@" in url else f": {exc}")) from None
        if userinfo:  # httpx would send it as the Authorization header, in place of the key
            raise UsageError("the service URL holds a user or password (user:password@): give the URL without it "
                             "and the key as api_key")  # fmt: skip
        if not isinstance(api_key, str) or not api_key.strip():
            raise UsageError("an API key is required (dossier keys create --org ORG --caller CALLER)")
        key = api_key.strip()
        if not all("!" <= c <= "~" for c in key):  # a header cannot carry it, and the driver's refusal quotes it
            raise UsageError("the API key holds a character no dossier key has (a control character, a space or one "
                             "outside ASCII): check where it was read from (it is not quoted here)")  # fmt: skip
        self.url = url.rstrip("/")
        self._shown = redacted_url(self.url)
        self._timeout = timeout
        #: the key as a message could hold it: itself, and escaped as JSON or repr() would escape it
        self._secrets = sorted({key, json.dumps(key)[1:-1], repr(key)[1:-1]}, key=len, reverse=True)
        self._headers = {"Authorization": f"Bearer {key}", "Accept": "application/json"}
        self._org: str | None = None

    # -- requests ----------------------------------------------------------------------------------------
    @staticmethod
    def _retrieve(request: RetrieveRequest | Mapping[str, Any]) -> _Call[RetrieveResponse]:
        parsed = parse_request(request)  # the library's own validation: the same InvalidRequest, nothing sent
        body = parsed.model_dump(mode="json", exclude_unset=True)
        return _Call("POST", "/v1/retrieve", RetrieveResponse.model_validate, body=body)

    @staticmethod
    def _result(call_id: str, wait: float) -> _Call[Synthesis]:
        def parse(found: Any) -> Synthesis:
            if found.get("synthesis") is None:  # as Engine.result: nothing deferred for this caller
                raise NotFound(f"no result for call {call_id!r}: it was not deferred, or another caller made it")
            return Synthesis.model_validate(found["synthesis"])

        return _Call("GET", f"/v1/calls/{_segment(call_id)}", parse, params={"wait": wait} if wait else None)

    @staticmethod
    def _feedback(org: str, call_id: str, rating: int, comment: str | None) -> _Call[Feedback]:
        body = _validate(FeedbackRequest, {"call_id": call_id, "rating": rating, "comment": comment})

        def parse(row: Any) -> Feedback:
            fields = {key: row[key] for key in ("call_id", "caller", "rating", "comment")}
            return _FEEDBACK.validate_python({**fields, "org": org, "at": datetime.fromisoformat(row["at"]).timestamp()})

        return _Call("POST", "/v1/feedback", parse, body=body.model_dump(mode="json"))

    @staticmethod
    def _remember(org: str, record: str | RecordRef | Mapping[str, Any], text: str,
                  created_at: datetime | None) -> _Call[Memory]:  # fmt: skip
        ref = _record_ref(record)
        kind, value = ref.identifier
        if kind == "id":
            new = _validate(NewMemory, {"record": value, "text": text, "created_at": created_at})

            def written(answer: Any) -> Memory:
                [row] = answer["memories"]
                return Memory(id=row["id"], org=org, record=row["record_id"], text=new.text, created_at=row["created_at"])

            body = new.model_dump(mode="json", exclude_none=True)
            return _Call("POST", "/v1/memories", written, body=body)
        if created_at is not None:
            raise UsageError("created_at needs the record's id (remember by another identifier stamps the memory now)")
        # By another identifier: the service's remember tool (MCP, on the same server) resolves it, merges followed.
        _validate(NewMemory, {"record": "x", "text": text})
        arguments = {"record": ref.model_dump(exclude_none=True), "text": text}

        def remembered(answer: str) -> Memory:
            row = json.loads(answer)
            return Memory(id=row["id"], org=org, record=row["record_id"], text=text, created_at=row["created_at"])

        return _Call("POST", "/mcp", remembered, body=_tool_call("remember", arguments), tool="remember")

    @staticmethod
    def _add_document(org: str, document: Document | NewDocument | Mapping[str, Any]) -> _Call[Document]:
        stored = _as_document(org, document)
        body = stored.model_dump(mode="json", exclude={"is_system"})
        if stored.org == org:
            body.pop("org")  # the key's org; a document naming another org is sent as it is and refused (403)

        def parse(answer: Any) -> Document:
            [row] = answer["documents"]
            if row["id"] != stored.id or list(row["sections"]) != [s.id for s in stored.sections]:
                raise DossierError(f"the service stored document {stored.id!r} otherwise than sent")
            return stored

        return _Call("POST", "/v1/documents", parse, body=body)

    @staticmethod
    def _load_bundle(source: str | Path | Mapping[str, Any] | Bundle) -> _Call[LoadReport]:
        if isinstance(source, Bundle):
            return _Call("POST", "/v1/bundles", _report, body=source.model_dump(mode="json"))
        if isinstance(source, Mapping):
            return _Call("POST", "/v1/bundles", _report, body=dict(source))
        try:
            raw = Path(source).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read bundle {source}: {exc.strerror or exc}") from exc
        return _Call("POST", "/v1/bundles", _report, raw=raw)

    @staticmethod
    def _whoami() -> _Call[str]:
        return _Call("GET", "/v1/usage", _org_of)

    # -- answers -----------------------------------------------------------------------------------------
    def _answer(self, call: _Call[T], response: httpx.Response) -> T:
        status = response.status_code
        if status >= 400:
            raise error_from(response, hide=self._scrub)
        if not 200 <= status < 300:  # a redirect is not followed: a POST's body would not go with it
            to = self._scrub(redacted_url(response.headers.get("location", "")))[:200]
            raise UsageError(f"{self._shown} answered {call.method} {call.path} with HTTP {status}"
                             f"{f' (to {to})' if to else ''}: the client follows no redirect, give it the URL "
                             "the service answers at")  # fmt: skip
        try:
            data = response.json()
        except (ValueError, RecursionError) as exc:
            raise self._not_an_answer(call, f"HTTP {status} with a body that is not JSON") from exc
        try:
            return call.parse(self._tool_text(data, call.tool) if call.tool else data)
        except _MALFORMED as exc:  # a refusal the answer states (a DossierError) goes through as it is
            raise self._not_an_answer(call, _flaw(exc)) from exc

    def _not_an_answer(self, call: _Call[Any], flaw: str) -> StoreError:
        return StoreError(f"the answer of {self._shown}{call.path} is not a dossier answer: {self._scrub(flaw)[:200]}")

    def _tool_text(self, answer: Any, name: str) -> str:
        """The text of an MCP tool's answer; a tool error as the error it stands for."""
        if "error" in answer:
            raise DossierError(self._scrub(f"the {name} tool failed: {answer['error'].get('message', '')}"))
        result = answer.get("result") or {}
        text = "".join(c.get("text", "") for c in result.get("content") or [] if c.get("type") == "text")
        if result.get("isError"):
            message = self._scrub(text.removeprefix(f"Error executing tool {name}: "))
            if message.startswith(("no record with", "unknown")):
                raise NotFound(message)
            if "another org" in message or "is not this key's org" in message:
                raise Forbidden(message)
            raise UsageError(message)
        return text

    def _scrub(self, text: str) -> str:
        """``text`` (a server's or a driver's words) as a message may quote it: without the key, whose every
        appearance becomes ``***``, and with the service URL's password hidden."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text.replace(self.url, self._shown)

    def _request_args(self, call: _Call[Any]) -> dict[str, Any]:
        headers = dict(self._headers)
        content = call.raw if call.raw is not None else None
        if call.body is not None:
            content = json.dumps(call.body, ensure_ascii=False).encode("utf-8")
        if content is not None:
            headers["Content-Type"] = "application/json"
        if call.path == "/mcp":
            headers["Accept"] = "application/json, text/event-stream"
        return {"method": call.method, "url": call.path, "content": content, "params": call.params, "headers": headers}

    def _unreachable(self, exc: httpx.HTTPError) -> StoreUnavailable:
        if isinstance(exc, httpx.TimeoutException):
            return StoreUnavailable(f"dossier at {self._shown} did not answer in time ({type(exc).__name__})")
        return StoreUnavailable(self._scrub(f"cannot reach dossier at {self._shown}: {type(exc).__name__}: {exc}"))

    def _late(self) -> StoreUnavailable:
        return StoreUnavailable(f"dossier at {self._shown} did not answer within {self._timeout:g} s "
                                "(a request that writes may have been carried out)")  # fmt: skip

    def _failed(self, exc: RuntimeError) -> UsageError:
        """httpx's refusal of a client it cannot use; it may come after the request went out."""
        return UsageError(self._scrub(f"the request failed ({exc}); it may have reached the service"))


class Client(_Base):
    """The service at ``url`` as the caller of ``api_key`` (see the module's docstring). Close it, or use ``with``."""

    def __init__(self, url: str, api_key: str, *, timeout: float = DEFAULT_TIMEOUT,
                 transport: httpx.BaseTransport | None = None) -> None:  # fmt: skip
        super().__init__(url, api_key, timeout)
        self._http = httpx.Client(base_url=self.url, timeout=timeout, transport=transport)

    def _send(self, call: _Call[T]) -> T:
        """One request, its whole answer within ``timeout``. httpx's timeout bounds each read, and a server that
        sends a byte now and then never trips it: the request runs on a thread, which the caller waits for until
        the deadline and no longer."""
        if self._http.is_closed:
            raise UsageError("this client is closed: make a new one")
        args = self._request_args(call)
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        outcome: list[httpx.Response | BaseException] = []
        done = threading.Event()

        def fetch() -> None:
            try:
                outcome.append(self._fetch(args, deadline))
            except BaseException as exc:  # raised again on the caller's thread
                outcome.append(exc)
            finally:
                done.set()

        worker = threading.Thread(target=contextvars.copy_context().run, args=(fetch,), name="dossier-client",
                                  daemon=True)  # fmt: skip
        worker.start()
        if not done.wait(self._timeout):
            raise self._late()
        [got] = outcome
        if isinstance(got, BaseException):
            raise got
        return self._answer(call, got)

    def _fetch(self, args: dict[str, Any], deadline: float | None) -> httpx.Response:
        """The whole answer to one request, read a chunk at a time: once ``deadline`` has passed (the caller has
        given up on it) it reads no further."""
        try:
            with self._http.stream(**args) as streamed:
                chunks = []
                for chunk in streamed.iter_bytes():
                    chunks.append(chunk)
                    if deadline is not None and time.monotonic() > deadline:
                        raise self._late()
                # the answer again, with the body read (decoded: the headers that described it on the wire go)
                headers = [(name, value) for name, value in streamed.headers.multi_items()
                           if name.lower() not in ("content-encoding", "content-length")]  # fmt: skip
                return httpx.Response(streamed.status_code, headers=headers, content=b"".join(chunks),
                                      request=streamed.request, extensions=streamed.extensions)  # fmt: skip
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        except RuntimeError as exc:
            raise self._failed(exc) from exc

    @property
    def org(self) -> str:
        """The org of this client's key (asked of the service once)."""
        if self._org is None:
            self._org = self._send(self._whoami())
        return self._org

    def retrieve(self, request: RetrieveRequest | Mapping[str, Any]) -> RetrieveResponse:
        """One retrieve call (``docs/retrieve.md``), as :meth:`dossier.Engine.retrieve` answers it."""
        return self._send(self._retrieve(request))

    def result(self, call_id: str, *, wait: float = 0.0) -> Synthesis:
        """The synthesis of one of this caller's ``deferred`` calls (``pending`` while it runs; waits up to
        ``wait`` seconds, at most 30). NotFound for a call that was not deferred or is another caller's."""
        return self._send(self._result(call_id, wait))

    def feedback(self, call_id: str, rating: int, comment: str | None = None) -> Feedback:
        """Rate one of this key's caller's calls (any of the org's for the admin role), 1-5, with an optional
        comment."""
        return self._send(self._feedback(self.org, call_id, rating, comment))

    def remember(self, record: str | RecordRef | Mapping[str, Any], text: str, *,
                 created_at: datetime | None = None) -> Memory:  # fmt: skip
        """Save a fact as a memory of a record: its id (``"rec-jane"``), or any identifier
        (``{"email": "jane@acme.com"}``; merges are followed)."""
        return self._send(self._remember(self.org, record, text, created_at))

    def add_document(self, document: Document | NewDocument | Mapping[str, Any]) -> Document:
        """Add or replace a document: a :class:`~dossier.Document`, or a mapping with ``title`` and ``sections``
        or with ``markdown`` (split at its headings, as ``dossier add-doc`` does). Returns it as stored."""
        return self._send(self._add_document(self.org, document))

    def load_bundle(self, source: str | Path | Mapping[str, Any] | Bundle) -> LoadReport:
        """Load a bundle (a path, a parsed dict or a :class:`~dossier.Bundle`) into the key's org: all of it
        or nothing. Needs the caller's admin role."""
        return self._send(self._load_bundle(source))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class AsyncClient(_Base):
    """:class:`Client` for asyncio: the same methods, awaited. Two things differ: the key's org is a method,
    ``await client.org()`` (on :class:`Client` a property), and it closes with ``await aclose()`` or ``async with``."""

    def __init__(self, url: str, api_key: str, *, timeout: float = DEFAULT_TIMEOUT,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:  # fmt: skip
        super().__init__(url, api_key, timeout)
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout, transport=transport)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _send(self, call: _Call[T]) -> T:
        if self._http.is_closed:
            raise UsageError("this client is closed: make a new one")
        self._on_its_loop()
        args = self._request_args(call)
        try:
            async with asyncio.timeout(self._timeout):  # the whole answer: httpx's timeout bounds each read
                response = await self._http.request(**args)
        except TimeoutError:
            raise self._late() from None
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        except RuntimeError as exc:
            raise self._failed(exc) from exc
        return self._answer(call, response)

    def _on_its_loop(self) -> None:
        """The client serves the event loop of its first request, and refuses another before anything is sent:
        its pooled connections belong to that loop, and on another one a request can fail after the server has
        run it."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise UsageError("an AsyncClient serves one event loop, the one it was first used on, and this is "
                             "another: make an AsyncClient per event loop (nothing was sent)")  # fmt: skip

    async def org(self) -> str:
        """The org of this client's key (asked of the service once)."""
        if self._org is None:
            self._org = await self._send(self._whoami())
        return self._org

    async def retrieve(self, request: RetrieveRequest | Mapping[str, Any]) -> RetrieveResponse:
        return await self._send(self._retrieve(request))

    async def result(self, call_id: str, *, wait: float = 0.0) -> Synthesis:
        return await self._send(self._result(call_id, wait))

    async def feedback(self, call_id: str, rating: int, comment: str | None = None) -> Feedback:
        return await self._send(self._feedback(await self.org(), call_id, rating, comment))

    async def remember(self, record: str | RecordRef | Mapping[str, Any], text: str, *,
                       created_at: datetime | None = None) -> Memory:  # fmt: skip
        return await self._send(self._remember(await self.org(), record, text, created_at))

    async def add_document(self, document: Document | NewDocument | Mapping[str, Any]) -> Document:
        return await self._send(self._add_document(await self.org(), document))

    async def load_bundle(self, source: str | Path | Mapping[str, Any] | Bundle) -> LoadReport:
        return await self._send(self._load_bundle(source))

    async def aclose(self) -> None:
        """Close the client, on the event loop it served. Once that loop is closed (``asyncio.run`` has returned),
        any loop may: the connections it left cannot be closed any more and are dropped."""
        served = self._loop
        if served is None or served is asyncio.get_running_loop():
            await self._http.aclose()
        elif not served.is_closed():
            raise UsageError("this AsyncClient serves another event loop, still open: close it there")
        else:
            try:
                await self._http.aclose()  # the client is closed first, then its connections
            except RuntimeError:  # the first connection, of the closed loop; the rest are dropped with it
                pass

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:  # fmt: skip
        await self.aclose()


# -- errors ------------------------------------------------------------------------------------------------
def error_from(response: httpx.Response, *, hide: Callable[[str], str] = str) -> DossierError:
    """The :mod:`dossier.errors` exception for an error answer of the service (``{"detail": {...}}``), whatever
    its body. ``hide`` takes out of the server's words what no message may quote (a client's key)."""
    status = response.status_code
    try:
        detail = response.json().get("detail") or {}
    except (ValueError, AttributeError, RecursionError):
        detail = {}
    if not isinstance(detail, dict):
        detail = {"message": str(detail)}
    message = hide(str(detail.get("message") or response.reason_phrase or f"HTTP {status}"))
    if status == 401:
        return Unauthorized(message)
    if status == 403:
        return Forbidden(message)
    if status == 404:
        return NotFound(message)
    if status == 422:
        problems, field = detail.get("problems"), detail.get("field")
        if isinstance(problems, list):
            return BundleError([_problem(hide(str(line))) for line in problems])
        return InvalidRequest(message, field=hide(field) if isinstance(field, str) else None)
    if status == 502:
        return ProviderError(message, status_code=status, body=hide(response.text[:2000]))
    if status == 503:
        return StoreUnavailable(message)
    if 400 <= status < 500:
        return UsageError(f"HTTP {status}: {message}")
    return DossierError(f"HTTP {status}: {message}")


def _problem(line: str) -> Problem:
    """A bundle problem back from its one-line form, ``kind [item id]: message``."""
    where, _, message = str(line).partition(": ")
    kind, _, item_id = where.partition(" ")
    return Problem(kind, item_id or None, message)


# -- helpers -----------------------------------------------------------------------------------------------
def _segment(value: str) -> str:
    """``value`` as one path segment, percent-encoded (``?``, ``#``, ``%``, spaces, non-ASCII), so the server
    gets it whole. One with ``/`` is refused: the server decodes ``%2F`` before routing."""
    if not isinstance(value, str):
        raise InvalidRequest(f"a call id is a string, not {type(value).__name__}", field="call_id")
    if not value or "/" in value or value in (".", ".."):
        raise InvalidRequest(f"invalid call id {value[:100]!r}", field="call_id")
    return quote(value, safe="")


def _record_ref(record: str | RecordRef | Mapping[str, Any]) -> RecordRef:
    if isinstance(record, RecordRef):
        return record
    if isinstance(record, str):
        return _validate(RecordRef, {"id": record}, prefix="record")
    return _validate(RecordRef, record, prefix="record")


def _as_document(org: str, document: Document | NewDocument | Mapping[str, Any]) -> Document:
    """The document as the service will store it (the same split and defaults as ``Service.add_documents``)."""
    if isinstance(document, Document):
        if document.is_system:
            raise UsageError("a system document is loaded with a bundle (load_bundle), not add_document")
        return document
    new = document if isinstance(document, NewDocument) else _validate(NewDocument, document)
    common: dict[str, Any] = dict(doc_type=new.doc_type, tags=new.tags, visible_to_roles=new.visible_to_roles,
                                  attached_record=new.attached_record)  # fmt: skip
    if new.markdown is not None:
        try:
            return document_from_markdown(new.markdown, org=new.org or org, title=new.title, doc_id=new.id, **common)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise InvalidRequest(f"invalid document: {exc}".splitlines()[0], field="markdown") from None
    sections = [s.model_dump() for s in new.sections or []]
    return _validate(Document, {"id": new.id or slug(new.title or ""), "org": new.org or org, "title": new.title,
                                "sections": sections, **common})  # fmt: skip


def _tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def _org_of(usage: Any) -> str:
    org = usage["org"]
    if not isinstance(org, str) or not org:
        raise ValueError("its org is not a name")
    return org


def _report(summary: Any) -> LoadReport:
    counts = {key: summary[key] for key in ("inserted", "updated", "unchanged", "embedded", "seconds")}
    return _REPORT.validate_python({**counts, "ignored_keys": summary.get("ignored_keys") or [],
                                    "ignored_fields": summary.get("ignored_fields") or {}})  # fmt: skip


def _flaw(exc: Exception) -> str:
    """What is wrong with an answer, in a few words: pydantic's first complaint, the key it lacks."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(part) for part in first['loc']) or 'its body'}: {first['msg']}"
    if isinstance(exc, KeyError):
        return f"it has no {exc.args[0]!r}"
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    return f"{type(exc).__name__}: {exc}"

