"""Strict input, in bundles and in retrieve requests: no string is read as a boolean or a number, every
identifier and text has a length limit, a bad value gets one readable line, and no error quotes more than
about 200 characters of what it was given. Bundle loads stay all or nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
from typer.testing import CliRunner

import dossier
from dossier import bundle as model
from dossier import cli
from dossier.retrieve import parse_request
from tests.test_loading import bundle

BIG = 100_000


def _problems(engine: dossier.Engine, data: dict[str, Any]) -> list[dossier.errors.Problem]:
    with pytest.raises(dossier.BundleError) as caught:
        engine.load_bundle(data)
    return caught.value.problems


def _longest_echo(message: str, filler: str) -> int:
    """The longest run of ``filler`` characters in ``message`` (the filler is what the input repeated)."""
    longest = run = 0
    for ch in message:
        run = run + 1 if ch == filler else 0
        longest = max(longest, run)
    return longest


# -- bundles: strict types ---------------------------------------------------------------------------
STRICT_BUNDLE = [
    ("records", 0, "pending_deletion", "yes", "r-jane"),
    ("records", 0, "pending_deletion", "false", "r-jane"),
    ("records", 0, "pending_deletion", 1, "r-jane"),
    ("documents", 0, "is_system", "false", "d-disc"),
    ("edges", 0, "active", "true", "e-1"),
    ("edges", 0, "dst_is_stub", 0, "e-1"),
    ("edges", 0, "confidence", "0.5", "e-1"),
    ("edges", 0, "weight", "2", "e-1"),
]


@pytest.mark.parametrize("list_name, position, field, value, item_id", STRICT_BUNDLE)
def test_a_bundle_never_reads_a_string_as_a_boolean_or_a_number(
    engine: dossier.Engine, list_name: str, position: int, field: str, value: Any, item_id: str
) -> None:
    data = bundle()
    data[list_name][position][field] = value
    [problem] = _problems(engine, data)
    assert problem.item_id == item_id
    wanted = "true or false" if field in ("pending_deletion", "is_system", "active", "dst_is_stub") else "a number"
    assert str(problem).startswith(f"{list_name[:-1]} {item_id}: {field}: must be {wanted}, not ")
    assert engine.store.get_org(org="acme") is None


def test_a_string_property_that_looks_like_a_boolean_stays_a_string(engine: dossier.Engine) -> None:
    data = bundle()
    data["records"][0]["properties"] = {"active": "true", "seats": "40", "vip": True, "ratio": 0.5}
    engine.load_bundle(data)
    [jane] = engine.store.get_records(["r-jane"], org="acme")
    assert jane.properties == {"active": "true", "seats": "40", "vip": True, "ratio": 0.5}


# -- bundles: property values ------------------------------------------------------------------------
ACCEPTED = "a string, number, boolean or null, or a list of those (dates as ISO strings)"


@pytest.mark.parametrize(
    "value, says",
    [
        ({"lang": "German"}, f"got an object; a property value is {ACCEPTED}"),
        ([["German"], "English"], f"got a list holding a list; a property value is {ACCEPTED}"),
        (["German", {"x": 1}], f"got a list holding an object; a property value is {ACCEPTED}"),
        (float("nan"), "nan is not a number that JSON can hold"),
        (2**64, "an integer beyond 64 bits; send it as a string"),
        ("x" * 10_001, "a string of 10,001 characters; at most 10,000"),
        (["x"] * 1_001, "a list of 1,001 values; at most 1,000"),
    ],
    ids=["object", "nested-list", "object-in-list", "nan", "huge-int", "long-string", "long-list"],
)
def test_a_bad_property_value_gets_one_line_naming_the_record_the_property_and_the_accepted_kinds(
    engine: dossier.Engine, value: Any, says: str
) -> None:
    data = bundle()
    data["records"][0]["properties"]["languages"] = value
    [problem] = _problems(engine, data)  # one line, not a line per member of a union
    assert str(problem) == f"record r-jane: properties.languages: {says}"
    assert "\n" not in str(problem) and "Input should be" not in str(problem)


def test_every_kind_of_property_value_loads_and_comes_back(engine: dossier.Engine) -> None:
    from datetime import date

    values = {"name": "Jane Doe", "seats": 40, "ratio": 0.25, "vip": False, "note": None,
              "languages": ["German", "English"], "mixed": ["a", 1, 2.5, True, None], "none_yet": [],
              "renewal": "2026-03-01", "renewals": ["2026-03-01", "2027-03-01"]}  # fmt: skip
    data = bundle()
    data["records"][0]["properties"] = values
    engine.load_bundle(data)
    [jane] = engine.store.get_records(["r-jane"], org="acme")
    assert jane.properties == values
    # from Python, a date is stored as its ISO string and a tuple as a list
    record = model.Record(id="r", org="o", kind="contact", properties={"since": date(2026, 3, 1), "tags": ("a", "b")})
    assert record.properties == {"since": "2026-03-01", "tags": ["a", "b"]}


@pytest.mark.parametrize("name", ["", "p" * 201])
def test_a_property_name_is_1_to_200_characters(engine: dossier.Engine, name: str) -> None:
    data = bundle()
    data["records"][0]["properties"][name] = 1
    [problem] = _problems(engine, data)
    assert problem.item_id == "r-jane" and "a property name is a string of 1-200 characters" in problem.message
    assert len(str(problem)) < 200


# -- bundles: length limits and capped echoes ----------------------------------------------------------
LIMITS: list[tuple[str, Callable[[dict[str, Any], str], None], int]] = [
    ("record id", lambda b, v: b["records"][0].update(id=v), model.ID_MAX),
    ("memory record", lambda b, v: b["memories"][0].update(record=v), model.ID_MAX),
    ("section id", lambda b, v: b["documents"][0]["sections"][0].update(id=v), model.ID_MAX),
    ("org name", lambda b, v: b["orgs"][0].update(name=v), model.LABEL_MAX),
    ("caller role", lambda b, v: b["callers"][0].update(roles=[v]), model.LABEL_MAX),
    ("document tag", lambda b, v: b["documents"][0].update(tags=[v]), model.LABEL_MAX),
    ("edge type", lambda b, v: b["edges"][0].update(type=v), model.LABEL_MAX),
    ("document title", lambda b, v: b["documents"][0].update(title=v), model.TITLE_MAX),
    ("section heading", lambda b, v: b["documents"][0]["sections"][0].update(heading=v), model.TITLE_MAX),
    ("memory text", lambda b, v: b["memories"][0].update(text=v), model.MEMORY_TEXT_MAX),
    ("section text", lambda b, v: b["documents"][0]["sections"][0].update(text=v), model.SECTION_TEXT_MAX),
]  # fmt: skip


@pytest.mark.parametrize("what, put, limit", LIMITS, ids=[x[0] for x in LIMITS])
def test_identifiers_and_texts_have_length_limits(engine: dossier.Engine, what: str, put: Callable, limit: int) -> None:
    at_limit = bundle()
    put(at_limit, "q" * limit)
    if what == "memory record":  # a reference: the record must exist too
        at_limit["records"][0]["id"] = "q" * limit
        at_limit["edges"][0]["src"] = "q" * limit
    problems = [p for p in _refusal_or_none(engine, at_limit)]
    assert problems == [], problems
    over = bundle()
    put(over, "q" * (limit + 1))
    [problem] = _problems(engine, over)
    assert f"at most {limit} characters" in problem.message
    assert _longest_echo(str(problem), "q") <= 100


def _refusal_or_none(engine: dossier.Engine, data: dict[str, Any]) -> list[Any]:
    try:
        dossier.loading.read_bundle(data)
    except dossier.BundleError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize("field", ["email", "phone", "website", "profile_url"])
def test_an_identifier_over_2048_characters_is_refused_without_being_echoed(engine: dossier.Engine, field: str) -> None:
    data = bundle()
    huge = {"email": "j" * BIG + "@acme.com", "phone": "+1 " + "5" * BIG, "website": "https://" + "w" * BIG + ".com",
            "profile_url": "https://www.linkedin.com/in/" + "p" * BIG}[field]  # fmt: skip
    data["records"][0]["identifiers"] = {field: huge}
    [problem] = _problems(engine, data)
    assert problem.item_id == "r-jane"
    assert f"identifiers.{field}: at most 2,048 characters (got {len(huge):,})" in problem.message
    assert len(str(problem)) < 200
    assert engine.store.get_org(org="acme") is None
    # at the limit it loads (when it is a valid identifier)
    fits = bundle()
    fits["records"][0]["identifiers"] = {"profile_url": "https://linkedin.com/in/" + "p" * (2048 - 24)}
    engine.load_bundle(fits)


@pytest.mark.parametrize(
    "put",
    [
        lambda b: b["records"][0].update(id="z" * BIG),
        lambda b: b["records"][0].update(kind="z" * BIG),
        lambda b: b["records"][0]["identifiers"].update(email="z" * 500),
        lambda b: b["records"][0]["identifiers"].update(website="z" * 500),
        lambda b: b["records"][0]["properties"].update({"z" * BIG: 1}),
        lambda b: b["records"][0]["properties"].update(languages=["z" * BIG]),
        lambda b: b["memories"][0].update(created_at="z" * BIG),
        lambda b: b["memories"][0].update(record="z" * BIG),
        lambda b: b["edges"][0].update(confidence="z" * BIG),
        lambda b: b.update(records="z" * BIG),
    ],
    ids=["id", "kind", "email", "website", "property-name", "property-value", "date", "reference", "number", "list"],
)
def test_no_bundle_error_echoes_more_than_100_characters_of_the_input(engine: dossier.Engine, put: Callable) -> None:
    data = bundle()
    put(data)
    with pytest.raises(dossier.BundleError) as caught:
        engine.load_bundle(data)
    for text in [str(caught.value), *(str(p) for p in caught.value.problems)]:
        assert _longest_echo(text, "z") <= 100, text[:300]
        assert len(text) < 400


# -- bundles: unknown fields, nothing to load --------------------------------------------------------
def test_ignored_keys_and_fields_are_listed_in_the_load_report(engine: dossier.Engine) -> None:
    data = bundle()
    data.update(widgets=[{"id": "w1"}], version=3)
    data["records"][0]["colour"] = "blue"
    data["records"][1]["colour"] = "red"
    data["records"][0]["identifiers"]["fax"] = "+44 20 7946 0000"
    data["documents"][0]["sections"][1]["page"] = 4
    report = engine.load_bundle(data)
    assert report.total_inserted == 8
    assert report.ignored_keys == ["widgets", "version"]
    assert report.ignored_fields == {"records": {"colour": 2, "identifiers.fax": 1}, "documents": {"sections.page": 1}}
    assert report.ignored_lines() == [
        "ignored top-level keys: widgets, version",
        "ignored fields of records: colour (2), identifiers.fax (1)",
        "ignored fields of documents: sections.page (1)",
    ]
    clean = engine.load_bundle(bundle())
    assert (clean.ignored_keys, clean.ignored_fields, clean.ignored_lines()) == ([], {}, [])


@pytest.mark.parametrize(
    "data",
    [{}, {"widgets": [{"id": "w1"}]}, {"records": [], "memories": []}, {"Records": [{"id": "r"}]}, {"records": None}],
    ids=["empty", "unknown-list", "empty-lists", "misspelt", "null"],
)
def test_a_bundle_with_nothing_to_load_is_refused(engine: dossier.Engine, data: dict[str, Any]) -> None:
    engine.load_bundle(bundle())
    before = engine.store.counts(org="acme")
    [problem] = _problems(engine, data)
    assert problem.kind == "bundle" and problem.message.startswith(
        "nothing to load: no orgs, callers, records, memories, documents, edges"
    )
    for key in data:
        if key not in model.ITEM_MODELS:
            assert key in problem.message  # "(ignored: widgets)"
    assert engine.store.counts(org="acme") == before


def test_the_cli_refuses_a_bundle_with_nothing_to_load_with_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.err, "_width", 500)
    path = tmp_path / "widgets.json"
    path.write_text(json.dumps({"widgets": [{"id": "w1"}]}))
    result = CliRunner().invoke(cli.app, ["load", str(path), "--db", f"sqlite:///{tmp_path}/c.db"])
    assert result.exit_code == 2
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error == "error: bundle: nothing to load: no orgs, callers, records, memories, documents, edges (ignored: widgets)"
    assert result.stdout == ""


def test_a_refused_bundle_changes_nothing_already_stored(engine: dossier.Engine) -> None:
    engine.load_bundle(bundle())
    before = engine.store.counts(org="acme")
    changed = bundle()
    changed["memories"][0]["text"] = "An update that must not be written."
    changed["records"][0]["properties"] = {"plan": "Starter", "languages": ["German", "English"]}  # valid
    changed["records"].append({"id": "r-new", "org": "acme", "kind": "contact", "pending_deletion": "yes"})
    changed["records"][1]["properties"]["regions"] = ["EMEA", ["APAC"]]
    problems = _problems(engine, changed)
    assert sorted(p.item_id or "" for p in problems) == ["r-acme", "r-new"]
    assert engine.store.counts(org="acme") == before
    assert engine.store.get_memories(["m-1"], org="acme")[0].text == bundle()["memories"][0]["text"]
    [jane] = engine.store.get_records(["r-jane"], org="acme")
    assert jane.properties == {"plan": "Enterprise", "seats": 40}
    assert engine.store.get_records(["r-new"], org="acme") == []


# -- requests ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body, field",
    [
        ({"trace": "true"}, "trace"),
        ({"trace": 1}, "trace"),
        ({"synthesize": "yes"}, "synthesize"),
        ({"deferred": "false"}, "deferred"),
        ({"infer_filters": "no"}, "infer_filters"),
        ({"sources": {"memories": "yes"}}, "sources.memories"),
        ({"sources": {"graph": 0}}, "sources.graph"),
        ({"budget": {"totalTokens": "8000"}}, "budget.totalTokens"),
        ({"budget": {"totalTokens": True}}, "budget.totalTokens"),
        ({"budget": {"shares": {"memories": "0.5"}}}, "budget.shares.memories"),
        ({"budget": {"shares": {"zz": 0.5}}}, "budget.shares.zz"),  # an unknown source: the key, not "zz.[key]"
        ({"record": {"email": "jane@acme.com", "zzz": 1}}, "record.zzz"),
        ({"budget": {"totalTokens": 100, "per_source": {}}}, "budget.per_source"),
        ({"filters": {"tags": ["pricing"], "colour": "blue"}}, "filters.colour"),
    ],
)
def test_a_request_is_strict_about_types_and_fields(body: dict, field: str) -> None:
    with pytest.raises(dossier.InvalidRequest) as caught:
        parse_request({"message": "hi", **body})
    assert caught.value.field == field
    assert field in str(caught.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_budget_share_that_is_not_a_finite_number_is_refused_as_such(value: float) -> None:
    with pytest.raises(dossier.InvalidRequest) as caught:  # NaN was "should be less than or equal to 1"
        parse_request({"message": "hi", "budget": {"shares": {"documents": value}}})
    assert caught.value.field == "budget.shares.documents" and str(caught.value).endswith("should be a finite number")


def test_booleans_and_numbers_of_the_right_type_pass() -> None:
    request = parse_request({"message": "hi", "trace": True, "sources": {"memories": False, "graph": None},
                            "budget": {"totalTokens": 500, "shares": {"memories": 1, "documents": 0.5}}})  # fmt: skip
    assert request.trace is True and request.sources.memories is False
    assert request.budget.shares == {"memories": 1.0, "documents": 0.5}


@pytest.mark.parametrize(
    "body, field, limit",
    [
        ({"record": {"id": "z" * 201}}, "record.id", 200),
        ({"record": {"profile_url": "https://linkedin.com/in/" + "z" * BIG}}, "record.profile_url", 2048),
        ({"record": {"email": "z" * BIG + "@acme.com"}}, "record.email", 2048),
        ({"message": "z" * 4001}, "message", 4000),
        ({"augmentation": ["z" * 4001]}, "augmentation.0", 4000),
        ({"fetch": ["z" * 201]}, "fetch.0", 200),
        ({"continuation": "z" * 201}, "continuation", 200),
        ({"filters": {"tags": ["z" * 201]}}, "filters.tags.0", 200),
        ({"filters": {"doc_types": ["policy"] * 101}}, "filters.doc_types", 100),
        ({"augmentation": ["again"] * 11}, "augmentation", 10),
    ],
)
def test_request_strings_have_length_limits_and_errors_do_not_echo_them(body: dict, field: str, limit: int) -> None:
    with pytest.raises(dossier.InvalidRequest) as caught:
        parse_request(body)
    assert caught.value.field == field
    assert f"at most {limit}" in str(caught.value)
    assert _longest_echo(str(caught.value), "z") == 0


@pytest.mark.parametrize("field", ["email", "phone", "website", "profile_url"])
def test_a_bad_identifier_in_a_request_is_echoed_at_most_100_characters(field: str) -> None:
    value = {"email": "z" * 2000, "phone": "z" * 2000, "website": "z" * 2000, "profile_url": "z" * 2000}[field]
    with pytest.raises(dossier.InvalidRequest) as caught:
        parse_request({"record": {field: value}})
    assert caught.value.field == f"record.{field}"
    assert 0 < _longest_echo(str(caught.value), "z") <= 100


def test_the_engine_refuses_a_coerced_request_before_the_store(engine: dossier.Engine) -> None:
    with pytest.raises(dossier.InvalidRequest) as caught:
        engine.retrieve({"message": "hi", "sources": {"memories": "yes"}}, org="nowhere", caller="nobody")
    assert caught.value.field == "sources.memories"


def test_no_retrieve_error_quotes_more_than_100_characters_of_the_input(engine: dossier.Engine) -> None:
    engine.load_bundle({"orgs": [{"id": "acme", "name": "Acme"}], "callers": [{"id": "ana", "org": "acme", "roles": []}]})
    cases = [
        (lambda: engine.retrieve({"message": "hi"}, org="x" * BIG, caller="ana"), dossier.NotFound, "x"),
        (lambda: engine.retrieve({"message": "hi"}, org="acme", caller="y" * BIG), dossier.NotFound, "y"),
        (lambda: engine.retrieve({"continuation": "z" * 200}, org="acme", caller="ana"), dossier.InvalidRequest, "z"),
        (lambda: engine.retrieve({"message": "hi", "q" * 600: 1}, org="acme", caller="ana"), dossier.InvalidRequest, "q"),
    ]
    for ask, error, filler in cases:
        with pytest.raises(error) as caught:
            ask()
        assert 0 < _longest_echo(str(caught.value), filler) < 100, str(caught.value)[:300]


@pytest.mark.parametrize("value", [1700000000, 1.7e9])
def test_a_date_is_never_made_of_a_number(engine: dossier.Engine, value: Any) -> None:
    data = bundle()
    data["memories"][0]["created_at"] = value
    [problem] = _problems(engine, data)
    assert problem.item_id == data["memories"][0]["id"] and "ISO 8601 string" in str(problem)
    assert engine.store.get_org(org="acme") is None


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_a_date_out_of_range_in_utc_is_a_problem_not_a_crash(engine: dossier.Engine, value: str) -> None:
    data = bundle()
    data["memories"][0]["created_at"] = value
    [problem] = _problems(engine, data)
    assert "out of range" in str(problem)


def test_a_document_visible_to_an_empty_list_of_roles_is_refused_and_null_is_the_whole_org(engine: dossier.Engine) -> None:
    data = bundle()
    data["documents"][0]["visible_to_roles"] = []  # no caller would ever see it: a mistake for null
    [problem] = _problems(engine, data)
    assert problem.item_id == data["documents"][0]["id"] and str(problem).endswith("visible_to_roles: names no role: "
        "null lets the whole org see the document, or list the roles that may")  # fmt: skip
    assert engine.store.get_org(org="acme") is None
    data["documents"][0]["visible_to_roles"] = None
    assert engine.load_bundle(data).inserted["documents"] == len(data["documents"])


def test_a_bundle_file_with_a_lone_surrogate_escape_is_refused_and_a_pair_loads(engine: dossier.Engine, tmp_path: Path) -> None:
    """The file parser would read a lone surrogate as "?", so two ids that differ only there became one."""
    lone = tmp_path / "lone.json"
    lone.write_text('{"orgs": [{"id": "o\\ud800", "name": "x"}, {"id": "o\\ud801", "name": "y"}]}', encoding="utf-8")
    with pytest.raises(dossier.BundleError, match="lone surrogate"):
        engine.load_bundle(lone)
    assert engine.store.get_org(org="o?") is None
    pair = tmp_path / "pair.json"
    pair.write_text('{"orgs": [{"id": "o\\ud83d\\ude00", "name": "x"}], "callers": []}', encoding="utf-8")
    assert engine.load_bundle(pair).inserted == {"orgs": 1}
    assert engine.store.get_org(org="o\U0001f600") is not None


@pytest.mark.parametrize("char", ["\u202e", "\u200b", "\u2066", "\x07", "\u00ad"])
def test_an_id_with_a_control_or_format_character_is_refused(engine: dossier.Engine, char: str) -> None:
    """A right-to-left override in an id made an edge display reversed in the inspector; a zero-width space
    makes two ids look alike. Refused by the bundle check, naming the item, and nothing is stored."""
    with pytest.raises(dossier.BundleError, match="control or format character") as caught:
        engine.load_bundle({"orgs": [{"id": "acme"}], "records": [{"id": f"rec-intern{char}", "org": "acme", "kind": "contact"}],
                            "edges": [{"id": f"e-1{char}", "org": "acme", "src": "rec-intern", "dst": "rec-x", "type": "reports_to"}]})  # fmt: skip
    assert len(caught.value.problems) == 2
    assert engine.store.get_org(org="acme") is None  # nothing stored
    engine.load_bundle({"orgs": [{"id": "acme"}], "records": [{"id": "rec-\u0645\u062d\u0645\u062f", "org": "acme", "kind": "contact"}]})  # right-to-left letters are fine


@pytest.mark.parametrize("extra,field", [
    ({"record": {"email": "marta@globex.com"}}, "record"), ({"fetch": ["doc-refund"]}, "fetch"), ({"filters": {"tags": ["pricing"]}}, "filters"),
    ({"augmentation": ["more"]}, "augmentation"), ({"mode": "brief"}, "mode"),
])  # fmt: skip
def test_a_continuation_beside_what_the_session_holds_is_refused(extra: dict, field: str) -> None:
    """The session of a continuation holds who and what the call was about: a record beside it replaced the
    session's, and the session's own items were governed against the wrong record and dropped for good."""
    with pytest.raises(dossier.InvalidRequest) as caught:
        parse_request({"continuation": "s-1", **extra})
    assert caught.value.field == field
    assert parse_request({"continuation": "s-1", "mode": "expand", "budget": {"totalTokens": 500}}).continuation == "s-1"
    # the question a synthesis of the page answers
    assert parse_request({"continuation": "s-1", "message": "Q?", "synthesize": True}).message == "Q?"
