"""The two-stage solver's capacity (issue 20, item 3): a package tree's defaults against another's, side by side.

``python benchmarks/bench_capacity.py --old-tree DIR [--datasets svmguide1,magic04,...] [--pooled-cod-rna N]
[--variants old,new] [--nystroem 500,2000] [--datasets-dir DIR] [--out DIR]``

Each fit is ``MWUMKLClassifier()`` with no argument (the defaults of the tree it is imported from) on the E8
protocol (``benchmarks/bench_e8.py``: ``load``, ``make_splits`` with one split, ``split_data``): the official
training / test files of svmguide1, a9a and cod-rna, one stratified 75/25 split (seed 0) of the others, a
``MinMaxScaler(clip=True)`` fitted on the training rows.  ``--pooled-cod-rna N`` adds E7's cod-rna point of
``N`` training rows (training and test files pooled, shuffled with seed 0, 30,000 test rows, the next ``N``
the training rows, min-max scaled on them).

Variants: ``old`` imports ``mwumkl_dist`` from ``--old-tree`` (e.g. ``git archive`` of the commit before the
change), ``new`` from this checkout; each fit runs in its own process (one BLAS / numba thread, an untimed
warm-up fit on 1 % of the rows first), so neither sees the other's compiled code or memory.  With
``--nystroem``: RBF Nystroem (gamma ``1 / (d var X)``, as E8) + ``LinearSVC()`` in this process.

Recorded per fit: test error (%), fit wall and CPU seconds, ``C_``, ``solver_``, the rank ``n_components_``
and ``nystroem_residual_`` (new trees).  Writes ``capacity.json`` and ``capacity.md`` into ``--out``
(default ``benchmarks/results/capacity``).  The machine's load average is recorded at the start and the end:
on a shared box the wall times are only comparable within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

DATASETS = ("svmguide1", "magic04", "twonorm", "ringnorm", "a9a", "cod-rna")
POOLED_TEST = 30_000
SEED = 0
#: ``--datasets-dir`` of a ``--smoke`` run: E8's generated stand-ins instead of files.
SMOKE = "<smoke>"

_CHILD = r"""
import json, sys, time, warnings
import numpy as np
sys.path.append({bench!r})  # after the tree's mwumkl_dist (PYTHONPATH)
import mwumkl_dist
from benchmarks.bench_capacity import split
from mwumkl_dist import MWUMKLClassifier
Xtr, ytr, Xte, yte = split({name!r}, {datasets_dir!r}, {pooled!r})
step = max(1, len(ytr) // 100)
MWUMKLClassifier().fit(Xtr[::step], ytr[::step])  # numba's kernels loaded (or compiled): not timed
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    wall, cpu = time.perf_counter(), time.process_time()
    est = MWUMKLClassifier().fit(Xtr, ytr)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
err = float(np.mean(est.predict(Xte) != yte))
rank = getattr(est, "n_components_", None)
rank = None if rank is None else np.asarray(rank).tolist()
res = getattr(est, "nystroem_residual_", None)
res = None if res is None else np.asarray(res).tolist()
print("RESULT " + json.dumps(dict(error=100 * err, fit_s=wall, fit_cpu_s=cpu, C=float(est.C_), solver=est.solver_,
      rank=rank, residual=res,
      n_landmarks=len(est.support_), n_train=len(ytr), n_test=len(yte), package=mwumkl_dist.__file__,
      warnings=sorted({{str(w.message)[:120] for w in caught}}))))
"""


def split(name: str, datasets_dir, pooled: int | None):
    """``Xtr, ytr, Xte, yte`` of one set (E8's protocol), or of E7's pooled cod-rna with ``pooled`` training rows."""
    from benchmarks import bench_e8 as E8

    if pooled is None:
        smoke = datasets_dir == SMOKE  # E8's generated stand-ins
        ds = E8.load(name, None if smoke else datasets_dir, smoke)
        return E8.split_data(ds, E8.make_splits(ds, 1, SEED)[0])
    from sklearn.preprocessing import MinMaxScaler

    from benchmarks import datasets as D

    ds = D.load_dataset("cod-rna", datasets_dir, download=False, manifest=E8._manifest(datasets_dir))
    X, y = ds.combined()
    X = np.asarray(X.toarray() if hasattr(X, "toarray") else X, dtype=np.float64)
    perm = np.random.default_rng(SEED).permutation(len(y))
    test, train = perm[:POOLED_TEST], perm[POOLED_TEST : POOLED_TEST + int(pooled)]
    scaler = MinMaxScaler().fit(X[train])
    return scaler.transform(X[train]), y[train], scaler.transform(X[test]), y[test]


def run_tree(tree: Path, name: str, datasets_dir, pooled) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1", MWUMKL_NUM_THREADS="1")  # fmt: skip
    code = _CHILD.format(bench=str(HERE.parent), name=name, datasets_dir=datasets_dir, pooled=pooled)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd="/")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            row = json.loads(line[7:])
            if not row["package"].startswith(str(tree)):
                raise RuntimeError(f"the fit imported {row['package']}, not the tree {tree}")
            return row
    return {"status": "failed", "stderr": proc.stderr[-2000:]}


def run_nystroem(k: int, name: str, datasets_dir, pooled) -> dict:
    from benchmarks import bench_e8 as E8

    Xtr, ytr, Xte, yte = split(name, datasets_dir, pooled)
    row = E8.fit_predict("Nystroem2000+LinearSVC" if k == 2000 else "Nystroem500+LinearSVC", Xtr, ytr, Xte, seed=SEED)
    return dict(error=100 * float(np.mean(row.pop("pred") != yte)), fit_s=row["fit_s"], fit_cpu_s=row["fit_cpu_s"],
                n_train=len(ytr), n_test=len(yte))  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old-tree", help="a package tree with the defaults to compare against (required)")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--pooled-cod-rna", type=int, action="append", default=[], help="E7's cod-rna at N rows")
    parser.add_argument("--variants", default="old,new", help="which trees to fit (old, new; empty: neither)")
    parser.add_argument("--nystroem", default="", help="components of the Nystroem+LinearSVC references, e.g. 2000")
    parser.add_argument("--datasets-dir", default="/work/shared/datasets")
    parser.add_argument("--out", default=None, help="output folder (default benchmarks/results/capacity)")
    parser.add_argument("--smoke", action="store_true",
                        help="this tree alone on E8's generated heart stand-in, into a temporary folder: checks the "
                             "script")  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        import tempfile

        args.old_tree, args.variants, args.datasets, args.datasets_dir = str(HERE.parent), "new", "heart", SMOKE
        args.pooled_cod_rna, args.nystroem = [], ""
        args.out = args.out or tempfile.mkdtemp(prefix="bench-smoke-")
    if args.old_tree is None:
        parser.error("--old-tree is required (a package tree with the defaults to compare against)")
    args.out = args.out or str(HERE / "results" / "capacity")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trees = {"old": Path(args.old_tree).resolve(), "new": HERE.parent}
    trees = {k: v for k, v in trees.items() if k in args.variants.split(",")}
    points = [(name, None) for name in args.datasets.split(",") if name] + [
        (f"cod-rna pooled {n}", n) for n in args.pooled_cod_rna
    ]
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_start = os.getloadavg()
    rows = []
    for label, pooled in points:
        name = "cod-rna" if pooled else label
        for variant, tree in trees.items():
            row = dict(set=label, method=f"MWUMKL {variant}", **run_tree(tree, name, args.datasets_dir, pooled))
            rows.append(row)
            print(json.dumps(row), flush=True)
        for k in [int(k) for k in args.nystroem.split(",") if k]:
            row = dict(set=label, method=f"Nystroem{k}+LinearSVC", **run_nystroem(k, name, args.datasets_dir, pooled))
            rows.append(row)
            print(json.dumps(row), flush=True)
    commit = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "HEAD"], capture_output=True, text=True)
    meta = dict(command=" ".join([Path(sys.executable).name, *sys.argv]), started=started,
                ended=time.strftime("%Y-%m-%d %H:%M:%S"), load_start=load_start, load_end=os.getloadavg(),
                commit=commit.stdout.strip(), old_tree=str(Path(args.old_tree).resolve()),
                cpus=os.cpu_count())  # fmt: skip
    (out / "capacity.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        f"`{meta['command']}` (commit {meta['commit'][:10]}, {started} to {meta['ended']}; load average "
        f"{'/'.join(f'{x:.1f}' for x in load_start)} at the start, {'/'.join(f'{x:.1f}' for x in meta['load_end'])} "
        f"at the end, {meta['cpus']} cores shared with other work: compare wall times within this run only)",
        "",
        "| set | n train / test | method | test error % | fit s (wall) | fit s (CPU) | C_ | rank | residual |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" not in r:
            lines.append(f"| {r['set']} | - | {r['method']} | failed | | | | | |")
            continue
        res = r.get("residual")
        lines.append(
            f"| {r['set']} | {r['n_train']} / {r['n_test']} | {r['method']} | {r['error']:.2f} | {r['fit_s']:.1f} | "
            f"{r['fit_cpu_s']:.1f} | {r.get('C', '-')} | {r.get('rank', '-')} | "
            f"{'-' if res is None else f'{res:.3f}' if isinstance(res, float) else res} |"
        )
    (out / "capacity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
