"""``fl-attack replay``: a real in-process federation's recorded updates attacked again, offline.

One module-scoped run (2 rounds, partition 0 attacked with PI-SME, 20 iterations, 1 torch thread)
is copied for the tests that change it.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket

import pytest
import torch
from flwr.supercore.task_identity import TaskIdentity

import fl_attack.attacker.runtime.run as workers_module  # where run_job calls reconstruct
from analysis.aggregate import differing_keys
from analysis.load import load_run
from analysis.report import main as report_main
from fl_attack.cli import main
from fl_attack.records import read_csv
from fl_attack.schema import ATTACK_COLUMNS
from strategies.server_app import write_run_config
from tests.inprocess import federate, flower_run_config

RUN = dict(num_rounds=2, attack_clients="0", attack_iterations=20, attack_method="pisme", attack_threads=1)
SCORES = ("psnr", "ssim", "fsim", "lpips", "label_accuracy", "lsim_honest", "lsim_calibrated")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished run folder with config.json (as the ServerApp writes it) and updates/."""
    folder = tmp_path_factory.mktemp("run")
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # as Flower sets it for a ServerApp
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the in-process attacker runs in this process: attack-threads=1
    try:
        settings, _, _, jobs = federate(folder, **RUN)
    finally:
        torch.set_num_threads(before)
    write_run_config(folder, settings, flower_run_config(**RUN), num_nodes=2)
    assert len(jobs) == 2 and (folder / "updates" / "index.csv").is_file()
    return folder


@pytest.fixture
def copy_of(run_dir, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run_dir, out, ignore=shutil.ignore_patterns("replays"))
    return out


def test_the_same_method_and_settings_reproduce_the_runs_rows_exactly(run_dir, capsys):
    assert main(["replay", str(run_dir), "--methods", "pisme", "--threads", "1", "--device", "cpu"]) == 0
    out = run_dir / "replays" / "pisme-recovered"
    columns, rows = read_csv(out / "attacks.csv")
    _, original = read_csv(run_dir / "attacks.csv")
    assert columns == ATTACK_COLUMNS and len(rows) == len(original) == 2
    key = lambda r: (r["round"], r["partition_id"], r["method"])  # noqa: E731
    for mine, theirs in zip(sorted(rows, key=key), sorted(original, key=key)):
        assert mine["status"] == theirs["status"] == "ok" and mine["device"] == "cpu"
        for column in (
            "round",
            "node_id",
            "partition_id",
            "client_id",
            "dataset",
            "defense",
            "local_steps",
            "gradients_per_iteration",
            "iterations",
            "labels",
            "label_estimator",
            "image",
            *SCORES,
        ):
            assert mine[column] == theirs[column], column  # the same text: the same float
        assert (out / mine["image"]).is_file()
    # a run folder of its own, that the analysis reads and compares with the run
    replayed = load_run(out)
    assert len(replayed.attacks) == 2 and len(replayed.rounds) == 2
    assert replayed.run_config["attack-method"] == "pisme" and replayed.config["replay"]["threads"] == 1
    assert set(differing_keys([load_run(run_dir), replayed])) <= {"attack-device"}
    assert "2 attack(s), 0 failed" in capsys.readouterr().err


@pytest.mark.runtime
@pytest.mark.slow  # 29 s; CI keeps worker processes against this process: test_workers.py
def test_local_worker_processes_reproduce_this_process_rows_exactly(run_dir):
    """--workers 2 (spawned processes, --threads 1 each) gives the rows --workers 0 gives, apart from
    the time and where it ran, and the run's own scores."""
    common = ["replay", str(run_dir), "--methods", "pisme,ig", "--threads", "1", "--device", "cpu"]
    assert main([*common, "--name", "inline"]) == 0
    assert main([*common, "--name", "pool", "--workers", "2"]) == 0
    key = lambda r: (r["round"], r["partition_id"], r["method"])  # noqa: E731
    inline, pool = (sorted(read_csv(run_dir / "replays" / n / "attacks.csv")[1], key=key) for n in ("inline", "pool"))
    assert len(inline) == len(pool) == 4 and all(r["status"] == "ok" for r in inline + pool)
    where = ("attack_seconds", "worker_node", "worker_id")
    for mine, theirs in zip(pool, inline):
        assert {k: v for k, v in mine.items() if k not in where} == {k: v for k, v in theirs.items() if k not in where}
    _, original = read_csv(run_dir / "attacks.csv")
    for mine, theirs in zip([r for r in pool if r["method"] == "pisme"], sorted(original, key=key)):
        assert [mine[c] for c in SCORES] == [theirs[c] for c in SCORES]
    # where each attack ran: this process, or the spawned ones
    assert {(r["worker_node"], r["worker_id"]) for r in inline} == {(socket.gethostname(), f"pid{os.getpid()}")}
    assert {r["worker_node"] for r in pool} == {socket.gethostname()}
    assert all(r["worker_id"].startswith("pid") and r["worker_id"] != f"pid{os.getpid()}" for r in pool)
    config = json.loads((run_dir / "replays" / "pool" / "config.json").read_text())
    assert config["replay"]["workers"] == 2 and config["replay"]["threads"] == 1
    assert "in 2 local process(es)" in (run_dir / "replays" / "pool" / "events.log").read_text()


def test_the_report_compares_a_run_with_its_replay(run_dir, tmp_path, capsys):
    assert main(["replay", str(run_dir), "--methods", "ig", "--iterations", "3", "--name", "ig-short"]) == 0
    out = tmp_path / "compare"
    assert report_main([str(run_dir), str(run_dir / "replays" / "ig-short"), "--out", str(out), "--format", "md"]) == 0
    text = (out / "report.md").read_text()
    assert "attack-method" in text and "attack-iterations" in text and "ig-short" in text


def test_oracle_labels_and_another_method_are_recorded_as_such(run_dir, tmp_path):
    assert (
        main(
            [
                "replay",
                str(run_dir),
                "--labels",
                "oracle",
                "--methods",
                "ig",
                "--iterations",
                "5",
                "--options",
                "tv_weight=0.02",
                "--rounds",
                "2",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    out = run_dir / "replays" / "ig-oracle-K5-tv_weight0.02-rounds2"
    _, rows = read_csv(out / "attacks.csv")
    assert [(r["round"], r["method"], r["labels"], r["gradients_per_iteration"], r["iterations"]) for r in rows] == [
        ("2", "ig", "oracle", "1", "5")
    ]
    assert float(rows[0]["label_accuracy"]) == 1.0
    config = load_run(out).config
    assert config["run_config"]["attack-labels"] == "oracle" and config["run_config"]["attack-rounds"] == "2"
    assert config["run_config"]["attack-options"] == "tv_weight=0.02" and config["attack_config"]["tv_weight"] == 0.02
    # the same replay again would mix two records in one folder
    assert (
        main(
            [
                "replay",
                str(run_dir),
                "--labels",
                "oracle",
                "--methods",
                "ig",
                "--iterations",
                "5",
                "--options",
                "tv_weight=0.02",
                "--rounds",
                "2",
            ]
        )
        == 2
    )


def test_the_prior_based_baselines_replay_a_run(run_dir):
    """GI-NAS and DGGI attack a recorded run's updates offline, as every other method does."""
    args = ["replay", str(run_dir), "--methods", "ginas,dggi", "--iterations", "2", "--rounds", "2"]
    assert main([*args, "--options", "generator_candidates=2,prior_every=1", "--threads", "1"]) == 0
    (out,) = (run_dir / "replays").glob("ginas*")
    _, rows = read_csv(out / "attacks.csv")
    assert sorted((r["round"], r["method"], r["status"]) for r in rows) == [("2", "dggi", "ok"), ("2", "ginas", "ok")]
    assert all(r["labels"] == "recovered" and float(r["psnr"]) > 0 for r in rows)


@pytest.mark.runtime
@pytest.mark.parametrize("workers", ["0", "2"])
def test_missing_completes_exactly_the_attacks_a_run_left_undone(copy_of, capsys, workers):
    columns, rows = read_csv(copy_of / "attacks.csv")
    kept = [r for r in rows if r["round"] != "2"]
    with open(copy_of / "attacks.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(kept)
    assert main(["replay", str(copy_of), "--missing", "--threads", "1", "--workers", workers]) == 0
    _, after = read_csv(copy_of / "attacks.csv")
    assert after[: len(kept)] == kept
    restored = after[len(kept) :]
    assert [r["round"] for r in restored] == ["2"]
    lost = [r for r in rows if r["round"] == "2"][0]
    for column in ("partition_id", "method", "labels", "image", *SCORES):
        assert restored[0][column] == lost[column], column
    assert restored[0]["worker_node"] == socket.gethostname() and restored[0]["worker_id"].startswith("pid")
    assert not (copy_of / "replays").exists()
    capsys.readouterr()
    assert main(["replay", str(copy_of), "--missing"]) == 0  # nothing left to do
    assert "nothing to attack" in capsys.readouterr().err and len(read_csv(copy_of / "attacks.csv")[1]) == 2


def test_without_threads_each_attack_runs_with_the_threads_its_row_recorded(copy_of):
    """A run whose attacks ran on 2 torch threads (attacks.csv's threads column) is replayed, without
    --threads, on 2 (not this process's 1): the threads are part of what reproduces a row's floats."""
    columns, rows = read_csv(copy_of / "attacks.csv")
    with open(copy_of / "attacks.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({**r, "threads": "2"} for r in rows)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["replay", str(copy_of), "--rounds", "1", "--device", "cpu", "--name", "recorded"]) == 0
        assert torch.get_num_threads() == 1  # given back
    finally:
        torch.set_num_threads(before)
    _, replayed = read_csv(copy_of / "replays" / "recorded" / "attacks.csv")
    assert [(r["round"], r["threads"]) for r in replayed] == [("1", "2")]


def test_missing_refuses_a_record_with_other_columns_before_any_attack(copy_of, capsys):
    """A run recorded before a column was added: appending would misalign every cell."""
    columns, rows = read_csv(copy_of / "attacks.csv")
    with open(copy_of / "attacks.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, [c for c in columns if c != "device"], extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows[:1])
    before = (copy_of / "attacks.csv").read_bytes()
    assert main(["replay", str(copy_of), "--missing"]) == 2
    assert "has other columns than this version writes (missing: ['device']" in _one_error_line(capsys)
    assert (copy_of / "attacks.csv").read_bytes() == before


def test_missing_refuses_a_record_under_a_former_column_name(copy_of, capsys):
    """A run recorded when gradients_per_iteration was named nodes: read under today's name, but never
    appended to under the old header (a resume rewrites it; fl_attack.audit.run_folder.RunFolder.cut_back)."""
    columns, rows = read_csv(copy_of / "attacks.csv")
    with open(copy_of / "attacks.csv", "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["nodes" if c == "gradients_per_iteration" else c for c in columns])
        writer.writerows([[r[c] for c in columns] for r in rows[:1]])
    before = (copy_of / "attacks.csv").read_bytes()
    assert main(["replay", str(copy_of), "--missing"]) == 2
    assert "(missing: ['gradients_per_iteration'], unknown: ['nodes'])" in _one_error_line(capsys)
    assert (copy_of / "attacks.csv").read_bytes() == before


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fl-attack: error: "), captured.err
    assert "Traceback" not in captured.err
    return lines[0]


def test_a_corrupted_record_is_refused_before_any_attack(copy_of, capsys):
    path = copy_of / "updates" / "round-2" / "client-0.pt"
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    path.write_bytes(bytes(data))
    assert main(["replay", str(copy_of), "--methods", "ig"]) == 2
    assert "does not match its checksum" in _one_error_line(capsys)
    assert not (copy_of / "replays").exists()


BAD = [
    (lambda run, tmp: [str(tmp)], "is not a run folder (no config.json)"),
    (lambda run, tmp: [str(tmp / "nowhere")], "is not a run folder (no such folder)"),
    (lambda run, tmp: [str(run), "--methods", "dlg"], "unknown attack method 'dlg'"),
    (lambda run, tmp: [str(run), "--missing", "--methods", "ig"], "it takes no --methods"),
    (lambda run, tmp: [str(run), "--rounds", "7"], "no update recorded in round(s) 7"),
    (lambda run, tmp: [str(run), "--options", "tv_weigth=1"], "unknown attack setting 'tv_weigth'"),
    (lambda run, tmp: [str(run), "--nodes", "0"], "quadrature nodes m must be an integer >= 1"),
    (lambda run, tmp: [str(run), "--name", "../x"], "--name must be a plain folder name"),
    (lambda run, tmp: [str(run), "--workers", "-1"], "--workers must be an integer >= 0"),
    (lambda run, tmp: [str(run), "--ray-address", "head-node"], "--ray-address must be auto, HOST:PORT"),
    (lambda run, tmp: [str(run), "--ray-address", "ray://h:99999"], "--ray-address must be auto, HOST:PORT"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[m for _, m in BAD])
def test_bad_input_exits_2_with_one_line(copy_of, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    assert main(["replay", *args(copy_of, tmp_path / "empty")]) == 2
    assert message in _one_error_line(capsys)
    assert not (copy_of / "replays").exists()


@pytest.mark.runtime
@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_ray_cluster_that_cannot_be_joined_is_refused_before_anything_is_written(copy_of, capsys, scheme):
    """A real join of an address where nothing listens: refused in one line within seconds (ray.init
    alone waits minutes there), and nothing written."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"{scheme}127.0.0.1:{s.getsockname()[1]}"
    assert main(["replay", str(copy_of), "--methods", "ig", "--ray-address", address, "--workers", "2"]) == 2
    assert f"cannot join the Ray cluster at {address}: nothing answers at {address}" in _one_error_line(capsys)
    assert not (copy_of / "replays").exists()


def test_a_run_without_recorded_updates_is_refused(copy_of, capsys):
    shutil.rmtree(copy_of / "updates")
    assert main(["replay", str(copy_of)]) == 2
    assert "has no recorded updates" in _one_error_line(capsys)


def test_a_run_that_audited_an_apps_own_model_is_refused_before_any_attack(copy_of, capsys):
    """strategies/audit.py records the app's model class, not a way to rebuild it: a replay would attack
    the update with fl-attack's own CNN and fail every attack (seen on the quickstart app's record)."""
    config = json.loads((copy_of / "config.json").read_text())
    config["audit"] = {"strategy": "FedAvg", "model": "quickstart.task.Net", "normalize": None, "scored": True}
    (copy_of / "config.json").write_text(json.dumps(config))
    assert main(["replay", str(copy_of), "--name", "app"]) == 2
    assert "audited an app's own model (quickstart.task.Net), which a replay cannot rebuild" in _one_error_line(capsys)
    assert not (copy_of / "replays").exists()


def test_every_attack_failing_exits_1_with_the_failures_recorded(copy_of, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(workers_module, "reconstruct", boom)  # where this process runs the attack
    assert main(["replay", str(copy_of), "--methods", "sme", "--name", "broken"]) == 1
    _, rows = read_csv(copy_of / "replays" / "broken" / "attacks.csv")
    assert [(r["status"], r["error"]) for r in rows] == [("failed", "RuntimeError: boom")] * 2
