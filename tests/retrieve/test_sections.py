"""Section selection: clear winner, selector picks, the sibling rule, fallbacks, fetch ranking,
governance of documents (roles, system, attached)."""

from __future__ import annotations

import dataclasses

import pytest

import dossier
from dossier.pipeline.places import region_words
from dossier.providers.ranker import FILE_ENV

from .conftest import ids


def scout(engine: dossier.Engine, message: str, caller: str = "ana", **extra) -> dossier.RetrieveResponse:  # type: ignore[no-untyped-def]
    body = {"mode": "scout", "message": message, "sources": {"memories": False, "properties": False}, **extra}
    return engine.retrieve(body, org="northwind", caller=caller)


def test_clear_winner_skips_the_selector(fresh_engine: dossier.Engine) -> None:
    t = fresh_engine.settings.thresholds
    fresh_engine.org_settings["northwind"] = fresh_engine.settings.replace(
        thresholds=dataclasses.replace(t, clear_winner=0.5, clear_winner_margin=0.05)
    )
    response = scout(fresh_engine, "What are the discount bands by seat count?", depth="fast")  # no lexical-only
    assert response.route["documents"].detail["selector"] == "clear_winner"
    high = [i for i in response.sources["documents"].items if i.confidence == "high"]
    assert [i.section_id for i in high] == ["doc-pricing-s2"]


@pytest.fixture
def heuristic(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """No usable ranker model: selection runs on the cosine rules (the fallback path these tests hold)."""
    monkeypatch.setenv(FILE_ENV, str(tmp_path / "missing.json"))


def test_without_a_clear_winner_the_heuristic_picks_at_most_three(sample_engine: dossier.Engine, heuristic: None) -> None:
    response = scout(sample_engine, "How long do we keep customer data after the contract ends?")
    assert response.route["documents"].detail["selector"] == "heuristic"
    high = [i for i in response.sources["documents"].items if i.confidence == "high"]
    assert 1 <= len(high) <= 3 and all(i.document_id == "doc-retention" for i in high)


def test_sibling_replaces_the_general_pick_when_its_qualifier_is_named(sample_engine: dossier.Engine) -> None:
    emea = scout(sample_engine, "What are the volume discount bands for an EMEA customer?")
    assert ids(emea, "documents")[0].startswith("doc-pricing-emea")
    general = scout(sample_engine, "What are the volume discount bands for a customer in Ohio?")
    assert ids(general, "documents")[0] == "doc-pricing-s2"


CLAIMS = {
    "orgs": [{"id": "ship", "name": "Ship Co"}],
    "callers": [{"id": "ops", "org": "ship", "roles": ["ops"]}],
    "records": [
        {"id": "rec-kenji", "org": "ship", "kind": "contact", "identifiers": {"email": "kenji@example.jp"},
         "properties": {"name": "Kenji Sato", "country": "Japan"}},
        {"id": "rec-amy", "org": "ship", "kind": "contact", "identifiers": {"email": "amy@example.com"},
         "properties": {"name": "Amy Lane", "country": "United States"}},
    ],
    "documents": [
        {"id": "doc-claims", "org": "ship", "title": "Cargo Claims Procedure", "sections": [
            {"id": "doc-claims-s1", "heading": "Notice deadlines",
             "text": "Visible damage must be noted on delivery; concealed damage must be notified within 7 days."},
            {"id": "doc-claims-s2", "heading": "Evidence required", "text": "Photos, the delivery note and the invoice."},
        ]},
        {"id": "doc-claims-apac", "org": "ship", "title": "APAC Cargo Claims Procedure", "sections": [
            {"id": "doc-claims-apac-s1", "heading": "Notice deadlines",
             "text": "Visible damage must be noted on delivery; concealed damage must be notified within 3 days."},
            {"id": "doc-claims-apac-s2", "heading": "Evidence required", "text": "Photos and a survey report."},
        ]},
    ],
}


def test_a_place_in_the_region_names_the_regional_sibling(tmp_path, embedder) -> None:  # type: ignore[no-untyped-def]
    asked = "A customer in {} found crushed cartons a week after delivery. How long did they have to notify us?"
    with dossier.open(f"sqlite:///{tmp_path}/claims.db", embedder=embedder) as engine:
        engine.load_bundle(CLAIMS)

        def first(message: str, record: dict | None = None) -> str:
            body = {"message": message, **({"record": record} if record else {})}
            return ids(engine.retrieve(body, org="ship", caller="ops"), "documents")[0]

        assert first(asked.format("Singapore")) == "doc-claims-apac-s1"  # Singapore is in APAC
        assert first(asked.format("Osaka")) == "doc-claims-apac-s1"
        assert first(asked.format("Ohio")) == "doc-claims-s1"  # the general rule elsewhere
        question = "How long does this customer have to notify us of concealed damage?"
        assert first(question, {"email": "kenji@example.jp"}) == "doc-claims-apac-s1"  # the record's country
        assert first(question, {"email": "amy@example.com"}) == "doc-claims-s1"


LETTINGS = {"orgs": [{"id": "lets", "name": "Lettings Co"}], "callers": [{"id": "ops", "org": "lets", "roles": ["ops"]}]}
DEPOSITS = {
    **LETTINGS,
    "documents": [
        {"id": "doc-dep", "org": "lets", "title": "Tenancy Deposit Procedure", "sections": [
            {"id": "doc-dep-s1", "heading": "Deposit cap", "text": "We take at most five weeks' rent as security."},
            {"id": "doc-dep-s2", "heading": "Returning it", "text": "Agreed amounts go back within 10 days."},
        ]},
        {"id": "doc-dep-wales", "org": "lets", "title": "Wales Tenancy Deposit Procedure", "sections": [
            {"id": "doc-dep-wales-s1", "heading": "Deposit cap",
             "text": "For a flat let on a new contract, the most deposit we would take is four weeks of rent."},
            {"id": "doc-dep-wales-s2", "heading": "Returning it", "text": "Agreed amounts go back within 14 days."},
        ]},
        {"id": "doc-dep-scot", "org": "lets", "title": "Scotland Tenancy Deposit Procedure", "sections": [
            {"id": "doc-dep-scot-s1", "heading": "Deposit cap", "text": "Two months' rent at most, lodged with a scheme."},
            {"id": "doc-dep-scot-s2", "heading": "Returning it", "text": "The scheme repays it within 5 days."},
        ]},
        {"id": "doc-fire", "org": "lets", "title": "Fire Safety Standards", "sections": [
            {"id": "doc-fire-s1", "heading": "Alarms", "text": "One alarm on each storey, tested at move-in."},
            {"id": "doc-fire-s2", "heading": "Escape routes", "text": "Keep hallways clear."},
        ]},
        {"id": "doc-fire-hmo", "org": "lets", "title": "HMO Fire Safety Standards", "sections": [
            {"id": "doc-fire-hmo-s1", "heading": "Alarms",
             "text": "How many smoke alarms are needed in a house: an interlinked smoke alarm in every room and hallway."},
            {"id": "doc-fire-hmo-s2", "heading": "Escape routes", "text": "Fire doors on every bedroom."},
        ]},
    ],
}


def test_an_unnamed_sibling_gives_way_to_the_general_document(tmp_path, embedder) -> None:  # type: ignore[no-untyped-def]
    """A pick in a more specific sibling whose qualifier nobody names ("Wales", "HMO") is replaced by the
    general document's section of the same heading; a named one (the word, a place in it, a plural)
    stands, and a negated one ("not an HMO") is not named."""
    with dossier.open(f"sqlite:///{tmp_path}/lets.db", embedder=embedder) as engine:
        engine.load_bundle(DEPOSITS)

        def answer(message: str) -> tuple[str, dict]:
            response = engine.retrieve({"mode": "scout", "message": message, "trace": True}, org="lets", caller="ops")
            return ids(response, "documents")[0], response.route["documents"].detail

        asked = "For a flat let on a new contract in {}, what is the most deposit we would take?"
        first, detail = answer(asked.format("Bristol"))
        assert first == "doc-dep-s1"
        assert detail["generals"] == [["doc-dep-wales-s1", "doc-dep-s1"]]  # the ranker had picked the Welsh section
        assert answer(asked.format("Cardiff"))[0] == "doc-dep-wales-s1"  # a Welsh city names Wales
        assert answer(asked.format("Edinburgh"))[0] == "doc-dep-scot-s1"  # a Scottish one Scotland, over the pick
        assert answer(asked.format("Wales"))[0] == "doc-dep-wales-s1"
        houses = "How many smoke alarms are needed in a house {}?"
        assert answer(houses.format("we let to a family, not an HMO"))[0] == "doc-fire-s1"
        assert answer(houses.format("in one of our HMOs"))[0] == "doc-fire-hmo-s1"  # the plural names it


PARKING = {
    **LETTINGS,
    "documents": [
        {"id": "doc-park", "org": "lets", "title": "Parking Rules", "sections": [
            {"id": "doc-park-s1", "heading": "Visitor parking permits", "text": "One a year, on request."},
            {"id": "doc-park-s2", "heading": "Bays", "text": "Bays are allocated by the block manager."},
        ]},
        {"id": "doc-park-wales", "org": "lets", "title": "Wales Parking Rules", "sections": [
            {"id": "doc-park-wales-s1", "heading": "Wales visitor parking permits for flats",
             "text": "How many visitor parking permits do we issue for a flat: three visitor parking permits for every flat."},
            {"id": "doc-park-wales-s2", "heading": "Bays", "text": "Bays are shared between the flats."},
        ]},
    ],
}


def test_sections_on_the_same_topic_match_when_headings_differ_by_the_qualifier(tmp_path, embedder, heuristic: None) -> None:  # type: ignore[no-untyped-def]
    """"Wales visitor parking permits for flats" in "Wales Parking Rules" is the regional version of
    "Visitor parking permits" in "Parking Rules": what the headings share once the titles' qualifier is
    set aside. (On the cosine rules, so that the Welsh section, the question's nearest, is the pick.)"""
    with dossier.open(f"sqlite:///{tmp_path}/park.db", embedder=embedder) as engine:
        engine.load_bundle(PARKING)
        asked = "How many visitor parking permits do we issue for a flat in {}?"
        bristol = engine.retrieve({"mode": "scout", "message": asked.format("Bristol")}, org="lets", caller="ops")
        assert ids(bristol, "documents")[0] == "doc-park-s1"
        assert bristol.route["documents"].detail["generals"] == [["doc-park-wales-s1", "doc-park-s1"]]
        swansea = engine.retrieve({"mode": "scout", "message": asked.format("Swansea")}, org="lets", caller="ops")
        assert ids(swansea, "documents")[0] == "doc-park-wales-s1"


def test_region_words_name_the_regions_of_the_places_a_text_names() -> None:
    assert {"middle", "east", "emea"} <= region_words("Our Doha hotel had a no-show")
    assert {"eu", "emea"} <= region_words("a Rotterdam import") and "eu" not in region_words("a customer in Oslo")
    assert "eu" not in region_words("a shipment to London") and "uk" in region_words("a shipment to London")
    # a large city names its state or province too; a state's generic words ("new") name nothing
    assert {"ontario", "canada"} <= region_words("a patient in Toronto")
    assert {"california", "us"} <= region_words("a San Diego patient") and "texa" not in region_words("San Diego")
    assert "jersey" in region_words("officials in New Jersey") and "new" not in region_words("officials in New Jersey")
    assert "nsw" in region_words("our Sydney office") and "wales" not in region_words("New South Wales")
    assert "california" in region_words("she moved to California")
    assert "apac" in region_words("crushed cartons in Singapore")
    assert "us" in region_words("officials in New Jersey") and "latam" in region_words("a trip to South America")
    assert "us" not in region_words("a trip to South America")  # the longest name wins
    assert region_words("Can you send us the refund rules?") == frozenset()  # "us" the word names no place
    assert {"wales", "uk"} <= region_words("a flat in Cardiff") and "scotland" not in region_words("a flat in Cardiff")
    assert {"scotland", "uk"} <= region_words("our Glasgow office") and {"england", "uk"} <= region_words("in Leeds")


def test_sibling_qualifier_from_the_record(fresh_engine: dossier.Engine) -> None:
    # Globex's region property is EMEA: the regional guideline answers for it without the word EMEA
    # (its section scores 0.40 against the general 0.57 here, so the ratio is set to let it through)
    t = fresh_engine.settings.thresholds
    fresh_engine.org_settings["northwind"] = fresh_engine.settings.replace(thresholds=dataclasses.replace(t, sibling_ratio=0.7))
    body = {"mode": "scout", "message": "What are the volume discount bands?", "sources": {"memories": False, "properties": False}}
    assert ids(fresh_engine.retrieve(body, org="northwind", caller="ana"), "documents")[0] == "doc-pricing-s2"
    response = fresh_engine.retrieve({**body, "record": {"website": "globex.com"}}, org="northwind", caller="ana")
    assert ids(response, "documents")[0].startswith("doc-pricing-emea")


def test_low_confidence_fallback_and_nothing_below_the_floors(fresh_engine: dossier.Engine, heuristic: None) -> None:
    t = fresh_engine.settings.thresholds
    strict = dataclasses.replace(t, selector_floor=0.99, clear_winner=0.99, supplementary=0.99)
    fresh_engine.org_settings["northwind"] = fresh_engine.settings.replace(thresholds=strict)
    response = scout(fresh_engine, "How long do we keep customer data after the contract ends?")
    items = response.sources["documents"].items
    assert len(items) == 1 and items[0].confidence == "low"
    assert response.route["documents"].detail["fallback"] == "best_candidate_low"
    nothing = dataclasses.replace(strict, fallback_low=0.99, fallback_last=0.99)
    fresh_engine.org_settings["northwind"] = fresh_engine.settings.replace(thresholds=nothing)
    assert scout(fresh_engine, "How long do we keep customer data after the contract ends?").sources["documents"].items == []


def test_fetch_with_a_message_ranks_sections_without_one_returns_whole_documents(sample_engine: dossier.Engine) -> None:
    ranked = sample_engine.retrieve({"fetch": ["doc-refund"], "message": "How long is the refund window?"},
                                    org="northwind", caller="ana")  # fmt: skip
    assert ranked.route["documents"].detail["ranked"] is True and ranked.route["documents"].backend == "hybrid"
    assert ids(ranked, "documents")[0] == "doc-refund-s3"  # the refund window section, ranked first
    whole = sample_engine.retrieve({"fetch": ["doc-refund"], "budget": {"totalTokens": 50_000}}, org="northwind", caller="ana")
    document = sample_engine.store.get_documents(["doc-refund"], org="northwind")[0]
    assert ids(whole, "documents") == [s.id for s in document.sections]


def test_fetch_is_visibility_checked(sample_engine: dossier.Engine) -> None:
    fetch = ["doc-commission", "doc-redlines", "doc-sys-agent", "doc-note-acme", "b-doc-pricing", "doc-refund"]
    response = sample_engine.retrieve({"fetch": fetch, "trace": True, "budget": {"totalTokens": 50_000}}, org="northwind", caller="ana")
    returned = {i.document_id for i in response.sources["documents"].items}
    assert returned == {"doc-refund"}
    # what the caller may not see reads as not found, like an unknown id (test_trace_visibility.py)
    assert response.route["documents"].detail["not_found"] == fetch[:-1]
    assert {t.id for t in response.trace or []} <= {s.id for s in sample_engine.store.get_documents(["doc-refund"], org="northwind")[0].sections}
    legal = sample_engine.retrieve({"fetch": ["doc-redlines"]}, org="northwind", caller="carla")
    assert {i.document_id for i in legal.sources["documents"].items} == {"doc-redlines"}


def test_attached_document_only_with_its_record(sample_engine: dossier.Engine) -> None:
    question = "What is the account plan and next steps for Acme?"
    org_wide = scout(sample_engine, question)
    assert not any(i.document_id == "doc-note-acme" for i in org_wide.sources["documents"].items)
    about_acme = scout(sample_engine, question, record={"website": "acme.com"})
    assert any(i.document_id == "doc-note-acme" for i in about_acme.sources["documents"].items)


def test_filter_mode_returns_documents_matching_filters(sample_engine: dossier.Engine) -> None:
    response = sample_engine.retrieve({"filters": {"tags": ["pricing"]}, "budget": {"totalTokens": 50_000}}, org="northwind", caller="ana")
    assert response.mode == "filter"
    docs = {i.document_id for i in response.sources["documents"].items}
    assert "doc-pricing" in docs and "doc-commission" not in docs  # finance-only stays hidden
    for doc in sample_engine.store.get_documents(sorted(docs), org="northwind"):
        assert "pricing" in doc.tags


def test_an_unnamed_sibling_gives_way_without_the_ranker_too(tmp_path, embedder, heuristic: None) -> None:  # type: ignore[no-untyped-def]
    with dossier.open(f"sqlite:///{tmp_path}/lets.db", embedder=embedder) as engine:
        engine.load_bundle(DEPOSITS)
        asked = "For a flat let on a new contract in {}, what is the most deposit we would take?"
        bristol = engine.retrieve({"mode": "scout", "message": asked.format("Bristol")}, org="lets", caller="ops")
        assert ids(bristol, "documents")[0] == "doc-dep-s1"
        cardiff = engine.retrieve({"mode": "scout", "message": asked.format("Cardiff")}, org="lets", caller="ops")
        assert ids(cardiff, "documents")[0] == "doc-dep-wales-s1"


CODES = {
    "orgs": [{"id": "fix", "name": "Fix Co"}],
    "callers": [{"id": "ops", "org": "fix", "roles": ["ops"]}],
    "documents": [
        {"id": "doc-a-contractors", "org": "fix", "title": "Contractor Spend Limits", "sections": [
            {"id": "doc-a-contractors-s1", "heading": "Emergency spend",
             "text": "Contractors may spend up to 500 pounds without approval on a P1 job."},
        ]},
        {"id": "doc-b-damp", "org": "fix", "title": "Damp and Mould", "sections": [
            {"id": "doc-b-damp-s1", "heading": "Triage", "text": "Mould with a leak is logged as P1, otherwise P3."},
        ]},
        {"id": "doc-z-repairs", "org": "fix", "title": "Repairs Procedure", "sections": [
            {"id": "doc-z-repairs-s1", "heading": "Priority levels and response times",
             "text": "Response times for repairs: P1 within 4 hours, P2 within 3 days, P3 within 20 working days."},
        ]},
    ],
}


def test_sections_holding_the_questions_code_keep_the_rankers_order(tmp_path, embedder, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every section holding an exact code of the question is lifted above the pick thresholds, in the
    ranker's order among themselves: not a tie broken by section id. (A section model that reads the cosine
    alone and rates every candidate below 0.9, written as a model file, makes the ranker's order the
    cosine's.)"""
    import json

    from dossier.evaluation.fit import ranker_file
    from dossier.pipeline.features import MEMORY_FEATURES, SECTION_FEATURES

    def model(features: tuple[str, ...]) -> dict:
        coef = [4.0 if f == "cosine" else 0.0 for f in features]
        return {"features": list(features), "mean": [0.0] * len(features), "scale": [1.0] * len(features),
                "coef": coef, "intercept": -4.0, "thresholds": {"first_pick": 0.5, "other_pick": 0.5}}  # fmt: skip

    path = tmp_path / "cosine-ranker.json"
    path.write_text(json.dumps(ranker_file({"sections": model(SECTION_FEATURES), "memories": model(MEMORY_FEATURES)})))
    monkeypatch.setenv(FILE_ENV, str(path))
    with dossier.open(f"sqlite:///{tmp_path}/codes.db", embedder=embedder) as engine:
        engine.load_bundle(CODES)
        response = engine.retrieve({"mode": "scout", "message": "What are the response times for P1 and P2 repairs?",
                                    "trace": True}, org="fix", caller="ops")  # fmt: skip
        cosine = {t.id: t.score for t in response.trace if t.source == "documents" and t.layer == "recall"}
    assert response.route["documents"].detail["ranker"].startswith("shipped:")
    returned = ids(response, "documents")
    assert set(returned) == set(cosine)  # all three hold "p1": all lifted, all picked
    assert returned == sorted(cosine, key=lambda section: -cosine[section])  # in the model's (the cosine's) order
    assert returned != sorted(cosine)  # which here is not the order of their ids
