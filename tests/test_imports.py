"""The package's import structure: no import cycles, no `sys.path` edits, Hydra only in `cli.py`,
`config` a leaf, `algorithms/` pure, and a cheap top-level import.

The import graph is read from the source with `ast`, not by importing anything. Its nodes are the
modules of `hacrl_lightning/` (a package is its `__init__`); its edges are every `import` and
`from ... import` of a package module, at the top of a file or inside a function alike: a lazy
import still ties the two modules together (and only hides a cycle until the function runs), so it
counts. `from a.b import c` is an edge to `a.b.c` when that is a module, else to `a.b`; relative
imports are resolved. Importing `a.b` also runs `a/__init__` at run time, but that implicit edge
is not counted: a package `__init__` that re-exports its submodules is the one allowed pattern, and
it stays acyclic as long as no submodule imports its own package's `__init__` back (which is an edge).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "hacrl_lightning"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _nearest_module(name: str) -> str | None:
    """`name` if it is a package module, else its closest enclosing one (None outside the package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> list[tuple[str, int]]:
    """(imported package module, line) for every import in `module`'s file, lazy ones included."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            resolved = _nearest_module(target) if target.split(".")[0] == "hacrl_lightning" else None
            if resolved and resolved != module:
                found.append((resolved, node.lineno))
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line importing it}."""
    graph = {}
    for module in MODULES:
        edges: dict[str, int] = {}
        for target, line in imports_of(module):
            edges.setdefault(target, line)
        graph[module] = edges
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (each one holds a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
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
    return components


def test_the_graph_sees_top_level_lazy_and_relative_imports():
    """The reader itself, on modules whose imports are known: a lazy import and a package import count."""
    graph = import_graph()
    assert "hacrl_lightning.agents.agent" in graph["hacrl_lightning.agents"]        # a package __init__
    assert "hacrl_lightning.rollout.hf" in graph["hacrl_lightning.rollout"]         # lazy, inside make_engine
    assert "hacrl_lightning.errors" in graph["hacrl_lightning.config"]              # top level
    assert "hacrl_lightning.agents.sources" in graph["hacrl_lightning.zoo.store"]  # `from ... import name`


def test_no_import_cycles_in_the_package():
    graph = import_graph()
    cycles = strongly_connected(graph)
    report = []
    for component in cycles:
        edges = [f"    {a} -> {b} ({MODULES[a].relative_to(REPO)}:{graph[a][b]})"
                 for a in component for b in sorted(graph[a]) if b in component]
        report.append(f"  cycle among {component}:\n" + "\n".join(edges))
    assert not cycles, "import cycles (lazy imports count):\n" + "\n".join(report)


def _sys_path_edits(path: Path) -> list[int]:
    """Lines calling sys.path.insert/append/extend (code only: strings and comments do not count)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("insert", "append", "extend")
                and ast.unparse(node.func.value) == "sys.path"):
            lines.append(node.lineno)
    return lines


def test_no_sys_path_edits_in_scripts_and_tests():
    """Scripts and tests import the installed package (`hacrl_lightning.cli`, ...), never a path hack."""
    found = {str(path.relative_to(REPO)): lines for folder in ("scripts", "tests")
             for path in sorted((REPO / folder).rglob("*.py")) if (lines := _sys_path_edits(path))}
    assert not found, f"sys.path edits (lines): {found}"


def _imports_outside(module: str, allowed_prefix: str) -> list[str]:
    return sorted({f"{target} (line {line})" for target, line in imports_of(module)
                   if not (target == allowed_prefix or target.startswith(allowed_prefix + "."))})


def test_algorithms_does_not_import_the_presets():
    """The presets build `AlgorithmConfig`s; the math reads the switches and never imports them."""
    assert not (PACKAGE / "algorithms" / "registry.py").exists()
    offenders = {module: targets for module in MODULES if module.startswith("hacrl_lightning.algorithms")
                 if (targets := [t for t, _ in imports_of(module) if t == "hacrl_lightning.presets"])}
    assert not offenders, offenders


def test_algorithms_imports_nothing_outside_algorithms():
    """`algorithms/` is pure tensor math: it imports no other module of the package (config included)."""
    offenders = {module: targets for module in MODULES if module.startswith("hacrl_lightning.algorithms")
                 if (targets := _imports_outside(module, "hacrl_lightning.algorithms"))}
    assert not offenders, offenders


def test_config_is_a_leaf_and_errors_imports_nothing_from_the_package():
    assert _imports_outside("hacrl_lightning.config", "hacrl_lightning.errors") == []
    assert imports_of("hacrl_lightning.errors") == []


def test_only_cli_imports_hydra():
    importers = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(name == "hydra" or name.startswith("hydra.") for name in names):
                importers.append(module)
    assert set(importers) == {"hacrl_lightning.cli"}, sorted(set(importers))


def test_importing_the_package_or_config_pulls_no_heavy_dependency():
    """The top-level names load on first use (PEP 562), so the config can be read without torch."""
    code = ("import sys, hacrl_lightning, hacrl_lightning.config\n"
            "print(sorted(m for m in ('torch', 'lightning', 'hydra', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_public_names_resolve():
    import hacrl_lightning
    import hacrl_lightning.callbacks as callbacks
    import hacrl_lightning.rollout as rollout

    for package in (hacrl_lightning, rollout, callbacks):
        missing = [name for name in package.__all__ if getattr(package, name, None) is None]
        assert not missing, (package.__name__, missing)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hacrl_lightning.nope  # noqa: B018
    from hacrl_lightning.rollout import make_engine
    from hacrl_lightning.training import train

    assert hacrl_lightning.make_engine is make_engine and hacrl_lightning.train is train


LAYERS = [
    {"errors"},
    {"config", "files", "hub", "console", "safe_load", "run_dir", "failures"},
    {"presets", "resume", "experiments", "algorithms", "rewards", "agents", "placement", "offload"},
    {"data", "plan", "loss_stats", "architecture", "strategies", "rollout", "compiling"},
    {"exchange", "zoo", "scoring", "memory", "collective"},
    {"step", "update"},
    {"step_metrics", "grad_share", "cross_ratios", "callbacks", "reference"},
    {"preflight", "module"},
    {"evaluation"},
    {"datamodule"},
    {"training"},
    {"cli", "pair_ratios"},
    {"bench", "entry", "hacrl_lightning"},
]
"""The package's layers, lowest first: each top-level module or subpackage of `hacrl_lightning` imports only
units of lower layers (and itself). Units of one layer know nothing of each other: `agents/` sits beside
`rewards/` and below `data/`, `rollout/` and the zoo, which build agents with the task, the rewards and the
engines; the exchange sits above agents and engines; the memory plan above the architecture reader (which reads
an agent's source through `agents/`); the module and the DataModule above the step's parts."""


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_import_runs_from_a_higher_layer_to_a_lower_one():
    layer = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}
    units = {_unit(module) for module in MODULES}
    assert units <= set(layer), f"units in no layer of LAYERS (add each where its imports put it): {sorted(units - set(layer))}"
    upward = sorted(f"{a} -> {b} ({MODULES[a].relative_to(REPO)}:{line})"
                    for a, edges in import_graph().items() for b, line in edges.items()
                    if _unit(a) != _unit(b) and layer[_unit(b)] >= layer[_unit(a)])
    assert not upward, "imports that do not run down the layers (tests/test_imports.py LAYERS):\n" + "\n".join(upward)


def test_agents_import_neither_the_engines_the_task_nor_the_rewards():
    imported = {_unit(target) for module in MODULES if _unit(module) == "agents" for target, _ in imports_of(module)}
    assert not imported & {"rollout", "data", "rewards", "zoo", "exchange"}, sorted(imported)
