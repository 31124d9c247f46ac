"""What a new user trips over (issue 41): a regression target fitted as hundreds of classes, a store
fitted unlike the same rows in a file, a slow start, ``predict_proba`` without ``probability=True``,
a zero-based svmlight file read silently, a saved structured model's summary.

In process (``main``) with short relative paths, as a user types them, except the start-up checks,
which run ``python -m mwumkl_dist`` as a user does.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import one_line_error, start_cluster
from sklearn.datasets import dump_svmlight_file, load_diabetes

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.cli import main

REPO = Path(__file__).resolve().parents[1]
FAST = ["--C", "10", "--epsilon", "0.4", "--polish", "no"]


# ----------------------------------------------------------------------------- labels that are not classes


def test_a_regression_target_is_refused_naming_the_classes_and_rows():
    X, y = load_diabetes(return_X_y=True)  # 442 rows, whole-number targets: 214 "classes"
    with pytest.raises(ValueError, match=r"214 classes among 442 rows .*labels must be classes"):
        MWUMKLClassifier(C=10, epsilon=0.4, polish=False).fit(X, y.astype(int))


def test_many_classes_with_enough_rows_each_are_fitted():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(12), 4)  # 12 classes of 4 rows: a small but real many-class problem
    X = rng.random((len(y), 3)) + y[:, None]
    clf = MWUMKLClassifier(kernels="linear", C=10, epsilon=0.4, polish=False, selectivity=0).fit(X, y)
    assert len(clf.classes_) == 12


def test_the_cli_refuses_a_regression_target_and_float_labels_naming_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    X, y = load_diabetes(return_X_y=True)
    dump_svmlight_file(X, y.astype(int), "diabetes.svm")
    err = one_line_error(capsys, ["fit", "--data", "diabetes.svm", "--model", "m.npz", *FAST])
    assert "diabetes.svm: 214 classes among 442 rows" in err and "a classifier: labels must be classes" in err
    dump_svmlight_file(X[:50], y[:50] + 0.25, "floats.svm")
    err = one_line_error(capsys, ["fit", "--data", "floats.svm", "--model", "m.npz", *FAST])
    assert "floats.svm: the labels are not classes" in err and "a classifier: labels must be classes" in err
    assert not os.path.exists("m.npz")


# ----------------------------------------------------------------------------- a small store fits like its file


def _cancer_rows(n=300):
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    return X[:n] / X.max(axis=0), y[:n]


def test_a_small_store_is_fitted_like_its_rows_in_memory_polish_included(tmp_path, monkeypatch):
    from mwumkl_dist.stores import write_data_store

    monkeypatch.delenv("MWUMKL_STORE_IN_MEMORY_BYTES")  # the default: a small store is read
    X, y = _cancer_rows()
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=128)
    params = dict(kernels="scaled", C=10.0, epsilon=0.4, selectivity=0)  # polish="auto"
    from_file = MWUMKLClassifier(**params).fit(X, y)
    from_store = MWUMKLClassifier(**params).fit(store)
    assert from_store.polished_ and from_file.polished_
    np.testing.assert_array_equal(from_store.dual_coef_, from_file.dual_coef_)
    np.testing.assert_array_equal(from_store.raw_kernel_weights_, from_file.raw_kernel_weights_)
    assert "then the exact polish (auto: small enough" in from_store.summary()


def test_an_out_of_core_store_fit_gives_the_real_reason_it_is_not_polished(tmp_path, monkeypatch):
    from mwumkl_dist.stores import write_data_store

    monkeypatch.setenv("MWUMKL_STORE_IN_MEMORY_BYTES", "1000")  # smaller than the store: out of core
    X, y = _cancer_rows(120)
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=64)
    clf = MWUMKLClassifier(kernels="linear,gaussian:0.5", C=10.0, epsilon=0.4, selectivity=0).fit(store)
    assert not clf.polished_
    text = clf.summary()
    assert "no exact polish (auto: not available for a fit from a store (the data are not in memory)" in text
    assert "too large" not in text
    clf.save(tmp_path / "m.npz")
    assert MWUMKLClassifier.load(tmp_path / "m.npz").summary() == text
    small = MWUMKLClassifier(kernels="linear", C=10.0, epsilon=0.4, selectivity=0, polish=False).fit(X, y)
    assert "no exact polish (polish=False;" in small.summary()


# ----------------------------------------------------------------------------- start time

HEAVY = ("sklearn", "numba", "dask", "distributed", "numpy", "scipy")
_PROBE = """
import resource, sys
from mwumkl_dist.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))
usage = resource.getrusage(resource.RUSAGE_SELF)
print("RESULT", code, usage.ru_utime + usage.ru_stime, ",".join(heavy) or "-", file=sys.stderr)
"""


def _probe(*argv):
    """Run the command line in a fresh interpreter: ``(exit code, CPU seconds, heavy modules loaded)``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    probe = _PROBE.replace("HEAVY", repr(HEAVY))
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, env=env, timeout=120,
                          cwd=REPO)  # fmt: skip
    line = next(x for x in done.stderr.splitlines() if x.startswith("RESULT "))
    _, code, cpu, heavy = line.split(" ")
    return int(code), float(cpu), heavy


@pytest.mark.timeout(300)
@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["fit", "--help"], ["store", "kernels", "--help"],
                                  ["fit", "--data", "x.svm"], ["predict", "--model"], ["bogus"]])  # fmt: skip
def test_version_help_and_usage_errors_load_nothing_heavy(argv):
    code, cpu, heavy = _probe(*argv)
    assert code in (0, 2)
    assert heavy == "-", f"{argv} imported {heavy}"
    assert cpu <= 0.5, f"{argv}: {cpu:.2f} s of CPU time"  # CPU time, not wall-clock: ~0.1 s measured


@pytest.mark.timeout(300)
def test_python_m_version_cpu_time():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "mwumkl_dist", "--version"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120, cwd=REPO)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert done.returncode == 0 and done.stdout.startswith("mwumkl-dist ")
    assert cpu <= 0.5, f"python -m mwumkl_dist --version: {cpu:.2f} s of CPU time"


def test_the_package_root_loads_its_names_on_first_use():
    import mwumkl_dist

    assert set(mwumkl_dist.__all__) == {*mwumkl_dist._PUBLIC, "__version__"}
    for name in mwumkl_dist.__all__:
        assert getattr(mwumkl_dist, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        mwumkl_dist.nonsense  # noqa: B018


def test_the_parsers_copies_of_library_names_match_their_owners():
    from mwumkl_dist.cli import parser
    from mwumkl_dist.io.files import SUPPORTED_EXTENSIONS
    from mwumkl_dist.kernels.specs import KERNEL_SPEC_HELP
    from mwumkl_dist.plotting import PLOT_KINDS
    from mwumkl_dist.solvers.spec import SOLVER_NAMES
    from mwumkl_dist.solvers.two_stage import AUTO_TWO_STAGE_POINTS

    assert parser.SOLVER_NAMES == SOLVER_NAMES
    assert parser.AUTO_TWO_STAGE_POINTS == AUTO_TWO_STAGE_POINTS
    assert parser.SUPPORTED_EXTENSIONS == SUPPORTED_EXTENSIONS
    assert parser.PLOT_KINDS == PLOT_KINDS
    assert parser.KERNEL_SPEC_HELP is KERNEL_SPEC_HELP  # one text (core.kernel_syntax), not a copy


def test_a_command_that_loads_long_says_what_it_loads(monkeypatch, capsys):
    import time

    from mwumkl_dist.cli import commands

    monkeypatch.setattr(commands, "LOADING_NOTICE_SECONDS", 0.01)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with commands.loading_notice() as notice:
        time.sleep(0.5)
    assert notice.said and "mwumkl-dist: loading scikit-learn, numba" in capsys.readouterr().err
    with commands.loading_notice(quiet=True) as notice:
        time.sleep(0.1)
    assert not notice.said


def test_store_kernels_says_it_compiles(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("mwumkl_dist.cli.store.numba_cache_is_cold", lambda: True)
    rng = np.random.default_rng(0)
    dump_svmlight_file(rng.random((20, 3)), np.arange(20) % 2, "t.svm")
    assert main(["store", "kernels", "--input", "t.svm", "--kernels", "linear", "--output", "K.zarr"]) == 0
    assert "compiling numba kernels" in capsys.readouterr().err


# ----------------------------------------------------------------------------- predict_proba without probability


def test_predict_proba_without_probability_says_to_refit():
    from mwumkl_dist.estimator import ProbabilityUnavailableError

    rng = np.random.default_rng(0)
    X = rng.random((40, 2))
    y = (X[:, 0] > 0.5).astype(int)
    clf = MWUMKLClassifier(kernels="linear", C=10.0, epsilon=0.4, selectivity=0).fit(X, y)
    assert not hasattr(clf, "predict_proba") and not hasattr(clf, "predict_log_proba")  # available_if's meaning
    for method in ("predict_proba", "predict_log_proba"):
        with pytest.raises(ProbabilityUnavailableError, match="refit with probability=True") as err:
            getattr(clf, method)(X)
        assert isinstance(err.value, AttributeError) and "decision_function" in str(err.value)
    assert MWUMKLClassifier.predict_proba.__doc__.startswith("Class probabilities")


# ----------------------------------------------------------------------------- svmlight index convention


def test_a_one_based_guess_is_said_once_naming_the_file(tmp_path, monkeypatch, capsys):
    from sklearn.datasets import load_digits

    from mwumkl_dist.io.files import OneBasedAssumedWarning, load_data

    monkeypatch.chdir(tmp_path)
    X, y = load_digits(return_X_y=True)
    keep = np.isin(y, (0, 1))
    dump_svmlight_file(X[keep], y[keep], "digits.svm")  # zero-based, and pixel 0 is always blank
    with pytest.warns(OneBasedAssumedWarning, match=r"digits.svm: feature indices read as one-based .* no index 0"):
        X1, _ = load_data("digits.svm")
    assert X1.shape[1] == 63  # the guess: one feature short
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_data("digits.svm", zero_based=True)[0].shape[1] == 64  # told: nothing to say
        dump_svmlight_file(X[keep][:, 1:], y[keep], "zero.svm", zero_based=True)  # index 0 occurs: certain
        load_data("zero.svm")
    assert main(["fit", "--data", "digits.svm", "--model", "m.npz", *FAST]) == 0
    out, err = capsys.readouterr()
    assert out.count("feature indices read as one-based") == 1 and "--zero-based yes" in out
    assert "one-based" not in err


# ----------------------------------------------------------------------------- the cluster's Ctrl-C


@pytest.mark.timeout(300)
def test_ctrl_c_in_a_terminal_stops_the_cluster_in_order(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: the workers leave the stop to the cluster command."""
    import signal
    import time

    address_file = tmp_path / "address"
    # Its own process group, as a shell's job.
    cluster = start_cluster(address_file, tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        while not address_file.exists() and time.monotonic() < deadline and cluster.poll() is None:
            time.sleep(0.2)
        assert address_file.exists(), cluster.communicate(timeout=30)
        os.killpg(cluster.pid, signal.SIGINT)  # what Ctrl-C does: every process of the group gets it
        out, err = cluster.communicate(timeout=120)
    finally:
        if cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.communicate()
    assert cluster.returncode == 0, err
    assert err.strip() == "stopping the cluster ...", err  # no worker's traceback, no nanny killing a worker


# ----------------------------------------------------------------------------- pictures and a saved structure search


@pytest.fixture(scope="module")
def searched():
    """A default fit whose structure search kept every feature (``structure_path_``, no ``structure_``)."""
    rng = np.random.default_rng(3)
    X = rng.random((150, 4))
    y = (X.sum(axis=1) + 0.2 * rng.standard_normal(150) > 2).astype(int)
    return MWUMKLClassifier().fit(X, y)


def test_a_saved_structure_search_keeps_its_summary_line(searched, tmp_path):
    assert searched.structure_path_ and getattr(searched, "structure_", None) is None
    searched.save(tmp_path / "m.npz")
    loaded = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert loaded.summary() == searched.summary()
    assert "structure        none: all 4 features" in loaded.summary()


def _ticks(ax) -> list[str]:
    return [t.get_text() for t in ax.get_xticklabels()]


def test_the_path_draws_the_structures_and_the_bands_in_order(searched, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from mwumkl_dist.plotting import plot_cv_path, pyplot

    tops = sorted({key[0].top for key in searched.structure_path_})
    ax = plot_cv_path(searched)
    structures = [t for t in _ticks(ax) if t.startswith(("top ", "relevant"))]
    assert len(structures) == len(searched.structure_path_)
    ranked = [int(t.split()[1]) for t in structures if t.startswith("top ")]
    assert ranked == sorted(ranked)  # the top-k rungs in order, after the relevance rungs
    assert set(ranked) == {t for t in tops if t > 0}
    assert {t.split()[0] for t in structures if not t.startswith("top ")} == {
        {0: "relevant", -1: "relevant+residual", -2: "relevant-additive"}[t] for t in tops if t <= 0
    }
    searched.save(tmp_path / "m.npz")  # the same after a load (candidates are names then)
    assert _ticks(plot_cv_path(MWUMKLClassifier.load(tmp_path / "m.npz"))) == _ticks(ax)
    model = MWUMKLClassifier.load(tmp_path / "m.npz")
    model.width_band_path_ = {("widths(6-8)", 1.0): 0.1, ("widths(2-4)", 1.0): 0.2, ("widths(10-12)", 1.0): 0.3,
                              ("widths(6-8)", 10.0): 0.15}  # fmt: skip
    bands = [t for t in _ticks(plot_cv_path(model)) if t.startswith("widths")]
    assert bands == ["widths(2-4) C=1", "widths(6-8) C=1", "widths(6-8) C=10", "widths(10-12) C=1"]
    pyplot().close("all")


def test_the_uniform_line_s_legend_leaves_the_bars_alone():
    import matplotlib

    matplotlib.use("Agg")
    from mwumkl_dist.plotting import plot_kernel_weights, pyplot

    rng = np.random.default_rng(0)
    X = rng.random((60, 3))
    y = (X[:, 0] > 0.5).astype(int)
    clf = MWUMKLClassifier(kernels="scaled", C=10.0, epsilon=0.4, selectivity=0, polish=False).fit(X, y)
    ax = plot_kernel_weights(clf)  # uniform weights: bars as tall as the line, in every corner
    ax.figure.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    bars = [patch.get_window_extent() for patch in ax.patches]
    assert bars and not any(legend.overlaps(bar) for bar in bars)
    pyplot().close("all")
