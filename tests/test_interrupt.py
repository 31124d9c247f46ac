"""A real Ctrl-C (SIGINT from another process) while ``C="auto"`` cross-validates.

The fit runs in a child process.  A watcher thread in the child reports on stderr the moment the
solver's own SIGINT handler is installed, i.e. once a cross-validation fold is iterating, and the
test then sends SIGINT with ``os.kill``.  On two threads the folds run side by side and the handler
is their parallel region's, which every fold (on the main thread or a helper) listens to.  The folds
run ``max_iter=10**7`` iterations (hours): only the interrupt ends the fit within the test's timeout,
so a SIGINT that is lost or ignored fails the test instead of passing it by luck.

Promised behaviour (``MWUMKLClassifier.fit``, ``mwu.solve``): the fold stops at the end of its
iteration, a half-run fold never scores a candidate ``C``, and the fit raises ``FitInterrupted``
("interrupted while choosing C ...") leaving no model; the CLI exits with 130 and saves nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

REPO = Path(__file__).resolve().parents[1]
SOLVING = "MARKER: the solver's SIGINT handler is installed"

#: Run first in the child: announces on stderr when ``mwu.solve`` takes over SIGINT (it restores the
#: previous handler when it returns, so this is exactly "a fit is iterating").
WATCHER = textwrap.dedent(
    f"""
    import signal, sys, threading, time

    def _announce_solving():
        while signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            time.sleep(0.005)
        print({SOLVING!r}, file=sys.stderr, flush=True)

    threading.Thread(target=_announce_solving, daemon=True).start()
    """
)

FIT = textwrap.dedent(
    """
    import json, signal, sys, time
    import numpy as np
    from sklearn.exceptions import NotFittedError
    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.solvers.mwu import FitInterrupted

    X, y = np.load(sys.argv[1]), np.load(sys.argv[2])
    clf = MWUMKLClassifier(kernels="paper", max_iter=10**7)  # C="auto": cross-validation first
    report = {}
    try:
        clf.fit(X, y)
        report["outcome"] = "fitted"
    except FitInterrupted as exc:
        report.update(outcome="FitInterrupted", message=str(exc))
    except KeyboardInterrupt:
        report["outcome"] = "KeyboardInterrupt"
    report["stopped_at"] = time.monotonic()
    try:
        clf.predict(X)
        report["predicts"] = True
    except NotFittedError:
        report["predicts"] = False
    report["model_attributes"] = sorted(
        a for a in ("C_", "C_path_", "kernel_weights_", "dual_coef_", "support_", "n_iter_") if hasattr(clf, a)
    )
    report["handler_restored"] = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    print(json.dumps(report), flush=True)
    """
)

CLI = textwrap.dedent(
    """
    import runpy, sys
    sys.argv = ["mwumkl-dist", *sys.argv[1:]]
    runpy.run_module("mwumkl_dist", run_name="__main__", alter_sys=True)
    """
)


def _data(tmp_path, n=300, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(X[:, 0] + X[:, 1] + 0.3 * rng.standard_normal(n) > 1.0, 1, -1)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "train.npy", np.column_stack([X, y]))
    return X, y


def _interrupt_once_solving(args, marker_timeout=120, exit_timeout=60, threads=None):
    """Start ``python -c WATCHER + script args``, SIGINT it once a fold iterates; ``(rc, out, err, sent_at)``.

    ``threads``: the child's ``MWUMKL_NUM_THREADS`` (2: the folds run side by side, on helper threads too).
    """
    env = dict(os.environ) if threads is None else {**os.environ, "MWUMKL_NUM_THREADS": str(threads)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WATCHER + args[0], *map(str, args[1:])],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # readline() blocks: a child that never reaches the solver must fail the test, not hang it.
    watchdog = threading.Timer(marker_timeout + exit_timeout, proc.kill)
    watchdog.start()
    err_lines = []
    try:
        while True:
            line = proc.stderr.readline()
            if not line:
                out, err = proc.communicate(timeout=exit_timeout)
                pytest.fail(
                    f"the child ended (rc {proc.returncode}) before its fit iterated:\n{''.join(err_lines)}{err}"
                )
            err_lines.append(line)
            if SOLVING in line:
                break
        sent_at = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=exit_timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the child still ran {exit_timeout} s after SIGINT: the interrupt was lost or ignored")
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, "".join(err_lines) + err, sent_at


@pytest.mark.timeout(240)
@pytest.mark.parametrize("threads", [1, 2])
def test_sigint_while_choosing_C_raises_fit_interrupted_and_fits_nothing(tmp_path, threads):
    _data(tmp_path)
    rc, out, err, sent_at = _interrupt_once_solving([FIT, tmp_path / "X.npy", tmp_path / "y.npy"], threads=threads)
    assert rc == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["outcome"] == "FitInterrupted", (report, err)
    assert report["message"] == "interrupted while choosing C by cross-validation; nothing was fitted"
    # No half-fitted model: nothing to predict with, no chosen C, no path of half-scored candidates.
    assert report["predicts"] is False
    assert report["model_attributes"] == []
    # The solver gave SIGINT back, and stopped at the end of an iteration (not after 10^7 of them).
    assert report["handler_restored"] is True
    assert report["stopped_at"] - sent_at < 30
    assert "Traceback" not in err


@pytest.mark.timeout(240)
def test_cli_sigint_while_choosing_C_exits_130_and_saves_nothing(tmp_path):
    _data(tmp_path)
    model = tmp_path / "model.npz"
    args = ["fit", "--data", tmp_path / "train.npy", "--model", model, "--max-iter", 10**7]  # --C auto: the default
    rc, out, err, _ = _interrupt_once_solving([CLI, *args])
    assert rc == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("mwumkl-dist: error: ") and "interrupted while choosing C" in last, err
    assert "nothing saved" in last
    assert not model.exists()
