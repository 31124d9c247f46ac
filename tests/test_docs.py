"""Every command and code block of the README and of docs/ runs (issue 31).

Each page's blocks run in order in a fresh directory, as a reader would type them: ``python`` blocks
in this process (one namespace per page), ``bash`` blocks in ``bash -e`` with this environment's
``mwumkl-dist`` first on the PATH.  ``text`` blocks are output and are not run.  A block that needs
what a test cannot have is marked on the line before it, ``<!-- docs-test: KIND -->``:

- ``cluster``: a running Dask cluster at an address the reader substitutes (``tcp://HOST:8786``);
- ``gpu``: an NVIDIA GPU;
- ``slow``: minutes of work, or a download (the benchmarks): checked, as the other two, not run.

A marked block is still checked: its Python compiles, its ``mwumkl-dist`` commands parse with the
tool's own parser (options and values), any other command exists.  ``pip install`` lines are never
run: the extras they name must exist in ``pyproject.toml``.  The pages' links to files of the
repository must lead somewhere, and the README must stay under 12 KB.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import pytest

from mwumkl_dist.cli import build_parser, main
from mwumkl_dist.cli.args import UsageError

matplotlib.use("Agg")  # the pages' pictures, headless
import matplotlib.pyplot  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: Marks a block may carry, and why it is not run.
KINDS = {"cluster": "needs a running Dask cluster", "gpu": "needs an NVIDIA GPU", "slow": "runs for minutes"}
LANGUAGES = {"python", "bash", "text"}
_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```\s*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*docs-test:\s*(\S+)\s*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int
    language: str
    code: str
    kind: str | None  # a KINDS key: checked only

    def __str__(self):
        return f"{self.page.relative_to(REPO)}:{self.line} ({self.language})"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    out = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        out.append(Block(page, line, m.group(1).strip(), m.group(2), mark.group(1) if mark else None))
    return out


def _pages_ids():
    return [str(p.relative_to(REPO)) for p in PAGES]


# ----------------------------------------------------------------------------- what a block is


def commands(code: str) -> list[str]:
    """The shell commands of a bash block: comments dropped, quoted newlines kept inside their command."""
    out, current = [], ""
    for line in code.splitlines():
        current = f"{current}\n{line}" if current else line
        try:
            shlex.split(current, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        if current.strip() and not current.lstrip().startswith("#"):
            out.append(current)
        current = ""
    assert not current, f"an unclosed quote in {code!r}"
    return out


def _extras() -> set:
    """The extras of pyproject.toml's ``[project.optional-dependencies]`` (their names)."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"(?m)^([A-Za-z][\w-]*)\s*=", section))


def check_pip(command: str) -> None:
    """``pip install -e '.[a,b]'``: the extras exist (nothing is installed)."""
    for spec in re.findall(r"\.\[([\w,-]+)\]", command):
        missing = set(spec.split(",")) - _extras()
        assert not missing, f"{command!r} names extras that pyproject.toml lacks: {missing}"


def check_command(command: str) -> None:
    """A command that is not run: its program exists; ``mwumkl-dist`` commands parse."""
    words = shlex.split(command, comments=True)
    while re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):  # environment assignments before the program
        words = words[1:]
    if words[0] == "pip":
        return check_pip(command)
    if words[0] == "mwumkl-dist":
        try:
            build_parser().parse_args(words[1:])
        except (UsageError, SystemExit) as exc:
            raise AssertionError(f"{command!r} does not parse: {exc}") from None
        return None
    if words[:2] == ["python", "-m"]:
        assert importlib.util.find_spec(words[2]) is not None, f"{command!r}: no module {words[2]}"
        return None
    assert (REPO / words[0]).exists() or subprocess.run(["bash", "-c", f"command -v {words[0]}"]).returncode == 0


# ----------------------------------------------------------------------------- running


def _environment() -> dict:
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run_block(block: Block, namespace: dict, cwd: Path) -> None:
    if block.language == "python":
        previous = os.getcwd()
        os.chdir(cwd)
        try:
            exec(compile(block.code, str(block), "exec"), namespace)  # noqa: S102  (the docs' own code)
        finally:
            os.chdir(previous)
            matplotlib.pyplot.close("all")
        return
    for command in commands(block.code):
        run_command(command, block, cwd)


#: Shell syntax that only bash runs: such a command goes to bash, not in process.
_SHELL = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "&"}


def run_command(command: str, block: Block, cwd: Path) -> None:
    """Run one command of a bash block: ``mwumkl-dist`` and ``python -c`` in this process (the same code,
    without an interpreter start and imports per command), anything else in bash; ``pip`` is only checked."""
    words = shlex.split(command, comments=True)
    if words[0] == "pip":
        return check_pip(command)  # never installs
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        if words[0] == "mwumkl-dist" and not _SHELL & set(words):
            assert main(words[1:]) == 0, f"{block}: {command!r} failed"
            return None
        if words[:2] == ["python", "-c"] and len(words) == 3:
            exec(compile(words[2], f"{block}: python -c", "exec"), {"__name__": "__main__"})  # noqa: S102
            return None
    finally:
        os.chdir(previous)
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=cwd, env=_environment(),
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 0, f"{block}: {command!r} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return None


def check_block(block: Block) -> None:
    if block.language == "python":
        ast.parse(block.code)
    else:
        for command in commands(block.code):
            check_command(command)


# ----------------------------------------------------------------------------- the tests


def test_the_readme_is_short_and_every_block_is_known():
    assert len((REPO / "README.md").read_bytes()) <= 12 * 1024
    for page in PAGES:
        for block in blocks(page):
            assert block.language in LANGUAGES, f"{block}: give the block a language ({', '.join(LANGUAGES)})"
            assert block.kind is None or block.kind in KINDS, f"{block}: unknown mark {block.kind!r}"
            if block.kind is not None:
                check_block(block)


@pytest.mark.parametrize("page", PAGES, ids=_pages_ids())
def test_links_to_the_repository_lead_somewhere(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to a missing {target}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", PAGES, ids=_pages_ids())
def test_every_block_of_a_page_runs(page, tmp_path):
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    for block in blocks(page):
        if block.language == "text" or block.kind is not None:
            continue
        run_block(block, namespace, tmp_path)
        ran += 1
    if page.name in ("README.md", "user-guide.md", "command-line.md", "kernels.md", "stores.md"):
        assert ran >= 1, f"{page.name}: no block ran"


def test_a_marked_block_is_still_checked():
    bad = Block(REPO / "README.md", 1, "bash", "mwumkl-dist fit --data x.svm --model m.npz --shards zero\n", "cluster")
    with pytest.raises(AssertionError, match="does not parse"):
        check_block(bad)
    with pytest.raises(AssertionError, match="extras that pyproject.toml lacks"):
        check_pip("pip install -e '.[nonsense]'")
    assert commands('python -c "\nprint(1)"\nmwumkl-dist demo  # a comment\n# only a comment\n') == [
        'python -c "\nprint(1)"',
        "mwumkl-dist demo  # a comment",
    ]


# ----------------------------------------------------------------------------- documented defaults (issue 41)


def _fit_parser():
    parser = build_parser()
    return next(a for a in parser._actions if a.dest == "command").choices["fit"]


def test_the_user_guides_signature_gives_the_estimators_defaults():
    from mwumkl_dist import MWUMKLClassifier

    text = (REPO / "docs" / "user-guide.md").read_text()
    signature = re.search(r"`MWUMKLClassifier\(([^`]*)\)`", text).group(1)
    params = MWUMKLClassifier().get_params()
    documented = {}
    for item in signature.split(", "):
        if item != "...":
            name, value = item.split("=", 1)
            documented[name] = ast.literal_eval(value)
    assert len(documented) >= 8
    for name, value in documented.items():
        assert name in params, f"user-guide.md's signature names {name}, which the estimator lacks"
        assert params[name] == value, f"user-guide.md says {name}={value!r}; the code's default is {params[name]!r}"
    table = text[text.index(signature) :].split("\n## ", 1)[0]  # the parameter table, after the signature
    for name in re.findall(r"(?m)^\| `(\w+)`", table):
        assert name in params, f"user-guide.md's table describes {name}, which the estimator lacks"


def test_the_command_line_pages_defaults_are_the_parsers():
    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.cli.parser import DEFAULT_KERNELS

    assert MWUMKLClassifier().kernels == DEFAULT_KERNELS  # the CLI's default is the estimator's
    text = " ".join((REPO / "docs" / "command-line.md").read_text().split())
    options = {o: a for a in _fit_parser()._actions for o in a.option_strings}
    effective = {"--kernels": DEFAULT_KERNELS}  # None in the parser: a kernel store's own, else this
    found = re.findall(r"`(--[\w-]+)[^`]*` \(default:? `?([\w.]+)`?[;,)]", text)
    assert len(found) >= 8, found
    for option, documented in found:
        if option not in options:
            continue  # another command's option
        default = effective.get(option, options[option].default)
        if default is None:
            continue  # resolved at run time (threads): said in words
        assert str(default) == documented or (isinstance(default, float) and float(documented) == default), (
            f"docs/command-line.md says {option} defaults to {documented!r}; the parser's default is {default!r}"
        )


def test_fit_help_says_a_kernel_store_needs_no_kernels_option():
    store = next(a for a in _fit_parser()._actions if a.dest == "store")
    assert "implied for a kernel store" in store.help and "with --kernels precomputed" not in store.help


def test_the_readme_has_two_set_up_commands_and_ci_runs_the_second():
    setup = next(b for b in blocks(REPO / "README.md") if "pip install" in b.code)
    first, second = commands(setup.code)
    assert "python -m venv" in first and "activate" in first and "mwumkl-dist demo" in first
    tests = second.split("&&")[-1].split("#")[0].strip()
    assert tests.startswith("python -m pytest")
    assert tests in (REPO / ".ci" / "run").read_text(), f".ci/run must run the README's {tests!r}"
