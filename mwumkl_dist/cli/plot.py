"""The ``plot`` command of ``mwumkl-dist``: a picture of a saved model (:mod:`mwumkl_dist.plotting`)."""

from __future__ import annotations

import os

from mwumkl_dist.cli.args import CommandError
from mwumkl_dist.cli.model import load_model_or_fail
from mwumkl_dist.io.atomic import atomic_file, check_output_path
from mwumkl_dist.plotting import MATPLOTLIB_MISSING, plot_model

__all__ = ["cmd_plot"]


def cmd_plot(args) -> int:
    """``plot``: load the model, draw it headless (Agg) and write the picture."""
    try:
        import matplotlib
    except ImportError:
        raise CommandError(MATPLOTLIB_MISSING) from None
    matplotlib.use("Agg")  # no display needed, none used
    model = load_model_or_fail(args.model, option="MODEL").model
    _check_output(args.output)
    try:
        figure = plot_model(model, args.kind, dpi=args.dpi)
        formats = figure.canvas.get_supported_filetypes()
        extension = os.path.splitext(args.output)[1]
        if extension[1:].lower() not in formats:
            raise CommandError(f"-o {args.output}: unknown picture format '{extension}' (use png, svg, pdf or "
                               f"one of the {len(formats)} formats matplotlib writes)")  # fmt: skip
        with atomic_file(args.output, "picture") as fh:  # a link, a device or a FIFO there is refused, not followed
            figure.savefig(fh, dpi=args.dpi, format=extension[1:].lower())
    finally:
        matplotlib.pyplot.close("all")
    print(f"{args.kind} plot of {args.model} written to {args.output}")
    return 0


def _check_output(path: str) -> None:
    if os.path.isdir(path):
        raise CommandError(f"-o {path}: is a directory; give a file name such as weights.png")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CommandError(f"-o {path}: directory {folder} does not exist")
    if not os.path.splitext(path)[1]:
        raise CommandError(f"-o {path}: no extension to tell the format; use e.g. weights.png or weights.svg")
    try:
        check_output_path(path, "picture")
    except OSError as exc:
        raise CommandError(f"-o {path}: {exc.strerror}") from None
