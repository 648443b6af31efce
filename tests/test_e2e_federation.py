"""A tiny federation end to end through the checked entry point (flwr run, Ray, attacks, report)."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scipy.stats import beta

from analysis.report import main as report_main
from fl_attack.evaluation.verdict import DEFAULT_DISTRACTORS
from fl_attack.federation.participants import sample_participants
from tests.gated import launch_gated

ROOT = Path(__file__).resolve().parent.parent
K = 6  # images per client (k), in 2 local steps of B = 3


def _clopper_pearson(count: int, k: int) -> tuple[int, int]:
    """The exact 95% interval of ``count`` of ``k`` as counts, the fractions' bounds rounded outwards:
    written out here with scipy's beta quantiles, importing nothing it checks."""
    low = 0.0 if count == 0 else beta.ppf(0.025, count, k - count + 1)
    high = 1.0 if count == k else beta.ppf(0.975, count + 1, k - count)
    return math.floor(low * k + 1e-9), math.ceil(high * k - 1e-9)


@pytest.fixture(scope="module")
def e2e_run(tmp_path_factory):
    """The tiny federation through the launcher (flwr run, Ray, attacks); returns (its run folder, the
    launcher's finished process, the folder holding run-dir)."""
    tmp_path = tmp_path_factory.mktemp("e2e")
    results = tmp_path / "results"
    run_config = (
        f"num-server-rounds=2 samples-per-client={K} batch-size=3 local-epochs=1 attack-iterations=6 "
        f'attack-nodes=2 attack-threads=1 attack-clients="all" attack-method="pisme" results-dir="{results}" '
        f'run-name="e2e" seed=3 fraction-train=0.5 attack-options="label_estimator=aux"'
    )
    gate = tmp_path / "attacks-may-end"  # every attack waits for it (GATE_ENV), opened once round 2 started
    env = {"FLWR_HOME": str(tmp_path / "flwr-home")}
    # The launcher passes a TOML run config through unchanged (flwr run's own format).
    (tmp_path / "overrides.toml").write_text(
        "\n".join(f"{k} = {v}" for k, v in (item.split("=", 1) for item in run_config.split()))
    )
    command = [
        sys.executable,
        "-m",
        "strategies.launch",
        "--run-config",
        str(tmp_path / "overrides.toml"),
        "--federation-config",
        "num-supernodes=4 client-resources-num-cpus=1",
        "--run-dir-file",
        str(tmp_path / "run-dir"),
    ]
    proc = launch_gated(command, env, results / "e2e", gate, timeout=900)
    log = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, log
    return results / "e2e", proc, tmp_path


@pytest.mark.runtime
def test_tiny_federation_end_to_end(e2e_run):
    run, proc, tmp_path = e2e_run
    assert (tmp_path / "run-dir").read_text().strip() == str(run)
    # The report is analysis' job, after the run (make demo does both; its command line: test_analysis.py).
    assert report_main([str(run), "--out", str(run / "report")]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["run_config"]["attack-method"] == "pisme" and config["seed"] == 3
    assert config["versions"]["flwr"] == "1.42.0"
    with open(run / "rounds.csv") as f:
        rounds = list(csv.DictReader(f))
    assert [r["round"] for r in rounds] == ["1", "2"] and all(r["clients"] == "2" for r in rounds)
    # 2 of the 4 clients a round, drawn from the seed and the round (fl_attack.federation.participants), not by
    # Flower's unseeded random.sample over the run's random node ids
    drawn = {r: sample_participants(range(4), 2, seed=3, server_round=r) for r in (1, 2)}
    assert [r["participants"] for r in rounds] == [",".join(map(str, drawn[r])) for r in (1, 2)]
    with open(run / "attacks.csv") as f:
        attacks = list(csv.DictReader(f))
    assert sorted((r["round"], r["partition_id"], r["method"]) for r in attacks) == sorted(
        (str(r), str(p), m) for r in (1, 2) for p in drawn[r] for m in ("pisme",)
    )
    for row in attacks:
        assert row["status"] == "ok", row["error"]
        # labels by the aux estimator on the server's held-out pool (red when the strategy does not pass it)
        assert row["label_estimator"] == "aux" and row["labels"] == "recovered", row
        assert row["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # attack-device auto
        for metric in ("psnr", "ssim", "lpips", "lsim_honest"):
            assert math.isfinite(float(row[metric])), (metric, row)
        assert (run / row["image"]).is_file()
        # the verdict (fl_attack.evaluation.verdict): k images, how many recovered, singled out against chance
        assert row["k"] == str(K) and 0 <= int(row["recovered"]) <= K
        assert float(row["reid_chance_uniform"]) == pytest.approx(1 / (K + DEFAULT_DISTRACTORS))
        assert float(row["reid_chance"]) >= K / (K + DEFAULT_DISTRACTORS)  # the matched null, at least k/(k+D)
        # the exact (Clopper-Pearson) 95% interval of the row's own count, in images, rounded outwards
        assert (int(row["recovered_low"]), int(row["recovered_high"])) == _clopper_pearson(int(row["recovered"]), K)
        assert set(json.loads(row["guesses"])) == {"pool mean", "class mean", "class medoid", "reader's pick"}
        assert int(row["recovered"]) <= round(float(row["reidentified"]) * K)
        assert float(row["psnr_margin"]) == pytest.approx(float(row["psnr"]) - float(row["guess_psnr"]))
    report_html = (run / "report" / "report.html").read_text()
    assert 0 < report_html.index('id="verdict"') < report_html.index('id="summary"')  # the first screen
    # The launcher's last lines and summary.json lead with the verdict, one line per attack.
    verdict = json.loads((run / "summary.json").read_text())["verdict"]
    assert len(verdict["attacks"]) == 4 and len(verdict["lines"]) == 5  # and the total
    assert verdict["lines"][-1].startswith("in all: ")
    assert "fl-attack: the verdict" in proc.stdout and proc.stdout.count("images recovered (95%: ") == 4
    # The attacker does not hold up training: round 1's 2 attacks cannot end before round 2 starts
    # (the gate), and the strategy counts all of them in flight then.
    events = (run / "events.log").read_text()
    in_flight = re.search(r"round 2: training starts with (\d+) attack\(s\) in flight", events)
    assert in_flight and int(in_flight.group(1)) == 2, events
    assert "fl-attack: leakage record" in proc.stdout
    # Where the time went: summary.json's timings, with the launcher's clock, all non-negative numbers.
    timings = json.loads((run / "summary.json").read_text())["timings"]
    assert {"seconds", "counts", "rounds", "main_started", "launcher"} <= set(timings), timings
    assert timings["counts"]["client_train"] == 4 and timings["counts"]["attack"] == 4, timings

    def numbers(value):
        if isinstance(value, dict):
            return [n for v in value.values() for n in numbers(v)]
        return [value] if isinstance(value, (int, float)) else []

    assert numbers(timings) and all(math.isfinite(n) and n >= 0 for n in numbers(timings)), timings
    assert "where the time went" in proc.stdout


@pytest.mark.runtime
@pytest.mark.slow  # a second process attacking again (about a minute on 2 busy cores); CI replays in process:
def test_a_replay_of_the_real_run_reproduces_its_rows_with_the_threads_it_recorded(e2e_run):  # test_replay.py
    """Round 2's attacks replayed from the launcher's run folder by the CLI, each with the threads it recorded
    (that a replay takes a row's recorded threads over this process's: test_replay.py, in CI)."""
    run, _, _ = e2e_run
    with open(run / "attacks.csv") as f:
        attacks = list(csv.DictReader(f))
    assert all(r["threads"] == "1" for r in attacks)
    replay = subprocess.run(
        [sys.executable, "-m", "fl_attack.cli", "replay", str(run), "--name", "same", "--rounds", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert replay.returncode == 0, replay.stderr[-4000:]
    with open(run / "replays" / "same" / "attacks.csv") as f:
        replayed = {(r["round"], r["partition_id"], r["method"]): r for r in csv.DictReader(f)}
    round_2 = [r for r in attacks if r["round"] == "2"]  # its 2 attacks
    assert sorted(replayed) == sorted((r["round"], r["partition_id"], r["method"]) for r in round_2)
    for row in round_2:
        again = replayed[(row["round"], row["partition_id"], row["method"])]
        assert (again["psnr"], again["lsim_honest"], again["threads"], again["recovered"]) == (
            row["psnr"],
            row["lsim_honest"],
            row["threads"],
            row["recovered"],
        ), (row, again)
        assert (again["label_estimator"], again["label_accuracy"]) == ("aux", row["label_accuracy"])
