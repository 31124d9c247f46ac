"""The parser of every ``mwumkl-dist`` command, and the commands' options.

It imports the standard library and :mod:`.args` only, so that ``--version``, ``--help`` and a usage error
answer at once (about 0.1 s of CPU time, against 1.5-2 s to import scikit-learn, numba and the package);
each command names its handler ``(module, function)``, which :mod:`.commands` imports when the command runs
(this module imports no command module: they import its constants). The few names of the library that the
options show are copied here (tests/test_new_user.py checks them against their owners).
"""

from __future__ import annotations

import argparse

from mwumkl_dist.cli.args import (
    PROG,
    C_or_auto,
    Parser,
    add_zero_based_argument,
    auto_or_positive_int,
    device_name,
    epsilon_or_auto,
    kernel_spec,
    memory_size,
    n_components_or_auto,
    n_jobs,
    positive_float,
    positive_int,
    selectivity_choice,
)
from mwumkl_dist.core.kernel_syntax import KERNEL_SPEC_HELP
from mwumkl_dist.core.version import __version__
from mwumkl_dist.devices.threads import available_cpus

__all__ = [
    "build_parser",
    "add_model_commands",
    "add_store_commands",
    "add_plot_command",
    "add_cluster_command",
    "DEFAULT_KERNELS",
    "DEFAULT_PORT",
    "POLISH",
    "PREDICT_OUTPUTS",
]

#: The kernels of ``fit`` and ``demo`` when ``--kernels`` is not given (a kernel store: its own).
DEFAULT_KERNELS = "auto"
#: ``--polish`` choices -> the estimator's ``polish``.
POLISH = {"auto": "auto", "yes": True, "no": False}
#: What ``predict --output`` writes.
PREDICT_OUTPUTS = ("labels", "scores", "proba")
#: Dask's usual scheduler port.
DEFAULT_PORT = 8786

# Copies of the library's names (importing their modules would load numpy, numba and scikit-learn).
#: :data:`mwumkl_dist.solvers.spec.SOLVER_NAMES`
SOLVER_NAMES = ("auto", "mwu", "two-stage")
#: :data:`mwumkl_dist.solvers.two_stage.AUTO_TWO_STAGE_POINTS`
AUTO_TWO_STAGE_POINTS = 3001
#: :data:`mwumkl_dist.io.files.SUPPORTED_EXTENSIONS`
SUPPORTED_EXTENSIONS = (".svm", ".svmlight", ".libsvm", ".txt", ".csv", ".tsv", ".npy", ".npz")
#: :data:`mwumkl_dist.plotting.PLOT_KINDS`
PLOT_KINDS = ("weights", "path", "features")


#: Each command's one-line help and its ``--help`` description (``store KIND``: the store's kinds).
COMMAND_TEXTS = {
    "demo": (
        "fit on scikit-learn's breast-cancer data and show the test error and kernel weights",
        "Fit on scikit-learn's breast-cancer data (569 points, 30 features; 80/20 split, features "
        "min-max scaled on the training part) and print the test error, the fit time and the kernel weights.",
    ),
    "fit": (
        "fit a model on a data file and save it",
        "Fit a model on a labelled data file and save it. The features are scaled first "
        "(fitted on the training file, stored in the model, applied by predict and evaluate): min-max to "
        "[0, 1] for dense files, divided by the largest |value| of each feature for sparse (svmlight) files, "
        "which keeps them sparse. Ctrl-C stops the fit and saves the iterations done (exit code 130); a "
        "second Ctrl-C aborts.",
    ),
    "predict": (
        "write one predicted label (or scores, or probabilities) per line",
        "Predict every point of a data file, one line per point. CSV and .npy files may omit the "
        "label column. The model's feature scaling is applied first.",
    ),
    "evaluate": (
        "print accuracy and error on a labelled data file",
        "Print the accuracy and error of a model on a labelled data file (after the model's feature scaling).",
    ),
    "store": (
        "write training data or precomputed kernels to a Zarr store (for out-of-core fits)",
        "Write training data or precomputed kernels to a Zarr store; 'fit --store' reads it.",
    ),
    "store data": (
        "features and labels, chunked by rows",
        "Write a data file's features (dense or CSR) and labels to a data store chunked by rows. "
        "The features are stored as they are: scale them first if the fit should see scaled data.",
    ),
    "store kernels": (
        "precomputed kernels (m, n, n), from data and a kernel spec or from .npy files",
        "Write precomputed kernels to a kernel store: computed from --input and --kernels, "
        "or read from .npy files (--npy, one (n, n) or (m, n, n) array per file) with --labels.",
    ),
    "store info": (
        "validate a store and show its metadata",
        "Validate a store.",
    ),
    "plot": (
        "draw a saved model: kernel weights, the cross-validation path, feature weights (needs matplotlib)",
        "Draw a model saved by 'fit': its kernel weights (by width, or feature groups x kernels), the "
        "cross-validated error of each candidate C and selectivity with one standard error bars, and the "
        "weight per feature. Needs matplotlib: pip install 'mwumkl-dist[plot]'.",
    ),
    "cluster": (
        "start a local Dask cluster (scheduler + workers) that stays up; fit --scheduler ADDRESS uses it",
        "Start a Dask scheduler and worker processes on this machine and keep them up until Ctrl-C. "
        "Prints the scheduler's address: pass it to 'fit --scheduler ADDRESS' from another terminal.",
    ),
}


def _command(sub, name: str, parents):
    """The subparser of command ``name`` (its texts from :data:`COMMAND_TEXTS`) on the subparsers ``sub``."""
    help, description = COMMAND_TEXTS[name]
    return sub.add_parser(name.split()[-1], parents=list(parents), help=help, description=description)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``mwumkl-dist``: one subparser per command."""
    parser = Parser(
        prog=PROG,
        description="Multiple kernel learning by matrix multiplicative weights (MWUMKL).",
        epilog=f"Data files: {', '.join(SUPPORTED_EXTENSIONS)} (text formats also .gz/.bz2); "
        "the label is the last column of CSV and .npy files.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--debug", action="store_true", default=False, help="show tracebacks instead of one line")

    # Accepted after the command name too; SUPPRESS keeps the main parser's default.
    common = Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    add_model_commands(sub, common)
    add_plot_command(sub, [common])
    add_store_commands(sub, [common])
    add_cluster_command(sub, [common])
    return parser


# ----------------------------------------------------------------------------- model commands


def add_model_commands(sub, common) -> None:
    """Register ``demo``, ``fit``, ``predict`` and ``evaluate`` on the subparsers ``sub``."""
    model = _model_options()
    _add_demo(sub, [common, model])
    _add_fit(sub, [common, model])
    _add_predict(sub, [common])
    _add_evaluate(sub, [common])


def _add_n_jobs(parser) -> None:
    """``--n-jobs N``: the threads of this process (the estimator's ``n_jobs``)."""
    parser.add_argument(
        "--n-jobs",
        type=n_jobs,
        default=None,
        metavar="N",
        help="threads to use: -1 all cores, -2 all but one, N that many (default: every core this process may "
        "use, or MWUMKL_NUM_THREADS when set); results do not depend on it",
    )


def _model_options() -> argparse.ArgumentParser:
    """The options of the estimator, shared by ``demo`` and ``fit``."""
    model = Parser(add_help=False)
    group = model.add_argument_group("model")
    group.add_argument(
        "--kernels",
        type=kernel_spec,
        default=None,
        metavar="SPEC",
        help=f"the base kernels (default: {DEFAULT_KERNELS}; a kernel store's own with --store): {KERNEL_SPEC_HELP}",
    )
    group.add_argument(
        "--epsilon",
        type=epsilon_or_auto,
        default="auto",
        metavar="E",
        help="approximation error; sets T = ceil(8 rho^2 / E^2 ln n) iterations "
        "(default auto: 0.2 when the fit ends with the exact polish, else 0.1)",
    )
    group.add_argument(
        "--C",
        "-C",
        dest="C",
        type=C_or_auto,
        default="auto",
        metavar="C",
        help="2-norm soft-margin constant, 'inf' for the hard margin, or 'auto' (default): "
        "chosen by 3-fold cross-validation on at most 4000 training points",
    )
    group.add_argument(
        "--rho",
        type=positive_float,
        default=0.5,
        metavar="R",
        help="width parameter: 0.5 (default, as the authors' code) or 1.5 (the paper's bound)",
    )
    group.add_argument(
        "--selectivity",
        type=selectivity_choice,
        default="auto",
        metavar="S",
        help="how sparse the kernel weights are: 0 = uniform, larger = fewer kernels, 'exact' = the MKL "
        "optimum's, 'paper' = the published rule; auto (default): cross-validated with --C auto, else 100",
    )
    group.add_argument("--max-iter", type=positive_int, default=None, metavar="N", help="run N iterations instead of T")
    _add_solver_options(group)
    return model


def _add_solver_options(group) -> None:
    """The model options that pick the solver and its budget: ``--polish``, ``--solver``, ``--n-components``,
    ``--memory-limit``, ``--no-scale-C``."""
    group.add_argument(
        "--polish",
        choices=tuple(POLISH),
        default="auto",
        help="re-solve the SVM exactly with the learned weights: auto (default) up to 3000 points",
    )
    group.add_argument(
        "--solver",
        choices=SOLVER_NAMES,
        default="auto",
        help="mwu: the paper's algorithm on all points (time ~ n^2); two-stage: kernel weights on a subsample, "
        "then a linear solver on Nystroem features of the learned kernel (time ~ n; data files and data stores, "
        f"not kernel stores); auto (default): two-stage from {AUTO_TWO_STAGE_POINTS} points",
    )
    group.add_argument(
        "--n-components",
        type=n_components_or_auto,
        default="auto",
        metavar="R",
        help="the two-stage fit's Nystroem rank: R landmarks, or auto (default): doubled while the held-out error "
        "improves by more than its standard error, within --memory-limit, or the exact solve where its Gram fits",
    )
    group.add_argument(
        "--memory-limit",
        type=memory_size,
        default="auto",
        metavar="SIZE",
        help="the memory the two-stage fit's large arrays may take (1GB, 512MiB, bytes); beyond it the kernel "
        "columns are spilled or computed again; auto (default): 1 GiB, less under a smaller cgroup limit",
    )
    group.add_argument(
        "--no-scale-C",
        dest="scale_C",
        action="store_false",
        help="use C as the paper does (ridge 1/C) instead of relative to the training size (ridge 1/(C n))",
    )


def _add_demo(sub, parents):
    p = _command(sub, "demo", parents)
    p.add_argument("--seed", type=int, default=0, help="seed of the train/test split (default 0)")
    _add_n_jobs(p)
    p.set_defaults(handler=("model", "cmd_demo"))


def _add_fit(sub, parents):
    p = _command(sub, "fit", parents)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", metavar="FILE", help="training data (svmlight, CSV, .npy, .npz)")
    add_zero_based_argument(p)
    source.add_argument(
        "--store",
        metavar="DIR.zarr",
        help="a data store or a kernel store (see 'store'; which one is read from the store, so --kernels "
        "precomputed is implied for a kernel store): a small data store is read into memory, a large one's shards "
        "read their own rows; with --kernels auto the fit scales a store's features itself (one pass over it), "
        "with other kernels a store is used as stored",
    )
    p.add_argument("--model", required=True, metavar="OUT", help="where to save the model (.npz)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --model or --checkpoint file that is not a model (or a checkpoint) of this "
        "program; an older model or checkpoint is replaced without it, and a link, device or FIFO never is",
    )
    p.add_argument(
        "--no-scale",
        dest="scale",
        action="store_false",
        help="use the features as they are (default: scale them on the training file, see above; the estimator's "
        "scale_features=False)",
    )
    p.add_argument(
        "--probability",
        action="store_true",
        help="also fit probability estimates (Platt scaling on 5 cross-validation folds, as LIBSVM's -b 1), "
        "for 'predict --output proba'",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary")
    _add_n_jobs(p)
    _add_engine_options(p.add_argument_group("engine and resilience"))
    p.set_defaults(handler=("model", "cmd_fit"))


def _add_engine_options(dist) -> None:
    """``fit``'s options of where and how the fit runs: engine, device, Dask, checkpoints."""
    dist.add_argument(
        "--engine",
        choices=["local", "dask"],
        default=None,
        help="where the shards live (default: local; 'dask' when --scheduler is given, else a local threaded cluster)",
    )
    dist.add_argument(
        "--device",
        type=device_name,
        default=None,
        help="where the supersteps run: cpu (the default), or cuda, an NVIDIA GPU (needs the [gpu] extra)",
    )
    dist.add_argument(
        "--scheduler", metavar="ADDR", help="Dask scheduler address, e.g. tcp://HOST:8786 (implies --engine dask)"
    )
    dist.add_argument(
        "--shards",
        type=auto_or_positive_int,
        default="auto",
        metavar="N",
        help="row shards, or 'auto' (the default: one locally; on Dask one per worker for the linear stage, and the "
        "MWU iterations where a superstep is cheapest)",
    )
    dist.add_argument(
        "--kernel-shards", type=positive_int, default=1, metavar="K", help="kernel shards per row shard (Dask engine)"
    )
    dist.add_argument(
        "--scheduler-timeout",
        type=positive_float,
        default=10.0,
        metavar="S",
        help="seconds to reach the scheduler (default 10)",
    )
    dist.add_argument(
        "--worker-timeout",
        type=positive_float,
        default=600.0,
        metavar="S",
        help="seconds to wait for Dask workers, at the start and when every worker is gone mid-fit (default 600); "
        "the wait is reported after 2 s, then every 10 s",
    )
    dist.add_argument(
        "--checkpoint", metavar="PATH", help="write the solver state to PATH every --checkpoint-every iterations"
    )
    dist.add_argument("--checkpoint-every", type=positive_int, default=100, metavar="K", help="default 100")
    dist.add_argument("--resume", metavar="PATH", help="continue a fit from its checkpoint (same data and settings)")


def _model_on_data(sub, parents, name: str, *, data_help: str):
    """A command that applies a saved model to a data file (``--data``) or to precomputed test kernels
    (``--kernels-npy``): ``--model``, ``--zero-based``, ``--n-jobs``."""
    p = _command(sub, name, parents)
    p.add_argument("--model", required=True, metavar="M", help="a model saved by 'fit'")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", metavar="FILE", help=data_help)
    source.add_argument(
        "--kernels-npy",
        nargs="+",
        metavar="K.npy",
        help="for a model fitted from a kernel store: the test points' kernel values against the training points, "
        "one (m, n_test, n_train) array or one (n_test, n_train) file per kernel, in the store's kernel order",
    )
    add_zero_based_argument(p)
    _add_n_jobs(p)
    return p


def _add_predict(sub, parents):
    p = _model_on_data(sub, parents, "predict", data_help="the points to predict")
    p.add_argument(
        "--output",
        choices=PREDICT_OUTPUTS,
        default="labels",
        help="what to write: 'labels' (default, one per line), 'scores' (the decision function: one column "
        "for two classes, the positive class's; one per class for more) or 'proba' (class probabilities, "
        "one column per class; needs a model fitted with probability estimates). Scores and probabilities "
        "are comma-separated with a header line naming the classes",
    )
    p.add_argument(
        "--output-file", "-o", metavar="OUT", help="write to OUT instead of stdout ('-' or /dev/stdout: stdout)"
    )
    p.set_defaults(handler=("model", "cmd_predict"))


def _add_evaluate(sub, parents):
    p = _model_on_data(sub, parents, "evaluate", data_help="labelled test data")
    p.add_argument("--labels", metavar="FILE", help="the labels of --kernels-npy's points: a 1-d .npy array, or text")
    p.set_defaults(handler=("model", "cmd_evaluate"))


# ----------------------------------------------------------------------------- store, plot, cluster


def add_store_commands(subparsers, parents=()):
    """Add ``store data``, ``store kernels`` and ``store info`` to the ``mwumkl-dist`` parser."""
    p = _command(subparsers, "store", list(parents))
    sub = p.add_subparsers(dest="store_command", metavar="KIND", parser_class=type(p))
    d = _command(sub, "store data", list(parents))
    d.add_argument("--input", required=True, metavar="FILE", help="data file (svmlight, CSV, .npy, .npz)")
    add_zero_based_argument(d, "--input")
    d.add_argument("--output", required=True, metavar="DIR.zarr", help="the store directory to create")
    d.add_argument("--chunk-rows", type=positive_int, default=4096, metavar="R", help="rows per chunk (default 4096)")
    d.add_argument("--overwrite", action="store_true", help="replace an existing store")
    d.add_argument("--no-compress", dest="compress", action="store_false", help="store chunks uncompressed")
    d.set_defaults(handler=("store", "cmd_store_data"))

    k = _command(sub, "store kernels", list(parents))
    src = k.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", metavar="FILE", help="data file to compute the kernels from (with --kernels)")
    src.add_argument("--npy", nargs="+", metavar="K.npy", help="kernel matrices as .npy files (read memory-mapped)")
    k.add_argument("--kernels", default=None, metavar="SPEC", help="kernel spec for --input (e.g. 'paper')")
    add_zero_based_argument(k, "--input")
    k.add_argument("--labels", metavar="FILE", help="labels for --npy: a 1-d .npy array, or a text file, one per line")
    k.add_argument("--output", required=True, metavar="DIR.zarr", help="the store directory to create")
    k.add_argument("--chunk-rows", type=positive_int, default=1024, metavar="R", help="rows per chunk (default 1024)")
    k.add_argument(
        "--chunk-kernels", type=positive_int, default=None, metavar="M", help="kernels per chunk (default all)"
    )
    k.add_argument("--overwrite", action="store_true", help="replace an existing store")
    k.set_defaults(handler=("store", "cmd_store_kernels"))

    i = _command(sub, "store info", parents)
    i.add_argument("path", metavar="DIR.zarr", help="a store written by 'store data' or 'store kernels'")
    i.set_defaults(handler=("store", "cmd_store_info"))
    p.set_defaults(handler=("store", "cmd_store_usage"))
    return p


def add_plot_command(sub, parents) -> None:
    """Register ``plot MODEL -o FILE`` on the subparsers ``sub``."""
    p = _command(sub, "plot", parents)
    p.add_argument("model", metavar="MODEL", help="a model file saved by 'fit' (.npz)")
    p.add_argument("--output", "-o", required=True, metavar="FILE", help="the picture to write: .png, .svg, .pdf, ...")
    p.add_argument(
        "--kind",
        choices=("all", *PLOT_KINDS),
        default="all",
        help="which panel: weights, path, features, or all that apply side by side (default)",
    )
    p.add_argument("--dpi", type=positive_int, default=100, help="dots per inch of a raster picture (default 100)")
    p.set_defaults(handler=("plot", "cmd_plot"))


def _port(text: str) -> int:
    """A TCP port number, 0 to 65535 (0: any free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535 (0: any free one), got {text!r}")
    return value


#: Worker processes (and threads per worker) at most, per core of this machine: more only competes for the cores.
MAX_PER_CPU = 4


def _bounded_count(what: str):
    """A positive integer at most :data:`MAX_PER_CPU` times this machine's cores (at least 8)."""

    def parse(text: str) -> int:
        value = positive_int(text)
        limit = max(8, MAX_PER_CPU * available_cpus())
        if value > limit:
            raise argparse.ArgumentTypeError(
                f"{value} {what} on a machine of {available_cpus()} cores: at most {limit} (for more, start workers "
                "on several machines, see deploy/)"
            )
        return value

    return parse


_MEMORY_LIMIT_HELP = "must be 'auto', 0 (no limit), a fraction of the memory (0.5) or a size (2GiB)"


def _memory_limit(text: str) -> str | int | float:
    """Dask's ``memory_limit``: ``auto``, ``0`` (none), a fraction of the memory in (0, 1], or a size (``2GiB``)."""
    word = text.strip().lower()
    if word == "auto":
        return "auto"
    try:
        value = float(word)
    except ValueError:
        from dask.utils import parse_bytes  # only when a size is given: the parser loads nothing heavy

        try:
            value = parse_bytes(word)
        except (ValueError, TypeError):
            value = -1
        if value < 0:
            raise argparse.ArgumentTypeError(f"{_MEMORY_LIMIT_HELP}, got {text!r}") from None
        return int(value)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{_MEMORY_LIMIT_HELP}, got {text!r}")
    return value if value <= 1 else int(value)


def add_cluster_command(sub, parents) -> None:
    """Register ``cluster`` on the subparsers ``sub``."""
    p = _command(sub, "cluster", parents)
    cpus = available_cpus()
    p.add_argument(
        "--workers", type=_bounded_count("workers"), default=2, metavar="N", help="worker processes (default 2)"
    )
    p.add_argument(
        "--threads-per-worker",
        type=_bounded_count("threads per worker"),
        default=None,
        metavar="T",
        help=f"threads of each worker (default: this machine's {cpus} cores shared by the workers, at least 1)",
    )
    p.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"the scheduler's port (default {DEFAULT_PORT}; 0: any free one)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for the network, "
        "see deploy/README.md on security)",
    )
    p.add_argument(
        "--memory-limit",
        type=_memory_limit,
        default="auto",
        metavar="BYTES",
        help="memory of each worker, e.g. 2GiB (default auto: the machine's memory shared by the workers)",
    )
    p.add_argument("--dashboard", action="store_true", help="also serve Dask's dashboard on port 8787")
    p.add_argument(
        "--address-file",
        metavar="FILE",
        help="also write the scheduler's address to FILE (one line), once the workers are up: for scripts",
    )
    p.set_defaults(handler=("cluster", "cmd_cluster"))
