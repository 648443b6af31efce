"""Where results go under plain `flwr run .`: Flower runs a packaged copy of the app under
$FLWR_HOME/apps (.py/.toml/.md files only), and results must still land in the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from fl_attack import paths

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def packaged_copy(tmp_path, monkeypatch):
    """A copy as Flower packages it: pyproject.toml and fl_attack/assets/README.md, but no data."""
    copy = tmp_path / "apps" / "fl-attack.fl-attack.0.1.0"
    (copy / "fl_attack" / "assets").mkdir(parents=True)
    (copy / "fl_attack" / "assets" / "README.md").write_text("provenance\n")
    (copy / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    monkeypatch.delenv(paths.HOME_ENV, raising=False)
    monkeypatch.setattr(paths, "_PACKAGE", copy / "fl_attack")
    paths._candidate_packages.cache_clear()
    yield copy
    paths._candidate_packages.cache_clear()


def test_results_resolve_in_the_checkout_not_in_flowers_copy(packaged_copy):
    assert paths.project_root() == ROOT
    assert paths.resolve_in_project("results") == ROOT / "results"
    assert paths.asset("femnist_sample.npz") == ROOT / "fl_attack" / "assets" / "femnist_sample.npz"


def test_an_absolute_results_dir_is_used_as_given(packaged_copy, tmp_path):
    assert paths.resolve_in_project(tmp_path / "mine") == tmp_path / "mine"


def test_fl_attack_home_wins(packaged_copy, monkeypatch):
    monkeypatch.setenv(paths.HOME_ENV, str(ROOT))
    paths._candidate_packages.cache_clear()
    assert paths.project_root() == ROOT
