"""The ``mwumkl-dist`` command-line tool (also ``python -m mwumkl_dist``).

Commands: ``demo`` (fit on scikit-learn's breast-cancer data and show the
kernel weights), ``fit``, ``predict`` and ``evaluate``.  Bad input ends with one
line ``mwumkl-dist: error: ...`` on stderr: exit code 2 for a bad command line,
1 for a problem found while running, 130 when interrupted (``fit`` still saves
the iterations done).  ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
import zipfile

import numpy as np

from . import __version__, mwu
from ._bank import bank_of
from ._progress import ProgressBar, format_rate
from .estimator import AUTO_C_GRID, AUTO_C_POINTS, MWUMKLClassifier
from .io import SUPPORTED_EXTENSIONS, ZERO_BASED, add_zero_based_argument, format_label, load_data
from .kernels import KERNEL_SPEC_HELP, KernelSet, parse_kernels
from .mwu import FitInterrupted
from .stores import KernelStore, add_store_commands, open_store

__all__ = ["main", "build_parser"]

PROG = "mwumkl-dist"
#: Exit code of an interrupted command (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130
#: Largest number of kernel weights printed after ``fit`` (largest first).
_MAX_TABLE_ROWS = 12


class UsageError(Exception):
    """A bad command line: reported on one line with exit code 2."""


class CommandError(Exception):
    """A failure with its own exit code (1 unless given)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------------------- argument types


class _Parser(argparse.ArgumentParser):
    """Raises usage errors instead of printing the usage block; :func:`main` prints one line."""

    def error(self, message):
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _positive_float(text: str) -> float:
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value


def _epsilon(text: str):
    if text.strip().lower() == "auto":
        return "auto"
    return _positive_float(text)


def _margin_C(text: str):
    if text.strip().lower() == "auto":
        return "auto"
    value = _number(text)
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be 'auto', a positive number or 'inf' (hard margin), got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _kernel_spec(text: str) -> str:
    if text.strip().lower() == "precomputed":
        return "precomputed"  # only with 'fit --store' of a kernel store; checked there
    try:
        parse_kernels(text, 1)  # the syntax only; feature indices are checked against the data
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


# ----------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``mwumkl-dist``: one subparser per command."""
    parser = _Parser(
        prog=PROG,
        description="Multiple kernel learning by matrix multiplicative weights (MWUMKL).",
        epilog=f"Data files: {', '.join(SUPPORTED_EXTENSIONS)} (text formats also .gz/.bz2); "
        "the label is the last column of CSV and .npy files.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--debug", action="store_true", default=False, help="show tracebacks instead of one line")

    # Accepted after the command name too; SUPPRESS keeps the main parser's default.
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    model = _Parser(add_help=False)
    group = model.add_argument_group("model")
    group.add_argument("--kernels", type=_kernel_spec, default="paper", metavar="SPEC", help=KERNEL_SPEC_HELP)
    group.add_argument(
        "--epsilon",
        type=_epsilon,
        default="auto",
        metavar="E",
        help="approximation error; sets T = ceil(8 rho^2 / E^2 ln n) iterations "
        "(default auto: 0.2 when the fit ends with the exact polish, else 0.1)",
    )
    group.add_argument(
        "--C",
        "-C",
        dest="C",
        type=_margin_C,
        default="auto",
        metavar="C",
        help="2-norm soft-margin constant, 'inf' for the hard margin, or 'auto' (default): "
        "chosen by 3-fold cross-validation on at most 4000 training points",
    )
    group.add_argument(
        "--rho",
        type=_positive_float,
        default=0.5,
        metavar="R",
        help="width parameter: 0.5 (default, as the authors' code) or 1.5 (the paper's bound)",
    )
    group.add_argument(
        "--max-iter", type=_positive_int, default=None, metavar="N", help="run N iterations instead of T"
    )
    group.add_argument(
        "--polish",
        choices=("auto", "yes", "no"),
        default="auto",
        help="re-solve the SVM exactly with the learned weights: auto (default) up to 3000 points",
    )
    group.add_argument(
        "--no-scale-C",
        dest="scale_C",
        action="store_false",
        help="use C as the paper does (ridge 1/C) instead of relative to the training size (ridge 1/(C n))",
    )

    # More commands (e.g. bench, store) register here the same way.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_demo(sub, [common, model])
    _add_fit(sub, [common, model])
    _add_predict(sub, [common])
    _add_evaluate(sub, [common])
    add_store_commands(sub, [common])
    _add_bench(sub)
    return parser


def _add_bench(sub):
    p = sub.add_parser(
        "bench",
        help="reproduce the paper's experiments (needs a source checkout: benchmarks/)",
        description="Run the benchmark suite of a source checkout (python -m benchmarks); "
        "arguments after 'bench' are passed on, e.g. 'mwumkl-dist bench e1 --quick'.",
        add_help=False,
    )
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    """``bench``: hand the arguments to the source tree's benchmark runner."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(root, "benchmarks", "runner.py")):
        raise CommandError(f"no benchmarks/ folder next to the package in {root}: 'bench' needs a source checkout")
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks.runner import main as bench_main

    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    return int(bench_main(bench_args or ["--help"]) or 0)


def _add_demo(sub, parents):
    p = sub.add_parser(
        "demo",
        parents=parents,
        help="fit on scikit-learn's breast-cancer data and show the test error and kernel weights",
        description="Fit on scikit-learn's breast-cancer data (569 points, 30 features; 80/20 split, features "
        "min-max scaled on the training part) and print the test error, the fit time and the kernel weights.",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the train/test split (default 0)")
    p.set_defaults(func=cmd_demo)


def _add_fit(sub, parents):
    p = sub.add_parser(
        "fit",
        parents=parents,
        help="fit a model on a data file and save it",
        description="Fit a model on a labelled data file and save it. Ctrl-C stops the fit and saves the "
        "iterations done (exit code 130); a second Ctrl-C aborts.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", metavar="FILE", help="training data (svmlight, CSV, .npy, .npz)")
    add_zero_based_argument(p)
    source.add_argument(
        "--store",
        metavar="DIR.zarr",
        help="a data store, or a kernel store with --kernels precomputed (see 'store'): shards read their rows",
    )
    p.add_argument("--model", required=True, metavar="OUT", help="where to save the model (.npz)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary")
    dist = p.add_argument_group("engine and resilience")
    dist.add_argument(
        "--engine",
        choices=["local", "dask"],
        default=None,
        help="where the shards live (default: local; 'dask' when --scheduler is given, else a local threaded cluster)",
    )
    dist.add_argument(
        "--scheduler", metavar="ADDR", help="Dask scheduler address, e.g. tcp://HOST:8786 (implies --engine dask)"
    )
    dist.add_argument("--shards", type=_positive_int, default=1, metavar="N", help="row shards (default 1)")
    dist.add_argument(
        "--kernel-shards", type=_positive_int, default=1, metavar="K", help="kernel shards per row shard (Dask engine)"
    )
    dist.add_argument(
        "--scheduler-timeout", type=_positive_float, default=10.0, metavar="S", help="seconds to reach the scheduler"
    )
    dist.add_argument(
        "--checkpoint", metavar="PATH", help="write the solver state to PATH every --checkpoint-every iterations"
    )
    dist.add_argument("--checkpoint-every", type=_positive_int, default=100, metavar="K", help="default 100")
    dist.add_argument("--resume", metavar="PATH", help="continue a fit from its checkpoint (same data and settings)")
    p.set_defaults(func=cmd_fit)


def _add_predict(sub, parents):
    p = sub.add_parser(
        "predict",
        parents=parents,
        help="write one predicted label per line",
        description="Predict a label for every point of a data file, one per line. CSV and .npy files may "
        "omit the label column.",
    )
    p.add_argument("--model", required=True, metavar="M", help="a model saved by 'fit'")
    p.add_argument("--data", required=True, metavar="FILE", help="the points to predict")
    add_zero_based_argument(p)
    p.add_argument("--output", "-o", metavar="OUT", help="write the labels to OUT instead of stdout")
    p.set_defaults(func=cmd_predict)


def _add_evaluate(sub, parents):
    p = sub.add_parser(
        "evaluate",
        parents=parents,
        help="print accuracy and error on a labelled data file",
        description="Print the accuracy and error of a model on a labelled data file.",
    )
    p.add_argument("--model", required=True, metavar="M", help="a model saved by 'fit'")
    p.add_argument("--data", required=True, metavar="FILE", help="labelled test data")
    add_zero_based_argument(p)
    p.set_defaults(func=cmd_evaluate)


# ----------------------------------------------------------------------------- shared pieces


def _check_model_args(args) -> None:
    if args.epsilon != "auto" and not args.epsilon < 2.0 * args.rho:
        raise UsageError(f"--epsilon must be below 2 * rho = {2.0 * args.rho:g}, got {args.epsilon:g}")


def _estimator(args, **extra) -> MWUMKLClassifier:
    return MWUMKLClassifier(
        kernels=args.kernels,
        epsilon=args.epsilon,
        C=args.C,
        rho=args.rho,
        max_iter=args.max_iter,
        scale_C=args.scale_C,
        polish={"auto": "auto", "yes": True, "no": False}[args.polish],
        **extra,
    )


def _count_kernels(spec: str, n_features: int, X=None) -> int:
    """How many base kernels ``spec`` means (checking feature indices), without expanding a big bank."""
    if spec == "precomputed":
        return X.n_kernels
    bank = bank_of(spec)
    if bank is not None:
        return bank.n_kernels
    return len(KernelSet(spec, n_features))


def _describe_params(args, clf) -> str:
    """The fitted model's epsilon, C and rho, saying which were chosen automatically."""
    eps = f"epsilon {clf.epsilon_:g}" + (" (auto)" if args.epsilon == "auto" else "")
    if math.isinf(clf.C_):
        C = "C inf (hard margin)"
    else:
        # C="auto" without a cross-validation (a kernel store, a class too small to split): the default.
        auto = (" (cross-validated)" if clf.C_path_ else " (auto)") if args.C == "auto" else ""
        C = f"C {clf.C_:g}{auto}"
        C += " (ridge 1/(C n))" if args.scale_C else " (ridge 1/C, as in the paper)"
    polish = ", exact polish" if clf.polished_ else ""
    return f"{eps}, {C}, rho {args.rho:g}{polish}"


def _weights_table(names, weights, raw_weights, limit=None) -> list[str]:
    """The kernel weights as aligned lines; the ``limit`` largest when there are more."""
    order = np.arange(len(names))
    if limit is not None and len(names) > limit:
        order = np.argsort(-np.asarray(weights), kind="stable")[:limit]
    rows = [(names[i], f"{weights[i]:.6f}", f"{raw_weights[i]:.4e}") for i in order]
    head = ("kernel", "weight mu_i", "raw weight mu_i/r_i")
    widths = [max(len(head[k]), *(len(r[k]) for r in rows)) for k in range(3)]
    lines = [f"  {head[0]:<{widths[0]}}  {head[1]:>{widths[1]}}  {head[2]:>{widths[2]}}"]
    lines += [f"  {a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}" for a, b, c in rows]
    if len(order) < len(names):
        lines.append(f"  ... and {len(names) - len(order)} more kernels (the {len(order)} largest weights shown)")
    return lines


def _load_model(path: str) -> MWUMKLClassifier:
    if os.path.isfile(path) and not zipfile.is_zipfile(path):
        raise CommandError(f"{path}: not a model file saved by '{PROG} fit' (not an .npz archive)")
    model = MWUMKLClassifier.load(path)
    if model.support_vectors_ is None:
        raise CommandError(f"{path}: a model of precomputed kernels cannot predict from a data file")
    return model


def _check_writable(path: str, what: str) -> None:
    """Fail before a long fit, not after it, when ``path`` cannot be written."""
    if os.path.isdir(path):
        raise CommandError(f"cannot write the {what} to {path}: it is a directory")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CommandError(f"cannot write the {what} to {path}: directory {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise CommandError(f"cannot write the {what} to {path}: permission denied")


# ----------------------------------------------------------------------------- commands


def cmd_demo(args) -> int:
    """``demo``: breast cancer, 80/20 split, min-max scaling; test error and kernel weights."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import MinMaxScaler

    _check_model_args(args)
    X, y = load_breast_cancer(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=args.seed, stratify=y)
    scaler = MinMaxScaler().fit(X_train)  # on the training part only: no test information leaks in
    X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
    n_kernels = _count_kernels(args.kernels, X.shape[1])
    clf = _estimator(args)

    print(f"MWUMKL demo: Wisconsin diagnostic breast cancer (scikit-learn), {X.shape[0]} points, {X.shape[1]} features")
    print(
        f"split 80/20 (seed {args.seed}): {len(y_train)} train, {len(y_test)} test; "
        "features min-max scaled on the training part"
    )
    print(f"kernels {args.kernels} ({n_kernels})" + (", choosing C by cross-validation" if args.C == "auto" else ""))
    start = time.perf_counter()
    clf.fit(X_train, y_train)
    elapsed = time.perf_counter() - start
    print(f"parameters {_describe_params(args, clf)}")
    errors = int(np.sum(clf.predict(X_test) != y_test))
    rate = format_rate(clf.n_iter_ / max(elapsed, 1e-9))
    print()
    if args.C == "auto":
        print(f"fit time         {elapsed:.2f} s ({clf.n_iter_} iterations; the choice of C included)")
    else:
        print(f"fit time         {elapsed:.2f} s ({clf.n_iter_} iterations, {rate} it/s)")
    print(f"test error       {errors / len(y_test):.2%} ({errors} of {len(y_test)})")
    print(f"support vectors  {len(clf.support_)} of {len(y_train)}")
    print(f"bias             {clf.intercept_[0]:.6g}")
    print()
    print("kernel weights (mu_i on the trace-normalised kernels, mu_i/r_i on the raw kernels):")
    for line in _weights_table(clf.kernel_names_, clf.kernel_weights_, clf.raw_kernel_weights_):
        print(line)
    return 0


def cmd_fit(args) -> int:
    """``fit``: load, fit with a progress bar, save (also after Ctrl-C), summarise."""
    _check_model_args(args)
    _check_writable(args.model, "model")
    if args.store is not None:
        X, y = open_store(args.store), None
        classes, n = np.asarray(X.classes), X.n_samples
        d = getattr(X, "n_features", n)
        source = args.store
        if (args.kernels == "precomputed") != isinstance(X, KernelStore):
            raise UsageError("a kernel store needs --kernels precomputed, and only a kernel store takes it")
    else:
        if args.kernels == "precomputed":
            raise UsageError("--kernels precomputed needs --store with a kernel store")
        X, y = load_data(args.data, zero_based=ZERO_BASED[args.zero_based])
        classes, (n, d), source = np.unique(y), X.shape, args.data
    if len(classes) < 2:
        raise CommandError(
            f"{source}: the labels hold one class only ({format_label(classes[0])}); a classifier needs two or more"
        )
    n_kernels = _count_kernels(args.kernels, d, X)  # feature indices against the data, before the fit
    eps = args.epsilon
    if eps == "auto":  # resolved as the estimator will (it depends on whether the fit ends with the polish)
        C = None if args.C == "auto" else args.C
        eps = _estimator(args)._auto_epsilon(n, n_kernels, X if args.store is not None else None, C)
    n_iter = args.max_iter if args.max_iter is not None else mwu.iteration_count(eps, args.rho, n)
    n_problems = 1 if len(classes) == 2 else len(classes)  # one-vs-rest: one solve per class

    if args.C == "auto" and not isinstance(X, KernelStore) and not args.quiet:  # a kernel store: C = 1
        where = "" if args.store is None else " read from the store"
        print(
            f"choosing C: {len(AUTO_C_GRID)} candidates x 3-fold cross-validation on "
            f"{min(n, AUTO_C_POINTS)} points{where} (pass --C to skip)",
            file=sys.stderr,
        )
    bar = None if args.quiet else ProgressBar(n_iter * n_problems, stream=sys.stderr)
    seen = {"problem": 0, "last": 0, "base": None}

    def on_progress(info):
        if info.iteration <= seen["last"]:  # the next one-vs-rest problem started
            seen["problem"] += 1
            seen["base"] = None
        seen["last"] = info.iteration
        if seen["base"] is None:  # the rate leaves out the first iteration's warm-up
            seen["base"] = (info.iteration, info.elapsed)
        if bar is not None:
            prefix = f"class {seen['problem'] + 1}/{n_problems} " if n_problems > 1 else ""
            done, seconds = info.iteration - seen["base"][0], info.elapsed - seen["base"][1]
            bar.update(
                seen["problem"] * n_iter + info.iteration,
                rate=done / seconds if done > 0 and seconds > 0 else None,
                prefix=prefix,
            )
        return None

    engine = args.engine or ("dask" if args.scheduler else "local")
    if engine == "local" and (args.scheduler or args.kernel_shards > 1):
        raise UsageError("--scheduler and --kernel-shards need --engine dask")
    if args.checkpoint is not None:
        _check_writable(args.checkpoint, "checkpoint")
    # Ctrl-C: the solver stops after the current iteration and keeps what it computed.
    clf = _estimator(
        args,
        callback=on_progress,
        callback_every=max(1, n_iter // 1000),
        engine=engine,
        client=args.scheduler,
        n_shards=args.shards,
        n_kernel_shards=args.kernel_shards,
        scheduler_timeout=args.scheduler_timeout,
        checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
    )
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="interrupted after")  # reported below, once
            clf.fit(X, y, resume=args.resume)
    except FitInterrupted as exc:  # one-vs-rest classes left unfitted: no model to save
        raise CommandError(f"{exc}; nothing saved", EXIT_INTERRUPTED) from None
    finally:
        if bar is not None:
            bar.close()
    elapsed = time.perf_counter() - start
    clf.save(args.model)

    n_iters = np.atleast_1d(clf.n_iter_)
    if clf.interrupted_:
        done = ", ".join(str(int(t)) for t in n_iters)
        per_class = " (per class)" if n_problems > 1 else ""
        print(
            f"{PROG}: fit interrupted after {done} of {n_iter} iterations{per_class}; "
            f"the partial model was saved to {args.model}",
            file=sys.stderr,
        )
    if not args.quiet:
        labels = ", ".join(format_label(c) for c in classes[:10]) + (", ..." if len(classes) > 10 else "")
        total = int(n_iters.sum())
        how = "one solve" if n_problems == 1 else f"{n_problems} one-vs-rest solves"
        print(f"model saved to   {args.model}")
        print(f"data             {source}: {n} points, {d} features, {len(classes)} classes ({labels})")
        print(f"kernels          {args.kernels} ({n_kernels})")
        print(f"parameters       {_describe_params(args, clf)}")
        print(
            f"iterations       {total} ({how}, T = {n_iter}) in {elapsed:.2f} s "
            f"({format_rate(total / max(elapsed, 1e-9))} it/s)"
        )
        print(f"support vectors  {len(clf.support_)} of {n}")
        if n_problems == 1:
            print("kernel weights:")
            table = _weights_table(clf.kernel_names_, clf.kernel_weights_, clf.raw_kernel_weights_, _MAX_TABLE_ROWS)
            for line in table:
                print(line)
    return EXIT_INTERRUPTED if clf.interrupted_ else 0


def cmd_predict(args) -> int:
    """``predict``: one label per line, to stdout or ``--output``."""
    model = _load_model(args.model)
    if args.output is not None:
        _check_writable(args.output, "predictions")
    X, _ = load_data(args.data, n_features=model.n_features_in_, labels="auto", zero_based=ZERO_BASED[args.zero_based])
    text = "".join(format_label(v) + "\n" for v in model.predict(X))
    if args.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


def cmd_evaluate(args) -> int:
    """``evaluate``: accuracy and error on a labelled file."""
    model = _load_model(args.model)
    X, y = load_data(args.data, n_features=model.n_features_in_, zero_based=ZERO_BASED[args.zero_based])
    labels = np.unique(y).tolist()
    known = set(model.classes_.tolist())
    unknown = [v for v in labels if v not in known]
    if len(unknown) == len(labels):
        raise CommandError(
            f"{args.data}: none of its labels ({', '.join(map(format_label, unknown[:5]))}) is a class of the "
            f"model ({', '.join(map(format_label, model.classes_[:5]))})"
        )
    if unknown:
        warnings.warn(
            f"{args.data}: labels {', '.join(map(format_label, unknown[:5]))} are not classes of the model "
            "and count as errors",
            stacklevel=1,
        )
    n = len(y)
    correct = int(np.sum(model.predict(X) == y))
    print(f"points    {n}")
    print(f"accuracy  {correct / n:.4f} ({correct} of {n})")
    print(f"error     {(n - correct) / n:.4f} ({n - correct} of {n})")
    return 0


# ----------------------------------------------------------------------------- main


def _one_line(message) -> str:
    return " ".join(str(message).split())


def _fail(message, code: int) -> int:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)
    return code


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"{PROG}: warning: {_one_line(message)}", file=sys.stderr)


#: Errors of bad input or of the environment: reported by their message alone.
_EXPECTED = (ValueError, TypeError, OSError, MemoryError)


def main(argv=None) -> int:
    """Run ``mwumkl-dist`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # everything after 'bench' belongs to the benchmark runner, --help too
        argv = ["bench", "--", *argv[1:]] if len(argv) > 1 else argv
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return _fail(exc, 2)
    if args.command is None:
        return _fail(f"choose a command: demo, fit, predict or evaluate (see '{PROG} --help')", 2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = _show_warning
            return int(args.func(args) or 0)
    except UsageError as exc:
        return _fail(f"{exc} (see '{PROG} {args.command} --help')", 2)
    except CommandError as exc:
        return _fail(exc, exc.code)
    except KeyboardInterrupt:
        if args.debug:
            raise
        return _fail("interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: silence the flush at exit (the Python docs' recipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:
        if args.debug:
            raise
        if isinstance(exc, _EXPECTED):
            return _fail(exc, 1)
        return _fail(f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", 1)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
