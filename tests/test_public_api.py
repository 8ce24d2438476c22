"""The public surface: what ``import dossier`` offers, and how it refuses bad configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

import dossier
import dossier.errors


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert dossier.__all__ == sorted(dossier.__all__)
    assert len(set(dossier.__all__)) == len(dossier.__all__)
    for name in dossier.__all__:
        assert getattr(dossier, name) is not None, name


def test_every_error_is_in_the_tree_and_drawn_in_its_docstring() -> None:
    errors = [getattr(dossier, n) for n in dossier.__all__ if isinstance(getattr(dossier, n), type)
              and issubclass(getattr(dossier, n), Exception)]  # fmt: skip
    assert dossier.OrgRequired in errors and dossier.MissingExtra in errors
    for error in errors:
        assert issubclass(error, dossier.DossierError)
        assert error.__name__ in (dossier.errors.__doc__ or ""), error
    assert issubclass(dossier.MissingExtra, dossier.ConfigError)
    assert issubclass(dossier.BundleError, dossier.UsageError) and issubclass(dossier.OrgRequired, dossier.UsageError)


@pytest.mark.parametrize(
    "url", ["mysql://localhost/db", "sqlite:/relative.db", "sqlite://relative.db", "sqlite:///", "file:///tmp/x.db", "dossier.db"]
)
def test_open_with_an_unknown_or_malformed_url_is_a_config_error(url: str) -> None:
    with pytest.raises(dossier.ConfigError):
        dossier.open(url)


def test_open_postgres_without_a_server_is_store_unavailable() -> None:
    # port 9 on loopback: nothing listens there, so the error is immediate and names the store
    with pytest.raises(dossier.StoreUnavailable, match="PostgreSQL"):
        dossier.open("postgresql://127.0.0.1:9/dossier?connect_timeout=2")


def test_open_sqlite_creates_the_file_and_closes(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "nested" / "d.db"
    with dossier.open(f"sqlite:///{path}", embedder=embedder) as engine:
        assert isinstance(engine, dossier.Engine)
        report = engine.load_bundle({"orgs": [{"id": "acme"}]})
        assert isinstance(report, dossier.LoadReport) and report.inserted == {"orgs": 1}
    assert path.exists()
    with dossier.open(f"sqlite:///{path}", embedder=embedder) as engine:
        assert engine.store.get_org(org="acme") == dossier.Org(id="acme")


def test_a_store_refuses_vectors_of_another_embedder(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/d.db"
    with dossier.open(url, embedder=embedder) as engine:
        engine.load_bundle({"orgs": [{"id": "acme"}]})
    with dossier.open(url) as engine:
        engine.store.bind_embedder(embedder.model_id, embedder.dimensions)  # the same model: fine
        with pytest.raises(dossier.SchemaMismatch):
            engine.store.bind_embedder("openai:text-embedding-3-small", 1536)
