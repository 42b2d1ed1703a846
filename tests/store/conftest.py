"""Every test here runs against SQLite and against a real PostgreSQL server (``store_backend``)."""

import pytest


@pytest.fixture(autouse=True)
def _both_backends(store_backend: str) -> str:
    return store_backend
