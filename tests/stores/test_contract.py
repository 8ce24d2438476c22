"""Runs the Store contract, part by part (tests/stores/contract*.py), against every backend of the ``store`` fixture."""

from tests.stores.contract import StoreContract
from tests.stores.contract_reader import ReaderContract
from tests.stores.contract_searcher import SearcherContract
from tests.stores.contract_writer import WriterContract


class TestReader(ReaderContract):
    """StoreReader."""


class TestSearcher(SearcherContract):
    """StoreSearcher."""


class TestWriter(WriterContract):
    """StoreWriter."""


class TestStore(StoreContract):
    """Across the parts: org isolation, and the parts make up the whole Store."""
