"""The benchmark suite: data download/verification, statistics, and one quick run of every experiment.

The quick run uses no file outside the repository: ``--datasets-dir`` points
at an empty folder and the download cache at a temporary one, so every data
set but scikit-learn's WDBC is a synthetic stand-in (as on a fresh clone).
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import math
import threading
from functools import partial

import numpy as np
import pytest
from conftest import closed_port

from benchmarks import datasets as D
from benchmarks.common import Context, RowJournal, median_ci

# ----------------------------------------------------------------------------- download path


@pytest.fixture
def http_root(tmp_path):
    """A local HTTP server on 127.0.0.1 serving ``tmp_path / 'www'``; yields (root, base_url)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


SVM_TEXT = b"-1 1:0.5 3:1\n+1 2:0.25 3:-2\n-1 1:1\n+1 2:1 3:0.125\n"


def _manifest(url, X, y, fmt=None, n_features=3):
    entry = {
        "file": "tiny.svm.gz",
        "sha256": "0" * 64,
        "n_samples": len(y),
        "n_features": n_features,
        "classes": {"-1.0": int(np.sum(y < 0)), "1.0": int(np.sum(y > 0))},
        "data_sha256": D.data_sha256(X, y),
        "source": {"url": url, "format": fmt or {"type": "svmlight"}},
    }
    return {"tiny": {"files": [entry], "note": "test"}}


def test_download_verifies_and_caches(http_root, tmp_path):
    root, base = http_root
    (root / "tiny").write_bytes(gzip.compress(SVM_TEXT))
    X = np.array([[0.5, 0, 1], [0, 0.25, -2], [1, 0, 0], [0, 1, 0.125]])
    y = np.array([-1.0, 1.0, -1.0, 1.0])
    manifest = _manifest(f"{base}/tiny", X, y)
    cache = tmp_path / "cache"
    ds = D.load_dataset("tiny", tmp_path / "nothing-here", manifest=manifest, cache=cache)
    assert ds.source == "cache"
    np.testing.assert_array_equal(ds.X, X)
    np.testing.assert_array_equal(ds.y, y)
    # Downloaded once: with the server's file gone, the verified cache still serves it.
    (root / "tiny").unlink()
    again = D.load_dataset("tiny", None, manifest=manifest, cache=cache, download=False)
    np.testing.assert_array_equal(again.X, X)


def test_download_with_wrong_checksum_is_refused(http_root, tmp_path):
    root, base = http_root
    (root / "tiny").write_bytes(SVM_TEXT.replace(b"0.125", b"0.126"))  # one value differs
    X = np.array([[0.5, 0, 1], [0, 0.25, -2], [1, 0, 0], [0, 1, 0.125]])
    manifest = _manifest(f"{base}/tiny", X, np.array([-1.0, 1.0, -1.0, 1.0]))
    cache = tmp_path / "cache"
    with pytest.raises(D.ChecksumError, match="do not match the manifest"):
        D.load_dataset("tiny", None, manifest=manifest, cache=cache)
    assert not any(cache.glob("*.npz")), "a file that failed verification must not be cached"


def test_tampered_cache_is_refused(http_root, tmp_path):
    root, base = http_root
    (root / "tiny").write_bytes(SVM_TEXT)
    X = np.array([[0.5, 0, 1], [0, 0.25, -2], [1, 0, 0], [0, 1, 0.125]])
    manifest = _manifest(f"{base}/tiny", X, np.array([-1.0, 1.0, -1.0, 1.0]))
    cache = tmp_path / "cache"
    D.load_dataset("tiny", None, manifest=manifest, cache=cache)
    np.savez_compressed(cache / "tiny.npz", X=X * 2, y=np.array([-1.0, 1.0, -1.0, 1.0]))
    with pytest.raises(D.ChecksumError, match="cached data checksum"):
        D.load_dataset("tiny", None, manifest=manifest, cache=cache, download=False)


def test_uci_csv_conversion(http_root, tmp_path):
    """The download path for the UCI originals: id column dropped, '?' rows dropped, labels mapped."""
    root, base = http_root
    (root / "bc.data").write_text("1001,5,1,2\n1002,?,3,4\n1003,1,10,2\n1004,3,3,4\n")
    X = np.array([[5.0, 1.0], [1.0, 10.0], [3.0, 3.0]])
    y = np.array([-1.0, -1.0, 1.0])
    fmt = {"type": "csv", "label_column": -1, "drop_columns": [0], "labels": {"2": -1, "4": 1}, "missing": "?"}
    manifest = _manifest(f"{base}/bc.data", X, y, fmt=fmt, n_features=2)
    ds = D.load_dataset("tiny", None, manifest=manifest, cache=tmp_path / "c")
    np.testing.assert_array_equal(ds.X, X)
    np.testing.assert_array_equal(ds.y, y)


def test_unreachable_source_and_no_download(tmp_path):
    manifest = _manifest(f"http://127.0.0.1:{closed_port()}/nothing", np.zeros((1, 3)), np.array([1.0]))
    with pytest.raises(D.DatasetUnavailableError, match="downloading is off"):
        D.load_dataset("tiny", tmp_path, manifest=manifest, cache=tmp_path / "c", download=False)
    with pytest.raises(D.DatasetUnavailableError, match="cannot download"):
        D.load_dataset("tiny", tmp_path, manifest=manifest, cache=tmp_path / "c")


def test_shared_file_checksum(tmp_path):
    """A file in a datasets folder is checked against the manifest's file sha256."""
    data = gzip.compress(SVM_TEXT)
    (tmp_path / "tiny.svm.gz").write_bytes(data)
    X = np.array([[0.5, 0, 1], [0, 0.25, -2], [1, 0, 0], [0, 1, 0.125]])
    manifest = _manifest(f"http://127.0.0.1:{closed_port()}/x", X, np.array([-1.0, 1.0, -1.0, 1.0]))
    with pytest.raises(D.ChecksumError, match="does not match the manifest"):
        D.load_dataset("tiny", tmp_path, manifest=manifest, cache=tmp_path / "c", download=False)
    manifest["tiny"]["files"][0]["sha256"] = hashlib.sha256(data).hexdigest()
    ds = D.load_dataset("tiny", tmp_path, manifest=manifest, cache=tmp_path / "c", download=False)
    assert ds.source == "shared" and ds.X.shape == (4, 3)


def test_shipped_manifest_lists_every_set_with_sources():
    manifest = D.load_manifest()
    assert set(manifest) == set(D.ALL_SETS) - {"wdbc"}
    for spec in manifest.values():
        for entry in spec["files"]:
            assert len(entry["sha256"]) == 64 and len(entry["data_sha256"]) == 64
            assert entry["source"]["url"].startswith("https://")


def test_data_checksum_ignores_formatting():
    X = np.array([[0.83398, 0.0986]])
    assert D.data_sha256(X, [1]) == D.data_sha256(np.array([[0.8339800000000001, 0.09859999999999999]]), [1.0])
    assert D.data_sha256(X, [1]) != D.data_sha256(X + 1e-5, [1])


# ----------------------------------------------------------------------------- statistics


def test_median_ci_order_statistics():
    ci = median_ci(np.arange(1, 31))  # x_(10) .. x_(21) for n = 30
    assert (ci["lo"], ci["hi"], ci["median"]) == (10, 21, 15.5)
    assert 0.95 <= ci["coverage"] < 0.96
    small = median_ci([3.0, 1.0])
    assert (small["lo"], small["hi"]) == (1.0, 3.0) and small["coverage"] < 0.95
    assert math.isnan(median_ci([])["median"])


# ----------------------------------------------------------------------------- baselines


def test_liblinear_features_equal_scikit_learn_nystroem():
    """LibLinear+'s own Nystroem evaluation gives scikit-learn's features, kernel by kernel."""
    from sklearn.kernel_approximation import Nystroem

    from benchmarks.baselines import LibLinearPlus, _sklearn_kernel
    from mwumkl_dist.kernels import KernelSet

    rng = np.random.default_rng(0)
    X, Z = rng.random((60, 4)), rng.random((9, 4))
    spec = "paper@1+3,linear,poly:2@0"
    est = LibLinearPlus(spec, n_components=20, random_state=3)
    est.transform_fit(X)
    F = est.transform(Z)
    for i, k in enumerate(KernelSet(spec, 4).specs):
        name, params = _sklearn_kernel(k)
        cols = slice(None) if k.features is None else list(k.features)
        ny = Nystroem(kernel=name, n_components=20, random_state=3 + i, **params).fit(X[:, cols])
        np.testing.assert_allclose(F[:, 20 * i : 20 * (i + 1)], ny.transform(Z[:, cols]), rtol=1e-7, atol=1e-9)


def test_liblinear_gram_path_matches_plain_linearsvc():
    """More features than points: fitting on the Gram matrix gives LinearSVC's decision function."""
    from sklearn.svm import LinearSVC

    from benchmarks.baselines import LibLinearPlus

    rng = np.random.default_rng(1)
    F = rng.normal(size=(40, 300))
    y = np.where(F[:, :5].sum(axis=1) > 0, 1, -1)
    F_new = rng.normal(size=(15, 300))
    plain = LinearSVC(C=0.05, dual=True, max_iter=100000, tol=1e-10).fit(F, y)
    est = LibLinearPlus(C=0.05, max_iter=100000)
    est.fit_features(F, y)
    assert est.basis_ is not None  # the reduced path was taken
    np.testing.assert_allclose(est.decision_from_features(F_new), plain.decision_function(F_new), atol=1e-5)
    gram = LibLinearPlus(C=0.05, max_iter=100000).fit_gram(F @ F.T, y)
    np.testing.assert_allclose(gram.decision_from_gram(F_new @ F.T), plain.decision_function(F_new), atol=1e-5)


def test_row_journal_resumes_and_sets_aside_other_settings(tmp_path):
    ctx = Context(out=tmp_path, log_stream=open(tmp_path / "log.txt", "w"))
    journal = RowJournal(ctx, "E9", {"splits": 3})
    journal.add("a/0/MWUMKL", {"error": 0.25})
    with open(journal.path, "a") as fh:
        fh.write('{"id": "a/1/MWU')  # a line cut by an interruption
    again = RowJournal(ctx, "E9", {"splits": 3})
    assert again.get("a/0/MWUMKL") == {"error": 0.25} and again.get("a/1/MWUMKL") is None
    assert again.resumed == 1
    again.add("a/1/MWUMKL", {"error": 0.5})  # appended on a clean line
    assert RowJournal(ctx, "E9", {"splits": 3}).get("a/1/MWUMKL") == {"error": 0.5}
    other = RowJournal(ctx, "E9", {"splits": 4})  # different settings: never mixed in
    assert other.get("a/0/MWUMKL") is None
    assert (tmp_path / "E9.partial.stale").is_file()
    other.finish()
    assert not other.path.exists()


# ----------------------------------------------------------------------------- quick run


# A long smoke run: in the slow set (python -m pytest -m slow; .ci/run runs it), timeout 10x its idle time or more.
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_quick_run_all_experiments(tmp_path, monkeypatch):
    """``python -m benchmarks all --quick`` on a fresh clone: every output exists and is sane."""
    from benchmarks.runner import main

    empty = tmp_path / "no-data"
    empty.mkdir()
    monkeypatch.setenv("MWUMKL_DIST_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    # One E1 split (quick: 2): the second repeats the first's code on another split of the same data.
    argv = ["all", "--quick", "--splits", "1", "--out", str(out), "--datasets-dir", str(empty), "--no-progress"]
    assert main(argv) == 0
    report = (out / "RESULTS.md").read_text()
    for key in ("E1", "E2", "E3", "E4", "E5"):
        assert (out / f"{key}.csv").stat().st_size > 0
        doc = json.loads((out / f"{key}.json").read_text())
        assert doc["quick"] is True and "--quick" in doc["command"]
        assert doc["machine"]["cores"] >= 1
        for fig in doc["figures"]:
            assert (out / fig).stat().st_size > 1000, fig
            assert f"({fig})" in report.replace("./", "")
        rows = doc["rows"]
        assert rows, key
        for r in rows:
            if "error" in r:
                assert 0.0 <= r["error"] <= 0.5, (key, r)
            if "fit_seconds" in r:
                assert r["fit_seconds"] > 0, (key, r)
        if key in ("E1", "E2", "E3", "E4"):
            methods = {r["method"] for r in rows}
            assert {"Uniform", "LibLinear+", "MWUMKL"} <= methods, (key, methods)
    e1 = json.loads((out / "E1.json").read_text())
    assert "wdbc" in e1["summary"]["datasets"]  # the real WDBC (scikit-learn)
    assert any("stand-in" in d for d in e1["summary"]["datasets"])
    assert "## E1" in report and "## E5" in report


def test_report_puts_the_hand_written_notes_in_their_sections(tmp_path):
    """``results/notes/EX.md`` opens section EX; another note is a section of its own at the end."""
    from benchmarks import report

    lines = ["# title", "", "## E1 — small sets", "", "generated E1", "", "## E7 — scale", "", "generated E7"]
    notes = tmp_path / report.NOTES
    assert report._with_notes(lines, notes) == lines  # no notes folder: unchanged
    notes.mkdir()
    (notes / "E7.md").write_text("E7 commentary\n")
    (notes / "threads.md").write_text("## Threads\n\nthread figures\n")
    assert report._with_notes(lines, notes) == [
        *lines[:7], "", "E7 commentary", "", "generated E7", "## Threads", "", "thread figures", "",
    ]  # fmt: skip
    # The committed report is what the generator writes from the committed results and notes.
    here = report.Path(report.__file__).resolve().parent
    assert report.render(here / "results", here / "RESULTS.md") == (here / "RESULTS.md").read_text()
