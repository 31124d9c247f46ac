"""Progress over the whole fit (issue 31): the phases, the callback, ``verbose``, the command line's lines.

The facility (:mod:`mwumkl_dist.core.progress`) on its own, then what a fit reports through it, then
the command line: a two-stage fit whose stderr lines are timestamped with the process's CPU clock (a
shared machine's load does not move it) must have no silent stretch longer than a tenth of the fit.
"""

from __future__ import annotations

import io
import logging
import pickle
import re
import threading
import time

import numpy as np
import pytest
from sklearn.datasets import dump_svmlight_file

from mwumkl_dist import MWUMKLClassifier, ProgressInfo
from mwumkl_dist.cli import main
from mwumkl_dist.cli.progress import LineProgress, PhaseBars
from mwumkl_dist.core import progress
from mwumkl_dist.core.progress import LogSink

# ----------------------------------------------------------------------------- the facility


def test_a_phase_without_a_reporter_is_silent_and_costs_nothing():
    with progress.phase("columns", 10, unit="rows") as step:
        assert step.silent
        assert step.advance(5) is False
    seen = []
    with progress.reporting(seen.append), progress.quiet(), progress.phase("columns", 10) as step:
        step.advance()
    assert seen == []  # quiet: a fold's nested fit


def test_phases_reach_the_sink_with_counts_descriptions_and_stages():
    seen: list[ProgressInfo] = []
    with progress.reporting(seen.append):
        with progress.phase("cross-validation", 3, unit="fits", description="choosing C") as step:
            for _ in range(3):
                step.advance()
        with progress.stage("weight stage"), progress.phase("iterations", 2, unit="it") as step:
            step.update(2, s=np.ones(3))
        with progress.phase("newton", None, unit="steps", description="Newton") as step:
            step.advance()
            step.advance()
        with progress.reporting(lambda info: pytest.fail("a nested reporter replaced the fit's")):
            progress.phase("polish", 1).advance()
    assert [(i.phase, i.done, i.total) for i in seen] == [
        ("cross-validation", 0, 3), ("cross-validation", 1, 3), ("cross-validation", 2, 3),
        ("cross-validation", 3, 3), ("iterations", 0, 2), ("iterations", 2, 2), ("newton", 0, None),
        ("newton", 1, None), ("newton", 2, None), ("newton", 2, 2), ("polish", 0, 1), ("polish", 1, 1),
    ]  # fmt: skip
    assert seen[0].description == "choosing C" and seen[0].unit == "fits"
    assert seen[4].description == "weight stage: iterations"  # the stage's prefix
    assert seen[5].s.shape == (3,) and seen[5].iteration == 2 and seen[5].n_iter == 2
    assert seen[0].s is None and all(i.elapsed >= 0 for i in seen)


def test_a_phase_is_thread_safe_and_pickles_to_a_silent_one():
    seen = []
    with progress.reporting(seen.append), progress.phase("columns", 4000, unit="rows") as step:
        workers = [threading.Thread(target=lambda: [step.advance() for _ in range(1000)]) for _ in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        remote = pickle.loads(pickle.dumps(step))  # what a Dask shard gets
        assert remote.silent and remote.advance(10) is False
    assert step.done == 4000 and seen[-1].done == 4000
    assert [i.done for i in seen] == list(range(4001))  # every count once, in order


def test_a_failed_phase_is_not_shown_complete():
    seen = []
    with pytest.raises(RuntimeError), progress.reporting(seen.append):
        with progress.phase("newton", None) as step:
            step.advance()
            raise RuntimeError("stop")
    assert [(i.done, i.total) for i in seen] == [(0, None), (1, None)]


def test_the_log_sink_logs_each_tenth_and_every_ten_seconds_of_a_slow_phase(caplog):
    now = [0.0]
    sink = LogSink(logging.getLogger("mwumkl_dist"), every=10.0, clock=lambda: now[0])
    with caplog.at_level("INFO", logger="mwumkl_dist"):
        for done in range(0, 101):  # a phase of 100 units, 3 (fake) seconds each
            sink(ProgressInfo("columns", done, 100, 3.0 * done, "kernel columns", "rows"))
            now[0] += 3.0
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "kernel columns: 0/100 rows (0.0 s)"
    assert messages[-1].startswith("kernel columns: 100/100 rows")
    counts = [int(re.match(r"kernel columns: (\d+)/", m).group(1)) for m in messages]
    assert all(b - a <= 4 for a, b in zip(counts, counts[1:]))  # 10 s of 3 s units: at most 4 units apart
    assert "about" in messages[1]  # an ETA


def test_line_progress_under_a_slowed_clock_prints_at_least_every_few_seconds():
    """A fake phase: 100 units of 3 (fake) seconds each; the log gets a line at least every 5 s + one unit."""
    log = io.StringIO()
    now = [0.0]
    bar = LineProgress(total=100, file=log, mininterval=0, miniters=1, every=5.0, desc="fake")
    bar._time = lambda: now[0]
    bar.start_t = bar.last_print_t = bar._shown_at = 0.0  # tqdm's clock and the last line's, on the fake one
    stamps = []
    for _ in range(100):
        now[0] += 3.0
        before = log.getvalue().count("\n")
        bar.update(1)
        if log.getvalue().count("\n") > before:
            stamps.append(now[0])
    bar.close()
    gaps = np.diff([0.0, *stamps])
    assert gaps.max() <= 5.0 + 3.0 and len(stamps) >= 100 * 3.0 / 8.0
    assert "\r" not in log.getvalue()


def test_phase_bars_open_one_bar_per_phase():
    log = io.StringIO()
    bars = PhaseBars(file=log)
    for info in [ProgressInfo("cross-validation", d, 4, 0.0, "choosing C", "fits") for d in range(5)]:
        bars(info)
    for info in [ProgressInfo("newton", d, None, 0.0, "Newton steps", "steps") for d in range(3)]:
        bars(info)
    bars(ProgressInfo("newton", 2, 2, 0.0, "Newton steps", "steps"))  # closed with its count
    bars.close()
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("choosing C:") and "0/4" in lines[0]
    assert any(line.startswith("choosing C:") and "4/4" in line for line in lines)
    assert any(line.startswith("Newton steps:") and "2/2" in line for line in lines)
    assert PhaseBars(file=log, quiet=True)(ProgressInfo("x", 0, 1, 0.0)) is None


# ----------------------------------------------------------------------------- what a fit reports


def _problem(n=240, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, 4))
    y = (X[:, 0] + 0.3 * rng.standard_normal(n) > 0.5).astype(int)
    return X, y


@pytest.mark.timeout(300)
def test_the_callback_and_verbose_see_every_phase_of_a_fit(caplog):
    X, y = _problem()
    seen: list[ProgressInfo] = []
    with caplog.at_level("INFO", logger="mwumkl_dist"):
        clf = MWUMKLClassifier(random_state=0, probability=True, callback=seen.append, verbose=1).fit(X, y)
    phases = list(dict.fromkeys(i.phase for i in seen))
    assert phases == ["cross-validation", "iterations", "polish", "calibration"]
    searches = list(dict.fromkeys(i.description.split(":")[0] for i in seen if i.phase == "cross-validation"))
    assert searches[:2] == ["choosing C", "choosing the selectivity"]
    for name in phases:  # each phase counts up to its total
        infos = [i for i in seen if i.phase == name]
        assert infos[-1].done == infos[-1].total and all(i.total is not None for i in infos)
    iterations = [i for i in seen if i.phase == "iterations"]
    kept = np.count_nonzero(clf.kernel_weights_)  # a band of widths: the iterations ran on its kernels
    assert iterations[-1].done == clf.n_iter_ and iterations[-1].s.shape == (kept,)
    logged = caplog.text
    for info in seen:
        if info.done == info.total:
            assert f"{info.description}: {info.done}/{info.total}" in logged  # verbose logs the same phases


def test_the_two_stage_fit_reports_its_stages(monkeypatch):
    from mwumkl_dist.solvers.two_stage import solver as two_stage

    monkeypatch.setattr(two_stage, "WEIGHT_POINTS", 200)
    X, y = _problem(900)
    seen: list[ProgressInfo] = []
    MWUMKLClassifier(kernels="paper", C=1.0, solver="two-stage", callback=seen.append).fit(X, y)
    phases = list(dict.fromkeys(i.phase for i in seen))
    assert phases == ["iterations", "polish", "traces", "nystroem", "columns", "newton"]
    assert all(i.description.startswith("weight stage on 200 of 900 rows: ") for i in seen if i.phase == "polish")
    columns = [i for i in seen if i.phase == "columns"]
    assert columns[-1].done == columns[-1].total == 900
    newton = [i for i in seen if i.phase == "newton"]
    assert newton[-1].total == newton[-1].done >= 1  # known once the solve ended


# ----------------------------------------------------------------------------- the command line


class _TimedStderr(io.TextIOBase):
    """A stderr that records each line with the process's CPU time when it was written."""

    def __init__(self):
        self.lines: list[tuple[float, str]] = []
        self._part = ""

    def write(self, text):
        self._part += text
        while "\n" in self._part:
            line, self._part = self._part.split("\n", 1)
            self.lines.append((time.process_time(), line))
        return len(text)

    def isatty(self):
        return False


#: The full stage's phases: the Nystroem features (the data too large for the exact solve), or the exact solve.
FULL_STAGE_PHASES = {
    "nystroem": ("Nystroem rank", "kernel columns", "Newton steps"),
    "exact": ("exact solve: the combined kernel of 6000 rows", "C at the final size"),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("full_stage", sorted(FULL_STAGE_PHASES))
def test_a_cli_fit_is_never_silent_for_a_tenth_of_it(monkeypatch, tmp_path, capsys, full_stage):
    """Every phase of a two-stage fit (cross-validation, iterations, polish, Nystroem, columns, Newton or the
    exact solve, calibration) shows lines; no two consecutive lines of the fit are further apart than 10 % of its
    CPU time.

    A smaller set stands in for 10^5 rows: the weight sample is 300 rows (of 6000) and the first Nystroem
    rank 100, so that each stage has several units as on large data.
    """
    from mwumkl_dist.solvers import auto
    from mwumkl_dist.solvers.two_stage import exact
    from mwumkl_dist.solvers.two_stage import solver as two_stage

    if full_stage == "nystroem":  # 6000 rows stand in for a set whose Gram matrix does not fit
        monkeypatch.setattr(exact, "EXACT_POINTS", 1000)
    # A long call that reports nothing (LIBSVM, a Newton step's factorisation) is heard from every few seconds in
    # a fit of minutes: here, a fit of about a second of CPU, every fiftieth of a second (the bars' lines too).
    monkeypatch.setattr(progress, "HEARTBEAT_SECONDS", 0.02)
    monkeypatch.setattr("mwumkl_dist.cli.progress.LINE_SECONDS", 0.02)
    monkeypatch.setattr(two_stage, "WEIGHT_POINTS", 300)
    monkeypatch.setattr(two_stage, "N_COMPONENTS", 100)
    # Platt's folds sample at most AUTO_C_POINTS rows: on large data each of its 5 exact solves is a small part
    # of the fit, as here with 600 of the 6000 rows.
    monkeypatch.setattr(auto, "AUTO_C_POINTS", 600)
    X, y = _problem(6000, seed=1)
    data = tmp_path / "train.svm"
    dump_svmlight_file(X, y, str(data))
    # numba's compiled code and the modules of each phase load once per process (about 0.1 s CPU each for the
    # selective fits, the structure search and Platt's folds here: a tenth of this fit of about a second, but
    # nothing next to a large one, and the CLI says when it compiles): a default fit of every phase on a few rows
    # loads them before the clock starts.
    MWUMKLClassifier(n_jobs=1, probability=True).fit(X[:150], y[:150])
    stderr = _TimedStderr()
    monkeypatch.setattr("sys.stderr", stderr)
    start = time.process_time()
    code = main(["fit", "--data", str(data), "--model", str(tmp_path / "m.npz"), "--solver", "two-stage",
                 "--probability", "--n-jobs", "1"])  # fmt: skip
    end = time.process_time()
    assert code == 0
    out = capsys.readouterr().out
    assert "cv error" in out and "training error" in out and "majority class" in out
    text = "\n".join(line for _, line in stderr.lines)
    for expected in ("choosing C: ", "MWU iterations on 300 rows", "exact polish", *FULL_STAGE_PHASES[full_stage],
                     "calibrating probabilities"):  # fmt: skip
        assert expected in text, text
    stamps = np.array([start] + [t for t, _ in stderr.lines] + [end])
    gaps = np.diff(stamps)
    worst = int(np.argmax(gaps))
    around = stderr.lines[max(worst - 2, 0) : worst + 1]  # the lines before the silent stretch, and its end
    assert gaps.max() <= 0.1 * (end - start), (gaps.max(), end - start, [(t - start, line) for t, line in around])


def test_a_phase_waiting_on_a_long_call_is_heard_from(monkeypatch):
    monkeypatch.setattr(progress, "HEARTBEAT_SECONDS", 0.02)
    events = []
    with progress.reporting(events.append):
        with progress.phase("polish", 2, unit="problems", description="exact solve") as step:
            with step.waiting():
                time.sleep(0.3)  # a call that reports nothing
            beats = len(events)
            time.sleep(0.1)
            assert len(events) == beats  # the heartbeat stops with the call
            step.advance(2)
    assert beats >= 4 and all(e.done == 0 and e.phase == "polish" for e in events[:beats])
    assert [e.elapsed for e in events[:beats]] == sorted(e.elapsed for e in events[:beats])
    assert events[-1].done == 2
    with progress.phase("polish", 1).waiting():  # no reporter: nothing runs
        pass


def test_the_bars_redraw_a_waiting_phase(monkeypatch):
    from mwumkl_dist.cli.progress import PhaseBars

    monkeypatch.setattr("mwumkl_dist.cli.progress.LINE_SECONDS", 0.0)
    out = io.StringIO()
    bars = PhaseBars(file=out)
    for elapsed in (0.0, 3.0, 6.0):
        bars(progress.ProgressInfo("polish", 0, 1, elapsed, "exact solve", "problems"))
    bars(progress.ProgressInfo("polish", 1, 1, 7.0, "exact solve", "problems"))
    lines = [line for line in out.getvalue().splitlines() if line.startswith("exact solve")]
    assert len(lines) >= 3 and "1/1" in lines[-1]
