"""What the import-linter contracts (pyproject.toml [tool.importlinter], `make lint`) cannot say.

The layers themselves (analysis <- the Flower app and the CLI <- the library's packages, the honest side
loading no attack code, the library importing no Flower) are stated once, in those contracts. Here:
benchmarks/ and tests/ (not packages, so outside the contracts) stay apart from each other and from
analysis/, the one crossing being benchmarks/attack_step.py timing tests/reference.py's literal loop
(read from the source with ast, so an import hidden inside a function counts too); a real client process
loads no attack code; and no modules import each other in a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What each folder outside the contracts' packages may not import (the library and the app: the contracts).
FORBIDDEN = {
    "fl_attack": ("benchmarks", "tests"),
    "clients": ("benchmarks", "tests"),
    "strategies": ("benchmarks", "tests"),
    "analysis": ("benchmarks", "tests"),
    "benchmarks": ("tests",),
    "tests": ("benchmarks",),
}
# The one documented crossing: the benchmark times the test reference's literal loop.
ALLOWED = {("benchmarks/attack_step.py", "tests.reference")}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def offending_imports(layer: str) -> list[str]:
    offending = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        where = str(path.relative_to(ROOT))
        for name in imported_modules(path):
            if name.split(".")[0] in FORBIDDEN[layer] and (where, name) not in ALLOWED:
                offending.append(f"{where} imports {name}")
    return offending


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_import_runs_up_or_across_the_layers(layer):
    assert not offending_imports(layer)


def test_the_check_sees_a_forbidden_import(tmp_path, monkeypatch):
    # the checker itself can fail: a clients/ module that imports a test is reported
    (tmp_path / "clients").mkdir()
    (tmp_path / "clients" / "bad.py").write_text("def f():\n    from tests.reference import loop\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert offending_imports("clients") == ["clients/bad.py imports tests.reference"]


@pytest.mark.runtime
def test_the_client_app_loads_no_attack_code():
    # a simulated client (a Ray actor) imports clients.client_app: no attacker, audit or evaluation module comes with it
    import subprocess
    import sys

    code = (
        "import sys, clients.client_app, clients.defenses, clients.mods; "
        "print(sorted(m for m in sys.modules if m.startswith(('fl_attack.attacker', 'fl_attack.audit', "
        "'fl_attack.evaluation', 'fl_attack.run_config'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- no modules import each other in a circle ------------------------------------------------------

PACKAGES = ("fl_attack", "clients", "strategies", "analysis")


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in the file, relative imports resolved; a
    name imported from a package counts as the package unless it is a module of its own)."""
    modules = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in modules.items():
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    deps.add(name)
        graph[module] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_modules_import_each_other_in_a_circle():
    assert import_cycles(import_graph(ROOT)) == []


def test_the_cycle_check_sees_a_circle_through_a_lazy_import(tmp_path):
    """The circle that was there (analysis.experiments.common <-> optimizers), made of a top-level
    import one way and an import inside a function the other."""
    package = tmp_path / "analysis" / "experiments"
    package.mkdir(parents=True)
    (tmp_path / "analysis" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "common.py").write_text("def regimes():\n    from .optimizers import REGIMES\n    return REGIMES\n")
    (package / "optimizers.py").write_text("from .common import regimes\nREGIMES = {}\n")
    assert import_cycles(import_graph(tmp_path)) == [["analysis.experiments.common", "analysis.experiments.optimizers"]]
