"""The Store protocol at the type level: a read without an org does not type-check."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mypy import api

CALLER = """\
    from dossier.stores.base import Store


    def without_org(store: Store) -> None:
        store.recent_memories(["r1"], limit=5)


    def with_org(store: Store) -> None:
        store.recent_memories(["r1"], org="acme", limit=5)
"""


@pytest.mark.slow  # runs mypy
def test_mypy_refuses_a_read_without_org(tmp_path: Path) -> None:
    source = tmp_path / "caller.py"
    source.write_text(textwrap.dedent(CALLER))
    stdout, stderr, status = api.run(
        [str(source), "--no-incremental", "--cache-dir", str(tmp_path / ".mypy_cache"), "--follow-imports", "silent",
         "--no-error-summary", "--hide-error-context", "--show-error-codes"]
    )  # fmt: skip
    errors = [line for line in stdout.splitlines() if ": error:" in line]
    assert status == 1, stdout + stderr
    assert errors == [
        f'{source}:5: error: Missing named argument "org" for "recent_memories" of "Store"  [call-arg]'
    ], stdout
