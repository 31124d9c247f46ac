"""Build the Markdown report (``benchmarks/RESULTS.md``) from the experiments' JSON outputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["write_report", "render"]

_E4 = ("MWUMKL", "Uniform", "LibLinear+")
_METHODS = ("MWUMKL", "MWUMKL-default", "MWUMKL-paper", "Uniform", "LibLinear+")


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def _C(row) -> str:
    """C as the row's method means it: size-relative for MWUMKL, raw for the paper's variant."""
    if row.get("C") is None:
        return "-"
    return f"{row['C']:g}" + (" (raw)" if row["method"] == "MWUMKL-paper" else "")


def _sec(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def _load(out: Path) -> dict:
    docs = {}
    for key in ("E1", "E2", "E3", "E4", "E5"):
        path = out / f"{key}.json"
        if path.is_file():
            with open(path, encoding="utf-8") as fh:
                docs[key] = json.load(fh)
    return docs


def _img(rel: str, name: str, alt: str) -> str:
    return f"![{alt}]({rel}/{name})"


def _header(doc) -> list[str]:
    m = doc["machine"]
    return [
        f"*Command:* `{doc['command']}` — {doc['started']}, {doc['seconds']:.0f} s"
        + (
            f" ({doc['resumed_measurements']} measurements taken over from an earlier run with the same settings)"
            if doc.get("resumed_measurements")
            else ""
        )
        + (" — **quick mode (shrunk; not the paper's settings)**" if doc["quick"] else ""),
        f"*Machine:* {m['cpu']}, {m['cores']} cores, {m.get('memory_gib')} GiB; numpy {m['numpy']}, "
        f"scikit-learn {m['scikit-learn']}, numba {m['numba']}; "
        + (f"MWUMKL on {m['mwumkl_threads']} thread(s), BLAS on {m['blas_threads']}; " if "mwumkl_threads" in m else "")
        + f"commit {m.get('git_commit')}",
        "",
    ]


def _e1(doc, rel) -> list[str]:
    s = doc["summary"]
    lines = ["## E1 — small data sets: median test error", ""]
    lines += _header(doc)
    st = doc["settings"]
    methods = [m for m in _METHODS if m in st["methods"]]
    lines += [
        f"{st['splits']} random stratified 80/20 splits per data set; kernels: {st['kernels']}; "
        f'C chosen on the training part only: by MWUMKL\'s built-in 3-fold cross-validation (`C="auto"`, '
        f"part of its fit time), by {st['cv_folds']}-fold cross-validation for the others; "
        "errors in %: median with the 95 % order-statistics confidence interval of the median "
        "(`lo-hi`), and the mean; then the median training time of the final fit (MWUMKL's includes its "
        "built-in choice of C; the others' cross-validation is not included).",
        "",
        "| data set | " + " | ".join(methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    for dataset, by in s["datasets"].items():
        cells = []
        for meth in methods:
            ci = by.get(meth)
            cells.append(
                "-"
                if ci is None
                else f"{_pct(ci['median'])} ({_pct(ci['lo'])}-{_pct(ci['hi'])}); mean {_pct(ci.get('mean'))}; "
                f"{_sec(ci['median_fit_seconds'])} s"
            )
        lines.append(f"| {dataset} | " + " | ".join(cells) + " |")
    lines += ["", "Goals (MWUMKL = the improved variant with its defaults; medians in %):", ""]
    lines += [
        "| data set | best baseline | MWUMKL | within 1 point | beats both | MWUMKL-paper | paper within 1 point |",
        "|---|---|---|---|---|---|---|",
    ]
    for dataset, g in s["goals"].items():
        lines.append(
            f"| {dataset} | {_pct(g['best_baseline_median'])} | {_pct(g['mwumkl_median'])} | "
            f"{'yes' if g['within_1_point'] else 'NO'} | {'yes' if g['beats_both_baselines'] else 'no'} | "
            f"{_pct(g.get('paper_median'))} | {'yes' if g.get('paper_within_1_point') else 'no'} |"
        )
    lines += ["", f"MWUMKL beats both baselines on {s['n_sets_beating_both']} of {len(s['goals'])} small sets.", ""]
    lines += _paired(doc["rows"], list(s["datasets"]))
    lines += [_img(rel, f, "E1") for f in doc["figures"]] + [""]
    return lines


def _paired(rows, datasets) -> list[str]:
    """Split by split, how often MWUMKL's test error is below, equal to and above each other method's."""
    by_split: dict = {}
    for r in rows:
        by_split.setdefault((r["dataset"], r["split"]), {})[r["method"]] = r["error"]
    others = [m for m in ("MWUMKL-paper", "Uniform", "LibLinear+") if any(m in v for v in by_split.values())]
    lines = [
        "Paired over the same splits (the test sets are small, so medians move in steps of one test point: "
        "2.4 points on sonar, 1.9 on heart): MWUMKL's error lower / equal / higher than each other method's.",
        "",
        "| data set | " + " | ".join(f"vs {m}" for m in others) + " |",
        "|---|" + "---|" * len(others),
    ]
    for dataset in datasets:
        cells = []
        for m in others:
            pairs = [v for (d, _), v in by_split.items() if d == dataset and "MWUMKL" in v and m in v]
            lower = sum(v["MWUMKL"] < v[m] for v in pairs)
            higher = sum(v["MWUMKL"] > v[m] for v in pairs)
            cells.append(f"{lower} / {len(pairs) - lower - higher} / {higher}")
        lines.append(f"| {dataset} | " + " | ".join(cells) + " |")
    return lines + [""]


def _curve(doc, rel, heading) -> list[str]:
    s = doc["summary"]
    st = doc["settings"]
    lines = [heading, ""] + _header(doc)
    lines += [
        f"Data: {st['dataset']}; kernels: {st['kernels']}; MWUMKL-paper uses the paper's epsilon "
        f'{st["epsilon"]}, MWUMKL its default (`epsilon="auto"`); C of each method chosen once on the first '
        f'{st["select_n"]} training points, by cross-validation (MWUMKL: its built-in `C="auto"`) '
        f"(chosen: {', '.join(f'{k} {v:g}' for k, v in s['chosen_C'].items() if v is not None)}); "
        f"MWUMKL-default chooses again at every size, inside its timed fit. Test error on "
        f"{st['test_points']} held-out points. Time = the final fit (kernel computations included).",
        "",
        "| n | " + " | ".join(f"{m} time (s) / error (%)" for m in _METHODS) + " |",
        "|---|" + "---|" * len(_METHODS),
    ]
    for n, by in s["by_size"].items():
        cells = []
        for meth in _METHODS:
            r = by.get(meth)
            cells.append("-" if r is None else f"{_sec(r['fit_seconds'])} / {_pct(r['error'])}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    if s.get("stopped"):
        lines += ["", "Stopped: " + "; ".join(f"{k} {v}" for k, v in s["stopped"].items())]
    goals = s.get("goals", {})
    speed = [f"n={n}: {g['speedup_vs_uniform']:.1f}x" for n, g in goals.items() if g["speedup_vs_uniform"]]
    if speed:
        lines += ["", "Uniform time / MWUMKL time: " + ", ".join(speed)]
    within = [
        f"n={n}: {'yes' if g['within_1_point'] else 'NO'}" for n, g in goals.items() if g["within_1_point"] is not None
    ]
    if within:
        lines += ["", "MWUMKL error within 1 point of the best baseline that ran: " + ", ".join(within)]
    lines += [""] + [_img(rel, f, doc["experiment"]) for f in doc["figures"]] + [""]
    return lines


def _e4(doc, rel) -> list[str]:
    s = doc["summary"]
    lines = ["## E4 — kernel scalability: time per kernel versus n", ""] + _header(doc)
    st = doc["settings"]
    lines += [
        f"{st['dataset']} with {st['kernels']} at {', '.join(map(str, st['sizes']))} training points "
        f"(fixed C: {st['fixed_C']}); seconds for the final fit (per kernel in the figure).",
        "",
        "| n | " + " | ".join(f"{m} time (s) / error (%)" for m in _E4) + " |",
        "|---|" + "---|" * len(_E4),
    ]
    for n, by in s["mushrooms"].items():
        cells = [("-" if m not in by else f"{_sec(by[m]['fit_seconds'])} / {_pct(by[m]['error'])}") for m in _E4]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"MWUMKL faster than LibLinear+ at every size: {'yes' if s['faster_than_liblinear_at_every_size'] else 'NO'}",
        "",
    ]
    lines += [_img(rel, f, "E4") for f in doc["figures"]] + [""]
    return lines


def _e5(doc, rel) -> list[str]:
    lines = ["## E5 — dynamic kernels (the paper's table)", ""] + _header(doc)
    lines += [
        "| data set | variant | points | kernels | C | epsilon | iterations | time (s) | test error (%) | paper "
        "| target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        target = (
            "-"
            if r["target_seconds"] is None
            else (f"<= {r['target_seconds']:.0f} s: {'met' if r['meets_target'] else 'NOT met'}")
        )
        paper = "-" if r["paper_seconds"] is None else f"{r['paper_seconds']:.0f} s"
        lines.append(
            f"| {r['dataset']} | {r['method']} | {r['n_train']} | {r['n_kernels']} | {_C(r)} "
            f"| {r['epsilon']:.3g} | "
            f"{r['n_iter']} | {_sec(r['fit_seconds'])} | {_pct(r['error'])} | {paper} | {target} |"
        )
    lines += [
        "",
        "MWUMKL = the defaults (C chosen by cross-validation, inside the time), except on the 100,000-kernel "
        "Sonar bank, where C = 100 is given (18 cross-validation fits of 100,000 kernels would dominate); "
        f"{doc['summary']['note']}.",
        "",
    ]
    return lines


def render(out: Path, report_path: Path) -> str:
    """The report's Markdown for the outputs in ``out`` (figure links relative to ``report_path``)."""
    docs = _load(out)
    rel = os.path.relpath(out, report_path.parent).replace(os.sep, "/")
    lines = [
        "# MWUMKL benchmark results",
        "",
        "Generated by `python -m benchmarks` (see `benchmarks/runner.py`) from the JSON files in "
        f"`{rel}/` and the commentary in `{rel}/{NOTES}/`; do not edit by hand.",
        "",
        "Methods: **MWUMKL** = the improved variant with the library's defaults, `MWUMKLClassifier(kernels=...)`: "
        'size-relative C chosen by built-in cross-validation on the training data (`C="auto"`), '
        '`epsilon="auto"` (0.2 when polishing, else at most 0.1 and small enough for T >= n/5 iterations) '
        'and `polish="auto"` (exact 2-norm SVM re-solve with '
        "the learned weights up to 3000 points); in the size curves (E2, E3) and E4 it runs with a C chosen "
        "once, like the baselines, and **MWUMKL-default** is the no-argument estimator refitted at every size "
        "(its selection inside its time). **MWUMKL-paper** = the algorithm as published (`scale_C=False, "
        "polish=False`, the paper's epsilon and kernel weights, raw C cross-validated). **Uniform** = LIBSVM on "
        "the average trace-normalised kernel; **LibLinear+** = Nystroem (150 components per kernel) + "
        "LIBLINEAR. Every method's C is chosen on the training part only; all methods see the same splits. "
        "All runs use one core per fit (one BLAS thread, one numba thread).",
        "",
        "## How to reproduce",
        "",
        "```",
        "pip install -e .[bench]",
        "python -m benchmarks all            # full run (about an hour on 2 cores); or e1 ... e5",
        "python -m benchmarks all --quick    # shrunk run, a few minutes",
        "python -m benchmarks report         # rebuild this file from the JSON outputs",
        "```",
        "",
        "Data: `--datasets-dir` (default `../shared/datasets`), else downloaded once from the LIBSVM / UCI "
        "addresses in `benchmarks/MANIFEST.json` into `$MWUMKL_DIST_CACHE` (default `~/.cache/mwumkl_dist`) "
        "and verified against its checksums.",
        "",
    ]
    if not docs:
        lines += ["No results yet.", ""]
    if "E1" in docs:
        lines += _e1(docs["E1"], rel)
    if "E2" in docs:
        lines += _curve(docs["E2"], rel, "## E2 — cod-rna: training time versus training size")
    if "E3" in docs:
        lines += _curve(docs["E3"], rel, "## E3 — a9a: test error versus training size")
    if "E4" in docs:
        lines += _e4(docs["E4"], rel)
    if "E5" in docs:
        lines += _e5(docs["E5"], rel)
    lines += _e6(out, rel)
    lines += _e7(out, rel)
    lines += _e8(out, rel)
    lines += _e10(out, rel)
    lines += _e35(out, rel)
    lines += _zoo(out, rel)
    return "\n".join(_with_notes(lines, out / NOTES)) + "\n"


#: Commentary written by hand, in ``results/notes/``: ``EX.md`` opens section EX (after its heading);
#: any other ``*.md`` is a section of its own (with its own ``## `` heading), after the experiments.
NOTES = "notes"


def _with_notes(lines: list[str], notes: Path) -> list[str]:
    """``lines`` with the hand-written commentary of ``notes`` put in (see :data:`NOTES`)."""
    if not notes.is_dir():
        return lines
    files = sorted(notes.glob("*.md"))
    by_key = {f.stem: f.read_text().strip("\n").splitlines() for f in files}
    out = []
    for line in lines:
        out.append(line)
        key = line[3:].split(" ", 1)[0] if line.startswith("## ") else None
        if key in by_key:
            out += ["", *by_key.pop(key)]
    for text in by_key.values():
        out += [*text, ""]
    return out


def _e6(out: Path, rel: str) -> list[str]:
    """E6, kernel selection (``benchmarks/bench_selection.py``, its own run and output folder ``e6/``)."""
    path = out / "e6" / "e6.json"
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    info = doc.get("info", {})
    table = (out / "e6" / "E6.md").read_text().rstrip("\n").splitlines()
    return [
        "## E6 — kernel selection",
        "",
        "`python -m benchmarks.bench_selection` (commit "
        f"{info.get('git_commit', '?')}, {'quick' if doc.get('quick') else 'full'} run): problems with a known set "
        "of relevant kernels, medians over splits (75/25, stratified). (a) `make_classification` with k "
        "informative of d features (columns shuffled), per-feature kernels; (b) labels from Gaussian bumps of "
        "one width on 2 features spanning [0, 10], the paper's 12 kernels, relevant = that width and its two "
        "neighbours; (c) real sets with 30 appended uniform-noise features, per-feature kernels, relevant = the "
        "original features' kernels. **MWUMKL** = `MWUMKLClassifier()` with no arguments; **MWUMKL-paper** = "
        '`selectivity="paper"` (the published exponents); **Uniform** = SVC on the average kernel; '
        "**EasyMKL** = Aiolli & Donini's algorithm as MKLpy implements it (written here, MKLpy's torch "
        "dependency is not installable), lambda by CV, SVC(C=100); **Oracle** = Uniform on the relevant "
        "kernels only. E2-E5 above were measured before the relative exponents (`selectivity`) existed; E1 "
        "with them (its commit line says which code each run used).",
        "",
        *table,
        "",
        _img(f"{rel}/e6", "e6_feature_weights.png", "E6: learned weight per feature against the truth"),
        "",
    ]


def _e10(out: Path, rel: str) -> list[str]:
    """E10, structure (``benchmarks/bench_structure.py``, its own run and output folder ``e10/``)."""
    path = out / "e10" / "E10.json"
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    commit = doc.get("machine", {}).get("git_commit", "?")
    table = (out / "e10" / "E10.md").read_text().rstrip("\n").splitlines()
    return [
        "## E10 — structure in the data",
        "",
        f"`python -m benchmarks.bench_structure` (commit {commit}): data whose signal lives in a few features or "
        "their interactions (E7's synthetic set, a madelon-like `make_classification`), `MWUMKLClassifier()` with "
        "no arguments against a tuned RBF SVC, the SVC on the true relevant features (oracle) and LightGBM's "
        "defaults. Every fit on one thread.",
        "",
        *table,
        "",
        _img(f"{rel}/e10", "e10_error.png", "E10: test error per problem and method"),
        "",
    ]


def _zoo(out: Path, rel: str) -> list[str]:
    """The structure zoo (``benchmarks/bench_zoo.py``, its own run and output folder ``zoo/``)."""
    path = out / "zoo" / "ZOO.json"
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    commit = doc.get("machine", {}).get("git_commit", "?")
    loads = [r["load"] for r in doc.get("rows", []) if "load" in r]
    table = (out / "zoo" / "ZOO.md").read_text().rstrip("\n").splitlines()
    return [
        "## ZOO — structure zoo: relevant features of any shape",
        "",
        f"`python -m benchmarks.bench_zoo` (commit {commit}): the 11 families of `benchmarks/structure_zoo.py` "
        "(signal in a few features as a linear, additive, 2-way, 3-way, ball, checkerboard, rule-like or mixed "
        "effect, 20 weak features, a dense all-features problem, redundant copies), the relevant features at "
        "random positions per seed, 5 % of the labels flipped. `MWUMKLClassifier()` with no arguments against "
        "LightGBM's defaults, a tuned RBF SVC on the relevant features only (oracle) and on all of them. Every "
        "fit on one thread; 1-minute load average during the runs "
        f"{f'{min(loads):.1f}-{max(loads):.1f}' if loads else '?'} (2 cores, shared).",
        "",
        *table,
        "",
    ]


def _e7(out: Path, rel: str) -> list[str]:
    """E7, scale in n (``benchmarks/bench_scale_n.py``, its own run and output folder ``e7/``)."""
    table_path = out / "e7" / "E7.md"
    if not table_path.exists():
        return []
    path = out / "e7" / "E7.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    info, st = doc.get("machine", {}), doc.get("settings", {})
    nys = st.get("nystroem", {})
    gamma = "scikit-learn's default 1 / n_features" if nys.get("gamma") is None else f"{nys['gamma']:g}"
    table = table_path.read_text().rstrip("\n").splitlines()
    return [
        "## E7 — scale in n: time, test error and peak memory versus the training size",
        "",
        f"`{info.get('command', 'python benchmarks/bench_scale_n.py')}` (commit {info.get('git_commit', '?')}, "
        f"{doc.get('started', '?')}, "
        + ("**smoke run: tiny sizes, timings mean nothing**" if st.get("smoke") else "full run")
        + "); "
        f"{info.get('cpu', '?')}, {info.get('cores', '?')} cores, {info.get('memory_gib', '?')} GiB; Python "
        f"{info.get('python', '?')}, numpy {info.get('numpy', '?')}, scikit-learn {info.get('scikit-learn', '?')}; "
        f"load average {_loadavg(info.get('load_average_start'))} at the start, "
        f"{_loadavg(info.get('load_average_end'))} at the end.",
        "",
        "Every (data set, n, method) point is a fresh Python process fitting on "
        f"{st.get('threads', 1)} thread(s) (BLAS, OpenMP and MWUMKL), so its peak RSS (`VmHWM` of the "
        "child: interpreter, imports, its data, the fit and the prediction) is its own; data are generated "
        "or parsed once beforehand and not timed. Training sets are nested prefixes of one shuffled pool; "
        "cod-rna = LIBSVM's training and test files pooled, a test set held out, min-max scaled on each "
        "point's training rows; synthetic = 20 uniform features, a checkerboard on two and a radial term "
        "on two more, 5 % label noise, its own test rows (the sizes are under each table). **MWUMKL** = "
        "`MWUMKLClassifier()` with its defaults (two-stage solver from 10^4 rows), after an untimed "
        "warm-up fit that loads numba's kernels; **LinearSVC** = `LinearSVC()`; **Nystroem+LinearSVC** = "
        f"Nystroem (RBF, gamma {gamma}, {nys.get('n_components', 500)} components) + `LinearSVC()`. "
        "Time = wall-clock seconds of `fit`. Slopes: least squares of log time on log n. Targets (the "
        f"issue's): MWUMKL's slope <= {st.get('target_slope', 1.2)}; from n = "
        f"{st.get('target_min_n', 100000)}, MWUMKL's time <= Nystroem+LinearSVC's and its error <= "
        f"Nystroem+LinearSVC's + {100 * st.get('error_margin', 0.003):.1f} points.",
        "",
        *table,
        "",
        _img(f"{rel}/e7", "e7_time.png", "E7: fit time versus n, log-log, with fitted slopes"),
        "",
        _img(f"{rel}/e7", "e7_error.png", "E7: test error versus n"),
        "",
        _img(f"{rel}/e7", "e7_memory.png", "E7: peak RSS versus n"),
        "",
    ]


def _e35(out: Path, rel: str) -> list[str]:
    """E35, lean default fits (``benchmarks/bench_lean.py``, output folder ``lean/``)."""
    path, table_path = out / "lean" / "lean.json", out / "lean" / "lean.md"
    if not (path.exists() and table_path.exists()):
        return []
    doc = json.loads(path.read_text())
    st = doc.get("settings", {})
    return [
        "## E35 — lean default fits: time and peak memory beside one tuned SVC fit and LightGBM",
        "",
        f"`{doc.get('command', 'python -m benchmarks.bench_lean')}` ({doc.get('started', '?')}, "
        + ("**smoke run: tiny sizes, timings mean nothing**" if st.get("smoke") else "full run")
        + f", {st.get('threads', 1)} thread(s) per fit; load average at the end "
        f"{_loadavg(doc.get('machine', {}).get('load_average_end'))}). Each fit is its own process on generated "
        "stand-ins (see the module's docstring); peak RSS is the child's high-water mark (interpreter, imports, "
        "data and fit), the figure in brackets its RSS just before `fit`; load = the 1-minute load average before "
        "and after the fit.",
        "",
        *table_path.read_text().rstrip("\n").splitlines(),
        "",
    ]


def _e8(out: Path, rel: str) -> list[str]:
    """E8, against a tuned RBF SVM (``benchmarks/bench_e8.py``, output folder ``e8/``; a quick subsampled run
    of the large sets, when there is one, in ``e8-large/``)."""
    runs = [(f, out / f / "E8.json") for f in ("e8", "e8-large") if (out / f / "E8.json").is_file()]
    if not runs:
        return []
    lines = [
        "## E8 — against a tuned RBF SVM",
        "",
        "`benchmarks/bench_e8.py`: `MWUMKLClassifier()` with the package's defaults (no argument passed; its "
        "kernels, C, selectivity and solver are its own choices, cross-validation inside the timed fit) against "
        '**SVC-RBF** = `GridSearchCV(SVC(kernel="rbf"), C = 10^-2 ... 10^4 (7 values) x gamma = 2^-4 ... 2^4 '
        "(9 values) times 1 / (d var X), cv=5)` on the training part, the reference of every paired "
        "comparison; **EasyMKL** (E6's implementation) on the kernels of the MWUMKL fit of the same split; "
        "**Nystroem500/2000+LinearSVC** = RBF Nystroem features (gamma 1 / (d var X), 500 or 2000 components) "
        "+ `LinearSVC()` (C=1); **LinearSVC** (C=1). Stratified random 75/25 splits, or the official "
        "training / test files (a9a, cod-rna, svmguide1; with a subsampled training file, one subsample per "
        "repetition); a training part larger than the run's cap is a stratified subsample (the same rows for "
        "every method); `MinMaxScaler(clip=True)` fitted on the training part. Δ = mean paired difference of "
        "the test error to SVC-RBF's (points, negative = better) with its standard error; a tie = within 0.5 "
        "points (on test sets under 200 rows: the same number of errors). Fit time = wall-clock seconds "
        "including each method's own search, one thread per fit.",
        "",
    ]
    for folder, path in runs:
        doc = json.loads(path.read_text())
        info, st = doc.get("machine", {}), doc.get("settings", {})
        table = (out / folder / "E8.md").read_text().rstrip("\n").splitlines()
        if folder != "e8":
            lines += ["### Large sets, subsampled (a quick run, not the protocol's full sizes)", ""]
        lines += [
            f"`{info.get('command', 'python benchmarks/bench_e8.py')}` (commit {info.get('git_commit', '?')}, "
            f"{doc.get('started', '?')}, {doc.get('seconds', 0):.0f} s"
            + (", **smoke run: generated data, the numbers mean nothing**" if st.get("smoke") else "")
            + f"); {info.get('cpu', '?')}, {info.get('cores', '?')} cores, {info.get('memory_gib', '?')} GiB; "
            f"Python {info.get('python', '?')}, numpy {info.get('numpy', '?')}, scikit-learn "
            f"{info.get('scikit-learn', '?')}; {st.get('threads', 1)} thread(s) per fit; load average "
            f"{_loadavg(info.get('load_average_start'))} at the start, {_loadavg(info.get('load_average_end'))} "
            "at the end.",
            "",
            "What this run covered (per set: protocol, splits, training / test rows, subsampling caps):",
            "",
            "| data set | source | protocol | splits | n train | n test | caps |",
            "|---|---|---|---|---|---|---|",
        ]
        for name in st.get("datasets", []):
            d = st.get("data", {}).get(name)
            if d is None:
                continue
            caps = []
            if d.get("max_train") is not None and d["max_train"] < d["rows"]:
                caps.append(f"training {d['max_train']} of {d['rows']}")
            if d.get("max_test") is not None:
                caps.append(f"test at most {d['max_test']}")
            cap = "; ".join(caps) or "-"
            lines.append(
                f"| {d.get('label', name)} | {d.get('source', '?')} | {d.get('protocol', '?')} | {d.get('splits')} | "
                f"{'/'.join(map(str, d.get('n_train', [])))} | {'/'.join(map(str, d.get('n_test', [])))} | {cap} |"
            )
        from .bench_e8 import DATASETS as E8_SETS

        missing = [d for d in E8_SETS if d not in st.get("datasets", [])]
        overall = []
        mw = [s for s in doc.get("summary", []) if s.get("method") == "MWUMKL" and s.get("paired_splits")]
        if mw:
            w, t, lo = (sum(s[k] for s in mw) for k in ("wins", "ties", "losses"))
            close = [s["dataset"] for s in mw if s["mean_diff"] <= 0.01]
            far = [s["dataset"] for s in mw if s["mean_diff"] > 0.01]
            overall = [
                f"MWUMKL against SVC-RBF over all {sum(s['paired_splits'] for s in mw)} paired splits of this run: "
                f"wins / ties / losses {w} / {t} / {lo}; mean error at most 1 point above the SVC's (or below it) on "
                f"{len(close)} of {len(mw)} sets"
                + (f" ({', '.join(close)})" if close else "")
                + (f"; more than 1 point worse on {', '.join(far)}" if far else "")
                + ".",
                "",
            ]
        lines += [
            "",
            f"Files: `{rel}/{folder}/E8.json` (settings, machine, every split), `E8.csv` (one line per set, split "
            "and method), `E8_summary.csv`, `E8.md` (the tables below), `e8_error.png`."
            + (f" Not in this run: {', '.join(missing)}." if missing else ""),
            "",
            *overall,
            *table,
            "",
            _img(f"{rel}/{folder}", "e8_error.png", "E8: test error relative to SVC-RBF"),
            "",
        ]
    return lines


def _loadavg(values) -> str:
    return "?" if not values else " / ".join(f"{v:.2f}" for v in values)


def write_report(out, report_path) -> Path:
    """Write the report for the outputs in ``out`` to ``report_path``."""
    out, report_path = Path(out), Path(report_path)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    text = render(out, report_path)
    with open(report_path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return report_path
