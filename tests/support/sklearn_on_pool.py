"""A pytest plugin that runs a whole session under
``parallel_config(backend="shm-pool", workers=2)``: ``pytest -p
tests.support.sklearn_on_pool --pyargs sklearn...`` runs scikit-learn's
own tests on the pool (:mod:`tests.integration.test_joblib`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from joblib import parallel_config

import pool.joblib


@pytest.fixture(scope="session", autouse=True)
def shm_pool_backend() -> Iterator[None]:
    with parallel_config(backend=pool.joblib.BACKEND, workers=2):
        yield
