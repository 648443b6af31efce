"""The real-federations study: what a server learns under the training regimes Flower apps use.

    python -m analysis.federations_study --out DIR [--only NAME,NAME] [--skip-replays]

Each run of ``RUNS`` is a real federation through the checked launcher (``strategies.launch``): FEMNIST
(and the CIFAR-100 recipe of strategies/run_configs/flower-app.toml), 2 rounds, tracked clients attacked
by PI-SME every round with the updates recorded. The regimes: the paper's (plain SGD, the paper's
partitions), Flower's quickstart (momentum 0.9, IID), weight decay 5e-4, Adam, Dirichlet partitions at
alpha 0.1 and 1, whole writers (natural partitions, samples-per-client 0) and batch norm in train mode
(beside the same model in eval mode).
Each entry of ``REPLAYS`` attacks a run's recorded updates again with the naive attack
(``optimizer_aware=false``: every update modelled as plain SGD), so both see the same updates, or, on
the batch-norm run, also matching the running statistics (``bn_stats_weight``).
Resumable as analysis.leakage_study (finished runs and replays are skipped). Written into DIR:
``runs/<name>/`` (each run, its replays inside), ``study.csv``/``study.md`` (per run, method and round:
mean PSNR, SSIM, LPIPS, label accuracy, global accuracy), ``runs.md`` (each run's settings) and ``report/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fl_attack.records import write_text_atomic
from strategies import run_configs

from .leakage_study import write_outputs
from .studies import run_config_text, study_main

# What every FEMNIST run shares: 10 writers, 2 rounds, k=16, B=8, E=5 (T=10), three tracked clients.
BASE = {
    "dataset": "femnist",
    "num-server-rounds": 2,
    "samples-per-client": 16,
    "batch-size": 8,
    "local-epochs": 5,
    "attack-clients": "0,1,2",
    "attack-method": "pisme",
    "attack-iterations": 100,
    "attack-nodes": 7,
    "attack-lr-schedule": "steps",  # as its docs were recorded
    "server-test-samples": 500,
    "seed": 0,
}
MOMENTUM = {"client-optimizer": "momentum", "client-momentum": 0.9, "lr": 0.01}
# A user model with BatchNorm2d and max pooling (eval mode unless client-train-mode).
BATCH_NORM = {**BASE, **MOMENTUM, "partitioner": "iid", "model": "tests.user_models:batch_norm_net"}
RUNS: list[tuple[str, dict, int]] = [  # (name, run config, supernodes)
    ("paper", {**BASE, "lr": 0.004}, 10),
    ("quickstart-iid", {**BASE, **MOMENTUM, "partitioner": "iid"}, 10),
    ("momentum-wd-iid", {**BASE, **MOMENTUM, "client-weight-decay": 5e-4, "partitioner": "iid"}, 10),
    ("adam-iid", {**BASE, "client-optimizer": "adam", "lr": 1e-3, "partitioner": "iid"}, 10),
    ("dirichlet-0.1", {**BASE, **MOMENTUM, "partitioner": "dirichlet", "dirichlet-alpha": 0.1}, 10),
    ("dirichlet-1", {**BASE, **MOMENTUM, "partitioner": "dirichlet", "dirichlet-alpha": 1.0}, 10),
    (  # whole writers: each client trains (and is attacked) on everything it has, one epoch
        "whole-writers",
        {
            **BASE,
            **MOMENTUM,
            "partitioner": "natural",
            "samples-per-client": 0,
            "batch-size": 32,
            "local-epochs": 1,
            "num-server-rounds": 1,
            "attack-clients": "0,1",
        },
        10,
    ),
    ("batchnorm-train", {**BATCH_NORM, "client-train-mode": True}, 10),  # batch norm in train mode
    # a second configuration of it: another seed (w0, data, batches), E=2 (T=4)
    ("batchnorm-train-seed1", {**BATCH_NORM, "client-train-mode": True, "seed": 1, "local-epochs": 2}, 10),
    ("batchnorm-eval", {**BATCH_NORM}, 10),  # the same model in eval mode: what train mode itself changes
    (  # the flower-app recipe (Flower's quickstart CNN on CIFAR-100, Dirichlet 0.5), made small
        "flower-app-cifar100",
        {
            **run_configs.load("flower-app"),
            "num-server-rounds": 2,
            "samples-per-client": 16,
            "batch-size": 8,
            "local-epochs": 5,
            "attack-memory": "none",
            "attack-iterations": 100,
            "attack-nodes": 7,
            "attack-lr-schedule": "steps",  # as its docs were recorded
            "server-test-samples": 500,
        },
        10,
    ),
]
NAIVE = ["--options", "optimizer_aware=false", "--name", "naive"]
REPLAYS: list[tuple[str, list[str]]] = [
    (name, NAIVE) for name, config, _ in RUNS if config.get("client-optimizer", "sgd") != "sgd"
] + [  # matching the client's feature statistics read off the running statistics (AttackConfig.bn_stats_weight)
    (run, ["--options", f"bn_stats_weight={w}", "--name", f"bn-stats-{w}"])
    for run in ("batchnorm-train", "batchnorm-train-seed1")
    for w in (0.1, 1.0)
]


def runs_markdown() -> str:
    """Each run's settings, as the launcher's --run-config text."""
    lines = ["| run | supernodes | run config |", "|---|---|---|"]
    lines += [f"| {name} | {n} | `{run_config_text(config)}` |" for name, config, n in RUNS]
    return "\n".join(lines) + "\n"


def outputs(out: Path, folders: list[Path]):
    """runs.md, then the leakage study's tables and report over ``folders``; returns the table."""
    write_text_atomic(out / "runs.md", runs_markdown())
    return write_outputs(out, folders)


def main(argv: list[str] | None = None) -> int:
    return study_main(
        argv,
        label="federations study",
        prog="python -m analysis.federations_study",
        doc=__doc__,
        runs=RUNS,
        replays=REPLAYS,
        outputs=outputs,
    )


if __name__ == "__main__":
    sys.exit(main())
