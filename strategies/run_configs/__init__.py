"""Ready-made run configs: ``strategies/run_configs/<name>.toml`` (paper, learning-femnist, ...).

``flwr run . --run-config strategies/run_configs/<name>.toml`` hands one to the apps; ``load(name)``
reads it the same way for the studies and the tests.
"""

from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """The shipped run configs' names, sorted."""
    return sorted(p.stem for p in DIR.glob("*.toml"))


def load(name: str) -> dict:
    """``<name>.toml`` as a flat run config, read by Flower's own parser (what ``--run-config`` hands
    the apps, before pyproject's defaults fill the other keys). ValueError naming the known ones for
    an unknown name."""
    from flwr.common.config import parse_config_args

    path = DIR / f"{name}.toml"
    if not path.is_file():
        raise ValueError(f"unknown run config '{name}'; choose from: {', '.join(names())}")
    return parse_config_args([str(path)])
