"""The service behind the HTTP and MCP front ends: API keys, audited and billed calls, feedback, loading.

The front ends are thin: each turns the API key of a request into a :class:`Principal` and the request
into one method call here, and a :class:`~dossier.errors.DossierError` into a status. Nothing here
knows about sockets, so all of it is tested in-process. Keys, sessions, the audit log, feedback and the
ledger are rows in the data's own database (``Engine.service_store``), so service workers are stateless.

* **Keys**: ``dk_<id>_<secret>``; only the SHA-256 of the secret is stored, compared in constant time.
  The key decides the org and the caller; no request body can.
* **Calls**: charged up front (``Settings.service``: by depth, plus synthesis), refunded in full when
  the call throws, and in part when the depth was downgraded or synthesis did not run. One audit row per
  call: its shape, never its bodies (no message, item text or identifiers).
* **Feedback**: a rating of one of the org's own calls.
* **Loading**: bundles and single records, memories and documents, all in the key's org; an item that
  names another org is refused. A bundle can define callers and their roles, so it needs an org admin.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import logging
import secrets
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, cast

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from .bundle import LABEL_MAX, MEMORY_TEXT_MAX, TITLE_MAX, Document, Id, Identifiers, Label, Labels, Memory, Record, Section
from .errors import BundleError, DossierError, Forbidden, InvalidRequest, NotFound, Unauthorized, UsageError, http_status
from .identifiers import NUL_MESSAGE, IdentifierKind, clip, normalize, nul_path
from .loading import LoadReport, document_from_markdown
from .pipeline.visibility import IDENTIFIER_KIND, preferred, shown_records, survivor, verdict
from .retrieve import parse_request
from .schema import RecordRef, RetrieveRequest, RetrieveResponse
from .stores.service_base import ApiKey, AuditRow, Feedback, LedgerEntry, ServiceStore, UsageLine

if TYPE_CHECKING:
    from .engine import Engine

KEY_PREFIX = "dk"
ADMIN_ROLE = "admin"
AUDITED = "_dossier_audited"  # set on an error whose audit row is written
log = logging.getLogger("dossier.service")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: decided by the API key (``key_id`` None for the Python API and the CLI)."""

    org: str
    caller: str
    key_id: str | None = None


# -- request bodies shared by the front ends ---------------------------------------------------------
# Single-item writes are strict: an unknown field is refused (422) naming it, and nothing is written.
# (Bundles, exported from other systems, ignore unknown fields and list them in the load report.)
class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    call_id: str = Field(min_length=1, max_length=64, description="The call_id of an earlier retrieve call.")
    rating: StrictInt = Field(ge=1, le=5, description="1 = useless or wrong, 3 = partly useful, 5 = exactly what was needed.")
    comment: str | None = Field(default=None, max_length=2000, description="What was missing or wrong (optional).")


class NewIdentifiers(Identifiers):
    """A new record's identifiers: the bundle's, with unknown fields refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NewRecord(Record):
    """A record to add or update; ``org`` may be left out (it is the key's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    org: Id | None = None  # type: ignore[assignment]
    identifiers: NewIdentifiers = NewIdentifiers()


class NewMemory(BaseModel):
    """A memory to add: ``record`` is a record id; ``id`` and ``created_at`` default to new / now."""

    model_config = ConfigDict(extra="forbid")

    record: Id
    text: str = Field(min_length=1, max_length=MEMORY_TEXT_MAX)  # a bundle's limit (docs/bundles.md)
    id: Id | None = None
    org: Id | None = None
    created_at: datetime | None = None


class NewSection(Section):
    """A section of a new document: the bundle's, with unknown fields refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NewDocument(BaseModel):
    """A document as ``sections`` (bundle form) or as ``markdown`` (split at headings); ``org`` may be left out."""

    model_config = ConfigDict(extra="forbid")

    title: str | None = Field(default=None, max_length=TITLE_MAX,
                              description="Required with sections; markdown may start with '# Title'.")  # fmt: skip
    id: Id | None = Field(default=None, description="Default: a slug of the title.")
    org: Id | None = None
    doc_type: Label = Field(default="guideline", max_length=LABEL_MAX)
    tags: Labels = ()
    visible_to_roles: Labels | None = Field(default=None, description="Roles that may see it; null = whole org.")
    attached_record: Id | None = None
    sections: list[NewSection] | None = None
    markdown: str | None = None

    @model_validator(mode="after")
    def _one_form(self) -> "NewDocument":
        if (self.sections is None) == (self.markdown is None):
            raise ValueError("give exactly one of 'sections' or 'markdown'")
        if self.sections is not None and not self.title:
            raise ValueError("a document given as sections needs a title")
        return self


# -- keys ----------------------------------------------------------------------------------------------
def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def split_key(key: str) -> tuple[str, str] | None:
    """``(key id, secret)`` of a well-formed key, else None."""
    parts = key.strip().split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header value."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


class CallThreads:
    """Retrieve calls run on at most ``size`` worker threads per process: they are CPU-bound and share one
    GIL, so more threads only add switching (the query embedding releases the GIL, so two overlap well).
    One per process, shared by ``/v1/retrieve`` and every MCP tool call, so neither front end can take the
    threads that key checks and ``/healthz`` run on (anyio's default pool)."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._limiter: Any = None

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        import anyio.to_thread  # the async front ends' dependency, not the library's

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.size)
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self._limiter)


class Service:
    """Layer 10 over one :class:`~dossier.Engine`; shared by the HTTP and MCP front ends and the CLI."""

    def __init__(self, engine: "Engine", *, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.clock = clock

    @property
    def store(self) -> ServiceStore:
        return self.engine.service_store

    # -- keys ------------------------------------------------------------------------------------------
    def create_key(self, org: str, caller: str, *, name: str | None = None) -> tuple[ApiKey, str]:
        """A new key for ``caller`` of ``org`` (both must exist): the stored row, and the key itself,
        which is shown once and never stored."""
        if self.engine.store.get_org(org=org) is None:
            raise NotFound(f"unknown org {clip(org)}: load it first (dossier load)")
        if self.engine.store.get_caller(caller, org=org) is None:
            raise NotFound(f"unknown caller {clip(caller)} in org {clip(org)}: load it first (dossier load)")
        key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        row = ApiKey(id=key_id, org=org, caller=caller, secret_hash=_digest(secret), created_at=self.clock(), name=name)
        self.store.add_key(row)
        return row, f"{KEY_PREFIX}_{key_id}_{secret}"

    def list_keys(self, *, org: str | None = None) -> list[ApiKey]:
        return self.store.list_keys(org=org)

    def revoke_key(self, key_id: str) -> None:
        if not self.store.revoke_key(key_id, at=self.clock()):
            raise NotFound(f"no live key with id {key_id!r} (dossier keys list shows them)")

    def authenticate(self, key: str | None) -> Principal:
        """The principal of an API key; :class:`Unauthorized` when it is missing, unknown or revoked."""
        if not key:
            raise Unauthorized("an API key is required: Authorization: Bearer <key>")
        parts = split_key(key)
        row = self.store.get_key(parts[0]) if parts else None
        presented = _digest(parts[1]) if parts else _digest(key)
        stored = row.secret_hash if row is not None else "0" * 64
        if not hmac.compare_digest(presented, stored) or row is None or row.revoked_at is not None:
            raise Unauthorized("the API key is unknown or revoked")
        return Principal(org=row.org, caller=row.caller, key_id=row.id)

    # -- calls -----------------------------------------------------------------------------------------
    def retrieve(
        self, principal: Principal, request: RetrieveRequest | Mapping[str, Any], *, front_end: str = "python"
    ) -> RetrieveResponse:
        """One retrieve call as ``principal``: charged up front, refunded if it throws, audited."""
        started, at = time.perf_counter(), self.clock()
        call_id = uuid.uuid4().hex
        try:
            parsed = parse_request(request)
        except InvalidRequest as exc:
            self._settle(principal, call_id, front_end, at, started, None, exc)
            raise
        org = principal.org
        item, units = self.price(parsed, org=org)
        self._ledger(org, call_id, "charge", item, units, at)
        given_back = 0
        try:
            response = self.engine.retrieve(parsed, org=org, caller=principal.caller, call_id=call_id,
                                            max_deadline_ms=self.engine.settings_for(org).service.max_deadline_ms)  # fmt: skip
            back = units - self.price(parsed, response, org=org)[1]
            if back > 0:
                self._ledger(org, call_id, "adjust", item, -back, self.clock())
                given_back = back
            self._audit(principal, call_id, front_end, at, started, parsed, response, None, units=units - given_back)
        except BaseException as exc:  # the call (or its audit) failed: no answer; give back what is left of the charge
            self._settle(principal, call_id, front_end, at, started, parsed, exc, refund=(item, given_back - units))
            raise
        return response

    def _settle(
        self, principal: Principal, call_id: str, front_end: str, at: float, started: float,
        request: RetrieveRequest | None, error: BaseException, *, refund: tuple[str, int] | None = None,
    ) -> None:  # fmt: skip
        """After a call that failed: the refund and the audit row, each tried on its own. The call's own
        error is what the caller gets; a refund or audit row that cannot be written either is logged."""
        if refund is not None:
            try:
                self._ledger(principal.org, call_id, "refund", refund[0], refund[1], self.clock())
            except Exception as exc:  # noqa: BLE001 - the call's error wins
                log.warning("call %s: the refund could not be written (%s)", call_id, type(exc).__name__)
        try:
            self._audit(principal, call_id, front_end, at, started, request, None, error, units=0)
        except Exception as exc:  # noqa: BLE001 - the call's error wins
            log.warning("call %s: the audit row could not be written (%s)", call_id, type(exc).__name__)
        else:
            with contextlib.suppress(AttributeError, TypeError):
                setattr(error, AUDITED, True)  # the front end does not audit it a second time

    def refused(
        self, principal: Principal, error: BaseException | str, *, front_end: str, route: str,
        status: int | None = None, field: str | None = None,
    ) -> bool:  # fmt: skip
        """Audit a request that was refused before anything ran (an invalid body, one over its limit, an
        unknown route or call, another org's item): by its shape only, the route template, the status, the
        error's class name and the offending field's name (:func:`audit_field`), never a value. False when
        the row could not be written: the refusal still goes out (it releases nothing), and that is logged."""
        if getattr(error, AUDITED, False):
            return True
        name = error if isinstance(error, str) else type(error).__name__
        shape = {"route": route, "status": status, "invalid_field": audit_field(field)}
        row = AuditRow(call_id=uuid.uuid4().hex, org=principal.org, caller=principal.caller, key_id=principal.key_id,
                       front_end=front_end, at=self.clock(), latency_ms=0.0, mode=None, depth=None, outcome="error",
                       error_type=name, units=0, shape=json.dumps(shape, separators=(",", ":"), sort_keys=True))  # fmt: skip
        try:
            self.store.add_audit(row)
        except Exception as exc:  # noqa: BLE001 - a refusal is answered even so
            log.warning("a refused request could not be audited (%s)", type(exc).__name__)
            return False
        return True

    def refused_error(self, principal: Principal, error: DossierError, *, front_end: str, route: str) -> None:
        """Audit ``error`` as a refusal (:meth:`refused`) when it is the caller's (the HTTP API answers it
        with a 4xx: another org's or an unknown item, a forbidden write, an invalid value); a fault of the
        store or of a model provider is not a refusal, and an error the call already audited is not
        audited again."""
        status = http_status(error)
        if status >= 500:
            return
        if isinstance(error, BundleError):
            field = error.problems[0].kind if error.problems else None
        else:
            field = getattr(error, "field", None)
        self.refused(principal, error, front_end=front_end, route=route, status=status, field=field)

    def ready(self) -> None:
        """Raise :class:`~dossier.errors.StoreError` (or the driver's error) unless the store can be read
        (the data and the service tables) and written (one committed row of the service tables)."""
        self.engine.store.get_org(org="readyz")
        self.store.check_ready(at=self.clock())

    def price(
        self, request: RetrieveRequest, response: RetrieveResponse | None = None, *, org: str
    ) -> tuple[str, int]:
        """What a call is billed as, and its units (``Settings.service`` of ``org``): up front from the
        request, or, given the response, what it actually ran (a downgraded depth, synthesis that did not run)."""
        cost = self.engine.settings_for(org).service
        item: str
        if request.continuation and request.mode in (None, "expand"):
            item, units = "expand", cost.cost_expand  # a page; synthesis over it is charged as on any call
        else:
            depth = request.depth
            route = response.route.get("documents") if response is not None else None
            if route is not None and route.effective_depth is not None:
                depth = route.effective_depth
            item, units = request.depth, {"fast": cost.cost_fast, "standard": cost.cost_standard, "deep": cost.cost_deep}[depth]
        if request.synthesize:
            item += "+synthesis"
            synthesis = response.synthesis if response is not None else None
            failed = synthesis is not None and synthesis.error is not None and not getattr(synthesis, "pending", False)
            if not failed:  # a deferred synthesis still running stays charged
                units += cost.cost_synthesis
        return item, units

    def call(self, principal: Principal, call_id: str, *, wait: float = 0.0) -> dict[str, Any]:
        """One of the principal's own calls (any call of its org for the admin role): its audited shape
        (``summary``) and, for a ``deferred`` call made by this caller, its ``synthesis`` (``pending`` while it
        runs; waits up to ``wait`` seconds for it). NotFound for an unknown call and, in the same words, for
        another org's or another caller's."""
        row = self._own_call(principal, call_id)
        summary = audit_dict(row)
        out: dict[str, Any] = {"call_id": row.call_id, "status": row.outcome, "summary": summary, "synthesis": None}
        result = getattr(self.engine, "result", None)
        background = summary["shape"].get("deferred") or summary["shape"].get("synthesis_background")
        if callable(result) and row.outcome == "ok" and background:
            try:
                synthesis = result(call_id, org=principal.org, caller=principal.caller, wait=min(max(wait, 0.0), 30.0))
            except NotFound:
                synthesis = None  # the call of another caller of the org: its answer is theirs
            if synthesis is not None:
                out["synthesis"] = synthesis.model_dump(mode="json") if isinstance(synthesis, BaseModel) else synthesis
        return out

    def feedback(self, principal: Principal, body: FeedbackRequest | Mapping[str, Any]) -> Feedback:
        """Rate one of the principal's own calls (any call of its org for the admin role)."""
        request = body if isinstance(body, FeedbackRequest) else _validate(FeedbackRequest, body)
        _text_only(request)
        self._own_call(principal, request.call_id)
        row = Feedback(call_id=request.call_id, org=principal.org, caller=principal.caller, rating=request.rating,
                       comment=request.comment, at=self.clock())  # fmt: skip
        self.store.add_feedback(row)
        return row

    def feedback_for(self, principal: Principal, call_id: str) -> list[Feedback]:
        """The feedback on one of the principal's own calls: its own, and for the admin role everyone's (the
        admin's comment on another caller's call may quote what that caller may not see)."""
        self._own_call(principal, call_id)
        rows = self.store.get_feedback(call_id, org=principal.org)
        return rows if self._is_admin(principal) else [r for r in rows if r.caller == principal.caller]

    def usage(self, org: str, *, since: float | None = None, until: float | None = None) -> list[UsageLine]:
        return self.store.usage(org=org, since=since, until=until)

    def _own_call(self, principal: Principal, call_id: str) -> AuditRow:
        """The call, when it is the principal's own or the principal has the admin role of its org. Another
        caller's call reads exactly like an unknown one: its shape (how many items each source returned,
        how many bytes) was governed for that caller and could tell of items this one may not see."""
        row = None if "\x00" in call_id else self.store.get_audit(call_id)  # no id holds a NUL character
        if row is None or row.org != principal.org or (row.caller != principal.caller and not self._is_admin(principal)):
            raise NotFound(f"no call {clip(call_id)}")
        return row

    def _ledger(self, org: str, call_id: str, kind: str, item: str, units: int, at: float) -> None:
        if units:
            self.store.add_ledger(LedgerEntry(org=org, call_id=call_id, kind=kind, item=item, units=units, at=at))

    def _audit(
        self, principal: Principal, call_id: str, front_end: str, at: float, started: float,
        request: RetrieveRequest | None, response: RetrieveResponse | None, error: BaseException | None, *, units: int,
    ) -> None:  # fmt: skip
        shape = call_shape(request, response)
        if isinstance(error, InvalidRequest):
            shape["invalid_field"] = audit_field(error.field)
        mode = response.mode if response is not None else (request.mode if request is not None else None)
        self.store.add_audit(
            AuditRow(
                call_id=call_id, org=principal.org, caller=principal.caller, key_id=principal.key_id,
                front_end=front_end, at=at, latency_ms=round((time.perf_counter() - started) * 1000, 3), mode=mode,
                depth=request.depth if request is not None else None, outcome="ok" if error is None else "error",
                error_type=type(error).__name__ if error is not None else None, units=units,
                shape=json.dumps(shape, separators=(",", ":"), sort_keys=True),
            )
        )  # fmt: skip

    # -- loading ---------------------------------------------------------------------------------------
    def load_bundle(self, principal: Principal, bundle: Mapping[str, Any]) -> LoadReport:
        """A bundle in the principal's org (items may leave ``org`` out). Needs the admin role: a bundle
        can define callers and their roles."""
        self._require_admin(principal)
        if not isinstance(bundle, Mapping):
            raise InvalidRequest("a bundle is a JSON object of lists", field="bundle")
        scoped: dict[str, Any] = {}
        for list_name, items in bundle.items():
            if list_name == "orgs" and isinstance(items, list):
                for item in items:
                    # an org without a string id is the bundle reader's to report (422), not another org
                    if isinstance(item, Mapping) and isinstance(item.get("id"), str) and item["id"] != principal.org:
                        raise Forbidden(f"orgs: {clip(item['id'])} is not this key's org {principal.org!r}")
                scoped[list_name] = items
            elif isinstance(items, list):
                scoped[list_name] = [self._scoped(principal, item, list_name) for item in items]
            else:
                scoped[list_name] = items
        return self.engine.load_bundle(scoped)

    def add_records(self, principal: Principal, records: Iterable[NewRecord | Mapping[str, Any]]) -> LoadReport:
        """Add or update records. A record pending deletion is the admin's alone: anyone else's write to it
        (which would store ``pending_deletion`` false, and its data could be read again) is refused, as a
        memory for it is."""
        items = _text_only([self._scoped(principal, _plain(r), "records") for r in records])
        if not self._is_admin(principal):
            ids = [str(i["id"]) for i in items if isinstance(i, Mapping) and isinstance(i.get("id"), str)]
            # merging a record into one pending deletion adds its data to that record; rewriting one merged into
            # such a record (directly or not) would take its data out from under the deletion
            targets = [str(i["merged_into"]) for i in items if isinstance(i, Mapping) and isinstance(i.get("merged_into"), str)]
            self._refuse_hidden_by_deletion(principal, [*ids, *targets])
            self._refuse_taken_identifiers(principal, items)
        return self._load(principal, {"records": items})

    def _refuse_taken_identifiers(self, principal: Principal, items: list[Any]) -> None:
        """An identifier that already names a live record (not this one, nor one merged with it) goes to another
        record only by the admin role: a second record holding jane@acme.com would be resolved for her in every
        call (docs/retrieve.md: ``ambiguous``), so anyone who may write records could put words in her mouth.
        A record written as merged into another (``merged_into``) may share its identifiers, and a record keeps
        those it holds already (two contacts loaded with one office phone stay writable); one request giving a
        new identifier to two records is refused too."""
        store = self.engine.store
        given: dict[tuple[str, str], str] = {}  # (kind, value) -> the record of this request it is given to
        for item in items:
            if not isinstance(item, Mapping) or not isinstance(item.get("id"), str) or item.get("merged_into"):
                continue
            identifiers = item.get("identifiers")
            for kind, value in (identifiers.items() if isinstance(identifiers, Mapping) else ()):
                if kind not in IDENTIFIER_KIND or not isinstance(value, str):
                    continue
                try:
                    wanted = normalize(kind, value)
                except ValueError:
                    continue  # the bundle check names it
                other = given.setdefault((kind, wanted), item["id"])
                if other != item["id"]:
                    raise Forbidden(f"{kind} {clip(value)} is given to two records in one request ({other!r} and "
                                    f"{item['id']!r}): only the admin role does that")  # fmt: skip
                found = store.find_records(cast(IdentifierKind, kind), wanted, org=principal.org)
                if any(r.id == item["id"] for r in found):
                    continue  # the record holds it already: not given to it now
                holders = [r for r in found if r.id != item["id"]]
                shown = shown_records(store, [r.id for r in holders], org=principal.org)
                for holder in holders:
                    if holder.id in shown and survivor(store, holder, org=principal.org)[0].id != item["id"]:
                        raise Forbidden(f"{kind} {clip(value)} already names record {holder.id!r}: only the admin role "
                                        "gives it to another record (or merge the two, merged_into)")  # fmt: skip

    def _load(self, principal: Principal, bundle: Mapping[str, Any], *, before_write: Callable[[], None] | None = None) -> LoadReport:
        """Load items a principal wrote. For a caller without the admin role the store checks again, inside its
        write, what the checks before it checked (nothing reaches a record hidden by a deletion): a deletion
        committed between those checks and the write would otherwise be undone by it."""
        from .loading import load_bundle

        return load_bundle(self.engine.store, self.engine.embedder, bundle, before_write=before_write,
                           guard=not self._is_admin(principal))  # fmt: skip

    def _refuse_hidden_by_deletion(self, principal: Principal, record_ids: Iterable[str]) -> None:
        """A record hidden by a deletion (pending deletion, or merged directly or not into such a record) is the
        admin's alone: nothing can be added to it, moved off it or merged into it. ``record_ids`` are ids the
        caller named."""
        store = self.engine.store
        rows = store.get_records(sorted(set(record_ids)), org=principal.org)
        for record in rows:
            if record.pending_deletion:
                raise UsageError(f"record {record.id!r} is pending deletion: nothing can be added to it")
        hidden = {r.id for r in rows} - shown_records(store, [r.id for r in rows], org=principal.org)
        if hidden:
            raise UsageError(f"record {min(hidden)!r} is merged into a record pending deletion: nothing can be added to it")

    def add_memories(self, principal: Principal, memories: Iterable[NewMemory | Mapping[str, Any]]) -> list[Memory]:
        out = []
        for raw in memories:
            m = _text_only(raw if isinstance(raw, NewMemory) else _validate(NewMemory, raw))
            self._scoped(principal, {"org": m.org}, "memories")
            try:
                out.append(Memory(id=m.id or f"mem-{uuid.uuid4().hex[:16]}", org=principal.org, record=m.record,
                                  text=m.text, created_at=m.created_at or datetime.now(timezone.utc)))  # fmt: skip
            except ValidationError as exc:  # a created_at out of range once in UTC, say
                raise _invalid(Memory, exc) from None
        # a record that is not in this org (unknown, or another org's: the same answer) is named by its field,
        # before the write; the bundle check would name the memory by an id the caller may not have sent
        store = self.engine.store
        known = {r.id: r for r in store.get_records(list({m.record for m in out}), org=principal.org)}
        for n, m in enumerate(out):
            if m.record not in known:
                field = "record" if len(out) == 1 else f"{n}.record"
                raise InvalidRequest(f"{field}: no record {clip(m.record)} in this org", field=field)
        self._refuse_hidden_by_deletion(principal, known)  # as remember() says it, for every caller
        if not self._is_admin(principal):  # rewriting a memory by its id would move it off its record
            owners = {m.id: m.record for m in store.get_memories([m.id for m in out], org=principal.org)}
            hidden = set(owners.values()) - shown_records(store, sorted(set(owners.values())), org=principal.org)
            for memory_id in sorted(i for i, owner in owners.items() if owner in hidden):  # its owner is not named
                raise Forbidden(f"memory {memory_id!r} exists and this caller may not change it")
        self._load(principal, {"memories": [m.model_dump(mode="json") for m in out]})
        return out

    def remember(self, principal: Principal, record: RecordRef | Mapping[str, Any], text: str,
                 *, created_at: datetime | None = None) -> Memory:  # fmt: skip
        """Add a memory to the record named by any identifier (merges followed to the survivor)."""
        ref = _text_only(record if isinstance(record, RecordRef) else _validate(RecordRef, record, prefix="record"),
                         prefix="record")  # fmt: skip
        _text_only(text, prefix="text")
        target = self.find_record(principal, ref)
        [memory] = self.add_memories(principal, [NewMemory(record=target.id, text=text, created_at=created_at)])
        return memory

    def find_record(self, principal: Principal, ref: RecordRef) -> Record:
        kind, value = ref.identifier
        store, org = self.engine.store, principal.org
        if kind == "id":
            found = store.get_records([value], org=org)
        else:  # the request validated the identifier's kind
            found = store.find_records(cast(IdentifierKind, kind), value, org=org)
        if not found:
            raise NotFound(f"no record with {kind} {value!r} in this org")
        # as a retrieve resolves it (layers/resolve.py): a live record before one hidden by a deletion, and a
        # record pending deletion ends the chain (what is merged into it is hidden with it)
        record = survivor(store, preferred(store, found, org=org, kind=IDENTIFIER_KIND.get(kind))[0], org=org)[0]
        if record.pending_deletion:
            raise UsageError(f"record {record.id!r} is pending deletion: nothing can be added to it")
        return record

    def add_documents(self, principal: Principal, documents: Iterable[NewDocument | Mapping[str, Any]]) -> list[Document]:
        """Add or replace documents. Replacing one the caller may not see is refused."""
        out: list[Document] = []
        for raw in documents:
            d = _text_only(raw if isinstance(raw, NewDocument) else _validate(NewDocument, raw))
            self._scoped(principal, {"org": d.org}, "documents")
            common: dict[str, Any] = dict(org=principal.org, doc_type=d.doc_type, tags=d.tags,
                                          visible_to_roles=d.visible_to_roles, attached_record=d.attached_record)  # fmt: skip
            if d.markdown is not None:
                try:  # the document made of the markdown is validated as a bundle document is
                    out.append(document_from_markdown(d.markdown, title=d.title, doc_id=d.id, **common))
                except ValidationError as exc:
                    raise _invalid(Document, exc) from None
            else:
                from .loading import slug

                doc_id = d.id or slug(d.title or "")
                sections = [s.model_dump() for s in d.sections or []]
                out.append(_validate(Document, {"id": doc_id, "title": d.title, "sections": sections, **common}))
        caller = self.engine.store.get_caller(principal.caller, org=principal.org)
        roles = set(caller.roles) if caller else set()

        def permitted() -> None:  # the admin may replace any document; others only those they may see
            store = self.engine.store
            existing = store.get_documents([d.id for d in out], org=principal.org)
            self._refuse_hidden_by_deletion(principal, [d.attached_record for d in out if d.attached_record])  # a new note
            attached = {d.attached_record for d in existing if d.attached_record}
            stored = [r.id for r in store.get_records(sorted(attached), org=principal.org)]
            deleted = set(stored) - shown_records(store, stored, org=principal.org)
            for existing_doc in existing:
                own = [existing_doc.attached_record] if existing_doc.attached_record else []
                if verdict(existing_doc, org=principal.org, roles=roles, record_ids=own) is not None or set(own) & deleted:
                    # a system document, one outside the caller's roles, or a note about a record pending deletion
                    raise Forbidden(f"document {existing_doc.id!r} exists and this caller may not see it, so cannot replace it")

        # asked once the write passed every check of the bundle: a broken write is told it is broken, so a write
        # meant to fail cannot ask, for free, whether a document this caller may not see exists
        self._load(principal, {"documents": [d.model_dump(mode="json") for d in out]},
                   before_write=None if ADMIN_ROLE in roles else permitted)  # fmt: skip
        return out

    def _scoped(self, principal: Principal, item: Any, list_name: str) -> Any:
        """``item`` in the principal's org: ``org`` filled in when absent, refused when another."""
        if not isinstance(item, Mapping):
            return item  # the bundle reader reports it
        org = item.get("org")
        if org is None:
            return {**item, "org": principal.org}
        if org != principal.org:
            where = f"{list_name} {clip(item.get('id'))}" if item.get("id") else list_name
            raise Forbidden(f"{where}: org {clip(org)} is not this key's org {principal.org!r}")
        return item

    def _is_admin(self, principal: Principal) -> bool:
        caller = self.engine.store.get_caller(principal.caller, org=principal.org)
        return caller is not None and ADMIN_ROLE in caller.roles

    def _require_admin(self, principal: Principal) -> None:
        if not self._is_admin(principal):
            raise Forbidden(f"loading a bundle needs the {ADMIN_ROLE!r} role; caller {principal.caller!r} lacks it")


# -- audit shape ---------------------------------------------------------------------------------------
def call_shape(request: RetrieveRequest | None, response: RetrieveResponse | None) -> dict[str, Any]:
    """Sizes, statuses and flags of a call: what an auditor may see. Never text, never identifiers."""
    shape: dict[str, Any] = {}
    if request is not None:
        shape.update(
            record_kind=request.record.identifier[0] if request.record else None,
            message_bytes=len((request.message or "").encode("utf-8")),
            sources_asked={s: v for s, v in request.sources.model_dump().items() if v is not None},
            budget_bytes=request.budget.totalTokens,
            budget_shares=bool(request.budget.shares),
            filter_counts=None if request.filters is None else
                [len(request.filters.doc_types), len(request.filters.tags)],
            infer_filters=request.infer_filters,
            augmentations=len(request.augmentation or []),
            fetch_ids=len(request.fetch or []),
            expand=request.continuation is not None,
            synthesize=request.synthesize,
            deferred=request.deferred,
            trace=request.trace,
            deadline_ms=request.deadline_ms,
        )  # fmt: skip
    if response is not None:
        documents = response.route.get("documents")
        shape.update(
            resolved=response.record is not None,
            tombstone=bool(response.record and response.record.tombstone),
            aliases=len(response.record.aliases) if response.record else 0,
            partial=response.partial,
            effective_depth=documents.effective_depth if documents else None,
            backend=documents.backend if documents else None,
            fallback=documents.fallback_reason if documents else None,
            sources={
                s: {"status": r.status, "items": len(r.items), "bytes": r.bytes_used, "dropped": r.dropped,
                    "error": r.error is not None}
                for s, r in response.sources.items()
            },
            bytes_used=sum(r.bytes_used for r in response.sources.values()),
            continuation=response.continuation is not None,
            synthesis=None if response.synthesis is None else ("error" if response.synthesis.error else "ok"),
            # a synthesis still running after the call (deferred, or late for its deadline): fetched by call id
            synthesis_background=bool(response.synthesis and response.synthesis.pending),
            deadline_missed=response.route["deadline"].detail["missed"] if "deadline" in response.route else [],
        )  # fmt: skip
    return shape


def audit_dict(row: AuditRow) -> dict[str, Any]:
    return {
        "call_id": row.call_id, "caller": row.caller, "front_end": row.front_end,
        "at": datetime.fromtimestamp(row.at, timezone.utc).isoformat(), "latency_ms": row.latency_ms,
        "mode": row.mode, "depth": row.depth, "outcome": row.outcome, "error_type": row.error_type,
        "units": row.units, "shape": json.loads(row.shape),
    }  # fmt: skip


# -- helpers -------------------------------------------------------------------------------------------
def _plain(item: Any) -> Any:
    return item.model_dump(mode="json", exclude_none=True) if isinstance(item, BaseModel) else item


def _text_only(value: Any, *, prefix: str = "") -> Any:
    """``value`` (a mapping, a model, a list of them), refused with a 422 naming the field where a string in it
    holds a NUL character: PostgreSQL cannot store one, so neither store is asked (the HTTP front end refuses
    it in the body; this is the same rule for MCP tools and in-process callers)."""
    plain = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    if isinstance(plain, (list, tuple)):
        plain = [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in plain]
    where = nul_path(plain)
    if where is not None:
        field = ".".join(p for p in (prefix, where) if p) or "body"
        raise InvalidRequest(f"{field}: {NUL_MESSAGE}", field=field)
    return value


def _validate(model: type[BaseModel], data: Any, *, prefix: str = "") -> Any:
    """``model`` from ``data``, or :class:`InvalidRequest` naming the first offending field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(model, exc, prefix=prefix) from None


def _invalid(model: type[BaseModel], exc: ValidationError, *, prefix: str = "") -> InvalidRequest:
    first = exc.errors()[0]
    where = ".".join([p for p in [prefix] if p] + [str(p) for p in first["loc"]]) or prefix or "body"
    message = "unknown field" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")
    where = clip(where, FIELD_ECHO, quote=False)
    return InvalidRequest(f"invalid {model.__name__}: {where}: {clip(message, MESSAGE_ECHO, quote=False)}", field=where)


#: The most characters of a field name (which may be the caller's own text) and of a message an error carries.
FIELD_ECHO = 200
MESSAGE_ECHO = 300


@functools.cache
def _known_names() -> frozenset[str]:
    """Every field name of every request body and bundle model: the names an audit row may keep."""
    from .bundle import Bundle

    names: set[str] = {"body", "bundle", "record", "sections"}

    def walk(schema: Any) -> None:
        if isinstance(schema, dict):
            for key, value in schema.items():
                if key == "properties" and isinstance(value, dict):
                    names.update(value)
                walk(value)
        elif isinstance(schema, list):
            for value in schema:
                walk(value)

    for model in (RetrieveRequest, NewRecord, NewMemory, NewDocument, FeedbackRequest, Bundle):
        walk(model.model_json_schema())
    return frozenset(names)


def audit_field(field: str | None) -> str | None:
    """The offending field's path as the audit keeps it: a part that is not a field name of a request body
    or bundle (an unknown field, a property name, a map key: text the caller made up) becomes ``?``."""
    if field is None:
        return None
    parts = field.replace(":", ".").split(".")
    kept: list[str] = []
    for part in parts:
        part = part if part.isdigit() or part in _known_names() else "?"
        if not (part == "?" and kept[-1:] == ["?"]):  # a made-up name with dots in it is one "?"
            kept.append(part)
    return ".".join(kept)[:FIELD_ECHO]
