"""The layers of docs/design.md, checked statically (the sources are parsed, nothing is imported).

Layers, lowest first; a module may import only modules of its own layer or a lower one:

    0 analysis     ``analysis/``: pure math, imports only itself, numpy, scipy, the standard library
    1 core         ``pate`` (the package), ``pate.errors``, ``pate.io``, ``pate.rundir``,
                   ``pate.data``, ``pate.aggregation``, ``pate.progress``,
                   ``pate.devices``
    2 teachers     ``teachers/``
    3 student      ``student/``
    4 application  ``pate.service``, ``pate.report``, ``pate.cli``, ``pate.pipeline``,
                   ``pate.config``, ``pate.config_changes``, ``pate.presets``, ``pate.audit``,
                   ``pate.comparison``, ``pate.__main__``

Every import counts: at module level, inside functions, under ``if TYPE_CHECKING:``, and
``importlib.import_module`` / ``__import__`` of a string literal (a module that imports by a
computed name, as ``pate.cli.main`` does from a tuple of names, is taken to import every project
module its dotted string literals name). No two modules may import each other, directly or through
others: the module graph has no cycle (a package's ``__init__`` is a module of its own).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("analysis", "pate", "teachers", "student")
LAYER_NAMES = ("analysis", "core", "teachers", "student", "application")

# A module's layer is the one of its longest dotted prefix listed here. The bare ``pate`` entry
# is the package's __init__ only: a new ``pate.*`` module must be given its layer here.
LAYER_OF: Mapping[str, int] = {
    "analysis": 0,
    "pate": 1,
    "pate.errors": 1,
    "pate.io": 1,
    "pate.rundir": 1,
    "pate.progress": 1,
    "pate.devices": 1,
    "pate.data": 1,
    "pate.aggregation": 1,
    "teachers": 2,
    "student": 3,
    "pate.service": 4,
    "pate.report": 4,
    "pate.cli": 4,
    "pate.pipeline": 4,
    "pate.comparison": 4,
    "pate.config": 4,
    "pate.config_changes": 4,
    "pate.presets": 4,
    "pate.audit": 4,
    "pate.api": 4,
    "pate.api_checks": 4,
    "pate.api_labels": 4,
    "pate.api_student": 4,
    "pate.api_teachers": 4,
    "pate.api_dpsgd": 4,
    "pate.api_tables": 4,
    "pate.status": 4,
    "pate.analyze": 4,
    "pate.__main__": 4,
}
# What analysis/ may import besides itself and the standard library.
ANALYSIS_THIRD_PARTY = frozenset({"numpy", "scipy"})


@dataclass(frozen=True)
class Import:
    """One import statement (or import_module call) of ``source``, naming ``target``."""

    source: str
    target: str
    line: int

    def __str__(self) -> str:
        path = module_path(self.source).relative_to(ROOT)
        return f"{self.source} -> {self.target} ({path}:{self.line})"


def module_path(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def project_modules() -> dict[str, Path]:
    """Every .py module of the packages, by dotted name (``a/b/__init__.py`` is ``a.b``)."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in LAYER_OF and (prefix != "pate" or module == "pate"):
            return LAYER_OF[prefix]
    return None


def _imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterable[tuple[str, int]]:
    """(dotted name, line) of everything ``module`` imports, each ``from m import n`` giving both
    ``m.n`` and ``m`` (the caller keeps ``m.n`` when it is a module, ``m`` otherwise)."""
    package = module if is_package else module.rpartition(".")[0]
    dynamic = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
            argument = node.args[0] if node.args else None
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                yield argument.value, node.lineno
            else:
                dynamic = True
    if dynamic:
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and "." in node.value and node.value.split(".")[0] in PACKAGES:
                yield node.value, node.lineno


def _is_dynamic_import(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in ("import_module", "__import__")


def imports_of(module: str, source: str, is_package: bool,
               known: Iterable[str]) -> list[Import]:
    """The project modules ``module`` imports, each the deepest known module its name reaches."""
    known = set(known)
    found: dict[str, Import] = {}
    for name, line in _imported_names(ast.parse(source), module, is_package):
        parts = name.split(".")
        target = next((".".join(parts[:end]) for end in range(len(parts), 0, -1)
                       if ".".join(parts[:end]) in known), None)
        if target is not None and target != module and target not in found:
            found[target] = Import(module, target, line)
    return list(found.values())


def external_imports(source: str) -> set[str]:
    """Top-level names of the absolute imports of ``source`` outside the project packages."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(PACKAGES)


def import_graph(modules: Mapping[str, Path]) -> dict[str, list[Import]]:
    return {name: imports_of(name, path.read_text(), path.name == "__init__.py", modules)
            for name, path in modules.items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan 1972), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph.get(node, ()):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def _layer_label(module: str) -> str:
    layer = layer_of(module)
    return "no layer" if layer is None else f"L{layer} {LAYER_NAMES[layer]}"


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(name for name in project_modules() if layer_of(name) is None)
    assert not unplaced, f"give these modules a layer in LAYER_OF: {unplaced}"


def test_every_import_goes_to_the_same_or_a_lower_layer() -> None:
    upward = [f"{edge}: {_layer_label(edge.source)} imports {_layer_label(edge.target)}"
              for edges in import_graph(project_modules()).values() for edge in edges
              if None not in (layer_of(edge.source), layer_of(edge.target))
              and layer_of(edge.source) < layer_of(edge.target)]
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_no_import_cycle_between_modules() -> None:
    graph = import_graph(project_modules())
    found = cycles({name: [edge.target for edge in edges] for name, edges in graph.items()})
    described = []
    for component in found:
        members = set(component)
        edges = [str(edge) for name in component for edge in graph[name] if edge.target in members]
        described.append(f"cycle {component}:\n    " + "\n    ".join(edges))
    assert not found, "import cycles:\n" + "\n".join(described)


def test_analysis_imports_only_numpy_scipy_and_the_standard_library() -> None:
    """analysis/ is pure math: no pate, teachers, student, matplotlib, torch, ..."""
    allowed = ANALYSIS_THIRD_PARTY | sys.stdlib_module_names | {"__future__"}
    foreign = {name: sorted(external_imports(path.read_text()) - allowed)
               for name, path in project_modules().items() if name.split(".")[0] == "analysis"}
    foreign = {name: names for name, names in foreign.items() if names}
    assert not foreign, f"analysis modules importing outside numpy/scipy/stdlib: {foreign}"


def test_the_check_sees_imports_in_functions_relative_and_by_name() -> None:
    source = (
        "import importlib\n"
        "from . import sibling\n"
        "from ..data import glyphs\n"
        "def f():\n"
        "    from pate.cli import main\n"
        "    importlib.import_module('student.rounds')\n"
    )
    known = {"pate", "pate.data", "pate.data.glyphs", "pate.aggregation",
             "pate.aggregation.sibling", "pate.cli", "pate.cli.main", "student", "student.rounds"}
    edges = imports_of("pate.aggregation.ledger", source, False, known)
    assert [(edge.target, edge.line) for edge in edges] == [
        ("pate.aggregation.sibling", 2), ("pate.data.glyphs", 3), ("pate.cli.main", 5),
        ("student.rounds", 6)]
    dynamic = "import importlib\nNAMES = ('pate.cli.run',)\nfor n in NAMES:\n" \
              "    importlib.import_module(n)\n"
    assert [edge.target for edge in imports_of("pate.cli.main", dynamic, False,
                                               {"pate.cli.run"})] == ["pate.cli.run"]
    assert layer_of("pate.newmodule") is None and layer_of("pate") == 1
    assert layer_of("pate.cli.main") == 4 and layer_of("analysis.rdp") == 0


def test_the_check_finds_cycles() -> None:
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a", "e"], "e": ["d"], "f": []}
    assert cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": ["b"], "b": []}) == []
