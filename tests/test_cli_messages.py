"""The command line's messages and commands of issue 31: one line, at most 200 characters, naming the option and
the file; a kernel store fitted and predicted from without being told what it is; ``mwumkl-dist cluster``.

In process (``main``) with short relative paths, as a user types them (the current directory is the test's),
except the cluster, which runs as the long-lived process it is.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import one_line_error, start_cluster
from sklearn.datasets import dump_svmlight_file, load_svmlight_file

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.cli import build_parser, main
from mwumkl_dist.kernels.specs import parse_kernels

REPO = Path(__file__).resolve().parents[1]
FAST = ["--C", "10", "--epsilon", "0.4", "--polish", "no"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A small training file ``train.svm`` (labels 0/1, 4 features) in the current directory."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    X = rng.random((80, 4))
    y = (X[:, 0] + X[:, 1] > 1.0).astype(int)
    dump_svmlight_file(X, y, "train.svm")
    os.mkdir("folder")
    return tmp_path


def test_a_bad_kernel_spec_is_one_short_line(workdir, capsys):
    err = one_line_error(capsys, ["fit", "--data", "train.svm", "--model", "m.npz", "--kernels", "nonsense"], 2)
    assert "argument --kernels: unknown kernel 'nonsense'" in err and "e.g. scaled, paper" in err
    err = one_line_error(capsys, ["fit", "--data", "train.svm", "--model", "m.npz", "--kernels", "poly:x"], 2)
    assert "--kernels: bad number 'x'" in err
    with pytest.raises(ValueError, match="expected comma-separated kernels"):  # the library keeps the whole help
        parse_kernels("nonsense", 2)


def test_directories_and_missing_files_are_named_with_their_option(workdir, capsys):
    MWUMKLClassifier(kernels="linear", C=1.0).fit(np.eye(4)[:, :2] + 0.1, [0, 1, 0, 1]).save("m.npz")
    cases = [
        (["fit", "--data", "folder", "--model", "m2.npz"], "--data folder: is a directory, not a file"),
        (["predict", "--model", "folder", "--data", "train.svm"], "--model folder: is a directory, not a file"),
        (["evaluate", "--model", "m.npz", "--data", "folder"], "--data folder: is a directory, not a file"),
        (["predict", "--model", "nope.npz", "--data", "train.svm"], "--model nope.npz: no such file"),
        (["store", "data", "--input", "folder", "--output", "d.zarr"], "--input folder: is a directory, not a file"),
        (["store", "data", "--input", "train.svm", "--output", "folder"],
         "--output folder: already exists; choose another path, or pass --overwrite"),
    ]  # fmt: skip
    for argv, message in cases:
        assert message in one_line_error(capsys, argv)
    assert main(["store", "data", "--input", "train.svm", "--output", "d.zarr"]) == 0
    capsys.readouterr()
    err = one_line_error(capsys, ["store", "data", "--input", "train.svm", "--output", "d.zarr"])
    assert "--overwrite" in err and "overwrite=True" not in err  # no Python name in a command-line message


def test_a_kernel_store_is_fitted_and_predicted_from_as_what_it_is(workdir, capsys):
    X, y = load_svmlight_file("train.svm")
    assert (
        main(["store", "kernels", "--input", "train.svm", "--kernels", "linear,gaussian:1", "--output", "K.zarr"]) == 0
    )
    capsys.readouterr()
    assert main(["fit", "--store", "K.zarr", "--model", "m.npz", *FAST]) == 0  # no --kernels precomputed needed
    out = capsys.readouterr().out
    assert "data             K.zarr: 80 points, 2 precomputed kernels, 2 classes (0, 1)" in out
    assert "features" not in out.split("data ")[1].splitlines()[0]
    assert "predict with     mwumkl-dist predict --model m.npz --kernels-npy K_TEST.npy" in out
    err = one_line_error(capsys, ["fit", "--store", "K.zarr", "--model", "m.npz", "--kernels", "scaled"], 2)
    assert "--store K.zarr is a kernel store (precomputed kernels): leave out --kernels" in err

    # predict from the test points' kernel values against the training points
    X = X.toarray()
    test = X[:20] * 0.9
    K = np.stack([test @ X.T, np.exp(-((test[:, None, :] - X[None]) ** 2).sum(axis=2) / 2.0)])
    np.save("K_test.npy", K)
    np.save("y_test.npy", y[:20])
    model = MWUMKLClassifier.load("m.npz")
    assert main(["predict", "--model", "m.npz", "--kernels-npy", "K_test.npy"]) == 0
    predicted = capsys.readouterr().out.split()
    assert predicted == [str(int(v)) for v in model.predict(K)]
    assert main(["evaluate", "--model", "m.npz", "--kernels-npy", "K_test.npy", "--labels", "y_test.npy"]) == 0
    correct = int(np.sum(model.predict(K) == y[:20]))
    assert f"accuracy  {correct / 20:.4f} ({correct} of 20)" in capsys.readouterr().out
    err = one_line_error(capsys, ["predict", "--model", "m.npz", "--data", "train.svm"])
    assert "--model m.npz: fitted on precomputed kernels" in err and "--kernels-npy" in err
    err = one_line_error(capsys, ["evaluate", "--model", "m.npz", "--kernels-npy", "K_test.npy"])
    assert "--labels FILE" in err


def _help(*command) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    p = sub[command[0]]
    if len(command) > 1:
        p = next(a for a in p._actions if a.dest == "store_command").choices[command[1]]
    return " ".join(p.format_help().split())


def test_help_texts_say_what_the_issue_missed():
    fit = _help("fit")
    assert "seconds to reach the scheduler (default 10)" in fit
    assert "in-memory" not in fit and "data files and data stores, not kernel stores" in fit
    assert "--input file" in _help("store", "data") and "--data file" not in _help("store", "data")
    assert "DIR.zarr a store written by 'store data' or 'store kernels'" in _help("store", "info")
    assert "14 kernels" not in fit and "up to 11 Gaussians" in fit


def test_the_fit_summary_answers_the_first_questions(workdir, capsys):
    kernels = "scaled-per-feature"  # 4 features x (3 polynomials + up to 11 widths): more than 10 of each
    assert main(["fit", "--data", "train.svm", "--model", "m.npz", "--kernels", kernels, "--C", "10",
                 "--selectivity", "100"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert re.search(r"^bias {13}[-\d.e]+$", out, re.M)
    assert re.search(r"^training error {3}[\d.]+ % \(all 80 training rows\)$", out, re.M)
    assert re.search(r"^majority class {3}[\d.]+ % error \(always predicting [01]\)$", out, re.M)
    per_type = re.search(r"^per kernel type  (.*)$", out, re.M).group(1)
    assert re.search(r"gaussian [\d.]+ \(\d+ widths\)", per_type) and "poly:1 " in per_type  # a width is no type
    per_width = re.search(r"^per width {8}(.*)$", out, re.M).group(1)
    assert re.match(r"\(largest 10 of \d\d\) ", per_width)  # cut, and says so
    widths = [w.split()[0] for w in per_width.split(") ", 1)[1].split(", ")]
    assert all(len(w.lstrip("0.").replace(".", "")) <= 3 for w in widths), widths  # 3 significant digits
    assert "C                10 (size-relative, ridge 1/(C n)): given" in out
    assert "selectivity      100: given" in out
    table = re.findall(r"^  (gaussian:\S+)@\d+\s", out, re.M)
    assert table and all(len(t.split(":")[1].lstrip("0.").replace(".", "")) <= 3 for t in table), table


# ----------------------------------------------------------------------------- cluster


def test_cluster_refuses_a_port_in_use(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        err = one_line_error(capsys, ["cluster", "--port", str(port)])
    assert f"--port {port}: already in use" in err and "--port 0" in err


@pytest.mark.timeout(240)
def test_cluster_stays_up_for_fits_and_stops_on_ctrl_c(tmp_path):
    """``mwumkl-dist cluster``: the address it prints serves two fits in a row; Ctrl-C stops it cleanly."""
    address_file = tmp_path / "address"
    cluster = start_cluster(address_file, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not address_file.exists() and time.monotonic() < deadline and cluster.poll() is None:
            time.sleep(0.2)
        assert address_file.exists(), cluster.communicate(timeout=30)
        address = address_file.read_text().strip()
        assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", address)
        rng = np.random.default_rng(1)
        X = rng.random((60, 3))
        dump_svmlight_file(X, (X[:, 0] > 0.5).astype(int), str(tmp_path / "train.svm"))
        for model in ("a.npz", "b.npz"):  # the cluster stays up between fits
            fit = subprocess.run(
                [sys.executable, "-m", "mwumkl_dist", "fit", "--data", "train.svm", "--model", model, "--scheduler",
                 address, "--shards", "2", "--kernels", "linear,gaussian:1", *FAST, "-q"],
                cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            assert fit.returncode == 0, fit.stderr
        local = MWUMKLClassifier.load(tmp_path / "a.npz")
        assert local.get_params()["engine"] == "dask"
        cluster.send_signal(signal.SIGINT)
        out, err = cluster.communicate(timeout=90)
    finally:
        if cluster.poll() is None:
            cluster.kill()
            cluster.communicate()
    assert cluster.returncode == 0, err
    assert f"Dask cluster up: scheduler {address}, 2 worker processes x 1 thread" in out
    assert f"--scheduler {address} --shards 2" in out
    assert "Traceback" not in err and "still alive" not in err and "already in use" not in err, err
    assert not address_file.exists()  # removed on the way out: it names no cluster any more
