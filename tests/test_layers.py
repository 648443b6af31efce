"""The layers point one way: fl_attack (the library) <- the Flower app (clients/, strategies/) <- analysis/.

clients/ and strategies/ are siblings (Flower's client_app / server_app): both read the run config
through fl_attack.run_config, and neither imports the other. Benchmarks and tests stay apart: the
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
