"""benchmarks/memory_cost.py on a real recorded run: it times n = 1..3 updates and traces the warm start."""

from __future__ import annotations

import torch
from flwr.supercore.task_identity import TaskIdentity

from benchmarks.memory_cost import main, run_bench
from strategies.server_app import write_run_config
from tests.inprocess import federate, flower_run_config

RUN = dict(num_rounds=3, attack_clients="0", attack_iterations=6, attack_nodes=2, attack_method="pisme")


def test_the_benchmark_times_joint_attacks_and_finds_the_warm_start(tmp_path, capsys):
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    settings, _, _, _ = federate(tmp_path, **RUN)
    write_run_config(tmp_path, settings, flower_run_config(**RUN), num_nodes=2)
    result = run_bench(tmp_path, max_updates=3, iterations=2, warm_updates=2, repeats=1)
    assert [t["updates"] for t in result["timing"]] == [1, 2, 3] and result["rounds"] == [1, 2, 3]
    assert all(t["seconds"] > 0 for t in result["timing"]) and result["cold_iterations"] == 6
    assert result["kept_round"] in (1, 2) and torch.isfinite(torch.tensor(result["kept_psnr"]))
    assert result["warm_iterations_to_kept_psnr"] is None or 1 <= result["warm_iterations_to_kept_psnr"] <= 6
    assert main([str(tmp_path), "--partition", "7"]) == 2
    assert "recorded no update of partition 7" in capsys.readouterr().err
