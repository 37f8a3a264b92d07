"""Calls that tests/integration/test_joblib.py runs through joblib on a pool."""

from __future__ import annotations

import os
import pickle
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
from joblib import Parallel, delayed, parallel_config

from tests.support.sample_tasks import gated


def fits() -> tuple[Any, ...]:
    from sklearn.datasets import make_classification
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.model_selection import GridSearchCV, cross_val_score
    from sklearn.svm import SVC

    X, y = make_classification(n_samples=200, n_features=8, random_state=0)
    scores = cross_val_score(SVC(), X, y, cv=4, n_jobs=-1)
    grid = {"C": [0.1, 1, 10], "gamma": ["scale", 0.1]}
    search = GridSearchCV(SVC(), grid, cv=3, n_jobs=-1).fit(X, y)
    forest = RandomForestClassifier(n_estimators=12, random_state=0, n_jobs=-1)
    probabilities = forest.fit(X, y).predict_proba(X[:20])
    results = search.cv_results_["mean_test_score"]
    return (
        scores.tolist(),
        search.best_params_,
        results.tolist(),
        probabilities.tolist(),
    )


def print_fits() -> None:
    """:func:`fits` on joblib's default backend (loky), pickled to stdout."""
    sys.stdout.buffer.write(pickle.dumps(fits()))


def counted(directory: str, index: int, gate: str) -> int:
    """Note that call ``index`` runs (a file), and how many ran at once when
    it began; wait for ``gate``; note its end (before it returns, so that
    the next call to begin never counts it)."""
    here = Path(directory)
    (here / f"start-{index}").touch()
    running = len(list(here.glob("start-*"))) - len(list(here.glob("end-*")))
    # (Listed starts then ends: a call that starts and ends in between is
    # not counted, so this may say fewer than ran, even below 0, never more.)
    (here / f"seen-{index}_{running}").touch()
    gated(gate, index)
    (here / f"end-{index}").touch()
    return index


def fails_first(directory: str, index: int, gate: str) -> int:
    """Call 0 raises at once; the others note that they began, then wait
    for ``gate``."""
    if index == 0:
        raise ValueError("call 0 fails")
    (Path(directory) / f"start-{index}").touch()
    return gated(gate, index)


def dies_once(marker: str, index: int) -> int:
    """The first call to get here SIGKILLs its own worker (leaving
    ``marker``); every later one, and that call run again, returns."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return index * index
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def inner_backends() -> tuple[str, str, list[int]]:
    """The backend a Parallel inside a task runs on, unless told otherwise,
    and when told; and what the inner one computes."""
    inner = Parallel(n_jobs=2)
    with parallel_config(backend="threading"):
        told = type(Parallel(n_jobs=2)._backend).__name__
    return (
        type(inner._backend).__name__,
        told,
        inner(delayed(abs)(-i) for i in range(3)),
    )


def total_when(gate: str, a: np.ndarray) -> float:
    """``a.sum()`` once ``gate`` exists."""
    gated(gate, 0)
    return float(a.sum())
