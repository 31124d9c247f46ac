"""Shared test helpers: explicit numpy kernel formulas, independent of the library's numba code."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

# A suite started in the background by a shell without job control (``nohup python -m pytest ... &``) inherits
# SIGINT ignored, and so would every process it starts: the tests of Ctrl-C (in process and in children) need it
# delivered, as in a terminal or CI.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def explicit_kernel(spec, X, Z=None):
    """The raw kernel matrix ``K(X, Z)`` of a library kernel spec, by the textbook formula.

    Only the spec's parameters are read (``degree``, ``coef0``, ``sigma``,
    ``features``); the values come from plain numpy on dense copies.
    """
    X = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    Z = X if Z is None else (Z.toarray() if sp.issparse(Z) else np.asarray(Z, dtype=np.float64))
    if spec.features is not None:
        X, Z = X[:, list(spec.features)], Z[:, list(spec.features)]
    name = type(spec).__name__
    if name == "Linear":
        return X @ Z.T
    if name == "Polynomial":
        return (X @ Z.T + spec.coef0) ** spec.degree
    if name == "Gaussian":
        d2 = ((X[:, None, :] - Z[None, :, :]) ** 2).sum(axis=2)
        return np.exp(-d2 / (2.0 * spec.sigma**2))
    raise AssertionError(f"no explicit formula for {spec!r}")


def explicit_kernels(specs, X, Z=None):
    """``(m, n_X, n_Z)`` stack of :func:`explicit_kernel`."""
    return np.stack([explicit_kernel(s, X, Z) for s in specs])


#: The MWU algorithm alone, at the estimator's former defaults: no cross-validated ``C`` or selectivity, no
#: exact polish, the paper's exponents.  Tests of the solver (brute-force reference, identities, invariances,
#: sharding, stores) pass these explicitly, so they test the algorithm and not ``C="auto"`` / ``polish="auto"``
#: (19 extra fits each); the relative exponents are tested against the same references in test_exact_mkl.py.
LITERAL = {"C": 100.0, "epsilon": 0.2, "polish": False, "selectivity": "paper"}


def literal(**params):
    """:data:`LITERAL` with ``params`` on top, for ``MWUMKLClassifier(**literal(epsilon=0.3))``."""
    return {**LITERAL, **params}


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released): connections are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def record_nested_fits(monkeypatch) -> list:
    """Record every nested fit (cross-validation folds, the two-stage weight stage) as
    ``(spec as a dict, n_samples, sample_weight)`` (the model's settings and the execution's options in one flat
    dict); the outer ``fit`` itself is not recorded."""
    from dataclasses import asdict

    from mwumkl_dist.solvers import driver

    calls = []
    fit_model = driver.fit_model

    def spy(spec, data, **kwargs):
        weights = kwargs.get("sample_weight")
        flat = {**asdict(spec.model), **asdict(spec.execution)}
        calls.append((flat, data.n_samples, None if weights is None else np.array(weights)))
        return fit_model(spec, data, **kwargs)

    monkeypatch.setattr(driver, "fit_model", spy)
    return calls


def one_line_error(capsys, argv, code: int = 1) -> str:
    """Run the CLI on ``argv``: its exit code is ``code`` and stderr one line of at most 200 characters; that line."""
    from mwumkl_dist.cli import main

    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("mwumkl-dist: error: ") and len(err) <= 200, (len(err), err)
    return err


def start_cluster(address_file, cwd, **popen) -> subprocess.Popen:
    """``mwumkl-dist cluster`` with two one-thread workers on a free port, its address written to ``address_file``
    (its output in pipes, no stdin; ``popen``: more of :class:`subprocess.Popen`'s arguments)."""
    argv = [sys.executable, "-m", "mwumkl_dist", "cluster", "--workers", "2", "--threads-per-worker", "1", "--port",
            "0", "--address-file", str(address_file)]  # fmt: skip
    return subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, **popen)  # fmt: skip


@pytest.fixture(scope="module")
def two_worker_client():
    """An in-process Dask client of two one-thread workers, shared by a module's tests."""
    import distributed

    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0") as client:
        yield client


@pytest.fixture
def fold_selectivities(monkeypatch) -> list:
    """The selectivity (or the search candidate) of every fold fit the automatic choices and Platt's folds run, in
    order (a spy on ``auto.fold_spec``)."""
    from mwumkl_dist.solvers import auto

    seen = []
    fold_spec = auto.fold_spec

    def spy(spec, **kwargs):
        seen.append(kwargs["candidate"] if kwargs.get("candidate") is not None else kwargs.get("selectivity"))
        return fold_spec(spec, **kwargs)

    monkeypatch.setattr(auto, "fold_spec", spy)
    return seen


@pytest.fixture(autouse=True)
def _ctrl_c_stops_pytest(monkeypatch):
    """One Ctrl-C stops the test run: a fit in a test does not take it as its own request to stop (a test of
    that request sets ``threads._CTRL_C_ASKS_TO_STOP`` back; fits in child processes keep it)."""
    from mwumkl_dist.devices import threads

    monkeypatch.setattr(threads, "_CTRL_C_ASKS_TO_STOP", False)


@pytest.fixture(autouse=True)
def _idle_machine_for_the_default_threads(monkeypatch):
    """Tests see no other process's load: the default thread count is every core (tests of the load patch it)."""
    from mwumkl_dist.devices import threads

    monkeypatch.setattr(threads, "_PROC_STAT", "/nonexistent/proc/stat")
    monkeypatch.setattr(threads, "_busy_cache", [])


@pytest.fixture(autouse=True)
def _stores_out_of_core(monkeypatch):
    """The suite's stores are small: a fit would read them into memory (``read_into_memory``) and the tests of the
    store path (shards reading their own rows) would test the in-memory fit instead. They stay out of core here,
    and in the command lines the tests start; tests of the default (tests/test_new_user.py) remove the setting."""
    monkeypatch.setenv("MWUMKL_STORE_IN_MEMORY_BYTES", "0")


def _no_worker_profiler():
    """In-process Dask workers do not sample every thread's stack (``sys._current_frames()`` every 10 ms).

    On CPython 3.11 that call holds the runtime's thread-list lock while it allocates frame objects; a
    garbage collection there that runs a finalizer needing the same lock deadlocks the whole process
    (python/cpython#106883), and one full-suite run hung so: a Dask worker thread stuck in
    ``Thread.start`` for minutes.  The suite's in-process clusters therefore run without the profiler.
    """
    try:
        import dask
    except ImportError:  # pragma: no cover - dask is a dependency
        return
    dask.config.set({"distributed.worker.profile.enabled": False})


_no_worker_profiler()
