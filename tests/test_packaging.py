"""The package's extras: ``pip install -e '.[test]'`` (what CI runs) brings what the tests need.

A test that needs an optional module skips without it (``pytest.importorskip``); in CI such a skip
would hide the test for good, so each module the tests skip on must come with the ``test`` extra
(or the core dependencies), unless listed below with the reason it may stay optional.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Modules the tests import with importorskip -> the distribution that provides them.
DISTRIBUTIONS = {
    "cryptography": "cryptography",
    "cvxpy": "cvxpy",
    "dask_jobqueue": "dask-jobqueue",  # test_deploy finds it without importing it (see _needs_dask_jobqueue)
    "distributed": "dask",
    "hypothesis": "hypothesis",
    "pandas": "pandas",
    "yaml": "pyyaml",
    "zarr": "zarr",
}
#: Modules that may stay missing in CI, and why.
OPTIONAL = {
    "threadpoolctl": "a scikit-learn dependency, always there; importorskip only guards odd installs",
    "resource": "the standard library's POSIX module (absent on Windows)",
}


def _extras():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = lambda reqs: {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in reqs}  # noqa: E731
    return names(project["dependencies"]), {k: names(v) for k, v in project["optional-dependencies"].items()}


def test_the_test_extra_brings_every_module_the_tests_skip_without():
    core, extras = _extras()
    skipped_on = set()
    for path in (REPO / "tests").glob("test_*.py"):
        if path.name == Path(__file__).name:
            continue
        text = path.read_text()
        skipped_on |= set(re.findall(r'importorskip\("([A-Za-z_][A-Za-z0-9_.]*)"', text))
        skipped_on |= set(re.findall(r'find_spec\("([A-Za-z_][A-Za-z0-9_.]*)"\) is None', text))
    assert {"cryptography", "dask_jobqueue"} <= skipped_on  # TLS cases of test_dask_channel.py; the Slurm driver
    for module in sorted(skipped_on - set(OPTIONAL)):
        assert module in DISTRIBUTIONS, f"tests skip without {module!r}: add it to DISTRIBUTIONS or OPTIONAL here"
        dist = DISTRIBUTIONS[module]
        assert dist in core | extras["test"], f"tests skip without {module!r}, but the test extra lacks {dist!r}"
        assert dist in core | extras["dev"], f"the dev extra lacks {dist!r} (it holds the test extra's packages)"
