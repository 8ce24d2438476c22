"""Multi-valued properties, as CRMs hold them (``"languages": ["Swahili", "Icelandic"]``), on every store:
stored as lists, embedded as ``name: v1, v2``, returned whole in property items, found by property
discovery, and masked element by element before a model sees them. Records pending deletion are never
discovered: they keep no property vectors."""

from __future__ import annotations

import re
from typing import Any, Iterator

import pytest

import dossier
from dossier.loading import property_text, text_hash
from dossier.schema import PropertyItem
from dossier.stores.base import property_key
from tests.scripted_llm import ScriptedLLM, scripted, scripted_server  # noqa: F401 - fixtures

ORG = "globex"
LISTS = {
    "languages": ["Swahili", "Icelandic"],
    "regions": ["Benelux", "Nordics"],
    "renewal_dates": ["2026-03-01", "2027-03-01"],
    "seat_tiers": [40, 120.5],
    "flags": [True, None],
}


def bundle() -> dict[str, Any]:
    return {
        "orgs": [{"id": ORG, "name": "Globex"}],
        "callers": [{"id": "ana", "org": ORG, "roles": ["sales"]}],
        "records": [
            {"id": "r-lena", "org": ORG, "kind": "contact", "identifiers": {"email": "lena@globex-client.com"},
             "properties": {"name": "Lena Vogel", **LISTS, "tags": [], "plan": "Enterprise"}},
            {"id": "r-kofi", "org": ORG, "kind": "contact", "identifiers": {"email": "kofi@globex-client.com"},
             "properties": {"name": "Kofi Mensah", "languages": ["German", "English"]}},
            # pending deletion: speaks Swahili too, and must never be discovered
            {"id": "r-gone", "org": ORG, "kind": "contact", "pending_deletion": True,
             "properties": {"name": "Gone Person", "languages": ["Swahili", "Klingon"]}},
        ],
        "memories": [
            {"id": "m-1", "org": ORG, "record": "r-lena", "text": "Lena asked for the contract in two languages.",
             "created_at": "2026-01-10T09:00:00Z"},
        ],
    }  # fmt: skip


@pytest.fixture
def engine(store_url: str, embedder) -> Iterator[dossier.Engine]:  # type: ignore[no-untyped-def]
    with dossier.open(store_url, embedder=embedder) as engine:
        engine.load_bundle(bundle())
        yield engine


def test_list_values_are_stored_and_embedded_as_name_colon_values(engine: dossier.Engine) -> None:
    [lena] = engine.store.get_records(["r-lena"], org=ORG)
    assert {name: lena.properties[name] for name in LISTS} == LISTS
    assert lena.properties["tags"] == []
    keys = [property_key("r-lena", name) for name in (*LISTS, "tags")]
    hashes = engine.store.vector_hashes("property", keys, org=ORG)
    assert hashes[property_key("r-lena", "languages")] == text_hash("languages: Swahili, Icelandic")
    assert hashes[property_key("r-lena", "seat_tiers")] == text_hash(property_text("seat_tiers", [40, 120.5]))
    assert property_text("flags", [True, None]) == "flags: True"
    assert property_key("r-lena", "tags") not in hashes  # an empty list has nothing to embed
    # loading the same bundle again is unchanged; changing one element re-embeds that property only
    again = engine.load_bundle(bundle())
    assert (again.total_inserted, again.total_updated, again.embedded) == (0, 0, 0)
    changed = bundle()
    changed["records"][0]["properties"]["languages"] = ["Swahili", "Icelandic", "Faroese"]
    report = engine.load_bundle(changed)
    assert report.updated == {"records": 1} and report.embedded == 1
    after = engine.store.vector_hashes("property", [property_key("r-lena", "languages")], org=ORG)
    assert after[property_key("r-lena", "languages")] == text_hash("languages: Swahili, Icelandic, Faroese")


def test_list_values_come_back_in_property_items(engine: dossier.Engine) -> None:
    response = engine.retrieve(
        {"mode": "brief", "record": {"email": "lena@globex-client.com"}, "message": "Which languages does she speak?"},
        org=ORG, caller="ana",
    )  # fmt: skip
    items = {i.name: i for i in response.sources["properties"].items}
    assert isinstance(items["languages"], PropertyItem)
    assert {name: items[name].value for name in LISTS} == LISTS
    ranked = [i.name for i in response.sources["properties"].items]
    assert ranked[0] == "languages"  # ranked by its "languages: Swahili, Icelandic" vector
    as_json = response.model_dump(mode="json")
    [languages] = [i for i in as_json["sources"]["properties"]["items"] if i["name"] == "languages"]
    assert languages["value"] == ["Swahili", "Icelandic"]


def test_discovery_finds_a_record_by_one_element_of_a_list(engine: dossier.Engine) -> None:
    response = engine.retrieve({"message": "Who speaks Icelandic?", "trace": True}, org=ORG, caller="ana")
    found = [(i.record_id, i.name, i.value, i.matched) for i in response.sources["properties"].items]
    assert found[0] == ("r-lena", "languages", ["Swahili", "Icelandic"], True)


def test_discovery_never_reaches_a_record_pending_deletion(engine: dossier.Engine) -> None:
    # the pending record's "languages: Swahili, Klingon" would match as well as r-lena's list does
    store = engine.store
    assert store.vector_hashes("property", ["r-gone/languages", "r-gone/name"], org=ORG) == {}
    query = engine.embed_query("Which customers speak Swahili?")
    hits = store.search_vectors("property", query, org=ORG, limit=100)
    assert hits and "r-gone" not in {h.parent for h in hits}
    response = engine.retrieve({"message": "Which customers speak Swahili?", "trace": True}, org=ORG, caller="ana")
    assert ("r-lena", "languages") in [(i.record_id, i.name) for i in response.sources["properties"].items]
    assert "r-gone" not in response.model_dump_json()
    # taken back from deletion, it is embedded and found again; marked again, its vectors go
    revived = bundle()
    revived["records"][2]["pending_deletion"] = False
    assert engine.load_bundle(revived).embedded == 2
    response = engine.retrieve({"message": "Who speaks Klingon?"}, org=ORG, caller="ana")
    assert response.sources["properties"].items[0].record_id == "r-gone"
    assert engine.load_bundle(bundle()).embedded == 0
    assert store.vector_hashes("property", ["r-gone/languages", "r-gone/name"], org=ORG) == {}
    assert "r-gone" not in {h.parent for h in store.search_vectors("property", query, org=ORG, limit=100)}


def test_list_elements_are_masked_before_synthesis(engine: dossier.Engine, scripted: ScriptedLLM) -> None:
    pytest.importorskip("openai")
    engine.use_llm(scripted.llm(timeouts={"synthesize": 5.0}))

    def answer(body: dict) -> dict:
        placeholders = re.findall(r"<VALUE_\d+>", body["messages"][-1]["content"].split("Context:\n", 1)[1])
        return {"answer": f"She speaks {' and '.join(dict.fromkeys(placeholders))} [P1].", "confidence": 0.6,
                "sources_used": ["P1"]}  # fmt: skip

    scripted.on("synthesize", answer)
    response = engine.retrieve(
        {"mode": "brief", "record": {"email": "lena@globex-client.com"}, "message": "Does Lena speak Icelandic, and which regions?",
         "synthesize": True},
        org=ORG, caller="ana",
    )  # fmt: skip
    [body] = scripted.bodies("synthesize")
    prompt = "\n".join(m["content"] for m in body["messages"])
    for secret in ("Swahili", "Icelandic", "Benelux", "Nordics", "Lena", "Vogel", "Enterprise"):
        assert not re.search(rf"(?<!\w){secret}(?!\w)", prompt, re.IGNORECASE), secret
    assert "<VALUE_" in prompt
    assert response.synthesis is not None and response.synthesis.answer is not None
    for value in ("Swahili", "Icelandic", "Benelux", "Nordics"):  # restored in the answer
        assert value in response.synthesis.answer
    assert "<" not in response.synthesis.answer
