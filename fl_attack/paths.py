"""Where the project's files are, also when Flower runs a packaged copy of the app.

``flwr run`` executes a copy of the app under $FLWR_HOME/apps that holds only .py/.toml/.md/.json
files, from the SuperLink's working directory. The bundled data and weights (.npz, .pth) and the
results folder are therefore resolved against the real project, found in this order:
1. the environment variable FL_ATTACK_HOME (set by ``python -m strategies.launch``);
2. this file's own package, when its assets are present (a normal checkout or install);
3. the installed ``fl-attack`` distribution (an editable install records its source folder).
"""

from __future__ import annotations

import json
import os
from functools import cache
from importlib import metadata
from pathlib import Path

HOME_ENV = "FL_ATTACK_HOME"
_PACKAGE = Path(__file__).resolve().parent


@cache
def _candidate_packages() -> tuple[Path, ...]:
    found = []
    if os.environ.get(HOME_ENV):
        found.append(Path(os.environ[HOME_ENV]).resolve() / "fl_attack")
    found.append(_PACKAGE)
    try:
        dist = metadata.distribution("fl-attack")
        direct = dist.read_text("direct_url.json")
        if direct:
            url = json.loads(direct).get("url", "")
            if url.startswith("file://"):
                found.append(Path(url[len("file://") :]) / "fl_attack")
        found.append(Path(str(dist.locate_file("fl_attack"))))
    except metadata.PackageNotFoundError:
        pass
    return tuple(found)


def asset(name: str) -> Path:
    """Path of a shipped file in fl_attack/assets (e.g. "femnist_sample.npz").

    Raises FileNotFoundError naming every place searched, and how to fix it.
    """
    tried = []
    for package in _candidate_packages():
        path = package / "assets" / name
        if path.is_file():
            return path
        tried.append(str(path))
    raise FileNotFoundError(
        f"bundled file '{name}' not found (searched: {', '.join(tried)}); "
        f"set {HOME_ENV} to the fl-attack checkout or `pip install -e .` it"
    )


def project_root() -> Path:
    """The fl-attack checkout: the parent of the first package folder that holds the bundled data, else
    cwd. Flower's packaged copy of the app has an assets/ folder too (its README) but no data, so
    a plain ``flwr run .`` resolves results/ in the checkout, not inside $FLWR_HOME."""
    for package in _candidate_packages():
        if (package / "assets" / "femnist_sample.npz").is_file() and (package.parent / "pyproject.toml").is_file():
            return package.parent
    return Path.cwd()


def resolve_in_project(path: str | os.PathLike) -> Path:
    """An absolute path; a relative one is taken from the project root (not the SuperLink's cwd)."""
    path = Path(os.path.expanduser(str(path)))
    return path if path.is_absolute() else (project_root() / path).resolve()
