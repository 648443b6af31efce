"""The project's federation as one user of the audit plugin: its rows are those of the strategy it
replaced, and the plugin's pieces do what their docstrings say.

tests/golden/ holds attacks.csv and rounds.csv of the run below made by the last commit before the
plugin (5bc84aa: the honest-but-curious FedAvg mixin, LeakageTracking), with 1 torch thread:
``serve(tmp, partitions=(0, 1, 2), num_rounds=2, attack_method="pisme,sme", attack_iterations=6,
attack_memory="keep", attack_clients="0,2", fraction_train=0.67, seed=5)``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from tests.inprocess import serve

GOLDEN = Path(__file__).parent / "golden"
WALL_CLOCK = {"attack_seconds", "seconds", "worker_id", "worker_node"}  # differ between any two runs


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return sorted(rows, key=lambda r: (int(r["round"]), r.get("partition_id", ""), r.get("method", "")))


def _same(a: str, b: str) -> bool:
    try:
        x, y = float(a), float(b)
    except ValueError:
        return a == b
    return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-7)


@pytest.mark.heavy
def test_the_project_federation_through_the_plugin_writes_the_rows_of_the_strategy_it_replaced(tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = serve(
            tmp_path,
            partitions=(0, 1, 2),
            num_rounds=2,
            attack_method="pisme,sme",
            attack_iterations=6,
            attack_memory="keep",
            attack_clients="0,2",
            fraction_train=0.67,
            seed=5,
        )
    finally:
        torch.set_num_threads(before)
    for name in ("attacks.csv", "rounds.csv"):
        golden, ours = _rows(GOLDEN / name), _rows(run / name)
        assert len(ours) == len(golden) and len(golden) in (2, 8), name
        for old, new in zip(golden, ours, strict=True):
            assert set(old) <= set(new), name  # columns added since (compile, batch) may follow
            differ = {k: (old[k], new[k]) for k in old if k not in WALL_CLOCK and not _same(old[k], new[k])}
            assert not differ, (name, old["round"], old.get("method"), differ)


@pytest.mark.heavy
def test_the_preflight_runs_once_per_run_and_the_clients_parse_the_run_config_once(tmp_path, monkeypatch):
    """The ServerApp checks the run config once (fl_attack.run_config.preflight) and hands the
    settings down; each client process parses it once per run, not per message (here every node
    shares this process: 3 nodes x 2 rounds x (train + evaluate) messages, one parse)."""
    from clients import client_app
    from fl_attack import run_config

    parses = []
    real = run_config.RunSettings.from_run_config.__func__

    def counted(cls, config):
        parses.append(dict(config))
        return real(cls, config)

    monkeypatch.setattr(run_config.RunSettings, "from_run_config", classmethod(counted))
    client_app._parsed.cache_clear()
    before = run_config.preflight.runs
    run = serve(tmp_path, partitions=(0, 1, 2), num_rounds=2, attack_method="ig", attack_iterations=1)
    assert (run / "summary.json").is_file()
    assert run_config.preflight.runs - before == 1
    assert len(parses) == 2  # the pre-flight's, and the clients' one
