"""The package's shape: layers imported only downwards, no import cycles, a light `import specbench`. (A module holds
one concept, whatever its length: no line cap, which moved code to meet a number.)

Imports are read with ``ast`` from every module of the package, at module level and inside functions,
absolute and relative; ``from specbench.core import engine`` counts as an import of the module
``specbench.core.engine``, ``from specbench.drafters import make_drafter`` as one of the package
``specbench.drafters`` (its ``__init__``).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "specbench"
PACKAGE_DIR = ROOT / PACKAGE

#: The layers, lowest first: a module imports modules of its own layer or lower ones. A layer holds
#: the modules named here and, for a package, every module inside it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("common", ("specbench.common",)),
    ("core", ("specbench.core",)),
    ("models", ("specbench.models",)),
    ("drafters", ("specbench.drafters",)),
    ("kernels", ("specbench.kernels",)),
    ("exact", ("specbench.exact",)),
    ("cost", ("specbench.cost",)),
    ("decoding", ("specbench.decoding",)),
    ("inputs", ("specbench.inputs",)),
    ("simulate", ("specbench.simulate",)),
    ("bench", ("specbench.bench",)),
    ("checks", ("specbench.checks",)),
    ("train", ("specbench.train",)),
    ("report", ("specbench.report",)),
    ("cli", ("specbench.cli", "specbench.__main__", "specbench")),
]
#: The only modules that may import the root package itself (the public API is for users).
ROOT_IMPORTERS = {"specbench.cli", "specbench.__main__"}
#: The report extra (`specbench[report]`): the notebooks' and the report's dependencies, not the library's.
REPORT_EXTRA = ("matplotlib", "ipywidgets", "jupyterlab", "ipykernel", "papermill", "nbconvert")
#: Heavy dependencies that `import specbench` (the engine path) must not load.
HEAVY = ("polars", *REPORT_EXTRA)


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    function: str | None  # the enclosing function of a function-level import

    def where(self) -> str:
        inside = f", inside {self.function}()" if self.function else ""
        return f"{module_path(self.importer)}:{self.line}{inside}"


# -- reading the package ----------------------------------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    """Every module of the package by dotted name (bundled assets are data, not modules)."""
    return {
        module_name(p): p
        for p in sorted(PACKAGE_DIR.rglob("*.py"))
        if "assets" not in p.relative_to(PACKAGE_DIR).parts and "__pycache__" not in p.parts
    }


def module_path(name: str) -> str:
    path = MODULES.get(name)
    return str(path.relative_to(ROOT)) if path else name


def _known(dotted: str, modules: dict[str, Path] | set[str]) -> str | None:
    """The longest prefix of ``dotted`` that is a module of the package."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def _base_package(importer: str, is_package: bool, level: int) -> str:
    """What a relative import of ``level`` dots starts from."""
    parts = importer.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts)


class _Collector(ast.NodeVisitor):
    def __init__(self, importer: str, is_package: bool, modules: dict[str, Path] | set[str]):
        self.importer, self.is_package, self.modules = importer, is_package, modules
        self.functions: list[str] = []
        self.found: list[Import] = []

    def _add(self, dotted: str, line: int) -> None:
        target = _known(dotted, self.modules)
        found = Import(self.importer, target, line, ".".join(self.functions) or None) if target else None
        if found is not None and target != self.importer and found not in self.found:
            self.found.append(found)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = _base_package(self.importer, self.is_package, node.level)
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module or ""
        for alias in node.names:
            # `from package import module` imports the module; `from module import name` the module.
            submodule = f"{source}.{alias.name}"
            self._add(submodule if submodule in self.modules else source, node.lineno)


def imports_of(name: str, source: str, modules: dict[str, Path] | set[str], is_package: bool = False) -> list[Import]:
    """The imports of package modules in ``source`` (module ``name``), in order of appearance."""
    collector = _Collector(name, is_package, modules)
    collector.visit(ast.parse(source))
    return collector.found


MODULES = package_modules()
IMPORTS = [
    imp
    for name, path in MODULES.items()
    for imp in imports_of(name, path.read_text(encoding="utf-8"), MODULES, path.name == "__init__.py")
]


def layer_of(name: str) -> str | None:
    best: tuple[int, str] | None = None
    for layer, members in LAYERS:
        for member in members:
            if name == member or (member != PACKAGE and name.startswith(member + ".")):
                if best is None or len(member) > best[0]:
                    best = (len(member), layer)
    return best[1] if best else None


LAYER_RANK = {layer: i for i, (layer, _) in enumerate(LAYERS)}


# -- the reader itself -------------------------------------------------------------------------------------------


def test_import_reader_resolves_modules_packages_and_relative_imports():
    modules = {"pkg", "pkg.core", "pkg.core.engine", "pkg.core.log", "pkg.models", "pkg.models.load"}
    source = (
        "import os\n"
        "import pkg.core.log as log\n"
        "from pkg.core import engine\n"
        "from pkg.models import helper_name\n"
        "from . import log\n"
        "from ..models.load import load\n"
        "def f():\n"
        "    from pkg import thing\n"
    )
    found = imports_of("pkg.core.forward", source, modules)
    assert [(i.imported, i.line, i.function) for i in found] == [
        ("pkg.core.log", 2, None),
        ("pkg.core.engine", 3, None),
        ("pkg.models", 4, None),
        ("pkg.core.log", 5, None),
        ("pkg.models.load", 6, None),
        ("pkg", 8, "f"),
    ]
    # inside a package's __init__, one dot is the package itself
    assert [i.imported for i in imports_of("pkg.core", "from .engine import x\n", modules, is_package=True)] == [
        "pkg.core.engine"
    ]


def test_layer_table():
    assert layer_of(PACKAGE) == "cli" and layer_of("specbench.cli") == "cli"
    assert layer_of("specbench.core.engine") == "core" and layer_of("specbench.decoding") == "decoding"
    assert layer_of("specbench.elsewhere") is None


# -- the rules ---------------------------------------------------------------------------------------------------


def test_every_module_has_a_layer():
    missing = [module_path(name) for name in MODULES if layer_of(name) is None]
    assert not missing, "modules outside the layer table (add them to LAYERS or move them):\n  " + "\n  ".join(missing)


def test_imports_run_down_the_layers():
    upward = []
    for imp in IMPORTS:
        low, high = layer_of(imp.importer), layer_of(imp.imported)
        if low is None or high is None or imp.imported == PACKAGE:
            continue  # reported by test_every_module_has_a_layer / test_no_module_imports_the_root_package
        if LAYER_RANK[high] > LAYER_RANK[low]:
            upward.append(
                f"{imp.importer} (layer {low}) imports {imp.imported} (layer {high}, higher) at {imp.where()}"
            )
    order = " < ".join(layer for layer, _ in LAYERS)
    assert not upward, f"imports up the layer order {order}:\n  " + "\n  ".join(upward)


def test_no_module_imports_the_root_package():
    offenders = [
        f"{imp.importer} (layer {layer_of(imp.importer)}) imports the root package {PACKAGE} at {imp.where()}: "
        f"import the name from the module that defines it"
        for imp in IMPORTS
        if imp.imported == PACKAGE and imp.importer not in ROOT_IMPORTERS
    ]
    assert not offenders, "\n  ".join(["imports of the root package inside the package:", *offenders])


def _cycles(edges: dict[str, dict[str, Import]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)

    cycles = []
    for component in components:
        members = set(component)
        start = component[0]
        # shortest path start -> ... -> start inside the component (breadth first)
        previous: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in previous:
            following = []
            for node in frontier:
                for nxt in sorted(edges.get(node, {})):
                    if nxt in members and nxt not in previous:
                        previous[nxt] = node
                        following.append(nxt)
            frontier = following
        path = [start]
        node = previous[start]
        while node != start:
            path.append(node)
            node = previous[node]
        path.append(start)
        path.reverse()
        cycles.append(path)
    return cycles


def test_no_import_cycles():
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(MODULES) + 1000))
    edges: dict[str, dict[str, Import]] = {}
    for imp in IMPORTS:
        edges.setdefault(imp.importer, {}).setdefault(imp.imported, imp)
    messages = []
    for cycle in _cycles(edges):
        steps = [
            f"{a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)}) at {edges[a][b].where()}"
            for a, b in zip(cycle, cycle[1:])
        ]
        messages.append("import cycle " + " -> ".join(cycle) + ":\n    " + "\n    ".join(steps))
    assert not messages, "\n  ".join(messages)


# -- the scripts: run as modules ----------------------------------------------------------------------------------


def script_files() -> list[Path]:
    return sorted(p for p in (ROOT / "scripts").rglob("*.py") if "__pycache__" not in p.parts)


def test_scripts_run_as_modules():
    """``python3 -m scripts.gpu.NAME`` from the root: no script edits sys.path or exempts itself from E402."""
    edits = []
    for path in script_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "sys.path.insert" in line or "sys.path.append" in line or "noqa: E402" in line:
                edits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not edits, "scripts that edit sys.path or import late:\n  " + "\n  ".join(edits)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "per-file-ignores" not in pyproject or '"scripts' not in pyproject.split("per-file-ignores", 1)[1]


def test_scripts_with_a_budget_share_one_implementation():
    """Every script that takes ``--budget`` keeps its time with ``scripts.gpu.budget.Budget``."""
    private = [
        str(path.relative_to(ROOT))
        for path in script_files()
        if '"--budget"' in (text := path.read_text(encoding="utf-8"))
        and "from scripts.gpu.budget import Budget" not in text
    ]
    assert not private, "scripts that time --budget themselves (use Budget):\n  " + "\n  ".join(private)


# -- a light import ----------------------------------------------------------------------------------------------

# Run in a fresh interpreter: records, for each heavy dependency, the package line that first imported it.
_PROBE = """
import importlib.abc, json, sys, traceback

heavy, package_dir = sys.argv[1].split(","), sys.argv[2]
first = {}


class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in heavy and name not in first:
            ours = [f for f in traceback.extract_stack() if f.filename.startswith(package_dir)]
            first[name] = f"{ours[-1].filename[len(package_dir) + 1:]}:{ours[-1].lineno}" if ours else "?"
        return None


sys.meta_path.insert(0, Watch())
import specbench

print(json.dumps({name: first.get(name, "?") for name in heavy if name in sys.modules}))
"""


def test_import_specbench_loads_no_heavy_dependency():
    run = subprocess.run(
        [sys.executable, "-c", _PROBE, ",".join(HEAVY), str(PACKAGE_DIR)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, f"`import specbench` failed:\n{run.stderr[-3000:]}"
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert not loaded, "`import specbench` loads " + ", ".join(
        f"{name} (first imported at specbench/{where})" for name, where in loaded.items()
    )


def test_the_report_dependencies_are_an_extra_that_setup_installs():
    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

    def names(requirements: list[str]) -> set[str]:
        return {req.split(";")[0].split("[")[0].split(">")[0].split("=")[0].strip().lower() for req in requirements}

    assert not names(project["dependencies"]) & set(REPORT_EXTRA), "the library alone must not need the report"
    assert names(project["optional-dependencies"]["report"]) == set(REPORT_EXTRA)
    assert ".[report,test]" in (ROOT / "Makefile").read_text(encoding="utf-8"), "make setup installs the report extra"
