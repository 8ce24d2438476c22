"""The stores stand below the loader and the layers: no module of ``dossier.stores`` imports either, read
from the source with ``ast`` (module level, inside functions and under ``TYPE_CHECKING`` alike)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

STORES = Path(__file__).resolve().parents[2] / "src" / "dossier" / "stores"
FORBIDDEN = ("dossier.loading", "dossier.layers")


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports made absolute (``from X import y`` counts X and X.y)."""
    package = ["dossier", "stores"]  # every file here, __init__.py included, resolves relative imports from it
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            target = ".".join(part for part in (base, node.module or "") if part)
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def forbidden_in(path: Path) -> list[str]:
    return sorted(m for m in imported_modules(path) if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))


def test_the_check_sees_relative_function_level_and_absolute_imports(tmp_path: Path) -> None:
    source = tmp_path / "example.py"
    source.write_text(
        "import dossier.layers.plan\n"
        "from .. import loading\n"
        "from .base import Store\n"
        "def f():\n"
        "    from ..layers import budget\n"
        "    from ..loading import content_hash\n"
    )
    assert forbidden_in(source) == [
        "dossier.layers", "dossier.layers.budget", "dossier.layers.plan", "dossier.loading",
        "dossier.loading.content_hash",
    ]  # fmt: skip
    assert "dossier.stores.base" in imported_modules(source)


@pytest.mark.parametrize("path", sorted(STORES.glob("*.py")), ids=lambda p: p.name)
def test_a_store_module_imports_neither_the_loader_nor_the_layers(path: Path) -> None:
    assert forbidden_in(path) == []
