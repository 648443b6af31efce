"""The layers point one way: fl_attack (the library) <- the Flower app (clients/, strategies/) <- analysis/.

clients/ and strategies/ are siblings (Flower's client_app / server_app), and neither imports the
other: the clients read the run config through fl_attack.federation.settings (the honest side loads
no attack code), the strategies through fl_attack.run_config (preflight), which sits above the audit
whose settings (fl_attack.audit.settings) it composes. Benchmarks and tests stay apart: the
one crossing is benchmarks/attack_step.py timing tests/reference.py's literal loop. Read from the
source with ast, so an import hidden inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What each layer may not import: anything above it or beside it (and the library not Flower either).
FORBIDDEN = {
    "fl_attack": ("analysis", "strategies", "clients", "benchmarks", "tests", "flwr"),
    "clients": ("analysis", "strategies", "benchmarks", "tests"),
    "strategies": ("analysis", "clients", "benchmarks", "tests"),
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
    # the checker itself can fail: a clients/ module that imports strategies is reported
    (tmp_path / "clients").mkdir()
    (tmp_path / "clients" / "bad.py").write_text("def f():\n    from strategies.server_app import app\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert offending_imports("clients") == ["clients/bad.py imports strategies.server_app"]


@pytest.mark.runtime
def test_the_client_app_loads_no_attack_code():
    # a simulated client (a Ray actor) imports clients.client_app: nothing of the attacker or audit comes with it
    import subprocess
    import sys

    code = (
        "import sys, clients.client_app, clients.defenses, clients.mods; "
        "print(sorted(m for m in sys.modules if m.startswith(('fl_attack.attacker', 'fl_attack.audit', "
        "'fl_attack.run_config'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# The attacker's side of the library: what runs on a worker and what it imports.
ATTACKER_SIDE = (
    "fl_attack.attacker.api",
    "fl_attack.attacker.workers",
    "fl_attack.attacker.labels",
    "fl_attack.attacker.attacks",
    "fl_attack.attacker.memory",
    "fl_attack.attacker.diffusion",  # the diffusion prior: trained on the server's public pool, loaded by dggi
)
PRIVATE = (
    "fl_attack.audit.victims",
    "fl_attack.audit.evaluator",
    "fl_attack.audit.verdict",
    "fl_attack.audit.reader",
    "fl_attack.audit.overlap",  # what the verdict's data shares with the clients: reads their images
)  # truth, scoring


def library_imports() -> dict[str, set[str]]:
    """module -> the fl_attack modules it imports (relative imports resolved, functions included)."""
    graph = {}
    for path in sorted((ROOT / "fl_attack").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts if parts[-1] == "__init__" else parts[:-1]
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = [p for p in package if p != "__init__"]
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                stem = ".".join([*base, node.module] if node.module else base)
                names.add(stem)
                names.update(f"{stem}.{alias.name}" for alias in node.names)  # `from . import victims`
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        graph[module] = {n for n in names if n.split(".")[0] == "fl_attack"}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [m for m in graph if m == start or m.startswith(start + ".")]
    while todo:
        module = todo.pop()
        if module in seen or module not in graph:
            continue
        seen.add(module)
        todo += graph[module]
    return seen


@pytest.mark.parametrize("side", ATTACKER_SIDE)
def test_the_attacker_side_never_reaches_the_ground_truth(side):
    graph = library_imports()
    assert side in graph or any(m.startswith(side + ".") for m in graph), side
    assert not reachable(graph, side) & set(PRIVATE)


def test_the_reachability_check_can_fail():
    graph = library_imports()
    assert "fl_attack.audit.victims" in reachable(graph, "fl_attack.standalone")  # the harness does reach it
    assert "fl_attack.audit.victims" in reachable(
        {**graph, "fl_attack.attacker.labels": {"fl_attack.audit.victims"}}, "fl_attack.attacker.labels"
    )


# --- the library's packages, by role (each package's __init__ says the same) ------------------------
# package -> what its modules may import of fl_attack (a module of the package, or one of these)
PACKAGE_RULES = {
    "fl_attack.privacy": (),
    # privacy: the defenses' DP accounting (FederationSettings' DefenseSettings); it imports nothing
    "fl_attack.federation": ("fl_attack.privacy", "fl_attack.paths", "fl_attack.records"),
    "fl_attack.attacker": ("fl_attack.federation", "fl_attack.paths", "fl_attack.records"),
    "fl_attack.audit": (
        "fl_attack.attacker",
        "fl_attack.federation",
        "fl_attack.privacy",
        "fl_attack.paths",
        "fl_attack.records",
        "fl_attack.__version__",
    ),
    # the run config's preflight: above the audit, whose settings (fl_attack.audit.settings) it composes
    # with the federation's; the audit never imports it (but for IGNORED below)
    "fl_attack.run_config": (
        "fl_attack.audit",
        "fl_attack.attacker",
        "fl_attack.federation",
        "fl_attack.privacy",
        "fl_attack.paths",
        "fl_attack.records",
    ),
    # the shared helpers import no other part of the library
    "fl_attack.paths": (),
    "fl_attack.records": (),
}


def package_offences(graph: dict[str, set[str]]) -> list[str]:
    modules = set(graph)
    offences = []
    for module, imported in sorted(graph.items()):
        rule = next((p for p in PACKAGE_RULES if module == p or module.startswith(p + ".")), None)
        if rule is None:
            continue
        allowed = (rule, *PACKAGE_RULES[rule])
        for name in sorted(imported):
            if name == "fl_attack" or (name not in modules and name != "fl_attack.__version__"):
                continue  # the top package (it imports nothing when loaded), or a name, not a module
            if not any(name == a or name.startswith(a + ".") for a in allowed):
                offences.append(f"{module} imports {name}")
    return offences


def ignored_imports() -> list[str]:
    """pyproject.toml's layers contract's ignore_imports ("a -> b"), as package_offences words them."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")
    return sorted(" imports ".join(p.strip() for p in rule.split("->")) for rule in layers.get("ignore_imports", []))


def test_each_library_package_imports_only_what_its_role_allows():
    # the offences are exactly the imports the layers contract ignores, each one still there (an ignore
    # whose import is gone fails here, as lint-imports fails on an unmatched ignore)
    assert package_offences(library_imports()) == ignored_imports()
    assert len(ignored_imports()) <= 1  # fl_attack.audit.runs' lazy import of the resume keys' old home


def test_the_package_check_sees_a_forbidden_import():
    graph = library_imports()
    graph["fl_attack.federation.data"] = graph["fl_attack.federation.data"] | {"fl_attack.audit.victims"}
    offences = [o for o in package_offences(graph) if o not in ignored_imports()]
    assert offences == ["fl_attack.federation.data imports fl_attack.audit.victims"]


def test_the_import_linter_contracts_agree_with_the_package_rules():
    # pyproject.toml's [tool.importlinter] (make lint) and PACKAGE_RULES say the same: no package may
    # import one in a higher layer, and the honest side may import nothing it forbids
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = {c["type"]: c for c in reversed(config["contracts"])}  # the first of each type
    layers = [[name.strip() for name in layer.split("|")] for layer in contracts["layers"]["layers"]]
    height = {name: len(layers) - i for i, layer in enumerate(layers) for name in layer}
    for package, allowed in PACKAGE_RULES.items():
        if package in height:
            above = [a for a in allowed if height.get(a, 0) > height[package]]
            assert not above, f"{package} may import {above}, a higher layer"
    honest = contracts["forbidden"]
    assert set(honest["source_modules"]) == {"clients", "fl_attack.federation"}
    assert not set(honest["forbidden_modules"]) & set(PACKAGE_RULES["fl_attack.federation"])


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
