"""The Store protocols at the type level: a read or a search without an org does not type-check, whether the
caller holds the whole ``Store`` or only the part it needs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mypy import api

CALLER = """\
    import numpy as np

    from dossier.stores.base import Store, StoreReader, StoreSearcher


    def without_org(store: Store, reader: StoreReader, searcher: StoreSearcher) -> None:
        store.recent_memories(["r1"], limit=5)
        reader.recent_memories(["r1"], limit=5)
        searcher.search_vectors("memory", np.zeros(3), limit=5)


    def with_org(store: Store, reader: StoreReader, searcher: StoreSearcher) -> None:
        store.recent_memories(["r1"], org="acme", limit=5)
        reader.recent_memories(["r1"], org="acme", limit=5)
        searcher.search_vectors("memory", np.zeros(3), org="acme", limit=5)
        store.search_vectors("memory", np.zeros(3), org="acme", limit=5)
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
    assert errors == [  # the method is named with the protocol part that declares it
        f'{source}:7: error: Missing named argument "org" for "recent_memories" of "StoreReader"  [call-arg]',
        f'{source}:8: error: Missing named argument "org" for "recent_memories" of "StoreReader"  [call-arg]',
        f'{source}:9: error: Missing named argument "org" for "search_vectors" of "StoreSearcher"  [call-arg]',
    ], stdout


def test_a_viewer_and_the_restricted_index_apply_the_visibility_rule() -> None:
    """The stores judge restricted documents for their full-text statistics with ``Viewer.may_see``: the one
    rule (``pipeline.visibility.verdict``) for every kind of restriction, role and record; the index grouped
    by attached record answers what judging each document would."""
    from itertools import product

    from dossier.pipeline.visibility import verdict
    from dossier.stores.base import DocumentAccess, RestrictedIndex, Viewer

    documents = [
        DocumentAccess(id=f"d{n}", org="acme", is_system=system, visible_to_roles=roles, attached_record=record)
        for n, (system, roles, record) in enumerate(product(
            (False, True), (None, (), ("sales",), ("legal", "sales"), ("legal",)), (None, "r-jane", "r-bob")))
    ]  # fmt: skip
    index = RestrictedIndex((d.id, d.is_system, d.visible_to_roles, d.attached_record) for d in documents)
    for roles, records in product(((), ("sales",), ("legal",), ("sales", "support")), ((), ("r-jane",), ("r-jane", "r-old"))):
        viewer = Viewer(roles=frozenset(roles), record_ids=frozenset(records))
        rule = {d.id for d in documents if verdict(d, org="acme", roles=roles, record_ids=records) is None}
        assert {d.id for d in documents if viewer.may_see(d)} == rule
        assert index.shown(viewer) == rule and index.shown(viewer) == rule  # answered again from what it kept
    assert index.keys == {d.id for d in documents}
