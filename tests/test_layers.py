"""The package's layers: each imports only the layers below it, with no import cycle at all.

The order (bottom to top) is the one ``docs/architecture.md`` describes. An import of a package
module inside a function is allowed only for a module that brings an optional or heavy
dependency (``LAZY``, ``LAZY_EDGES``), never to dodge a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mwumkl_dist

PACKAGE = Path(mwumkl_dist.__file__).parent

#: Bottom to top. A module belongs to the first entry that is it or a package above it.
LAYERS = [
    ("core", ["mwumkl_dist.core"]),
    ("devices", ["mwumkl_dist.devices"]),
    ("kernels", ["mwumkl_dist.kernels"]),
    ("io", ["mwumkl_dist.io"]),
    ("data", ["mwumkl_dist.data"]),
    ("engines", ["mwumkl_dist.engines"]),
    ("solvers", ["mwumkl_dist.solvers"]),
    (
        "api",
        [
            "mwumkl_dist.estimator",
            "mwumkl_dist.inspection",
            "mwumkl_dist.summary",
            "mwumkl_dist.plotting",
            "mwumkl_dist.threads",
            "mwumkl_dist.stores",
            "mwumkl_dist",
        ],
    ),
    ("cli", ["mwumkl_dist.cli", "mwumkl_dist.__main__"]),
]

#: Modules that may be imported inside a function, and why: each pulls in a dependency that a fit
#: without it must not pay for (distributed's import, a CUDA toolkit).
LAZY = {
    "mwumkl_dist.engines.dask": "distributed (only engine='dask' fits import it)",
    "mwumkl_dist.engines.dask_pool": "distributed (only engine='dask' fits import it)",
    "mwumkl_dist.data.cuda": "numba.cuda (only device='cuda' imports it)",
    "mwumkl_dist.data.cuda.kernels": "numba.cuda (only device='cuda' compiles it)",
    # The command line's parser loads nothing heavy, so that --version, --help and usage errors answer at once:
    # a command's module (scikit-learn, numba, Dask) is imported when the command runs (by cli.commands).
    "mwumkl_dist.cli.model": "scikit-learn and numba (imported when a model command runs)",
    "mwumkl_dist.cli.store": "numba and zarr (imported when a store command runs)",
    "mwumkl_dist.cli.plot": "scikit-learn and matplotlib (imported when plot runs)",
    "mwumkl_dist.cli.cluster": "the cluster command (imported when it runs)",
}
#: Imports inside a function allowed for one importer only, and why.
LAZY_EDGES = {
    ("mwumkl_dist.cli.args", "mwumkl_dist.kernels.specs"): "numpy and numba: a --kernels value is checked when given",
    ("mwumkl_dist.cli.args", "mwumkl_dist.data.backends"): "numpy: a --device value is checked when given",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = rank, len(prefix)
    if best is None:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS and to docs/architecture.md")
    return best


def package_imports(path: Path, module: str):
    """``(target, line, at_module_level)`` for each import of a package module in ``path``."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not (source == "mwumkl_dist" or source.startswith("mwumkl_dist.")):
                continue
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                candidate = f"{source}.{alias.name}"
                target = candidate if _is_module(candidate) else source
                yield target, node.lineno, id(node) in top_level
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mwumkl_dist"):
                    yield alias.name, node.lineno, id(node) in top_level


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def check_imports(edges) -> list[str]:
    """The layering violations among ``edges`` ``(source, target, line, at_module_level)``."""
    problems = []
    for source, target, line, top in edges:
        if target == source or source.startswith(target + ".") and target == "mwumkl_dist":
            continue
        low, high = layer_of(target), layer_of(source)
        if low > high:
            problems.append(
                f"{source}:{line} imports {target}: layer {LAYERS[high][0]!r} may not import "
                f"the higher layer {LAYERS[low][0]!r}"
            )
        if not top and target not in LAZY and (source, target) not in LAZY_EDGES:
            problems.append(f"{source}:{line} imports {target} inside a function (only LAZY modules may be)")
    return problems


def find_cycle(edges) -> list[str] | None:
    graph: dict[str, set[str]] = {}
    for source, target, _, top in edges:
        if top and source != target:
            graph.setdefault(source, set()).add(target)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def all_edges():
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        for target, line, top in package_imports(path, module):
            # The root package imports its public names from below; a submodule importing the root
            # (e.g. for __version__) would be a cycle, which find_cycle reports.
            edges.append((module, target, line, top))
    return edges


def test_every_module_imports_only_lower_layers():
    problems = check_imports(all_edges())
    assert not problems, "\n".join(problems)


def test_no_import_cycle():
    edges = [(s, t, line, top) for s, t, line, top in all_edges() if not (t == "mwumkl_dist" and s != t)]
    roots = [s for s, t, _, _ in all_edges() if t == "mwumkl_dist" and s != "mwumkl_dist"]
    assert not roots, f"modules import the package root (a cycle through __init__): {sorted(set(roots))}"
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_no_import_cycle_even_through_imports_inside_functions():
    """A lazy import (:data:`LAZY`) defers a heavy dependency; it never closes a loop that a static reading sees
    (e.g. a parser that imports its commands inside functions while they import its constants)."""
    edges = [(s, t, line, True) for s, t, line, _ in all_edges() if not (t == "mwumkl_dist" and s != t)]
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle)


def test_every_module_has_a_layer():
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(path))


@pytest.mark.parametrize(
    ("source", "target", "top", "expected"),
    [
        ("mwumkl_dist.core.exact", "mwumkl_dist.solvers.driver", True, "may not import the higher layer"),
        ("mwumkl_dist.devices.threads", "mwumkl_dist.devices.cpu", False, "inside a function"),
        ("mwumkl_dist.kernels.specs", "mwumkl_dist.data.problems", True, "may not import the higher layer"),
        ("mwumkl_dist.solvers.driver", "mwumkl_dist.engines.dask", False, None),
        ("mwumkl_dist.solvers.driver", "mwumkl_dist.core.exact", True, None),
    ],
)
def test_the_checker_catches_an_upward_or_hidden_import(source, target, top, expected):
    problems = check_imports([(source, target, 1, top)])
    if expected is None:
        assert problems == []
    else:
        assert len(problems) == 1 and expected in problems[0]


def test_the_cycle_finder_finds_a_cycle():
    edges = [("a", "b", 1, True), ("b", "c", 1, True), ("c", "a", 1, True), ("c", "d", 1, True)]
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle(edges[:2]) is None


#: Where a device name may be compared with a value: the back-ends (the one decision of a fit's device), the cost
#: model they ask, and each device's own package.  Everything else asks its back-end
#: (:mod:`mwumkl_dist.data.backends`), so that a new device is one module and one registry entry.
DEVICE_DECIDERS = ("mwumkl_dist.data.backends", "mwumkl_dist.devices.routing", "mwumkl_dist.data.cuda")


def device_comparisons(path: Path) -> list[int]:
    """The lines of ``path`` that compare something with a device name (``x == "cuda"``, ``"cpu" != x``, ``in``)."""
    from mwumkl_dist.data.backends import BACKENDS

    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value in BACKENDS for o in operands):
                lines.append(node.lineno)
    return lines


def test_only_the_back_ends_decide_the_device():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if any(module == d or module.startswith(d + ".") for d in DEVICE_DECIDERS):
            continue
        found += [f"{module}:{line}" for line in device_comparisons(path)]
    assert not found, f"device decided outside the back-ends (ask mwumkl_dist.data.backends): {found}"


def test_the_device_check_catches_a_comparison(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('def f(spec):\n    return 1 if spec.device == "cuda" else 0\n')
    assert device_comparisons(path) == [2]
    path.write_text("def f(backend):\n    return backend.kernel_sums()\n")
    assert device_comparisons(path) == []


#: Longest function (lines, its ``def`` to its last line) and most parameters (``self``/``cls`` not counted)
#: outside numba kernels, whose plan arrays are their arguments.
MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 10
#: Functions exempt from the parameter rule, and why.
MANY_PARAMETERS_ALLOWED = {
    "mwumkl_dist.estimator.MWUMKLClassifier.__init__": "scikit-learn: every parameter is an __init__ argument",
}
_NUMBA_DECORATORS = {"njit", "jit", "vectorize", "guvectorize", "stencil", "cfunc"}


def _is_numba_kernel(node) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in _NUMBA_DECORATORS:
            return True
    return False


def oversized_functions(path: Path, module: str) -> list[str]:
    """``module.qualname: why`` for each Python (non-numba) function of ``path`` over the size rules."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{module}.{prefix}{child.name}"
                if not _is_numba_kernel(child):
                    a = child.args
                    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
                    count = sum(p.arg not in ("self", "cls") for p in params)
                    lines = child.end_lineno - child.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        found.append(f"{name}: {lines} lines")
                    if count > MAX_PARAMETERS and name not in MANY_PARAMETERS_ALLOWED:
                        found.append(f"{name}: {count} parameters")
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text()), "")
    return found


def test_no_long_function_and_no_long_parameter_list():
    """No function over :data:`MAX_FUNCTION_LINES` lines, none with over :data:`MAX_PARAMETERS` parameters (numba
    kernels apart: their Python wrappers pass plan arrays as one small struct)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += oversized_functions(path, module_name(path))
    assert not found, "\n".join(found)


def test_the_size_check_catches_a_long_function_and_a_long_parameter_list(tmp_path):
    path = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    params = ", ".join(f"a{i}" for i in range(MAX_PARAMETERS + 1))
    path.write_text(f"def long():\n{body}\n\nclass K:\n    def wide(self, {params}):\n        pass\n\n"
                    f"@numba.njit(cache=True)\ndef kernel({params}):\n{body}\n")  # fmt: skip
    assert oversized_functions(path, "m") == [f"m.long: {MAX_FUNCTION_LINES + 1} lines", "m.K.wide: 11 parameters"]


def test_the_command_lines_modules_export_only_their_own_names():
    """No re-exports among ``mwumkl_dist.cli``'s modules (the package's public ``main`` and ``build_parser``
    aside): a name is imported from the module that defines it (the parser's ``add_*_command`` once came back
    through the command modules, a cycle to a static reading)."""
    found = []
    for path in sorted(p for p in (PACKAGE / "cli").glob("*.py") if p.name != "__init__.py"):
        tree = ast.parse(path.read_text())
        defined, exported = set(), []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            defined.update(names)
            if "__all__" in names:
                exported = ast.literal_eval(node.value)
        found += [f"{module_name(path)}.{name}" for name in exported if name not in defined]
    assert not found, f"re-exported (import them from their own module): {found}"
