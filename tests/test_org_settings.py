"""An org's stored settings, on both stores: stored settings are merged into what is stored (a calibration
keeps the service limits and the reverse), every value is checked before anything is stored, a stored
row that cannot be read is one clear error, and a running engine picks up what another process stores."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import dossier
from dossier.errors import ConfigError

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample-org.json"


def test_stored_settings_merge_group_by_group_and_replace_on_request(store_url: str, embedder: Any) -> None:
    with dossier.open(store_url, embedder=embedder) as engine:
        engine.save_org_settings("acme", {"service": {"max_deadline_ms": 60_000}, "thresholds": {"clear_winner": 0.6}})
        engine.save_org_settings("acme", {"thresholds": {"supplementary": 0.7}, "max_picks": 2})
        assert engine.store.get_settings(org="acme") == {
            "service": {"max_deadline_ms": 60_000}, "thresholds": {"clear_winner": 0.6, "supplementary": 0.7}, "max_picks": 2}
        settings = engine.settings_for("acme")
        assert (settings.service.max_deadline_ms, settings.thresholds.clear_winner, settings.max_picks) == (60_000, 0.6, 2)
        engine.save_org_settings("acme", {"max_picks": 1}, replace=True)
        assert engine.store.get_settings(org="acme") == {"max_picks": 1}
        assert engine.settings_for("acme").service.max_deadline_ms == engine.settings.service.max_deadline_ms


@pytest.mark.parametrize(("bad", "says"), [
    ({"thresholds": {"clear_winner": "x"}}, "setting thresholds.clear_winner: 'x' is not a valid value"),
    ({"thresholds": {"clear_winner": float("nan")}}, "setting thresholds.clear_winner: nan is not a valid value"),
    ({"max_picks": 2.5}, "setting max_picks: 2.5 is not a valid value"),
    ({"include_stub_edges": 1}, "setting include_stub_edges: 1 is not a valid value"),
    ({"rankers": "garbage"}, "setting rankers: 'garbage' is not a valid value"),
    ({"service": {"colour": 1}}, "unknown setting: service.colour"),
    ({"shares": "half"}, "setting shares: must be an object of settings"),
    ({"semantic_memory_orgs": frozenset({"acme"})}, "setting semantic_memory_orgs: frozenset"),  # not JSON
])  # fmt: skip
def test_a_setting_of_the_wrong_type_is_refused_and_nothing_is_stored(store_url: str, embedder: Any, bad: dict, says: str) -> None:
    with dossier.open(store_url, embedder=embedder) as engine:
        engine.save_org_settings("acme", {"max_picks": 2})
        with pytest.raises(ConfigError, match=says.replace(".", r"\.")):
            engine.save_org_settings("acme", bad)
        assert engine.store.get_settings(org="acme") == {"max_picks": 2}


def test_a_running_engine_reads_what_another_process_stores(store_url: str, embedder: Any) -> None:
    with dossier.open(store_url, embedder=embedder) as server, dossier.open(store_url, embedder=embedder) as other:
        before = server.settings_for("acme").service.max_deadline_ms
        other.save_org_settings("acme", {"service": {"max_deadline_ms": before + 5_000}})
        assert server.settings_for("acme").service.max_deadline_ms == before  # read within settings_ttl: kept
        server.settings_ttl = 0.0  # as once SETTINGS_TTL seconds have passed
        assert server.settings_for("acme").service.max_deadline_ms == before + 5_000
        server.org_settings["acme"] = server.settings  # set on the engine itself: that wins
        assert server.settings_for("acme").service.max_deadline_ms == before


def test_a_stored_settings_row_that_cannot_be_read_is_one_clear_error(tmp_path: Any, embedder: Any) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    with dossier.open(url, embedder=embedder) as engine:
        engine.load_bundle(json.loads(SAMPLE.read_text()))
        engine.save_org_settings("northwind", {"max_picks": 2})
    for row in ("not json", json.dumps({"rankers": "garbage"}), json.dumps({"colour": 1})):
        with sqlite3.connect(f"{tmp_path}/s.db") as db:  # a row written by hand
            db.execute("UPDATE org_settings SET settings = ? WHERE org = 'northwind'", (row,))
        with dossier.open(url, embedder=embedder) as engine:
            with pytest.raises(ConfigError, match="the stored settings of org 'northwind' are not valid"):
                engine.retrieve({"message": "What discount rules apply?"}, org="northwind", caller="ana")
            assert engine.retrieve({"message": "What discount rules apply?"}, org="southwind", caller="zoe").mode


def test_whole_numbers_are_float_settings_however_large_and_a_bad_row_is_replaced(tmp_path: Path, embedder: Any) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    with dossier.open(url, embedder=embedder, settings=dossier.Settings(filter_timeout=5)) as engine:
        engine.save_org_settings("acme", {"filter_timeout": 2.5, "thresholds": {"clear_winner": 1}})  # a float, an int
        engine.save_org_settings("acme", {"external_timeout": 10**400})
        assert engine.settings_for("acme").thresholds.clear_winner == 1
    with sqlite3.connect(f"{tmp_path}/s.db") as db:
        db.execute("UPDATE org_settings SET settings = 'not json' WHERE org = 'acme'")
    with dossier.open(url, embedder=embedder) as engine:  # the fix settings_for's error names: store valid ones
        engine.save_org_settings("acme", {"max_picks": 2})
        assert engine.store.get_settings(org="acme") == {"max_picks": 2} and engine.settings_for("acme").max_picks == 2


def test_rankers_are_merged_by_ranker(store_url: str, embedder: Any) -> None:
    with dossier.open(store_url, embedder=embedder) as engine:
        engine.save_org_settings("acme", {"rankers": {"memories": {"features": ["a"], "coef": [1.0]}}})
        engine.save_org_settings("acme", {"rankers": {"sections": {"features": ["b"], "coef": [2.0]}}})
        assert set(engine.store.get_settings(org="acme")["rankers"]) == {"memories", "sections"}
