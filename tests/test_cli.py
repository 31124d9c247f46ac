"""The ``mwumkl-dist`` command line: end to end in subprocesses, error paths in-process.

Every subprocess pays the package import (numba, scikit-learn: about 2 s), so
the end-to-end runs are few and the many bad-input cases call ``main()``
directly, which is the same code without the interpreter start.
"""

from __future__ import annotations

import importlib.metadata
import io
import math
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.cli import main
from mwumkl_dist.cli.progress import COMPILING_NOTE
from mwumkl_dist.cli.scaling import load_model_file
from mwumkl_dist.io import format_label, load_data
from mwumkl_dist.solvers import mwu
from mwumkl_dist.stores import open_store

REPO = Path(__file__).resolve().parents[1]
ERROR = re.compile(r"^mwumkl-dist: error: \S")


def run_cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "mwumkl_dist", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def without_compiling_note(stderr: str) -> str:
    """``stderr`` without the first-run note (printed when numba's cache is cold, e.g. on a fresh clone)."""
    return "".join(line for line in stderr.splitlines(keepends=True) if COMPILING_NOTE not in line)


def scaled_predict(path, X):
    """What ``predict`` answers for ``X`` with the model file ``path`` (its scaling applied)."""
    model, scaling = load_model_file(path)
    return model.predict(X if scaling is None else scaling.transform(X))


def assert_one_line_error(stderr: str, pattern: str):
    assert "Traceback" not in stderr
    lines = without_compiling_note(stderr).strip().splitlines()
    assert len(lines) == 1, stderr
    assert ERROR.match(lines[0]), lines[0]
    assert re.search(pattern, lines[0]), lines[0]


def blobs(n, d, n_classes, seed):
    """Well separated clusters in [0, 1]^d, balanced classes 0..n_classes-1."""
    rng = np.random.default_rng(seed)
    centers = 0.2 + 0.6 * rng.random((n_classes, d))
    centers[:, 0] = np.linspace(0.1, 0.9, n_classes)  # at least 0.4 apart on feature 0
    y = np.arange(n) % n_classes
    X = np.clip(centers[y] + 0.05 * rng.standard_normal((n, d)), 0.0, 1.0)
    return X, y


@pytest.fixture(scope="module")
def binary_files(tmp_path_factory):
    """Training and test svmlight files (labels -1/+1); the test file never mentions feature 4."""
    root = tmp_path_factory.mktemp("binary")
    X, y = blobs(120, 4, 2, seed=1)
    y = np.where(y == 1, 1.0, -1.0)
    X_test = X[80:].copy()
    X_test[:, 3] = 0.0
    dump_svmlight_file(X[:80], y[:80], str(root / "train.svm"), zero_based=False)
    dump_svmlight_file(X_test, y[80:], str(root / "test.svm"), zero_based=False)
    return root


# ----------------------------------------------------------------------------- end to end (subprocesses)


def test_demo():
    proc = run_cli("demo")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    out = proc.stdout
    error = float(re.search(r"test error\s+([\d.]+) % \((\d+) of 114\)", out).group(1))
    assert error < 10.0  # WDBC: about 3 % with the default parameters
    assert re.search(r"^fit time\s+[\d.]+ s \(the choice of C included\)$", out, re.M)
    assert re.search(r"^iterations\s+\d+$", out, re.M) and re.search(r"^bias\s+[-\d.e]+$", out, re.M)
    # what was chosen, with why, and the errors that put the test error in context
    assert re.search(r"^C {16}[\d.]+ \(size-relative.*\): the lowest cross-validated error of 6 candidates", out, re.M)
    assert re.search(r"^cv error {9}[\d.]+ % \+- [\d.]+ % \(the chosen settings; 3-fold", out, re.M)
    assert re.search(r"^training error {3}[\d.]+ % \(all 455 training rows\)$", out, re.M)
    assert re.search(r"^majority class {3}37\.36 % error \(always predicting 1\)$", out, re.M)  # 170 of 455 are 0
    rows = re.findall(r"^  (\S+)\s+([\d.]+)\s+([\d.e+-]+)$", out, flags=re.M)
    m = int(re.search(r"^kernels {10}auto: (\d+) kernels \(poly:1, poly:2, poly:3, (\d+) Gaussian", out, re.M).group(1))
    assert len(rows) == m and 12 <= m <= 14 and [r[0] for r in rows[:3]] == ["poly:1", "poly:2", "poly:3"]
    assert all(re.fullmatch(r"gaussian:\d\.?\d{0,3}", r[0]) for r in rows[3:])  # widths rounded to 3 digits
    assert math.isclose(sum(float(r[1]) for r in rows), 1.0, abs_tol=1e-5)
    assert re.search(rf"^kernels used     [\d.]+ effective of {m} ", out, re.M)


def test_fit_predict_evaluate_svmlight(binary_files, tmp_path):
    train, test, model = binary_files / "train.svm", binary_files / "test.svm", tmp_path / "model.npz"
    kernels = "linear,poly:2,gaussian:0.5,gaussian:1@0-1"
    args = ["--kernels", kernels, "--epsilon", "0.5", "--rho", "1.5", "--C", "10", "--no-scale-C"]
    proc = run_cli("fit", "--data", train, "--model", model, *args)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # The progress display in a pipe: whole lines (no carriage returns), one phase at a time, each ending at 100 %.
    iterations = r"^MWU iterations on 80 rows: 100%\|[^|\n]*\| (\d+)/\1 \[[\d:]+<[\d:]+, +[\d.]+k? it/s\]$"
    assert re.search(iterations, proc.stderr, re.M)
    assert re.search(r"^exact polish: LIBSVM on the combined kernel of 80 rows: 100%.* 1/1 \[", proc.stderr, re.M)
    assert "\r" not in proc.stderr
    T = mwu.iteration_count(0.5, 1.5, 80)
    assert f"iterations       {T} (one solve, T = {T})" in proc.stdout
    assert "support vectors" in proc.stdout
    assert "scaling          divided by each feature's largest |value|" in proc.stdout

    # The CLI fits what the Python API fits with the same parameters, on the scaled features.
    fitted, scaling = load_model_file(model)
    X, y = load_data(train)
    assert scaling.kind == "max-abs" and not scaling.offset.any()
    np.testing.assert_array_equal(scaling.scale, 1.0 / abs(X).max(axis=0).toarray().ravel())
    X = scaling.transform(X)
    assert X.format == "csr" and math.isclose(X.max(), 1.0, rel_tol=1e-15)
    ref = MWUMKLClassifier(kernels=kernels, epsilon=0.5, rho=1.5, C=10.0, scale_C=False).fit(X, y)
    assert fitted.n_iter_ == ref.n_iter_ == T
    assert fitted.kernel_names_ == ref.kernel_names_
    np.testing.assert_allclose(fitted.kernel_weights_, ref.kernel_weights_, rtol=1e-12)
    np.testing.assert_allclose(fitted.dual_coef_, ref.dual_coef_, rtol=1e-12)
    assert fitted.n_features_in_ == 4

    # The test file mentions 3 features only: predict/evaluate pass the model's feature count.
    X_test, y_test = load_data(test, n_features=4)
    expected = fitted.predict(scaling.transform(X_test))
    proc = run_cli("predict", "--model", model, "--data", test)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [format_label(v) for v in expected]
    assert set(proc.stdout.split()) <= {"-1", "1"}

    proc = run_cli("evaluate", "--model", model, "--data", test)
    assert proc.returncode == 0, proc.stderr
    correct = int(np.sum(expected == y_test))
    assert f"points    {len(y_test)}" in proc.stdout
    assert f"accuracy  {correct / len(y_test):.4f} ({correct} of {len(y_test)})" in proc.stdout
    assert correct / len(y_test) >= 0.9  # separated clusters


def test_zero_based_svmlight_files(tmp_path, capsys):
    """A 0-based test file that never uses index 0 needs --zero-based yes (auto reads it shifted)."""
    X, y = blobs(100, 4, 2, seed=3)
    y = np.where(y == 1, 1.0, -1.0)
    X[:, 0] = np.where(np.arange(100) % 2 == 0, X[:, 0], 0.0)  # index 0 used in training ...
    X_test = X[60:].copy()
    X_test[:, 0] = 0.0  # ... but never in the test file
    train, test, model = tmp_path / "train.svm", tmp_path / "test.svm", tmp_path / "model.npz"
    dump_svmlight_file(X[:60], y[:60], str(train), zero_based=True)
    dump_svmlight_file(X_test, y[60:], str(test), zero_based=True)
    args = ["--kernels", "linear,gaussian:1", "--C", "10", "--epsilon", "0.3", "--polish", "no", "--quiet"]
    assert main(["fit", "--data", str(train), "--zero-based", "yes", "--model", str(model), *args]) == 0
    fitted = MWUMKLClassifier.load(model)
    assert fitted.n_features_in_ == 4
    expected = [format_label(v) for v in scaled_predict(model, X_test)]
    capsys.readouterr()
    assert main(["predict", "--model", str(model), "--data", str(test), "--zero-based", "yes"]) == 0
    assert capsys.readouterr().out.splitlines() == expected
    # "auto" sees no index 0 and reads the file as 1-based: every feature moves one column left.
    shifted, _ = load_data(test, n_features=4)
    np.testing.assert_allclose(shifted.toarray()[:, :3], X_test[:, 1:], rtol=1e-12)
    assert main(["evaluate", "--model", str(model), "--data", str(test), "--zero-based", "yes"]) == 0
    correct = sum(a == format_label(b) for a, b in zip(expected, y[60:]))
    assert f"({correct} of 40)" in capsys.readouterr().out
    # The store command reads the same way.
    store = tmp_path / "test.zarr"
    assert main(["store", "data", "--input", str(test), "--zero-based", "yes", "--output", str(store)]) == 0
    np.testing.assert_allclose(open_store(store).read_rows(0, 40).toarray(), X_test, rtol=1e-12)
    # 'no' on a file that uses index 0 is LIBSVM's format error, named.
    assert main(["fit", "--data", str(train), "--zero-based", "no", "--model", str(model), *args]) != 0
    assert "train.svm" in capsys.readouterr().err


def test_csv_string_labels_multiclass_predict_to_file(tmp_path, capsys):
    """In process (``main``): the subprocess runs above cover fit and predict end to end."""
    X, y = blobs(90, 3, 3, seed=2)
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    train = tmp_path / "train.csv"
    with open(train, "w", newline="") as fh:
        fh.write("a,b,c,species\r\n")
        for row, label in zip(X[:60], names[:60]):
            fh.write(",".join(f"{v:.17g}" for v in row) + f",{label}\r\n")
    unlabelled = tmp_path / "new.csv"  # no label column: predict tells by the column count
    np.savetxt(unlabelled, X[60:], delimiter=",", fmt="%.17g")
    model, out = tmp_path / "m.npz", tmp_path / "pred.txt"

    assert main(["fit", "--data", str(train), "--model", str(model), "--epsilon", "0.4", "--kernels", "paper"]) == 0
    stdout, stderr = capsys.readouterr()
    assert "3 classes (setosa, versicolor, virginica)" in stdout
    assert "3 one-vs-rest solves" in stdout
    assert "scaling          min-max to [0, 1]" in stdout
    assert "MWU iterations on 60 rows, class 3 of 3: 100%" in stderr  # one progress phase per class

    assert main(["predict", "--model", str(model), "--data", str(unlabelled), "--output-file", str(out)]) == 0
    assert capsys.readouterr().out == ""
    predicted = out.read_text().splitlines()
    assert predicted == scaled_predict(model, X[60:]).tolist()
    assert np.mean(np.array(predicted) == names[60:]) >= 0.9


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("n_classes", [2, 3])
def test_ctrl_c_keeps_the_iterations_done(tmp_path, n_classes):
    X, y = blobs(60, 3, n_classes, seed=3)
    data, model = tmp_path / "d.npy", tmp_path / "m.npz"
    np.save(data, np.column_stack([X, y]))
    max_iter = 10**7  # hours: only Ctrl-C ends this fit within the test's timeout
    cmd = [sys.executable, "-m", "mwumkl_dist", "fit", "--data", str(data), "--model", str(model)]
    proc = subprocess.Popen(
        # an explicit C: with --C auto the cross-validation would run 10^7 iterations per fold, silently
        [*cmd, "--max-iter", str(max_iter), "--C", "100"],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(120, proc.kill)  # readline() blocks: a silent fit must fail the test, not hang it
    watchdog.start()
    try:
        deadline = time.monotonic() + 60
        line = ""
        # the first progress line past the start of the iterations (their phase begins just before them)
        while not re.search(r"[1-9]\d*/\d+ \[", line) and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "the fit ended before it was interrupted"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    if n_classes == 2:
        assert re.search(rf"fit interrupted after \d+ of {max_iter} iterations; the partial model was saved", err)
        fitted = MWUMKLClassifier.load(model)
        assert fitted.interrupted_ and 1 <= fitted.n_iter_ < max_iter
        assert f"iterations       {fitted.n_iter_} " in out
        assert np.mean(scaled_predict(model, X) == y) >= 0.9
    else:  # one-vs-rest with classes left unfitted: no model
        assert_one_line_error(err.splitlines()[-1], r"interrupted after 1 of 3 one-vs-rest problems.*nothing saved")
        assert not model.exists()


@pytest.mark.parametrize(
    "args, code, pattern",
    [
        (["fit", "--data", "{nan}", "--model", "{model}"], 1, r"nan\.svm: line 2 has a feature value nan"),
        (["fit", "--data", "{nan}", "--model", "{model}", "--kernels", "gaussian:2,spline:3"], 2, r"unknown kernel"),
    ],
)
def test_bad_input_subprocess(tmp_path, args, code, pattern):
    nan = tmp_path / "nan.svm"
    nan.write_text("1 1:0.5\n-1 1:nan\n")
    args = [a.format(nan=nan, model=tmp_path / "m.npz") for a in args]
    proc = run_cli(*args)
    assert proc.returncode == code
    assert proc.stdout == ""
    assert_one_line_error(proc.stderr, pattern)


def test_a_save_over_the_file_size_limit_keeps_the_previous_model(binary_files, tmp_path):
    """The issue's ``(ulimit -f 12; mwumkl-dist fit ... --model model.npz)``: the older model stays, and loads."""
    resource = pytest.importorskip("resource")
    model = tmp_path / "model.npz"
    args = ["fit", "--data", str(binary_files / "train.svm"), "--model", str(model), "--C", "1", "-q"]
    assert main(args) == 0  # also warms numba's cache (in this process): the limited run writes no cache file
    before = model.read_bytes()
    limit = len(before) // 2

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run(
        [sys.executable, "-m", "mwumkl_dist", *map(str, args), "--epsilon", "0.5"],
        cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, preexec_fn=limit_file_size,
    )  # fmt: skip
    assert proc.returncode == 1
    assert_one_line_error(
        proc.stderr, rf"could not write model file {re.escape(str(model))}: \[Errno 27\] File too large$"
    )
    assert model.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["model.npz"]
    MWUMKLClassifier.load(model)


# ----------------------------------------------------------------------------- in-process


def test_npy_hard_margin_quiet_and_evaluate(tmp_path, capsys):
    X, y = blobs(60, 3, 2, seed=4)
    data, model = tmp_path / "d.npy", tmp_path / "m.npz"
    np.save(data, np.column_stack([X, y]))
    assert main(["fit", "--data", str(data), "--model", str(model), "--C", "inf", "--epsilon", "0.5", "-q"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    fitted = MWUMKLClassifier.load(model)
    assert math.isinf(fitted.C) and fitted.classes_.tolist() == [0.0, 1.0]
    assert main(["evaluate", "--model", str(model), "--data", str(data)]) == 0
    out, _ = capsys.readouterr()
    correct = int(np.sum(scaled_predict(model, X) == y))
    assert f"accuracy  {correct / 60:.4f} ({correct} of 60)" in out
    assert f"error     {(60 - correct) / 60:.4f}" in out


def test_fit_summary_of_a_two_stage_fit_and_the_data_scale(tmp_path, capsys):
    """The iterations are the weight stage's, on its subsample; no iteration rate over both stages; sigma_0 shown."""
    X, y = blobs(300, 3, 2, seed=6)
    data, model = tmp_path / "d.npy", tmp_path / "m.npz"
    np.save(data, np.column_stack([X, y]))
    assert main(["fit", "--data", str(data), "--model", str(model), "--C", "1", "--solver", "two-stage"]) == 0
    out = capsys.readouterr().out
    fitted = MWUMKLClassifier.load(model)
    assert fitted.solver_ == "two-stage" and fitted.weight_points_ == 300
    T = mwu.iteration_count(fitted.epsilon_, 0.5, 300)
    assert re.search(
        rf"^iterations       {fitted.n_iter_} in the weight stage \(one solve on 300 of the 300 points, T = {T}\), "
        r"then the linear stage on all 300 points; fit time [\d.]+ s \(both stages\)$",
        out,
        re.M,
    )
    assert "it/s" not in out
    assert f"Gaussian widths in units of the data's scale sigma_0 = {fitted.kernel_scale_:.4g}" in out
    assert re.search(r"^solver {11}two-stage: kernel weights on 300 rows, then a linear SVM on Nystroem features", out,
                     re.M)  # fmt: skip
    assert re.search(r"^support vectors  \d+ \(the Nystroem landmarks\)$", out, re.M)
    assert re.search(r"^threads          \d+ in this process$", out, re.M)  # how many threads the fit used


def test_fit_says_when_a_checkpoint_rules_out_the_two_stage_fit(tmp_path, capsys):
    X, y = blobs(3001, 3, 2, seed=7)
    data, model = tmp_path / "d.npy", tmp_path / "m.npz"
    np.save(data, np.column_stack([X, y]))
    argv = ["fit", "--data", str(data), "--model", str(model), "--C", "1", "--max-iter", "5", "-q"]
    assert main([*argv, "--checkpoint", str(tmp_path / "c.npz")]) == 0
    err = capsys.readouterr().err
    assert re.search(
        r"^mwumkl-dist: warning: solver=\"auto\" runs the MWU solver on all 3001 points, not the two-stage fit .* "
        r"does not support checkpoints",
        err,
        re.M,
    ), err
    assert MWUMKLClassifier.load(model).solver_ == "mwu"


def test_auto_C_epsilon_and_polish_options(tmp_path, capsys):
    """The defaults choose C and epsilon and say so; --C/--epsilon/--polish override them."""
    X, y = blobs(80, 3, 2, seed=5)
    data, model = tmp_path / "d.npy", tmp_path / "m.npz"
    np.save(data, np.column_stack([X, y]))
    assert main(["fit", "--data", str(data), "--model", str(model)]) == 0
    out, err = capsys.readouterr()
    fitted = MWUMKLClassifier.load(model)
    assert fitted.C == "auto" and fitted.C_ in (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)
    assert fitted.polished_ and fitted.epsilon_ == 0.2
    assert f"C                {fitted.C_:g} (size-relative, ridge 1/(C n)): the lowest cross-validated error" in out
    assert "epsilon          0.2 (auto: " in out and "then the exact polish (auto: small enough" in out
    assert "choosing C: 6 candidates x 3 folds on 80 rows: 100%" in err
    argv = ["fit", "--data", str(data), "--model", str(model), "--C", "10", "--polish", "no", "-q"]
    assert main(argv) == 0
    fitted = MWUMKLClassifier.load(model)
    assert (fitted.C_, fitted.polished_, fitted.epsilon_) == (10.0, False, 0.1)
    assert main([*argv[:-1], "--epsilon", "0.3", "--polish", "yes", "-q"]) == 0
    fitted = MWUMKLClassifier.load(model)
    assert (fitted.polished_, fitted.epsilon_) == (True, 0.3)
    assert main(["fit", "--data", str(data), "--model", str(model), "--C", "inf", "--polish", "yes", "-q"]) == 1
    assert "polish=True is not available for the hard margin" in capsys.readouterr().err


@pytest.fixture(scope="module")
def files(tmp_path_factory, binary_files):
    """A fitted model plus assorted good and bad files."""
    tmp_path = tmp_path_factory.mktemp("files")
    model = tmp_path / "model.npz"
    train = str(binary_files / "train.svm")
    assert main(["fit", "--data", train, "--model", str(model), "--epsilon", "0.5", "-q"]) == 0
    paths = {"model": model, "train": binary_files / "train.svm", "test": binary_files / "test.svm"}
    texts = {
        "one_class": ("one_class.svm", "1 1:0.5\n1 2:0.25\n"),
        "inf_csv": ("inf.csv", "0.1,0.2,0.3,0.4,1\n0.1,inf,0.3,0.4,-1\n"),
        "narrow_csv": ("narrow.csv", "0.1,0.2,1\n0.3,0.4,-1\n"),
        "wide_svm": ("wide.svm", "1 1:0.5 7:1\n-1 2:0.25\n"),
        "text_npz": ("text.npz", "not a model"),
        "words_csv": ("words.csv", "0.1,0.2,0.3,0.4,1\n0.1,abc,0.3,0.4,-1\n"),
        "other_labels": ("other_labels.svm", "5 1:0.5\n6 2:0.25\n"),
        "empty_svm": ("empty.svm", ""),
    }
    for key, (name, text) in texts.items():
        paths[key] = tmp_path / name
        paths[key].write_text(text)
    paths["dir"] = tmp_path
    paths["missing_dir_out"] = tmp_path / "no" / "such" / "dir" / "m.npz"
    return paths


@pytest.mark.parametrize(
    "argv, code, pattern",
    [
        # command-line errors: exit 2
        ([], 2, r"choose a command"),
        (["train"], 2, r"invalid choice: 'train'"),
        (["fit", "--data", "{train}"], 2, r"required: --model"),
        (["fit", "--data", "{train}", "--model", "m.npz", "--epsilon", "abc"], 2, r"--epsilon: 'abc' is not a number"),
        (["fit", "--data", "{train}", "--model", "m.npz", "--epsilon", "-1"], 2, r"positive finite number"),
        (["fit", "--data", "{train}", "--model", "m.npz", "--epsilon", "1.2"], 2, r"below 2 \* rho = 1"),
        (
            ["fit", "--data", "{train}", "--model", "m.npz", "--C", "nan"],
            2,
            r"--C/-C: must be 'auto', a positive number or 'inf'",
        ),
        (["fit", "--data", "{train}", "--model", "m.npz", "--max-iter", "0"], 2, r"--max-iter: must be a positive"),
        (["fit", "--data", "{train}", "--model", "m.npz", "--kernels", "poly"], 2, r"expected 'poly:DEGREE"),
        (["fit", "--data", "{train}", "--model", "m.npz", "--kernels", "precomputed"], 2, r"precomputed needs --store"),
        (["demo", "--rho", "0"], 2, r"--rho: must be a positive finite number"),
        # problems found while running: exit 1
        (["fit", "--data", "{one_class}", "--model", "m.npz"], 1, r"one_class\.svm: the labels hold one class"),
        (["fit", "--data", "{inf_csv}", "--model", "m.npz"], 1, r"inf\.csv: line 2, feature column 2 is inf"),
        (["fit", "--data", "{words_csv}", "--model", "m.npz"], 1, r"words\.csv: line 2, column 2 holds 'abc'"),
        (["fit", "--data", "{empty_svm}", "--model", "m.npz"], 1, r"empty\.svm: the file holds no data rows"),
        (["fit", "--data", "{dir}/nope.svm", "--model", "m.npz"], 1, r"--data .*nope\.svm: no such file"),
        (["fit", "--data", "{train}", "--model", "{missing_dir_out}", "-q"], 1, r"directory .* does not exist"),
        (["fit", "--data", "{train}", "--model", "{dir}"], 1, r"it is a directory"),
        (["fit", "--data", "{train}", "--model", "m.npz", "--kernels", "gaussian:1@2-9"], 1, r"uses feature 9"),
        (["predict", "--model", "{model}", "--data", "{narrow_csv}"], 1, r"narrow\.csv: 2 feature columns .* 4"),
        (["evaluate", "--model", "{model}", "--data", "{wide_svm}"], 1, r"wide\.svm: the file uses 7 features"),
        (["evaluate", "--model", "{model}", "--data", "{other_labels}"], 1, r"none of its labels \(5, 6\)"),
        (["evaluate", "--model", "{text_npz}", "--data", "{test}"], 1, r"text\.npz: not a model file"),
        (["evaluate", "--model", "{train}", "--data", "{test}"], 1, r"train\.svm: not a model file"),
        (["predict", "--model", "{dir}/none.npz", "--data", "{test}"], 1, r"--model .*none\.npz: no such file"),
        (["predict", "--model", "{model}", "--data", "{test}", "-o", "{missing_dir_out}"], 1, r"does not exist"),
    ],
)
def test_bad_input_one_line(files, capsys, monkeypatch, tmp_path, argv, code, pattern):
    monkeypatch.chdir(tmp_path)
    argv = [a.format(**files) for a in argv]
    assert main(argv) == code
    out, err = capsys.readouterr()
    assert out == ""
    assert_one_line_error(err, pattern)
    assert not (tmp_path / "m.npz").exists()


def test_unknown_labels_warn_but_evaluate(files, capsys, tmp_path):
    mixed = tmp_path / "mixed.svm"
    mixed.write_text("1 1:0.5\n7 2:0.25\n")
    assert main(["evaluate", "--model", str(files["model"]), "--data", str(mixed)]) == 0
    out, err = capsys.readouterr()
    expected = f"mwumkl-dist: warning: {mixed}: labels 7 are not classes of the model and count as errors"
    assert without_compiling_note(err).strip() == expected
    assert "points    2" in out


def test_unexpected_error_is_one_line_unless_debug(files, capsys, monkeypatch):
    def boom(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr("mwumkl_dist.cli.model.read_data", boom)
    argv = ["evaluate", "--model", str(files["model"]), "--data", str(files["test"])]
    assert main(argv) == 1
    assert_one_line_error(capsys.readouterr().err, r"unexpected KeyError: 'boom' \(rerun with --debug")
    with pytest.raises(KeyError):
        main(["--debug", *argv])
    with pytest.raises(KeyError):
        main([*argv, "--debug"])


def test_version_and_entry_point(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert re.fullmatch(r"mwumkl-dist \S+\n", capsys.readouterr().out)
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert [ep.value for ep in scripts if ep.name == "mwumkl-dist"] == ["mwumkl_dist.cli:main"]


# ----------------------------------------------------------------------------- scaling, outputs, progress, notes

FAST = ["--kernels", "linear,gaussian:1", "--C", "10", "--epsilon", "0.4", "--polish", "no"]


@pytest.fixture(scope="module")
def unscaled_files(tmp_path_factory):
    """Dense CSV files whose features are far from [0, 1] (one in the hundreds, one around -3)."""
    root = tmp_path_factory.mktemp("unscaled")
    X, y = blobs(90, 3, 2, seed=7)
    X = X * np.array([1.0, 1000.0, 0.01]) + np.array([0.0, 500.0, -3.0])
    np.savetxt(root / "train.csv", np.column_stack([X[:60], y[:60]]), delimiter=",", fmt="%.17g")
    np.savetxt(root / "test.csv", np.column_stack([X[60:], y[60:]]), delimiter=",", fmt="%.17g")
    return root, X, y.astype(float)


def test_fit_scales_dense_features_min_max_and_predict_applies_it(unscaled_files, tmp_path, capsys):
    from sklearn.preprocessing import MinMaxScaler

    root, X, y = unscaled_files
    train, test, model = str(root / "train.csv"), str(root / "test.csv"), str(tmp_path / "m.npz")
    assert main(["fit", "--data", train, "--model", model, *FAST]) == 0
    assert "scaling          min-max to [0, 1] per feature, fitted on the training file" in capsys.readouterr().out
    fitted, scaling = load_model_file(model)
    assert scaling.kind == "min-max"
    scaler = MinMaxScaler().fit(X[:60])
    np.testing.assert_array_equal(scaling.transform(X[:60]), scaler.transform(X[:60]))  # scikit-learn's numbers
    ref = MWUMKLClassifier(kernels="linear,gaussian:1", C=10.0, epsilon=0.4, polish=False)
    ref.fit(scaler.transform(X[:60]), y[:60])
    np.testing.assert_array_equal(fitted.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(fitted.kernel_weights_, ref.kernel_weights_)
    # predict and evaluate scale the test file with the training file's scaling.
    expected = ref.predict(scaler.transform(X[60:]))
    assert main(["predict", "--model", model, "--data", test]) == 0
    assert capsys.readouterr().out.splitlines() == [format_label(v) for v in expected]
    assert main(["evaluate", "--model", model, "--data", test]) == 0
    correct = int(np.sum(expected == y[60:]))
    assert f"accuracy  {correct / 30:.4f} ({correct} of 30)" in capsys.readouterr().out
    assert correct >= 27  # separated clusters, once scaled


def test_no_scale_and_a_model_saved_without_scaling(unscaled_files, tmp_path, capsys):
    root, X, y = unscaled_files
    train, test, model = str(root / "train.csv"), str(root / "test.csv"), str(tmp_path / "m.npz")
    assert main(["fit", "--data", train, "--model", model, "--no-scale", *FAST]) == 0
    assert "scaling          none (--no-scale)" in capsys.readouterr().out
    fitted, scaling = load_model_file(model)
    assert scaling is None
    ref = MWUMKLClassifier(kernels="linear,gaussian:1", C=10.0, epsilon=0.4, polish=False).fit(X[:60], y[:60])
    np.testing.assert_array_equal(fitted.dual_coef_, ref.dual_coef_)
    # A model saved by the Python API (as every model before the CLI scaled) predicts on the raw features.
    plain = tmp_path / "plain.npz"
    ref.save(plain)
    assert load_model_file(plain)[1] is None
    assert main(["predict", "--model", str(plain), "--data", test]) == 0
    assert capsys.readouterr().out.splitlines() == [format_label(v) for v in ref.predict(X[60:])]


def test_predict_scores_and_a_model_without_probabilities(files, capsys):
    model, test = str(files["model"]), str(files["test"])
    fitted, scaling = load_model_file(model)
    X_test, _ = load_data(test, n_features=4)
    scores = fitted.decision_function(scaling.transform(X_test))
    assert main(["predict", "--model", model, "--data", test, "--output", "scores"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "1"  # two classes (-1, 1): one column, the positive class's score
    np.testing.assert_array_equal([float(v) for v in lines[1:]], scores)  # written exactly
    assert main(["predict", "--model", model, "--data", test, "--output", "labels"]) == 0
    labels = capsys.readouterr().out.splitlines()
    assert labels == [format_label(fitted.classes_[int(s > 0)]) for s in scores]
    assert main(["predict", "--model", model, "--data", test, "--output", "proba"]) == 1  # fitted without them
    assert_one_line_error(capsys.readouterr().err, r"model\.npz: the model gives no probability estimates; fit it")
    assert main(["predict", "--model", model, "--data", test, "--output", "probabilities"]) == 2
    assert_one_line_error(capsys.readouterr().err, r"--output: invalid choice: 'probabilities'")


def test_predict_scores_of_three_classes_to_a_file(tmp_path, capsys):
    X, y = blobs(60, 3, 3, seed=8)
    data, model, out = tmp_path / "d.npy", tmp_path / "m.npz", tmp_path / "scores.csv"
    np.save(data, np.column_stack([X, y]))
    assert main(["fit", "--data", str(data), "--model", str(model), *FAST, "-q"]) == 0
    assert main(["predict", "--model", str(model), "--data", str(data), "--output", "scores", "-o", str(out)]) == 0
    assert capsys.readouterr().out == ""
    lines = out.read_text().splitlines()
    assert lines[0] == "0,1,2"  # one column per class, named by the header
    fitted, scaling = load_model_file(model)
    expected = fitted.decision_function(scaling.transform(X))
    np.testing.assert_array_equal(np.array([[float(v) for v in line.split(",")] for line in lines[1:]]), expected)


def test_feature_scaling_forms_and_errors():
    from mwumkl_dist.cli.scaling import FeatureScaling

    X = np.array([[1.0, 5.0, 0.0], [3.0, 5.0, -2.0]])
    dense = FeatureScaling.fit(X)
    np.testing.assert_array_equal(dense.transform(X), [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])  # constant -> 0
    np.testing.assert_array_equal(X, [[1.0, 5.0, 0.0], [3.0, 5.0, -2.0]])  # not changed in place
    # Min-max shifts zeros: sparse test data of a dense-trained model come back dense, same numbers.
    np.testing.assert_array_equal(dense.transform(sp.csr_matrix(X)), dense.transform(X))
    S = sp.csr_matrix(np.array([[2.0, 0.0, 0.0], [-4.0, 0.0, 1.0]]))
    sparse = FeatureScaling.fit(S)
    assert sparse.kind == "max-abs" and not sparse.offset.any()
    T = sparse.transform(S)
    assert sp.issparse(T) and T.nnz == S.nnz  # kept sparse
    np.testing.assert_array_equal(T.toarray(), [[0.5, 0.0, 0.0], [-1.0, 0.0, 1.0]])  # an all-zero feature: 1
    np.testing.assert_array_equal(sparse.transform(S.toarray()), T.toarray())
    arrays, meta = sparse.to_arrays()
    again = FeatureScaling.from_arrays(arrays, meta)
    assert again.kind == "max-abs" and np.array_equal(again.scale, sparse.scale)
    assert FeatureScaling.from_arrays({}, {}) is None
    with pytest.raises(ValueError, match="has 3 features, the data 2"):
        dense.transform(X[:, :2])
    with pytest.raises(ValueError, match="unknown feature scaling 'z-score'"):
        FeatureScaling("z-score", np.ones(3), np.zeros(3))
    with pytest.raises(ValueError, match="finite 1-d arrays of one length"):
        FeatureScaling("min-max", np.array([1.0, np.nan]), np.zeros(2))
    with pytest.raises(ValueError, match="finite 1-d arrays of one length"):
        FeatureScaling("min-max", np.ones(3), np.zeros(2))


def test_progress_lines_in_a_log():
    from mwumkl_dist.cli.progress import LineProgress, progress_bar

    log = io.StringIO()
    assert isinstance(progress_bar(10, file=log), LineProgress)  # not a terminal
    log = io.StringIO()
    bar = LineProgress(total=50, file=log, mininterval=0, miniters=1)
    for _ in range(50):
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert [int(re.match(r"\s*(\d+)%", line).group(1)) for line in lines] == list(range(0, 101, 10))
    assert lines[-1].split("|")[-1].startswith(" 50/50 [")  # the last tenth once, not repeated by close()
    log = io.StringIO()
    bar = LineProgress(total=50, file=log, mininterval=0, miniters=1, desc="class 2/3")
    bar.update(7)
    bar.close()  # stopped early (Ctrl-C): the last count is shown
    assert log.getvalue().splitlines()[-1].startswith("class 2/3:  14%")


def test_compiling_note_when_the_numba_cache_is_cold(files, capsys, monkeypatch):
    from mwumkl_dist.cli import progress

    assert progress.numba_cache_is_cold() is False  # the module's fits compiled and cached the kernels
    monkeypatch.setattr("mwumkl_dist.cli.model.numba_cache_is_cold", lambda: True)
    assert main(["evaluate", "--model", str(files["model"]), "--data", str(files["test"])]) == 0
    assert capsys.readouterr().err == f"mwumkl-dist: {COMPILING_NOTE}\n"
    assert main(["fit", "--data", str(files["train"]), "--model", str(files["dir"] / "q.npz"), *FAST, "-q"]) == 0
    assert capsys.readouterr().err == ""  # --quiet: no note either
    monkeypatch.undo()
    # Cold: no index file in numba's cache folder, or only ones of kernels at other lines (older sources).
    monkeypatch.setattr(progress.os, "listdir", lambda path: [])
    assert progress.numba_cache_is_cold() is True
    monkeypatch.setattr(progress.os, "listdir", lambda path: ["cpu.kernel_diagonal-1.py311.nbi", "x.nbi"])
    assert progress.numba_cache_is_cold() is True
    # Warm once a third of the module's kernels are cached as they are now (a fit caches most of them).
    from mwumkl_dist.devices import cpu as _columns

    kernels = {k.py_func for module in _columns.KERNEL_MODULES for k in vars(module).values()
               if hasattr(k, "py_func") and getattr(k, "stats", None)}  # fmt: skip
    names = [f"{f.__module__.rsplit('.', 1)[-1]}.{f.__qualname__}-{f.__code__.co_firstlineno}.py311.nbi"
             for f in sorted(kernels, key=lambda f: f.__qualname__)]  # fmt: skip
    monkeypatch.setattr(progress.os, "listdir", lambda path: names[: len(names) // 3 - 1])
    assert progress.numba_cache_is_cold() is True  # e.g. after a run that only predicted
    monkeypatch.setattr(progress.os, "listdir", lambda path: names[: len(names) // 3 + 1])
    assert progress.numba_cache_is_cold() is False


def test_bench_is_not_an_installed_command(capsys):
    assert main(["bench", "e1", "--quick"]) == 2  # benchmarks/ is a source-checkout tool: python -m benchmarks
    assert_one_line_error(capsys.readouterr().err, r"invalid choice: 'bench'")


def test_layers_only_the_command_line_uses_argparse_and_nothing_imports_it():
    """The library never imports the CLI, argparse or the source tree's benchmarks/ (absent once installed)."""
    import ast

    import mwumkl_dist

    root = Path(mwumkl_dist.__file__).parent
    checked = 0
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if parts[0] == "cli" or parts == ("__main__.py",):  # the command line and its runner
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                modules = [base] + [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                top = module.split(".")
                assert top[0] not in ("argparse", "benchmarks", "deploy"), f"{path.name} imports {module}"
                assert "cli" not in top, f"{path.name} imports the command line ({module})"
        checked += 1
    assert checked >= 15


def test_fit_from_stores_uses_the_stored_values(binary_files, tmp_path, capsys):
    """``store data`` + ``fit --store`` (no scaling: the store's values), and a kernel store with precomputed."""
    train, test = str(binary_files / "train.svm"), str(binary_files / "test.svm")
    data_store, kernel_store = str(tmp_path / "d.zarr"), str(tmp_path / "k.zarr")
    model = str(tmp_path / "m.npz")
    assert main(["store", "data", "--input", train, "--output", data_store, "--chunk-rows", "32"]) == 0
    assert main(["fit", "--store", data_store, "--model", model, *FAST, "--shards", "2"]) == 0
    out = capsys.readouterr().out
    assert "scaling          none (a store is used as stored with explicit kernels)" in out
    assert "80 points, 4 features" in out
    fitted, scaling = load_model_file(model)
    assert scaling is None
    X, y = load_data(train)
    ref = MWUMKLClassifier(kernels="linear,gaussian:1", C=10.0, epsilon=0.4, polish=False).fit(X, y)
    np.testing.assert_array_equal(fitted.kernel_weights_, ref.kernel_weights_)
    assert main(["predict", "--model", model, "--data", test]) == 0
    X_test, _ = load_data(test, n_features=4)
    assert capsys.readouterr().out.splitlines() == [format_label(v) for v in ref.predict(X_test)]

    assert main(["store", "kernels", "--input", train, "--kernels", "linear,gaussian:1", "--output", kernel_store]) == 0
    argv = ["fit", "--store", kernel_store, "--kernels", "precomputed", "--model", model, "--C", "10", "-q"]
    assert main(argv) == 0
    assert load_model_file(model)[0].kernel_names_ == ["linear", "gaussian:1"]
    capsys.readouterr()
    assert main(["predict", "--model", model, "--data", test]) == 1
    assert_one_line_error(capsys.readouterr().err, r"precomputed kernels, it predicts from test kernels: .*-npy")


def test_fit_probability_and_predict_proba(tmp_path, capsys):
    X, y = blobs(90, 3, 3, seed=9)
    names = np.array(["a", "b", "c"])[y]
    train, model = tmp_path / "train.csv", tmp_path / "m.npz"
    train.write_text("".join(",".join(f"{v:.17g}" for v in row) + f",{label}\n" for row, label in zip(X, names)))
    assert main(["fit", "--data", str(train), "--model", str(model), *FAST, "--probability"]) == 0
    assert "probabilities    Platt sigmoids" in capsys.readouterr().out
    fitted, scaling = load_model_file(model)
    assert fitted.probability
    assert main(["predict", "--model", str(model), "--data", str(train), "--output", "proba"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "a,b,c"
    proba = np.array([[float(v) for v in line.split(",")] for line in lines[1:]])
    np.testing.assert_array_equal(proba, fitted.predict_proba(scaling.transform(X)))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    assert np.mean(names[proba.argmax(axis=1)] == names) >= 0.9


def test_fit_summary_of_a_group_selection(tmp_path, capsys):
    """Per-feature kernels whose labels come from two of six features: the summary says what was kept."""
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(90, 6))
    y = np.where(X[:, 0] + X[:, 1] + 0.15 * rng.normal(size=90) > 1.0, 1, -1)
    data, model = tmp_path / "d.npy", tmp_path / "m.npz"
    np.save(data, np.column_stack([X, y]))
    kernels = ",".join(f"poly:1@{f},gaussian:0.5@{f}" for f in range(6))
    assert main(["fit", "--data", str(data), "--model", str(model), "--kernels", kernels]) == 0
    out = capsys.readouterr().out
    fitted = MWUMKLClassifier.load(model)
    g = fitted.group_selection_
    assert g["groups_kept"] == 2 and g["groups"] == 6
    assert (
        f"group selection  kept 2 of 6 feature groups (a fit at C {g['C']:g}, selectivity {g['selectivity']:g}): "
        "within one standard error of the best candidate, with fewer inputs" in out
    )
    assert "selectivity      0: uniform weights on the kept kernels" in out
