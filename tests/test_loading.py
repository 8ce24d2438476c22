"""Loading bundles and markdown: idempotent by id, re-embedding only what changed, all or nothing."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

import dossier
from dossier.loading import document_from_markdown, property_text, text_hash
from dossier.stores.base import property_key


def bundle(org: str = "acme") -> dict[str, Any]:
    """A small bundle: 3 property values + 2 memories + 2 sections = 7 texts to embed."""
    return {
        "orgs": [{"id": org, "name": "Acme Adhesives"}],
        "callers": [{"id": "c-sales", "org": org, "roles": ["sales"]}],
        "records": [
            {"id": "r-jane", "org": org, "kind": "contact", "identifiers": {"email": "Jane@Acme.com"},
             "properties": {"plan": "Enterprise", "seats": 40}},
            {"id": "r-acme", "org": org, "kind": "company", "identifiers": {"website": "https://www.acme.com"},
             "properties": {"industry": "Industrial adhesives", "note": None}},
        ],
        "memories": [
            {"id": "m-1", "org": org, "record": "r-jane", "text": "Jane asked whether annual prepay gets a discount.",
             "created_at": "2024-03-01T10:00:00Z"},
            {"id": "m-2", "org": org, "record": "r-jane", "text": "Jane wants invoices every quarter.",
             "created_at": "2024-03-02T10:00:00Z"},
        ],
        "documents": [
            {"id": "d-disc", "org": org, "title": "Discount policy", "doc_type": "policy", "tags": ["pricing"],
             "sections": [
                 {"id": "s-limits", "heading": "Limits", "text": "Discounts above 20% need VP approval."},
                 {"id": "s-prepay", "heading": "Prepay", "text": "Annual prepay earns an extra 5%."},
             ]},
        ],
        "edges": [{"id": "e-1", "org": org, "src": "r-jane", "dst": "r-acme", "type": "works_at"}],
    }  # fmt: skip


def _changed(change: Callable[[dict[str, Any]], Any], org: str = "acme") -> dict[str, Any]:
    data = bundle(org)
    change(data)
    return data


def test_first_load_inserts_everything_and_embeds_every_text(engine: dossier.Engine) -> None:
    report = engine.load_bundle(bundle())
    assert report.inserted == {"orgs": 1, "callers": 1, "records": 2, "memories": 2, "documents": 1, "edges": 1}
    assert report.total_updated == 0 and report.embedded == 7
    counts = engine.store.counts(org="acme")
    assert (counts["records"], counts["memories"], counts["sections"], counts["vectors"]) == (2, 2, 2, 7)
    [jane] = engine.store.find_records("email", "jane@acme.com", org="acme")
    assert jane.properties == {"plan": "Enterprise", "seats": 40}


def test_loading_the_same_bundle_twice_changes_nothing(engine: dossier.Engine) -> None:
    engine.load_bundle(bundle())
    again = engine.load_bundle(bundle())
    assert (again.total_inserted, again.total_updated, again.embedded) == (0, 0, 0)
    assert again.unchanged == {"orgs": 1, "callers": 1, "records": 2, "memories": 2, "documents": 1, "edges": 1}


def test_a_bundle_file_loads_like_its_dict(engine: dossier.Engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(bundle()))
    assert engine.load_bundle(path).total_inserted == 8
    assert engine.load_bundle(str(path)).embedded == 0
    assert engine.load_bundle(dossier.Bundle.model_validate(bundle())).total_updated == 0


@pytest.mark.parametrize(
    "change, updated, embedded",
    [
        (lambda b: b["memories"][0].update(text="Jane asked about a two-year prepay."), {"memories": 1}, 1),
        (lambda b: b["memories"][0].update(created_at="2024-03-09T10:00:00Z"), {"memories": 1}, 0),
        (lambda b: b["records"][0]["properties"].update(seats=45), {"records": 1}, 1),
        (lambda b: b["records"][0]["properties"].update(region="EMEA"), {"records": 1}, 1),
        (lambda b: b["records"][0]["identifiers"].update(email="jane.doe@acme.com"), {"records": 1}, 0),
        (lambda b: b["documents"][0]["sections"][1].update(text="Annual prepay earns an extra 7%."), {"documents": 1}, 1),
        (lambda b: b["documents"][0].update(tags=["pricing", "sales"]), {"documents": 1}, 0),
        (lambda b: b["documents"][0].update(title="Discount rules"), {"documents": 1}, 2),  # title is in every section's text
        (lambda b: b["edges"][0].update(confidence=0.5), {"edges": 1}, 0),
        (lambda b: b["callers"][0].update(roles=["sales", "admin"]), {"callers": 1}, 0),
    ],
    ids=["memory-text", "memory-date", "property-value", "property-added", "identifier", "section-text", "doc-tags",
         "doc-title", "edge", "caller-roles"],
)  # fmt: skip
def test_a_change_updates_one_item_and_re_embeds_only_changed_texts(
    engine: dossier.Engine, change: Callable, updated: dict[str, int], embedded: int
) -> None:
    engine.load_bundle(bundle())
    report = engine.load_bundle(_changed(change))
    assert report.updated == updated
    assert report.total_inserted == 0
    assert report.embedded == embedded


def test_changing_a_property_re_embeds_that_property_only(engine: dossier.Engine) -> None:
    engine.load_bundle(bundle())
    keys = [property_key("r-jane", "plan"), property_key("r-jane", "seats")]
    before = engine.store.vector_hashes("property", keys, org="acme")
    engine.load_bundle(_changed(lambda b: b["records"][0]["properties"].update(seats=45)))
    after = engine.store.vector_hashes("property", keys, org="acme")
    assert after[keys[0]] == before[keys[0]]
    assert after[keys[1]] == text_hash(property_text("seats", 45)) != before[keys[1]]


@pytest.mark.parametrize("removal", ["deleted", "set-to-null", "set-to-empty"])
def test_a_property_that_loses_its_value_loses_its_vector(engine: dossier.Engine, removal: str) -> None:
    engine.load_bundle(bundle())
    props = {"deleted": {"plan": "Enterprise"}, "set-to-null": {"plan": "Enterprise", "seats": None},
             "set-to-empty": {"plan": "Enterprise", "seats": ""}}[removal]  # fmt: skip
    report = engine.load_bundle(_changed(lambda b: b["records"][0].update(properties=props)))
    assert report.embedded == 0
    assert list(engine.store.vector_hashes("property", ["r-jane/plan", "r-jane/seats"], org="acme")) == ["r-jane/plan"]
    hits = engine.store.search_vectors("property", engine.embed_query("seats: 40"), org="acme", limit=10)
    assert "r-jane/seats" not in [h.id for h in hits]


def test_a_memory_moved_to_another_record_is_searched_under_that_record(engine: dossier.Engine) -> None:
    engine.load_bundle(bundle())
    report = engine.load_bundle(_changed(lambda b: b["memories"][1].update(record="r-acme")))
    assert report.updated == {"memories": 1} and report.embedded == 0  # same text, same vector
    query = engine.embed_query("quarterly invoices")
    store = engine.store
    assert [h.id for h in store.search_vectors("memory", query, org="acme", limit=5, parents=["r-acme"])] == ["m-2"]
    assert [h.id for h in store.search_vectors("memory", query, org="acme", limit=5, parents=["r-jane"])] == ["m-1"]
    assert [h.id for h in store.search_text("memory", "quarter", org="acme", limit=5, parents=["r-acme"])] == ["m-2"]


def test_unknown_fields_are_ignored_top_level_and_per_item(engine: dossier.Engine) -> None:
    engine.load_bundle(bundle())
    extra = bundle()
    extra.update(version=3, exported_by="crm-x", notes=[{"id": "n1"}])
    for list_name in ("orgs", "callers", "records", "memories", "documents", "edges"):
        for item in extra[list_name]:
            item["colour"] = "blue"
    extra["records"][0]["identifiers"]["fax"] = "+44 20 7946 0000"
    extra["documents"][0]["sections"][0]["page"] = 4
    report = engine.load_bundle(extra)
    assert (report.total_inserted, report.total_updated, report.embedded) == (0, 0, 0)  # the same content as before
    assert report.ignored_keys == ["version", "exported_by", "notes"]  # and the load report says what it ignored
    assert report.ignored_fields == {
        "orgs": {"colour": 1}, "callers": {"colour": 1}, "records": {"colour": 2, "identifiers.fax": 1},
        "memories": {"colour": 2}, "documents": {"colour": 1, "sections.page": 1}, "edges": {"colour": 1},
    }  # fmt: skip


def test_a_record_pending_deletion_keeps_no_property_vectors(engine: dossier.Engine) -> None:
    engine.load_bundle(bundle())
    keys = ["r-jane/plan", "r-jane/seats"]
    assert len(engine.store.vector_hashes("property", keys, org="acme")) == 2
    report = engine.load_bundle(_changed(lambda b: b["records"][0].update(pending_deletion=True)))
    assert report.updated == {"records": 1} and report.embedded == 0
    assert engine.store.vector_hashes("property", keys, org="acme") == {}
    assert engine.load_bundle(bundle()).embedded == 2  # taken back: embedded again


# -- all or nothing --------------------------------------------------------------------------------
def _add(list_name: str, item: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda b: b[list_name].append(item)


DANGLING = [
    ("memory", "m-lost", _add("memories", {"id": "m-lost", "org": "acme", "record": "r-ghost", "text": "Hi.",
                                          "created_at": "2024-01-01T00:00:00Z"})),
    ("edge", "e-lost", _add("edges", {"id": "e-lost", "org": "acme", "src": "r-jane", "dst": "r-ghost", "type": "knows"})),
    ("edge", "e-from-ghost", _add("edges", {"id": "e-from-ghost", "org": "acme", "src": "r-ghost", "dst": "r-jane",
                                            "type": "knows"})),
    ("caller", "c-lost", _add("callers", {"id": "c-lost", "org": "nowhere", "roles": []})),
    ("record", "r-lost", _add("records", {"id": "r-lost", "org": "nowhere", "kind": "contact"})),
    ("record", "r-merged", _add("records", {"id": "r-merged", "org": "acme", "kind": "contact", "merged_into": "r-ghost"})),
    ("document", "d-lost", _add("documents", {"id": "d-lost", "org": "acme", "title": "Notes", "attached_record": "r-ghost",
                                              "sections": [{"id": "s-lost", "text": "x"}]})),
    # a record of another org does not satisfy a reference
    ("memory", "m-cross", _add("memories", {"id": "m-cross", "org": "acme", "record": "r-beta-only", "text": "Hi.",
                                           "created_at": "2024-01-01T00:00:00Z"})),
]  # fmt: skip


def _valid_additions(b: dict[str, Any]) -> None:
    b["records"].append({"id": "r-new", "org": "acme", "kind": "contact", "properties": {"plan": "Starter"}})
    b["memories"].append({"id": "m-new", "org": "acme", "record": "r-new", "text": "Brand new memory.",
                          "created_at": "2024-05-01T00:00:00Z"})  # fmt: skip
    b["memories"][0]["text"] = "An update that must not be written."


@pytest.mark.parametrize("kind, item_id, add", DANGLING, ids=[d[1] for d in DANGLING])
def test_a_dangling_reference_names_the_item_and_writes_nothing(
    engine: dossier.Engine, kind: str, item_id: str, add: Callable
) -> None:
    engine.load_bundle(bundle())
    engine.load_bundle({"orgs": [{"id": "beta"}], "records": [{"id": "r-beta-only", "org": "beta", "kind": "contact"}]})
    before = engine.store.counts(org="acme")
    broken = _changed(_valid_additions)
    add(broken)
    with pytest.raises(dossier.BundleError) as caught:
        engine.load_bundle(broken)
    assert [(p.kind, p.item_id) for p in caught.value.problems] == [(kind, item_id)]
    assert item_id in str(caught.value)
    assert engine.store.counts(org="acme") == before
    assert engine.store.get_records(["r-new"], org="acme") == []
    assert engine.store.get_memories(["m-1"], org="acme")[0].text == bundle()["memories"][0]["text"]
    assert engine.store.get_org(org="nowhere") is None


def test_a_broken_first_load_leaves_the_store_empty(engine: dossier.Engine) -> None:
    broken = bundle()
    broken["edges"][0]["dst"] = "r-ghost"
    with pytest.raises(dossier.BundleError):
        engine.load_bundle(broken)
    assert engine.store.get_org(org="acme") is None
    assert set(engine.store.counts(org="acme").values()) == {0}


@pytest.mark.parametrize(
    "list_name, position, change, expected_id, field",
    [
        ("records", 0, {"identifiers": {"email": "jane-at-acme"}}, "r-jane", "email"),
        ("records", 1, {"kind": "robot"}, "r-acme", "kind"),
        ("records", 1, {"id": None}, "#1", "id"),
        ("memories", 1, {"created_at": None}, "m-2", "created_at"),
        ("memories", 0, {"text": ""}, "m-1", "text"),
        ("edges", 0, {"confidence": 2}, "e-1", "confidence"),
        ("documents", 0, {"sections": []}, "d-disc", "sections"),
        ("records", 0, {"identifiers": {"website": "not a site"}}, "r-jane", "website"),
        ("records", 0, {"identifiers": {"phone": "12"}}, "r-jane", "phone"),
    ],
)
def test_an_invalid_item_gives_a_problem_naming_it(
    engine: dossier.Engine, list_name: str, position: int, change: dict, expected_id: str, field: str
) -> None:
    broken = bundle()
    item = broken[list_name][position]
    for key, value in change.items():
        if value is None:
            item.pop(key)
        else:
            item[key] = value
    with pytest.raises(dossier.BundleError) as caught:
        engine.load_bundle(broken)
    [problem] = caught.value.problems
    assert problem.item_id == expected_id
    assert field in problem.message
    assert engine.store.get_org(org="acme") is None


def test_every_problem_is_reported_at_once(engine: dossier.Engine) -> None:
    broken = bundle()
    broken["records"][0]["kind"] = "robot"
    broken["memories"][1]["created_at"] = "yesterday"
    broken["edges"].append(copy.deepcopy(broken["edges"][0]))  # duplicate id
    with pytest.raises(dossier.BundleError) as caught:
        engine.load_bundle(broken)
    assert {p.item_id for p in caught.value.problems} == {"r-jane", "m-2"}  # shape problems stop before references
    fixed = bundle()
    fixed["edges"].append(copy.deepcopy(fixed["edges"][0]))
    fixed["memories"].append({**fixed["memories"][0], "record": "r-ghost"})
    with pytest.raises(dossier.BundleError) as caught:
        engine.load_bundle(fixed)
    assert sorted((p.kind, p.item_id) for p in caught.value.problems) == [("edge", "e-1"), ("memory", "m-1"), ("memory", "m-1")]


def _document(doc_id: str, *section_ids: str) -> dict[str, Any]:
    return {"id": doc_id, "org": "acme", "title": doc_id, "sections": [{"id": s, "text": f"Text of {s}."} for s in section_ids]}


def test_a_section_id_repeated_in_a_document_is_one_problem_per_id(engine: dossier.Engine) -> None:
    broken = _changed(lambda b: b["documents"].append(_document("d-rep", "s-1", "s-2", "s-1", "s-2", "s-1", "s-3")))
    with pytest.raises(dossier.BundleError) as caught:
        engine.load_bundle(broken)
    assert [(p.item_id, p.message) for p in caught.value.problems] == [
        ("d-rep", "section id 's-1' is used 3 times"), ("d-rep", "section id 's-2' is used twice"),
    ]  # fmt: skip
    clash = _changed(lambda b: b["documents"].append(_document("d-clash", "s-prepay")))
    with pytest.raises(dossier.BundleError) as caught:
        engine.load_bundle(clash)
    assert [(p.item_id, p.message) for p in caught.value.problems] == [
        ("d-clash", "section id 's-prepay' is also used by document 'd-disc'")
    ]


def test_a_section_id_a_stored_document_holds_is_refused_before_anything_is_written(engine: dossier.Engine) -> None:
    engine.load_bundle(bundle())
    before = engine.store.counts(org="acme")
    new = {"documents": [_document("d-new", "s-new", "s-limits")], "records": [{"id": "r-new", "org": "acme", "kind": "contact"}]}
    with pytest.raises(dossier.BundleError) as caught:
        engine.load_bundle(new)
    assert [(p.kind, p.item_id) for p in caught.value.problems] == [("document", "d-new")]
    assert "'s-limits' is already used by another document in org 'acme'" in str(caught.value)
    moved = bundle()
    moved["documents"][0]["sections"].pop()  # s-prepay leaves d-disc for d-new in the same load
    moved["documents"].append(_document("d-new", "s-prepay"))
    with pytest.raises(dossier.BundleError, match="'s-prepay' is already used by document 'd-disc'"):
        engine.load_bundle(moved)  # a section changes document in two loads: dropped from one, then added
    assert engine.store.counts(org="acme") == before
    edited = engine.load_bundle(_changed(lambda b: b["documents"][0]["sections"][0].update(text="Above 25% needs VP approval.")))
    assert edited.updated == {"documents": 1} and edited.embedded == 1  # a document keeps its own section ids
    assert engine.load_bundle(bundle("beta")).inserted["documents"] == 1  # the same section ids in another org


MERGE_CYCLES = [
    ([("r-self", "r-self")], "r-self", "merged_into refers to the record itself"),
    ([("r-a", "r-b"), ("r-b", "r-a")], "r-a", "merged_into makes a cycle: 'r-a' -> 'r-b' -> 'r-a'"),
    ([("r-x", "r-b"), ("r-b", "r-c"), ("r-c", "r-b")], "r-b", "merged_into makes a cycle: 'r-b' -> 'r-c' -> 'r-b'"),
    ([("r-jane", "r-old")], "r-jane", "merged_into makes a cycle: 'r-jane' -> 'r-old' -> 'r-jane'"),  # r-old is stored
]


@pytest.mark.parametrize("merges, item_id, message", MERGE_CYCLES, ids=["self", "pair", "into-a-pair", "through-the-store"])
def test_a_merge_cycle_is_one_problem_naming_its_records(
    engine: dossier.Engine, merges: list[tuple[str, str]], item_id: str, message: str
) -> None:
    engine.load_bundle(bundle())
    engine.load_bundle({"records": [{"id": "r-old", "org": "acme", "kind": "contact", "merged_into": "r-jane"}]})
    before = engine.store.counts(org="acme")
    records = [{"id": r, "org": "acme", "kind": "contact", "merged_into": into} for r, into in merges]
    with pytest.raises(dossier.BundleError) as caught:
        engine.load_bundle({"records": records})
    assert [(p.kind, p.item_id, p.message) for p in caught.value.problems] == [("record", item_id, message)]
    assert engine.store.counts(org="acme") == before


def test_a_merge_turned_around_in_one_bundle_is_not_a_cycle(engine: dossier.Engine) -> None:
    engine.load_bundle(bundle())
    engine.load_bundle({"records": [{"id": "r-old", "org": "acme", "kind": "contact", "merged_into": "r-jane"}]})
    swapped = [{"id": "r-old", "org": "acme", "kind": "contact"},
               {"id": "r-jane", "org": "acme", "kind": "contact", "merged_into": "r-old"}]  # fmt: skip
    assert engine.load_bundle({"records": swapped}).updated == {"records": 2}
    assert engine.store.merged_from("r-old", org="acme") == ["r-jane"]


@pytest.mark.parametrize("source", [{"records": "nope"}, ["not", "an", "object"]])
def test_a_bundle_of_the_wrong_shape_is_a_bundle_error(engine: dossier.Engine, source: Any) -> None:
    with pytest.raises(dossier.BundleError):
        engine.load_bundle(source)


def test_a_missing_or_malformed_file_is_a_usage_error(engine: dossier.Engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(dossier.UsageError, match="cannot read bundle"):
        engine.load_bundle(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(dossier.BundleError, match="not valid JSON"):
        engine.load_bundle(tmp_path / "bad.json")


def test_references_to_records_already_stored_are_fine(engine: dossier.Engine) -> None:
    engine.load_bundle(bundle())
    later = {
        "memories": [{"id": "m-3", "org": "acme", "record": "r-jane", "text": "Jane renewed.", "created_at": "2024-06-01T00:00:00Z"}],
        "edges": [{"id": "e-2", "org": "acme", "src": "r-acme", "dst": "r-jane", "type": "employs"}],
        "documents": [{"id": "d-jane", "org": "acme", "title": "Jane's contract", "attached_record": "r-jane",
                       "sections": [{"id": "s-jane", "text": "Two-year term."}]}],
        "callers": [{"id": "c-2", "org": "acme"}],
    }  # fmt: skip
    report = engine.load_bundle(later)
    assert report.inserted == {"memories": 1, "edges": 1, "documents": 1, "callers": 1}
    assert engine.store.recent_memories(["r-jane"], org="acme", limit=1)[0].id == "m-3"


def test_the_same_ids_in_two_orgs_do_not_collide(engine: dossier.Engine) -> None:
    beta = bundle("beta")
    beta["memories"][0]["text"] = "Beta's Jane asked about zebra stripes."
    both = bundle("acme")
    for list_name in both:
        both[list_name] += beta[list_name]
    first = engine.load_bundle(both)
    assert first.inserted["records"] == 4 and first.embedded == 14
    assert engine.store.counts(org="acme") == engine.store.counts(org="beta")
    assert engine.store.get_memories(["m-1"], org="beta")[0].text.startswith("Beta's")
    assert engine.store.get_memories(["m-1"], org="acme")[0].text.startswith("Jane asked")
    assert engine.store.search_text("memory", "zebra", org="acme", limit=5) == []
    again = engine.load_bundle(both)
    assert (again.total_inserted, again.total_updated, again.embedded) == (0, 0, 0)
    changed = engine.load_bundle(_changed(lambda b: b["memories"][0].update(text="Only beta changes."), org="beta"))
    assert changed.updated == {"memories": 1} and changed.embedded == 1
    assert engine.store.get_memories(["m-1"], org="acme")[0].text.startswith("Jane asked")


def test_progress_reports_every_embedded_text(engine: dossier.Engine) -> None:
    seen: list[tuple[int, int]] = []
    engine.load_bundle(bundle(), progress=lambda done, total: seen.append((done, total)))
    assert seen[0] == (0, 7) and seen[-1] == (7, 7)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


# -- markdown --------------------------------------------------------------------------------------
HANDBOOK = """\
# Returns handbook

How we handle returns.

## Refunds

Refunds are issued within 30 days.

### Partial refunds

Partial refunds need a manager.

## Shipping damage

Photograph the parcel first.
"""


def test_markdown_splits_at_headings_and_takes_the_title() -> None:
    doc = document_from_markdown(HANDBOOK, org="acme", doc_type="policy", tags=["returns"])
    assert (doc.id, doc.title, doc.doc_type, doc.tags, doc.org) == ("returns-handbook", "Returns handbook", "policy", ("returns",), "acme")
    assert [(s.id, s.heading, s.text) for s in doc.sections] == [
        ("returns-handbook--introduction", "Introduction", "How we handle returns."),
        ("returns-handbook--refunds", "Refunds", "Refunds are issued within 30 days."),
        ("returns-handbook--partial-refunds", "Partial refunds", "Partial refunds need a manager."),
        ("returns-handbook--shipping-damage", "Shipping damage", "Photograph the parcel first."),
    ]
    assert doc.visible_to_roles is None and doc.attached_record is None


def test_markdown_title_and_id_can_be_given() -> None:
    doc = document_from_markdown(HANDBOOK, org="acme", title="Returns", doc_id="ret", visible_to_roles=["support"])
    assert (doc.id, doc.title, doc.visible_to_roles) == ("ret", "Returns", ("support",))
    assert doc.sections[1].id == "ret--refunds"
    assert "Returns handbook" not in [s.heading for s in doc.sections]


def test_markdown_with_several_top_level_headings_needs_a_title() -> None:
    text = "# One\n\nfirst\n\n# Two\n\nsecond\n"
    with pytest.raises(dossier.UsageError, match="title"):
        document_from_markdown(text, org="acme")
    doc = document_from_markdown(text, org="acme", title="Pair")
    assert [s.heading for s in doc.sections] == ["One", "Two"]


def test_markdown_without_text_is_refused() -> None:
    with pytest.raises(dossier.UsageError):
        document_from_markdown("# Only a title\n", org="acme")


@pytest.mark.parametrize(
    "headings, ids",
    [
        (["FAQ", "FAQ", "FAQ"], ["faq", "faq-2", "faq-3"]),
        (["FAQ", "FAQ", "FAQ 2"], ["faq", "faq-2", "faq-2-2"]),
        (["FAQ 2", "FAQ", "FAQ"], ["faq-2", "faq", "faq-3"]),
        (["Q&A", "Q & A", "q/a"], ["q-a", "q-a-2", "q-a-3"]),
    ],
)
def test_repeated_headings_get_distinct_ids(headings: list[str], ids: list[str]) -> None:
    text = "\n\n".join(f"## {h}\n\nbody {i}" for i, h in enumerate(headings))
    doc = document_from_markdown(text, org="acme", title="Doc", doc_id="d")
    assert [s.id for s in doc.sections] == [f"d--{i}" for i in ids]


def test_markdown_reload_is_stable_and_an_edit_re_embeds_one_section(engine: dossier.Engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine.load_bundle({"orgs": [{"id": "acme"}]})
    path = tmp_path / "handbook.md"
    path.write_text(HANDBOOK)
    first = engine.add_markdown(path, org="acme", doc_type="policy")
    assert first.inserted == {"documents": 1} and first.embedded == 4
    again = engine.add_markdown(path, org="acme", doc_type="policy")
    assert (again.total_inserted, again.total_updated, again.embedded) == (0, 0, 0)
    path.write_text(HANDBOOK.replace("within 30 days", "within 14 days"))
    edited = engine.add_markdown(path, org="acme", doc_type="policy")
    assert edited.updated == {"documents": 1} and edited.embedded == 1
    hits = engine.store.search_text("section", "14 days", org="acme", limit=5)
    assert [h.id for h in hits] == ["returns-handbook--refunds"]


def test_markdown_sections_dropped_from_the_file_leave_search(engine: dossier.Engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine.load_bundle({"orgs": [{"id": "acme"}]})
    path = tmp_path / "handbook.md"
    path.write_text(HANDBOOK)
    engine.add_markdown(path, org="acme")
    path.write_text(HANDBOOK.split("## Shipping damage")[0])
    assert engine.add_markdown(path, org="acme").embedded == 0
    assert engine.store.search_text("section", "photograph parcel", org="acme", limit=5) == []
    hits = engine.store.search_vectors("section", engine.embed_query("photograph the parcel"), org="acme", limit=10)
    assert "returns-handbook--shipping-damage" not in [h.id for h in hits]
    assert engine.store.counts(org="acme")["sections"] == 3


def test_markdown_into_an_unknown_org_is_refused(engine: dossier.Engine) -> None:
    doc = document_from_markdown(HANDBOOK, org="nowhere")
    with pytest.raises(dossier.BundleError) as caught:
        engine.add_document(doc)
    assert caught.value.problems[0].item_id == "returns-handbook"


def test_titles_of_other_scripts_or_of_no_letters_give_documents_ids_of_their_own() -> None:
    titles = ["価格ガイド", "返金ポリシー", "Über uns", "Uber uns!", "???", "!!!", "Pricing Policy 2024"]
    ids = [document_from_markdown(f"# {t}\n\nText.", org="acme").id for t in titles]
    assert ids[0] == "価格ガイド" and ids[2] == "uber-uns" and ids[-1] == "pricing-policy-2024"  # ASCII titles as before
    assert len(set(ids)) == len(ids) - 1  # "Über uns" and "Uber uns!" are one id; the rest are all different
    assert ids[4].startswith("doc-") and ids[4] != ids[5]
    doc = document_from_markdown("# ???\n\n## ...\n\nA.\n\n## !!!\n\nB.", org="acme")
    assert [s.id for s in doc.sections] == [f"{doc.id}--section", f"{doc.id}--section-2"]
