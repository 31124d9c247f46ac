"""Pictures of a model (issue 31): ``MWUMKLClassifier.plot``, :mod:`mwumkl_dist.plotting`, ``mwumkl-dist plot``.

Headless (matplotlib's Agg backend); each picture is checked for what it draws (bars, map cells, error
bars) and its written file for content (not a blank canvas).
"""

from __future__ import annotations

import re
import sys

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from mwumkl_dist import MWUMKLClassifier  # noqa: E402
from mwumkl_dist.cli import main  # noqa: E402
from mwumkl_dist.plotting import MATPLOTLIB_MISSING, plot_cv_path, plot_kernel_weights, pyplot  # noqa: E402


def _problem(n=150, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = (X[:, 0] + X[:, 1] + 0.2 * rng.standard_normal(n) > 1.0).astype(int)
    return X, y


@pytest.fixture(scope="module")
def scaled_model():
    X, y = _problem()
    return MWUMKLClassifier(kernels="scaled", random_state=0).fit(X, y)


@pytest.fixture(scope="module")
def per_feature_model():
    X, y = _problem(seed=1)
    return MWUMKLClassifier(kernels="paper-per-feature", C=1.0, selectivity=100.0).fit(X, y)


def _has_content(path) -> bool:
    """A written picture that is not one flat colour: some pixels far from the background."""
    image = matplotlib.image.imread(str(path))[..., :3]
    background = np.median(image.reshape(-1, 3), axis=0)
    drawn = np.abs(image - background).sum(axis=2) > 0.3
    return image.std() > 0.01 and 0.01 < drawn.mean() < 0.9


def test_the_kernel_weights_of_one_feature_group_are_bars_by_width(scaled_model):
    ax = plot_kernel_weights(scaled_model)
    bars = ax.patches
    m = len(scaled_model.kernel_names_)
    assert len(bars) == m
    heights = sorted(b.get_height() for b in bars)
    np.testing.assert_allclose(heights, sorted(scaled_model.kernel_weights_), rtol=1e-12)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[:3] == ["poly:1", "poly:2", "poly:3"]
    widths = [float(label.split(":")[1]) for label in labels[3:]]
    assert widths == sorted(widths) and all(len(label) <= len("gaussian:0.123") for label in labels)  # rounded
    plt.close("all")


def test_per_feature_kernels_are_a_map_of_groups_by_kernels(per_feature_model):
    ax = plot_kernel_weights(per_feature_model)
    image = ax.images[0].get_array()
    assert image.shape == (4, 12)  # 4 features x (3 polynomials + 9 widths)
    np.testing.assert_allclose(image.sum(), 1.0, rtol=1e-9)
    rows = [t.get_text() for t in ax.get_yticklabels()]
    heaviest = np.argmax(per_feature_model.feature_weights_)
    assert rows[0] == f"feature {heaviest}"  # the heaviest group on top
    plt.close("all")


def test_the_path_has_one_point_per_candidate_with_standard_error_bars(scaled_model):
    ax = plot_cv_path(scaled_model)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    n_candidates = sum(len(getattr(scaled_model, name, None) or {}) for name in
                       ("C_path_", "selectivity_path_", "group_selection_path_", "width_band_path_"))  # fmt: skip
    assert len(labels) == n_candidates and labels[0] == "C=0.1"
    assert len(ax.containers) == n_candidates  # one error bar each
    rows = scaled_model.cross_validation_["rows"]
    first = scaled_model.C_path_[0.1]
    _, _, (bar,) = ax.containers[0].lines
    low, high = bar.get_segments()[0][:, 1]
    np.testing.assert_allclose(high - low, 2 * 100 * np.sqrt(first * (1 - first) / rows), rtol=1e-9)
    chosen = [line for line in ax.lines if line.get_linestyle() == "--"]
    np.testing.assert_allclose(chosen[0].get_ydata()[0], 100 * scaled_model.cross_validation_["error"])
    plt.close("all")


def test_plot_draws_all_panels_and_writes_a_picture(per_feature_model, tmp_path):
    figure = per_feature_model.plot(path=tmp_path / "all.png")
    assert [ax.get_title().split(" (")[0] for ax in figure.axes if ax.get_title()] == [
        "kernel weights by feature group", "weight per feature",
    ]  # fmt: skip  # C given and no selectivity path: no path panel
    assert _has_content(tmp_path / "all.png")
    fig, ax = plt.subplots()
    assert per_feature_model.plot("features", ax=ax) is fig and len(ax.patches) == 4
    with pytest.raises(ValueError, match="one kind"):
        per_feature_model.plot("all", ax=ax)
    with pytest.raises(ValueError, match="kind must be"):
        per_feature_model.plot("nonsense")
    plt.close("all")


def test_without_matplotlib_the_error_says_how_to_install_it(monkeypatch, scaled_model, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"pip install 'mwumkl-dist\[plot\]'"):
        pyplot()
    with pytest.raises(ImportError, match="matplotlib"):
        scaled_model.plot()
    scaled_model.save(tmp_path / "m.npz")
    assert main(["plot", str(tmp_path / "m.npz"), "-o", str(tmp_path / "w.png")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"mwumkl-dist: error: {MATPLOTLIB_MISSING}" and len(err) <= 200


def test_the_cli_plots_a_saved_model_with_its_path(scaled_model, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # short paths in the messages, as a user types them
    model = tmp_path / "m.npz"
    scaled_model.save(model)
    loaded = MWUMKLClassifier.load(model)  # the paths and the chosen settings' cross-validation come back
    assert loaded.C_path_ == scaled_model.C_path_ and loaded.cross_validation_ == scaled_model.cross_validation_
    assert loaded.selectivity_path_ == scaled_model.selectivity_path_
    assert loaded.width_band_path_ == scaled_model.width_band_path_  # the candidates themselves, not their names
    assert main(["plot", str(model), "-o", str(tmp_path / "weights.png")]) == 0
    assert "written to" in capsys.readouterr().out and _has_content(tmp_path / "weights.png")
    assert main(["plot", str(model), "-o", str(tmp_path / "path.svg"), "--kind", "path"]) == 0
    assert (tmp_path / "path.svg").read_text().count("<path") > 10
    for argv, pattern in [
        ([".", "-o", "x.png"], r"MODEL \.: is a directory, not a file"),
        (["m.npz", "-o", "."], r"-o \.: is a directory; give a file name such as weights\.png"),
        (["m.npz", "-o", "weights"], r"-o weights: no extension to tell the format"),
        (["m.npz", "-o", "w.nonsense"], r"-o w\.nonsense: unknown picture format '\.nonsense' \(use png, svg, pdf"),
        (["none.npz", "-o", "w.png"], r"MODEL none\.npz: no such file"),
    ]:
        capsys.readouterr()
        assert main(["plot", *argv]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and len(err) <= 200, err
        assert err.startswith("mwumkl-dist: error: ") and re.search(pattern, err), err
