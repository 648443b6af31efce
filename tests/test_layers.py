"""The layers point one way: fl_attack (the library) <- the Flower app (clients/, strategies/) <- analysis/.

Read from the source with ast, so an import hidden inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What each layer may not import: anything above it (and the library not Flower either).
FORBIDDEN = {
    "fl_attack": ("analysis", "strategies", "clients", "benchmarks", "tests", "flwr"),
    "clients": ("analysis", "benchmarks", "tests"),
    "strategies": ("analysis", "benchmarks", "tests"),
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_import_runs_up_the_layers(layer):
    offending = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for name in imported_modules(path):
            if name.split(".")[0] in FORBIDDEN[layer]:
                offending.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offending, offending
