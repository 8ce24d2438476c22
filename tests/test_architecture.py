"""The import rules between the package's floors (docs/architecture.md), read from the source with ``ast``.

Every import counts: at module level, inside functions and under ``TYPE_CHECKING`` alike, since each of
them ties one floor to another.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "dossier"

FRONT_ENDS = ("dossier.cli", "dossier.http", "dossier.mcp", "dossier.service", "dossier.client", "dossier.inspector",
              "dossier.integrations")  # fmt: skip
ENGINE = ("dossier.engine", "dossier.retrieve")
#: What a layer or a source may use of the stores: the protocols and the full-text helpers, no backend.
STORE_INTERFACES = ("dossier.stores.base", "dossier.stores.service_base", "dossier.stores.fulltext")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The dossier modules ``path`` imports (``from X import y`` counts X, and X.y when that is a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names if _is_module(f"{target}.{alias.name}"))
    return {m for m in found if m == "dossier" or m.startswith("dossier.")}


def _is_module(name: str) -> bool:
    path = SRC.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def modules_under(prefix: str) -> list[Path]:
    root = SRC.joinpath(*prefix.split("."))
    return sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def is_store_implementation(module: str) -> bool:
    return within(module, ("dossier.stores",)) and not within(module, STORE_INTERFACES)


def violations(prefix: str, forbidden: Callable[[str], bool]) -> list[str]:
    out = []
    for path in modules_under(prefix):
        for imported in sorted(imports_of(path)):
            if forbidden(imported):
                out.append(f"{module_name(path)} imports {imported}")
    return out


def test_the_rules_see_imports() -> None:
    """The parser itself: relative, absolute, function-level and package imports are all found."""
    found = imports_of(PACKAGE / "sources" / "documents.py")
    assert {"dossier.pipeline.call", "dossier.sources", "dossier.stores.base"} <= found
    assert "dossier.stores" in imports_of(PACKAGE / "cli.py")  # an import inside a function (the CLI's are lazy)
    assert violations("dossier.engine", lambda m: within(m, ("dossier.layers",)))  # the engine does use layers


@pytest.mark.parametrize("floor", ["dossier.layers", "dossier.sources", "dossier.pipeline"])
def test_layers_and_sources_never_import_the_engine_a_front_end_or_a_store_backend(floor: str) -> None:
    assert violations(floor, lambda m: within(m, ENGINE + FRONT_ENDS) or is_store_implementation(m)) == []


def test_sources_never_import_layers() -> None:
    assert violations("dossier.sources", lambda m: within(m, ("dossier.layers",))) == []


def test_the_floor_imports_no_layer_and_no_source() -> None:
    """dossier.pipeline is what layers and sources share: it stands below both."""
    assert violations("dossier.pipeline", lambda m: within(m, ("dossier.layers", "dossier.sources"))) == []


def test_stores_never_import_the_loader() -> None:
    assert violations("dossier.stores", lambda m: within(m, ("dossier.loading",))) == []


def test_stores_never_import_layers_sources_or_the_pipeline() -> None:
    floors = ("dossier.layers", "dossier.sources", "dossier.pipeline", "dossier.engine", "dossier.retrieve")
    assert violations("dossier.stores", lambda m: within(m, floors + FRONT_ENDS)) == []


def names_of_the_call(path: Path) -> list[str]:
    """Where ``path`` imports ``Call`` from dossier.pipeline.call or names ``Call`` at all (``x.Call`` included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "Call" for alias in node.names):
            found.append(f"{module_name(path)}:{node.lineno} imports Call")
        elif (isinstance(node, ast.Name) and node.id == "Call") or (isinstance(node, ast.Attribute) and node.attr == "Call"):
            found.append(f"{module_name(path)}:{node.lineno} names Call")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip() == "Call":
            found.append(f"{module_name(path)}:{node.lineno} names Call in a string annotation")
    return found


def test_the_rule_about_the_call_sees_it() -> None:
    assert names_of_the_call(PACKAGE / "layers" / "recall.py")  # the recall layer does take the call
    assert not names_of_the_call(PACKAGE / "pipeline" / "source_io.py")


def test_sources_never_see_the_call() -> None:
    """A source is given a SourceQuery and SourceTools and returns what it found (pipeline/source_io.py);
    only the recall layer writes into the call."""
    assert [hit for path in modules_under("dossier.sources") for hit in names_of_the_call(path)] == []
