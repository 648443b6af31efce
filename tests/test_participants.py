"""Same seed, same study: who trains each round is drawn from the run's seed, not by Flower's
unseeded ``random.sample`` over random node ids (fl_attack.participants, strategies/sampling.py)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fl_attack.participants import sample_participants, sample_size
from tests.inprocess import federate, serve

ROOT = Path(__file__).resolve().parent.parent
# Columns that are wall-clock readings or the runtime's own ids, not the study's numbers.
TIMING = {"seconds", "attacks_in_flight", "attack_lag_rounds", "attack_seconds", "lag_rounds", "worker_node"}
RUNTIME = {"node_id", "worker_id"}


def test_sample_size_is_flowers_count():
    """Unit test: max(int(n * fraction), minimum), at most n; 0 when the stage is off."""
    assert sample_size(10, 0.5, 1) == 5
    assert sample_size(10, 0.25, 1) == 2  # int(), not round()
    assert sample_size(3, 0.1, 1) == 1
    assert sample_size(3, 0.1, 5) == 3
    assert sample_size(10, 0.0, 1) == 0
    with pytest.raises(ValueError, match="fraction"):
        sample_size(10, 1.5, 1)


def test_sample_participants_is_a_seeded_uniform_draw():
    """Unit test: a function of (partitions, size, seed, round, stage) only: the order the
    partitions come in does not matter; rounds, seeds and stages draw differently; over many
    rounds every partition takes part about ``size / n`` of the time."""
    pool = list(range(10))
    first = sample_participants(pool, 3, seed=0, server_round=1)
    assert first == sorted(first) and len(set(first)) == 3 and set(first) <= set(pool)
    assert sample_participants(reversed(pool), 3, seed=0, server_round=1) == first
    rounds = [sample_participants(pool, 3, seed=0, server_round=r) for r in range(1, 401)]
    assert len({tuple(r) for r in rounds}) > 50  # a new draw every round
    assert [sample_participants(pool, 3, seed=1, server_round=r) for r in range(1, 401)] != rounds
    evaluate = [sample_participants(pool, 3, seed=0, server_round=r, stage="evaluate") for r in range(1, 401)]
    assert evaluate != rounds
    counts = Counter(p for r in rounds for p in r)
    assert set(counts) == set(pool)
    assert all(abs(c / 400 - 0.3) < 0.08 for c in counts.values()), counts  # binomial sd about 0.023
    assert sample_participants([7, 3, 5], 5, seed=0, server_round=1) == [3, 5, 7]  # size >= n: everyone
    with pytest.raises(ValueError, match="repeat"):
        sample_participants([1, 1, 2], 1, seed=0, server_round=1)
    with pytest.raises(ValueError, match="stage"):
        sample_participants(pool, 1, seed=0, server_round=1, stage="fit")


def _rows(path):
    with open(path) as f:
        return [{k: v for k, v in row.items() if k not in TIMING | RUNTIME} for row in csv.DictReader(f)]


def _study(tmp_path, seed):
    run = serve(
        tmp_path,
        partitions=(0, 1, 2, 3),
        num_rounds=3,
        random_node_ids=True,  # new random node ids per run, listed in a random order, as Flower's
        seed=seed,
        fraction_train=0.5,
        fraction_evaluate=0.5,
        attack_clients="all",
        attack_method="ig",
        attack_iterations=2,
        attack_threads=1,
    )
    return _rows(run / "rounds.csv"), _rows(run / "attacks.csv")


@pytest.mark.heavy
def test_same_seed_same_participants_rounds_and_attacks(tmp_path):
    """The real ServerApp twice with seed 0 and fraction-train=0.5 (2 of 4 clients a round), node ids
    random per run: rounds.csv and attacks.csv are identical but for wall times and node ids, and
    the participants are the seeded draw's; seed 1 trains other clients."""
    rounds, attacks = _study(tmp_path / "a", seed=0)
    again = _study(tmp_path / "b", seed=0)
    assert (rounds, attacks) == again
    assert [r["participants"] for r in rounds] == [
        ",".join(map(str, sample_participants(range(4), 2, seed=0, server_round=r))) for r in (1, 2, 3)
    ]
    assert all(r["clients"] == "2" for r in rounds)
    assert {(a["round"], a["partition_id"]) for a in attacks} == {
        (r["round"], p) for r in rounds for p in r["participants"].split(",")
    }
    other, _ = _study(tmp_path / "c", seed=1)
    assert [r["participants"] for r in other] != [r["participants"] for r in rounds]


@pytest.mark.heavy
def test_secagg_draws_the_same_participants(tmp_path):
    """Flower's legacy path under SecAgg+ (3 of 4 clients a round) draws the seeded participants too."""
    federate(
        tmp_path,
        partitions=(0, 1, 2, 3),
        num_rounds=2,
        random_node_ids=True,
        defense="secagg",
        fraction_train=0.75,
        attack_method="ig",
        attack_iterations=1,
        seed=2,
    )
    with open(tmp_path / "rounds.csv") as f:
        participants = [r["participants"] for r in csv.DictReader(f)]
    assert participants == [
        ",".join(map(str, sample_participants(range(4), 3, seed=2, server_round=r))) for r in (1, 2)
    ]
    assert participants[0] != participants[1]  # a draw, not the first three


@pytest.mark.runtime
def test_flwr_run_draws_the_seeded_participants_and_attacks_with_aux_labels(tmp_path):
    """A real ``flwr run`` (4 SuperNodes, Ray, random node ids): each round's participants are the
    seeded draw; the attacks run the ``aux`` label estimator on the server's held-out pool (none
    fails, every row says aux), and a replay of the run reproduces their labels and numbers."""
    results = tmp_path / "results"
    config = (
        "num-server-rounds=2 samples-per-client=10 batch-size=5 local-epochs=1 attack-iterations=3 "
        'attack-nodes=2 attack-threads=1 attack-clients="all" attack-method="pisme" seed=3 fraction-train=0.5 '
        f'attack-options="label_estimator=aux" results-dir="{results}" run-name="run"'
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "strategies.launch",
            "--run-config",
            config,
            "--federation-config",
            "num-supernodes=4 client-resources-num-cpus=1",
        ],
        cwd=ROOT,
        env={**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home")},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run = results / "run"
    with open(run / "rounds.csv") as f:
        rounds = list(csv.DictReader(f))
    drawn = [",".join(map(str, sample_participants(range(4), 2, seed=3, server_round=r))) for r in (1, 2)]
    assert [r["participants"] for r in rounds] == drawn
    with open(run / "attacks.csv") as f:
        attacks = list(csv.DictReader(f))
    assert sorted((a["round"], a["partition_id"]) for a in attacks) == sorted(
        (str(r), p) for r, d in zip((1, 2), drawn, strict=True) for p in d.split(",")
    )
    for row in attacks:
        assert row["status"] == "ok" and row["label_estimator"] == "aux", row
        assert row["labels"] == "recovered" and 0 <= float(row["label_accuracy"]) <= 1, row
    replay = subprocess.run(
        [sys.executable, "-m", "fl_attack.cli", "replay", str(run), "--name", "same"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert replay.returncode == 0, replay.stderr[-4000:]
    with open(run / "replays" / "same" / "attacks.csv") as f:
        replayed = {(r["round"], r["partition_id"]): r for r in csv.DictReader(f)}
    for row in attacks:
        again = replayed[(row["round"], row["partition_id"])]
        assert again["label_estimator"] == "aux"
        assert (again["label_accuracy"], again["psnr"], again["recovered"]) == (
            row["label_accuracy"],
            row["psnr"],
            row["recovered"],
        )
