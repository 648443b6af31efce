"""A Flower app that is not fl-attack's (tests/quickstart_app, laid out as Flower's
quickstart-pytorch), run through ``flwr run`` as its user would: the proof that the audit plugs
into someone else's app. Its two app files carry the audit's marked blocks (the leakage_metadata
mod in the ClientApp, ``strategies.audit.audit`` around its strategy in the ServerApp); two rounds with
Flower's FedAvg or FedAdam leave a leakage record whose every row is scored against its own client's
images, round 2's attacked on the strategy's own aggregate."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from strategies.deploy import flwr_json
from strategies.launch import _environment, _stop_superlink

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "tests" / "quickstart_app"
RUN_CONFIG = tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def flwr_run_app(tmp_path: Path, run_config: str = "", nodes: int = 3, timeout: float = 300):
    """``flwr run tests/quickstart_app --stream`` on a local simulation SuperLink of its own (free
    ports, FLWR_HOME in ``tmp_path``, offline), stopped afterwards. Returns (the run's final status
    from ``flwr ls``, its output)."""
    env = _environment()
    env["FLWR_HOME"] = str(tmp_path / "flwr-home")
    command = ["flwr", "run", str(APP), "--stream"]
    command += ["--federation-config", f"num-supernodes={nodes} client-resources-num-cpus=1"]
    command += ["--run-config", run_config] if run_config else []
    try:
        proc = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
        out = proc.stdout + proc.stderr
        found = re.search(r"Successfully started run (\d+)", out)
        runs = flwr_json(["ls", "--run-id", found.group(1)], env, tmp_path).get("runs", []) if found else []
        return (str(runs[0].get("status")) if runs else "unknown"), out
    finally:
        _stop_superlink(env["FLWR_LOCAL_CONTROL_API_PORT"])


NODES, EXAMPLES = 2, 10  # 10 images per partition: k = 8 training images (B = 8, E = 2: T = 2 steps)
AUDIT = (
    'attack-method="ig" attack-iterations=30 attack-clients="all" num-server-rounds=2 batch-norm=true '
    f"examples-per-partition={EXAMPLES}"
)


def partition_images(partition_id: int) -> np.ndarray:
    """The images partition ``partition_id`` trains on, uint8 (k, 32, 32, 3), from the app's own data loading
    (``task.load_partition``, what its ClientApp's train loader holds), not from the audit's ``truth``."""
    sys.path.insert(0, str(APP))
    try:
        from quickstart.task import load_partition
    finally:
        sys.path.remove(str(APP))
    return load_partition(partition_id, NODES, EXAMPLES)["train"][0]


def grid_pairs(path: Path, k: int, size: int = 32, columns: int = 16, pad: int = 2, scale: int = 2):
    """(originals, reconstructions), uint8 (k, size, size, 3) each, read back from the evaluator's grid PNG
    (fl_attack.evaluation.images: bands of ``columns`` pairs, originals over their matched reconstructions,
    ``pad``-pixel gaps, every pixel enlarged ``scale`` times)."""
    grid = np.asarray(Image.open(path).convert("RGB"))[::scale, ::scale]
    per_band, cell = min(k, columns), size + pad
    pairs = [[], []]
    for i in range(k):
        band, column = divmod(i, per_band)
        x = pad + column * cell
        for row in (0, 1):
            y = pad + (2 * band + row) * cell
            pairs[row].append(grid[y : y + size, x : x + size])
    return np.stack(pairs[0]), np.stack(pairs[1])


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """The mean over images of 10 log10(1 / MSE), pixels in [0, 1] (the row's psnr, written out)."""
    mse = ((a.astype(np.float64) / 255 - b.astype(np.float64) / 255) ** 2).reshape(len(a), -1).mean(1)
    return float((10 * np.log10(1 / mse)).mean())


def second_round_w0(strategy: str, w0: dict, replies: list[dict]) -> dict:
    """Round 2's global weights (the floating-point arrays) by Flower's rule, written out: FedAvg's mean of
    round 1's replies (equal k); FedAdam's first step from w0 toward it (flwr.serverapp.strategy.FedAdam:
    m = (1 - beta_1) delta, v = (1 - beta_2) delta^2, eta_norm = eta sqrt(1 - beta_2^2) / (1 - beta_1^2)),
    with the app's eta and Flower's betas and tau."""
    sys.path.insert(0, str(APP))
    try:
        from quickstart.server_app import make_strategy
    finally:
        sys.path.remove(str(APP))
    out = {}
    for key, start in w0.items():
        if not start.is_floating_point():
            continue
        mean = sum(r[key].double() for r in replies) / len(replies)
        if strategy == "fedavg":
            out[key] = mean
            continue
        adam = make_strategy({**RUN_CONFIG, "strategy": strategy})
        delta = mean - start.double()
        m, v = (1 - adam.beta_1) * delta, (1 - adam.beta_2) * delta**2
        eta = adam.eta * math.sqrt(1 - adam.beta_2**2) / (1 - adam.beta_1**2)
        out[key] = start.double() + eta * m / (v.sqrt() + adam.tau)
    return out


@pytest.mark.runtime
# Both in the slow tier (63 s and 41 s; the suite's 15-minute budget). CI keeps the path in parts: the plugin
# in process (test_audit_plugin.py, its batch-norm counter included) and the audited ServerApp through
# flwr run (test_e2e_federation.py).
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fedavg", "fedadam"])
def test_the_quickstart_app_is_audited_over_two_rounds_through_flwr_run(tmp_path, strategy):
    """Two rounds of the app with batch norm (its int64 counter averaged into a float by Flower's strategies
    failed every round-2 attack once), every client attacked each round. Each row of both rounds is scored
    against that partition's own images: its grid's originals are the images the app's own loader gives
    that partition, and its PSNR re-scored from the grid's matched reconstructions against them is the
    row's. Round 2's w0 the attacker took is the strategy's own aggregate of round 1 (FedAvg's mean,
    FedAdam's step, far from the mean): the strategy reaches the attacker."""
    results = tmp_path / "results"
    run_config = f'strategy="{strategy}" {AUDIT} results-dir="{results}" run-name="audit"'
    status, out = flwr_run_app(tmp_path, run_config, nodes=NODES)
    assert status == "finished:completed", out[-4000:]
    record = results / "audit"
    config = json.loads((record / "config.json").read_text())
    assert config["audit"]["strategy"] == {"fedavg": "FedAvg", "fedadam": "FedAdam"}[strategy]
    rows = list(csv.DictReader((record / "attacks.csv").open()))
    assert sorted((r["round"], r["partition_id"]) for r in rows) == [("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]
    own = {p: partition_images(p) for p in range(NODES)}
    assert not np.array_equal(own[0], own[1])
    for row in rows:
        assert row["status"] == "ok", row["error"]
        assert row["local_steps"] == "2" and row["optimizer"].startswith("momentum")
        assert row["recovered"] != "" and 0 <= float(row["label_accuracy"]) <= 1
        originals, matched = grid_pairs(record / row["image"], k=len(own[0]))
        p = int(row["partition_id"])
        np.testing.assert_array_equal(originals, own[p])  # scored against this partition's images
        assert psnr(matched, own[p]) == pytest.approx(float(row["psnr"]), abs=0.01)  # 8-bit grid: < 0.01 dB
    updates = record / "updates"
    w0 = torch.load(updates / "round-1" / "w0.pt", weights_only=True)["w0"]
    replies = [torch.load(updates / "round-1" / f"client-{p}.pt", weights_only=False)["wT"] for p in range(NODES)]
    seen = torch.load(updates / "round-2" / "w0.pt", weights_only=True)["w0"]
    expected, mean = second_round_w0(strategy, w0, replies), second_round_w0("fedavg", w0, replies)
    for key, value in expected.items():
        assert torch.allclose(seen[key].double(), value, atol=1e-6), key
    if strategy == "fedadam":  # its step is not the mean: round 2 really attacks what the strategy made
        assert max(float((expected[k] - mean[k]).abs().max()) for k in mean) > 1e-2
    assert "bn1.running_var" in seen and seen["bn1.num_batches_tracked"].dtype == torch.int64
    rounds = list(csv.DictReader((record / "rounds.csv").open()))
    assert [(r["participants"], r["attacks_dispatched"]) for r in rounds] == [("0,1", "2"), ("0,1", "2")]
    summary = json.loads((record / "summary.json").read_text())
    assert summary["attacks"] == summary["attacks_ok"] == 4
    # the app's own training ran as before: its metric, and the mod's metadata averaged by Flower
    final = re.search(r"Final train metrics: (\{.*\})", out)
    assert final and "'train_loss'" in final.group(1) and "'local-steps': 2.0" in final.group(1), out[-4000:]


@pytest.mark.parametrize(
    ("name", "cls", "setting"),
    [
        ("fedavg", "FedAvg", None),
        ("fedprox", "FedProx", ("proximal_mu", 0.01)),
        ("fedadam", "FedAdam", ("eta", 0.01)),
        ("fedavgm", "FedAvgM", ("server_momentum", 0.9)),
    ],
)
def test_the_app_s_strategy_is_flower_s_own_chosen_by_the_run_config(monkeypatch, name, cls, setting):
    from flwr.serverapp import strategy as flower

    monkeypatch.syspath_prepend(str(APP))
    from quickstart.server_app import make_strategy

    strategy = make_strategy({**RUN_CONFIG, "strategy": name})
    assert type(strategy) is getattr(flower, cls)
    assert (strategy.fraction_train, strategy.fraction_evaluate) == (1.0, 0.5)
    assert setting is None or getattr(strategy, setting[0]) == setting[1]
    with pytest.raises(ValueError, match="strategy must be one of fedavg, fedprox, fedadam, fedavgm; got 'fedsgd'"):
        make_strategy({**RUN_CONFIG, "strategy": "fedsgd"})
