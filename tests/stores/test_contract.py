"""Runs the Store contract (tests/stores/contract.py) against every backend of the ``store`` fixture."""

from tests.stores.contract import *  # noqa: F401,F403
