"""A Flower app that is not fl-attack's (tests/quickstart_app, laid out as Flower's
quickstart-pytorch), run through ``flwr run`` as its user would: the proof that the audit plugs
into someone else's app. Its two app files carry the audit's marked blocks (the leakage_metadata
mod in the ClientApp, ``strategies.audit.audit`` around its strategy in the ServerApp); a run with
Flower's FedAvg, FedProx or FedAdam leaves a scored leakage record."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

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


AUDIT = 'attack-method="ig" attack-iterations=30 attack-clients="all" num-server-rounds=1'


@pytest.mark.runtime
@pytest.mark.parametrize("strategy", ["fedavg", "fedprox", "fedadam"])
def test_the_quickstart_app_is_audited_through_flwr_run(tmp_path, strategy):
    results = tmp_path / "results"
    run_config = f'strategy="{strategy}" {AUDIT} results-dir="{results}" run-name="audit"'
    status, out = flwr_run_app(tmp_path, run_config, nodes=2)
    assert status == "finished:completed", out[-4000:]
    record = results / "audit"
    config = json.loads((record / "config.json").read_text())
    assert config["audit"]["strategy"] == {"fedavg": "FedAvg", "fedprox": "FedProx", "fedadam": "FedAdam"}[strategy]
    rows = list(csv.DictReader((record / "attacks.csv").open()))
    # both clients of the one round attacked, each row scored against that client's training images
    assert sorted(r["partition_id"] for r in rows) == ["0", "1"], out[-4000:]
    for row in rows:
        assert row["status"] == "ok", row["error"]
        assert row["local_steps"] == "8" and row["optimizer"].startswith("momentum")
        assert 0 < float(row["psnr"]) < 60 and row["recovered"] != ""
        assert (record / row["image"]).is_file()
    (round_row,) = list(csv.DictReader((record / "rounds.csv").open()))
    assert round_row["participants"] == "0,1" and round_row["attacks_dispatched"] == "2"
    summary = json.loads((record / "summary.json").read_text())
    assert summary["attacks"] == summary["attacks_ok"] == 2
    # the app's own training ran as before: its metric, and the mod's metadata averaged by Flower
    final = re.search(r"Final train metrics: (\{.*\})", out)
    assert final and "'train_loss'" in final.group(1) and "'local-steps': 8.0" in final.group(1), out[-4000:]


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
