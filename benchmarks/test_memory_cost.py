"""benchmarks/memory_cost.py on a real recorded run folder (one FEMNIST writer trained for 3 rounds
from the last wT, its updates recorded as a federation records them): it times n = 1..3 updates and
traces the warm start."""

from __future__ import annotations

import math

from benchmarks.memory_cost import main, run_bench
from fl_attack.audit.run_folder import RunFolder
from fl_attack.audit.settings import RunSettings
from fl_attack.evaluation.victims import private_samples
from fl_attack.federation.training import train_local
from fl_attack.federation.update import AttackTarget, save_update
from strategies.server_app import write_run_config

RUN_CONFIG = {"samples-per-client": 8, "batch-size": 4, "local-epochs": 1, "attack-iterations": 6, "attack-nodes": 2}


def recorded_run(folder) -> RunFolder:
    settings = RunSettings.from_run_config(RUN_CONFIG)
    run = RunFolder(folder)
    write_run_config(run, settings, RUN_CONFIG, num_nodes=2)
    client, model = private_samples(settings.data, 0), settings.new_model(seed=0)
    for r in (1, 2, 3):
        update = train_local(
            model, client.images, client.labels, dataset="femnist", lr=settings.lr, batch_size=4, local_epochs=1
        ).update
        save_update(update, AttackTarget(r, (0,)), run.updates)
        model.load_state_dict(update.wT)
    return run


def test_the_benchmark_times_joint_attacks_and_finds_the_warm_start(tmp_path, capsys):
    run = recorded_run(tmp_path)
    result = run_bench(run.path, max_updates=3, iterations=2, warm_updates=2, repeats=1)
    assert [t["updates"] for t in result["timing"]] == [1, 2, 3] and result["rounds"] == [1, 2, 3]
    assert all(t["seconds"] > 0 for t in result["timing"]) and result["cold_iterations"] == 6
    assert result["kept_round"] in (1, 2) and math.isfinite(result["kept_psnr"])
    assert result["warm_iterations_to_kept_psnr"] is None or 1 <= result["warm_iterations_to_kept_psnr"] <= 6
    assert main([str(run.path), "--partition", "7"]) == 2
    assert "recorded no update of partition 7" in capsys.readouterr().err
