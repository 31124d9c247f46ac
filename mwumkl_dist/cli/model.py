"""The model commands of ``mwumkl-dist``: ``demo``, ``fit``, ``predict`` and ``evaluate``."""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
import zipfile

import numpy as np
from sklearn.utils.multiclass import type_of_target

from mwumkl_dist.cli.args import (
    PROG,
    ZERO_BASED,
    CommandError,
    UsageError,
    existing_file,
    interrupted_code,
    signal_name,
)
from mwumkl_dist.cli.parser import DEFAULT_KERNELS, POLISH
from mwumkl_dist.cli.progress import COMPILING_NOTE, PhaseBars, format_rate, numba_cache_is_cold
from mwumkl_dist.cli.scaling import FeatureScaling, read_model_file, save_model_file
from mwumkl_dist.cli.store import load_labels, read_npy_kernels
from mwumkl_dist.core.mwu_rules import FitInterrupted
from mwumkl_dist.data.backends import backend_named
from mwumkl_dist.data.problems import read_into_memory
from mwumkl_dist.estimator import MWUMKLClassifier
from mwumkl_dist.io.atomic import atomic_file, check_output_path, exclusive_writer
from mwumkl_dist.io.checkpoint import is_checkpoint_file
from mwumkl_dist.io.files import OneBasedAssumedWarning, format_label, read_data
from mwumkl_dist.io.model_files import is_model_file
from mwumkl_dist.io.zarr_format import KernelStore, open_store
from mwumkl_dist.kernels.specs import DataScale, FeatureSums, KernelSet, RandomGaussianBank, parse_kernels
from mwumkl_dist.solvers.auto import plan_iterations
from mwumkl_dist.solvers.base import continuous_target
from mwumkl_dist.solvers.two_stage import AUTO_TWO_STAGE_POINTS, weight_points_for
from mwumkl_dist.summary import fit_summary, weights_table

__all__ = [
    "cmd_demo",
    "cmd_fit",
    "cmd_predict",
    "cmd_evaluate",
    "load_model_or_fail",
]

#: Largest number of kernel weights printed after ``fit`` (largest first).
MAX_TABLE_ROWS = 12


# ----------------------------------------------------------------------------- shared pieces


def _check_model_args(args) -> None:
    if args.epsilon != "auto" and not args.epsilon < 2.0 * args.rho:
        raise UsageError(f"--epsilon must be below 2 * rho = {2.0 * args.rho:g}, got {args.epsilon:g}")


#: The estimator's parameters that ``demo`` and ``fit`` take as they are, from the options of the same name.
SAME_NAMED_PARAMS = ("kernels", "epsilon", "C", "rho", "selectivity", "max_iter", "scale_C", "n_jobs", "solver",
                     "n_components", "memory_limit")  # fmt: skip


def _device(args) -> str:
    """``--device``, or the estimator's default device."""
    return MWUMKLClassifier().device if args.device is None else args.device


def _estimator(args, **extra) -> MWUMKLClassifier:
    same = {name: getattr(args, name) for name in SAME_NAMED_PARAMS}
    # --no-scale: the features as they are, also to the estimator (which scales them with --kernels auto)
    scale_features = "auto" if getattr(args, "scale", True) else False
    return MWUMKLClassifier(**same, polish=POLISH[args.polish], scale_features=scale_features, **extra)


def _count_kernels(spec: str, n_features: int, X=None) -> int:
    """How many base kernels ``spec`` means (checking feature indices), without expanding a big bank."""
    if spec == "precomputed":
        return X.n_kernels
    zeros = FeatureSums(n_features, {})
    items = parse_kernels(spec, n_features, scale=lambda: DataScale(1, zeros, zeros))
    closed_form = [k for k in items if not isinstance(k, RandomGaussianBank)]
    if closed_form:
        KernelSet(closed_form, n_features)  # feature indices against the data
    return len(closed_form) + sum(k.n_kernels for k in items if isinstance(k, RandomGaussianBank))


def _note_compiling(quiet: bool = False) -> None:
    """Say on stderr that the next step compiles the numba kernels, when their cache is cold."""
    if not quiet and numba_cache_is_cold():
        print(f"{PROG}: {COMPILING_NOTE}", file=sys.stderr, flush=True)


def load_model_or_fail(path: str, n_jobs=None, *, option: str = "--model"):
    """The :class:`~mwumkl_dist.cli.scaling.ModelFile` of a model file written by ``fit``: the model, its feature
    scaling (None when it was not scaled) and its training file's svmlight index convention.

    The model predicts with ``n_jobs`` threads (``--n-jobs``), not with the setting it was fitted with.
    Errors are one line naming ``option`` and the file.
    """
    existing_file(path, option)
    if not zipfile.is_zipfile(path):
        raise CommandError(f"{option} {path}: not a model file saved by '{PROG} fit' (not an .npz archive)")
    saved = read_model_file(path)
    saved.model.set_params(n_jobs=n_jobs)
    return saved


def _load_points(args, saved, labels=True):
    """The points of ``--data`` with the model's feature count, scaled as the training file was; or the test
    kernels of ``--kernels-npy`` (``(m, n_test, n_train)``, labels from ``--labels``) for a precomputed model.

    ``--zero-based auto`` reads an svmlight file with the training file's convention when the model recorded it.
    """
    model, scaling = saved.model, saved.scaling
    precomputed = model.support_vectors_ is None
    if args.data is not None:
        if precomputed:
            raise CommandError(
                f"--model {args.model}: fitted on precomputed kernels, it predicts from test kernels: give "
                "--kernels-npy K.npy ((m, n_test, n_train)) instead of --data"
            )
        zero_based = ZERO_BASED[args.zero_based]
        if zero_based == "auto" and saved.zero_based is not None:
            zero_based = saved.zero_based
        X, y = read_data(existing_file(args.data, "--data"), n_features=model.n_features_in_, labels=labels,
                         zero_based=zero_based)[:2]  # fmt: skip
        return (X if scaling is None else scaling.transform(X)), y
    if not precomputed:
        raise CommandError(f"--kernels-npy: --model {args.model} was fitted on features: give --data FILE")
    mats, _ = read_npy_kernels([existing_file(f, "--kernels-npy") for f in args.kernels_npy])
    K = np.stack([np.asarray(k, dtype=np.float64) for k in mats])
    label_file = getattr(args, "labels", None)
    if labels is True and label_file is None:
        raise CommandError("--kernels-npy: evaluate needs the points' labels too (--labels FILE)")
    return K, (None if label_file is None else load_labels(existing_file(label_file, "--labels")))


def _check_distinct(written: tuple[str, str | None], *others: tuple[str, str | None]) -> None:
    """Refuse a command whose output ``written`` (option, path) is one of its other files: it would destroy it."""
    option, path = written
    if path is None:
        return
    for other, other_path in others:
        if other_path is not None and _same_file(path, other_path):
            raise UsageError(
                f"{option} {path} is also the {other} file: writing it would destroy that file; choose another path"
            )


def _same_file(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


#: What ``fit`` may replace without ``--overwrite``, by the kind of file it writes.
_OURS = {"model": is_model_file, "checkpoint": is_checkpoint_file}


def _check_writable(path: str, what: str, overwrite: bool = False) -> None:
    """Fail before a long fit, not after it, when ``path`` cannot or must not be written.

    A link, a device node, a FIFO, a directory, a bad name (empty, ending in a slash, too long) are
    refused, and a model or checkpoint path holding another kind of file unless ``overwrite``
    (:func:`~mwumkl_dist.io.atomic.check_output_path`).
    """
    try:
        check_output_path(path, f"{what} file" if what != "checkpoint" else what, is_ours=_OURS.get(what),
                          overwrite=overwrite)  # fmt: skip
    except OSError as exc:
        raise CommandError(f"--{'output-file' if what == 'predictions' else what} {path}: {exc.strerror}") from None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise CommandError(f"cannot write the {what} to {path}: permission denied")


# ----------------------------------------------------------------------------- demo


def cmd_demo(args) -> int:
    """``demo``: breast cancer, 80/20 split, min-max scaling; test error, the summary and the kernel weights."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    _check_model_args(args)
    args.kernels = args.kernels or DEFAULT_KERNELS
    X, y = load_breast_cancer(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=args.seed, stratify=y)
    scaling = FeatureScaling.fit(X_train)  # on the training part only: no test information leaks in
    X_train, X_test = scaling.transform(X_train), scaling.transform(X_test)
    _count_kernels(args.kernels, X.shape[1])  # feature indices, before the fit
    progress = PhaseBars()
    clf = _estimator(args, callback=progress)

    print(f"MWUMKL demo: Wisconsin diagnostic breast cancer (scikit-learn), {X.shape[0]} points, {X.shape[1]} features")
    print(
        f"split 80/20 (seed {args.seed}): {len(y_train)} train, {len(y_test)} test; "
        "features min-max scaled on the training part"
    )
    sys.stdout.flush()  # before the progress on stderr
    _note_compiling()
    start = time.perf_counter()
    try:
        clf.fit(X_train, y_train)
    finally:
        progress.close()
    elapsed = time.perf_counter() - start
    errors = int(np.sum(clf.predict(X_test) != y_test))
    print()
    chosen = " (the choice of C included)" if args.C == "auto" else ""
    print(f"fit time         {elapsed:.2f} s{chosen}")
    print(f"test error       {100 * errors / len(y_test):.2f} % ({errors} of {len(y_test)})")
    for line in fit_summary(clf, X_train, y_train):
        print(line)
    print()
    print("kernel weights (mu_i on the trace-normalised kernels, mu_i/r_i on the raw kernels):")
    for line in weights_table(clf.kernel_names_, clf.kernel_weights_, clf.raw_kernel_weights_):
        print(line)
    return 0


# ----------------------------------------------------------------------------- fit


#: A data file above this many bytes takes long enough to read (seconds) for ``fit`` to say it reads it.
LARGE_INPUT_BYTES = 8 << 20


def _large_input(path) -> bool:
    try:
        return path is not None and os.path.getsize(path) > LARGE_INPUT_BYTES
    except OSError:  # missing or unreadable: the reader says what is wrong, in one line
        return False


def _training_data(args):
    """``(X, y, classes, n, d, source, zero_based)`` of ``--data`` or ``--store`` (``d`` None for a kernel store);
    sets ``args.kernels`` where it was not given: a kernel store's are precomputed, else :data:`DEFAULT_KERNELS`.

    ``zero_based`` is the svmlight file's index convention (None for other inputs).
    """
    zero_based = None
    if args.store is not None:
        X, y = open_store(args.store), None
        classes, n = np.asarray(X.classes), X.n_samples
        kernel_store = isinstance(X, KernelStore)
        d = None if kernel_store else X.n_features
        source = args.store
        args.in_memory = read_into_memory(X)  # a small data store is fitted as its rows in memory
        if args.kernels is None:
            args.kernels = "precomputed" if kernel_store else DEFAULT_KERNELS
        elif kernel_store and args.kernels != "precomputed":
            raise UsageError(f"--store {args.store} is a kernel store (precomputed kernels): leave out --kernels")
        elif not kernel_store and args.kernels == "precomputed":
            raise UsageError(f"--kernels precomputed: --store {args.store} is a data store, not a kernel store")
    else:
        if args.kernels == "precomputed":
            raise UsageError("--kernels precomputed needs --store with a kernel store ('store kernels' writes one)")
        args.kernels = args.kernels or DEFAULT_KERNELS
        with warnings.catch_warnings():  # said in the summary's data line instead (--quiet: not at all)
            warnings.simplefilter("ignore", OneBasedAssumedWarning)
            X, y, zero_based = read_data(existing_file(args.data, "--data"), zero_based=ZERO_BASED[args.zero_based])
        classes, (n, d), source = np.unique(y), X.shape, args.data
    if len(classes) < 2:
        raise CommandError(
            f"{source}: the labels hold one class only ({format_label(classes[0])}); a classifier needs two or more"
        )
    labels = X.y if y is None else y
    if type_of_target(labels) == "continuous":
        fraction = next(v for v in classes if v != np.round(v))
        raise CommandError(
            f"{source}: the labels are not classes (e.g. {format_label(fraction)}, not a whole number); "
            f"{PROG} fits a classifier: labels must be classes"
        )
    if (problem := continuous_target(labels, PROG)) is not None:
        raise CommandError(f"{source}: {problem}")
    return X, y, classes, n, d, source, zero_based


def _planned_iterations(args, n: int, n_kernels: int) -> int:
    """The iteration count T of each binary problem, resolved as the estimator will."""
    two_stage = args.solver == "two-stage" or (
        args.solver == "auto" and args.kernels != "precomputed" and n >= AUTO_TWO_STAGE_POINTS
        and args.checkpoint is None and args.resume is None
        and not (args.C != "auto" and math.isinf(args.C))
    )  # fmt: skip
    if two_stage:  # the MWU iterations run on the weight subsample only, read into memory
        return _iteration_plan(args, weight_points_for(n), n_kernels, in_memory=True)
    return _iteration_plan(args, n, n_kernels)


def _iteration_plan(args, n: int, n_kernels: int, *, in_memory: bool | None = None) -> int:
    """T of an MWU fit on ``n`` points with the command line's settings (in memory unless from a store)."""
    plan = plan_iterations(
        epsilon=args.epsilon,
        max_iter=args.max_iter,
        rho=args.rho,
        polish=POLISH[args.polish],
        C=args.C,
        n_samples=n,
        n_kernels=n_kernels,
        in_memory=getattr(args, "in_memory", args.store is None) if in_memory is None else in_memory,
    )
    return plan.n_iter


def _fit_estimator(args, n_iter: int, progress: PhaseBars) -> MWUMKLClassifier:
    engine = args.engine or ("dask" if args.scheduler else "local")
    if engine == "local" and (args.scheduler or args.kernel_shards > 1):
        raise UsageError("--scheduler and --kernel-shards need --engine dask")
    if args.checkpoint is not None and args.overwrite:
        if os.path.isfile(args.checkpoint) and not os.path.islink(args.checkpoint):
            if not is_checkpoint_file(args.checkpoint):
                os.unlink(args.checkpoint)  # asked for: the fit refuses to replace a file that is no checkpoint
    # Ctrl-C: the solver stops after the current iteration and keeps what it computed.
    return _estimator(
        args,
        callback=progress,
        callback_every=max(1, n_iter // 1000),
        engine=engine,
        device=_device(args),
        client=args.scheduler,
        n_shards=args.shards,
        n_kernel_shards=args.kernel_shards,
        scheduler_timeout=args.scheduler_timeout,
        worker_timeout=args.worker_timeout,
        checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
        probability=args.probability,
    )


def _describe_scaling(args, scaling, clf) -> str:
    if scaling is not None:
        return scaling.describe()
    if not args.scale:
        return "none (--no-scale)"
    if hasattr(clf, "feature_scale_"):  # a store with --kernels auto: the estimator's, kept in the model
        return "learned by the fit on the store (one pass over its chunks) and kept in the model"
    return "none (a store is used as stored with explicit kernels)"


#: What ``fit`` says of an svmlight file that ``--zero-based auto`` read as one-based.
_ONE_BASED_NOTE = (
    "feature indices read as one-based (LIBSVM's convention: no index 0 occurs); "
    "if the file counts from 0, as scikit-learn's dump_svmlight_file writes, fit with --zero-based yes"
)


def _describe_data(source: str, X, n: int, d, classes) -> str:
    labels = ", ".join(format_label(c) for c in classes[:10]) + (", ..." if len(classes) > 10 else "")
    if d is None:  # a kernel store: its rows are points, it has no features
        return f"{source}: {n} points, {X.n_kernels} precomputed kernels, {len(classes)} classes ({labels})"
    return f"{source}: {n} points, {d} features, {len(classes)} classes ({labels})"


def cmd_fit(args) -> int:
    """``fit``: load, scale, fit with progress on stderr, save (also after Ctrl-C), summarise.

    The model file is this fit's alone while it runs: a second fit writing it fails at once.
    """
    _check_model_args(args)
    _check_distinct(("--model", args.model), ("--data", args.data), ("--resume", args.resume))
    _check_distinct(("--checkpoint", args.checkpoint), ("--data", args.data), ("--model", args.model))
    _check_writable(args.model, "model", args.overwrite)
    if args.checkpoint is not None:
        _check_writable(args.checkpoint, "checkpoint", args.overwrite)  # before the data is read
    if args.scheduler is None:  # the device is this machine's (a local or a local Dask fit): checked before the data
        try:
            backend_named(_device(args)).check()
        except RuntimeError as exc:
            raise CommandError(f"--device {_device(args)}: {exc}") from None
    with exclusive_writer(args.model, "model file"):
        return _fit_and_save(args)


def _fit_and_save(args) -> int:
    if not args.quiet and _large_input(args.data):  # reading a large file takes a while: say so before
        print(f"{PROG}: reading {args.data}", file=sys.stderr, flush=True)
    X, y, classes, n, d, source, zero_based = _training_data(args)
    n_kernels = _count_kernels(args.kernels, d, X)  # feature indices against the data, before the fit
    scaling = FeatureScaling.fit(X) if args.scale and args.store is None else None
    if scaling is not None:
        X = scaling.transform(X)
    n_iter = _planned_iterations(args, n, n_kernels)
    n_problems = 1 if len(classes) == 2 else len(classes)  # one-vs-rest: one solve per class

    progress = PhaseBars(quiet=args.quiet)
    try:
        clf = _fit_estimator(args, n_iter, progress)
        _note_compiling(args.quiet)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="interrupted after")  # reported below, once
            clf.fit(X, y, resume=args.resume)
    except FitInterrupted as exc:  # one-vs-rest classes left unfitted: no model to save
        raise CommandError(f"{exc}{signal_name()}; nothing saved", interrupted_code()) from None
    finally:
        progress.close()
    elapsed = time.perf_counter() - start
    save_model_file(clf, args.model, scaling, zero_based, overwrite=args.overwrite)

    n_iters = np.atleast_1d(clf.n_iter_)
    if clf.interrupted_:
        done = ", ".join(str(int(t)) for t in n_iters)
        per_class = " (per class)" if n_problems > 1 else ""
        checkpoint = f"; checkpoint {args.checkpoint} written (--resume {args.checkpoint})" if args.checkpoint else ""
        print(
            f"{PROG}: fit interrupted{signal_name()} after {done} of {n_iter} iterations{per_class}; "
            f"the partial model was saved to {args.model}{checkpoint}",
            file=sys.stderr,
        )
    if not args.quiet:
        print(f"model saved to   {args.model}")
        print(f"data             {_describe_data(source, X, n, d, classes)}")
        if zero_based is False and args.zero_based == "auto":
            print(f"                 {_ONE_BASED_NOTE}")
        print(f"scaling          {_describe_scaling(args, scaling, clf)}")
        train_X, train_y = (X, y) if args.store is None else (None, X.y)  # a store's rows are not read again
        iterations = _describe_iterations(args, clf, n, n_kernels, n_problems, elapsed)
        for line in fit_summary(clf, train_X, train_y, iterations=iterations):
            print(line)
        shards = "; the shards use their workers'" if clf.get_params()["engine"] == "dask" else ""
        print(f"threads          {clf.n_threads_} in this process{shards}")
        if args.probability:
            print("probabilities    Platt sigmoids fitted on cross-validated decision values (--output proba)")
        if clf.kernels == "precomputed":
            print(f"predict with     {PROG} predict --model {args.model} --kernels-npy K_TEST.npy "
                  "(test x training kernel values, (m, n_test, n_train))")  # fmt: skip
        if n_problems == 1:
            print("kernel weights:")
            table = weights_table(clf.kernel_names_, clf.kernel_weights_, clf.raw_kernel_weights_, MAX_TABLE_ROWS)
            for line in table:
                print(line)
    return interrupted_code() if clf.interrupted_ else 0


def _describe_iterations(args, clf, n: int, n_kernels: int, n_problems: int, elapsed: float) -> str:
    """The summary's iteration line: what the MWU iterations ran on, and the time (a rate only where it is one).

    A two-stage fit's iterations are those of its weight stage, on a subsample; its time includes the
    linear stage on all the rows, so iterations per second would mislead.  Likewise with ``C="auto"``,
    whose time includes the cross-validation.
    """
    total = int(np.sum(clf.n_iter_))
    how = "one solve" if n_problems == 1 else f"{n_problems} one-vs-rest solves"
    chosen = ", the choice of C included" if args.C == "auto" else ""
    if getattr(clf, "solver_", "mwu") == "two-stage":
        m = int(clf.weight_points_)
        T = _iteration_plan(args, m, n_kernels, in_memory=True)
        return (
            f"{total} in the weight stage ({how} on {m} of the {n} points, T = {T}), then the linear stage on all "
            f"{n} points; fit time {elapsed:.2f} s (both stages{chosen})"
        )
    T = _iteration_plan(args, n, n_kernels)
    if args.C == "auto":
        return f"{total} ({how}, T = {T}) in {elapsed:.2f} s (the choice of C included)"
    rate = format_rate(total / max(elapsed, 1e-9))
    return f"{total} ({how}, T = {T}) in {elapsed:.2f} s ({rate} it/s)"


# ----------------------------------------------------------------------------- predict, evaluate


def _number_text(value) -> str:
    return repr(float(value))


def _prediction_lines(model, X, output: str, source: str) -> list[str]:
    """The lines ``predict --output`` writes for the points ``X``."""
    if output == "labels":
        return [format_label(v) for v in model.predict(X)]
    classes = [format_label(c) for c in model.classes_]
    if output == "scores":
        scores = np.asarray(model.decision_function(X))
        header = classes[1:] if scores.ndim == 1 else classes  # two classes: the positive class's score
    else:
        if not hasattr(model, "predict_proba"):
            raise CommandError(
                f"{source}: the model gives no probability estimates; fit it with 'fit --probability' "
                "(MWUMKLClassifier(probability=True)) or use --output scores"
            )
        try:
            scores = np.asarray(model.predict_proba(X))
        except (AttributeError, ValueError) as exc:  # a model fitted without them
            raise CommandError(f"{source}: the model gives no probability estimates ({exc})") from None
        header = classes
    rows = scores[:, None] if scores.ndim == 1 else scores
    return [",".join(header)] + [",".join(_number_text(v) for v in row) for row in rows]


def cmd_predict(args) -> int:
    """``predict``: one label (or row of scores or probabilities) per line, to stdout or ``--output-file``."""
    if args.output_file in ("-", "/dev/stdout"):
        args.output_file = None  # stdout: written as a stream, whatever it is (a pipe, a terminal)
    _check_distinct(("--output-file", args.output_file), ("--model", args.model), ("--data", args.data))
    saved = load_model_or_fail(args.model, args.n_jobs)
    model = saved.model
    if args.output_file is not None:
        _check_writable(args.output_file, "predictions")
    X, _ = _load_points(args, saved, labels="auto")
    _note_compiling()
    text = "".join(line + "\n" for line in _prediction_lines(model, X, args.output, args.model))
    if args.output_file is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with atomic_file(args.output_file, "predictions file") as fh:  # a failed write keeps an older file
            fh.write(text.encode("utf-8"))
    return 0


def cmd_evaluate(args) -> int:
    """``evaluate``: accuracy and error on a labelled file."""
    saved = load_model_or_fail(args.model, args.n_jobs)
    model = saved.model
    X, y = _load_points(args, saved)
    if args.data is None and len(y) != X.shape[1]:
        raise CommandError(f"--labels {args.labels}: {len(y)} labels for the {X.shape[1]} points of --kernels-npy")
    source = args.data if args.data is not None else args.labels
    labels = np.unique(y).tolist()
    known = set(model.classes_.tolist())
    unknown = [v for v in labels if v not in known]
    if len(unknown) == len(labels):
        raise CommandError(
            f"{source}: none of its labels ({', '.join(map(format_label, unknown[:5]))}) is a class of the "
            f"model ({', '.join(map(format_label, model.classes_[:5]))})"
        )
    if unknown:
        warnings.warn(
            f"{source}: labels {', '.join(map(format_label, unknown[:5]))} are not classes of the model "
            "and count as errors",
            stacklevel=1,
        )
    _note_compiling()
    n = len(y)
    correct = int(np.sum(model.predict(X) == y))
    print(f"points    {n}")
    print(f"accuracy  {correct / n:.4f} ({correct} of {n})")
    print(f"error     {(n - correct) / n:.4f} ({n - correct} of {n})")
    return 0
