"""Same seed, same study: who trains each round is drawn from the run's seed, not by Flower's
unseeded ``random.sample`` over random node ids (fl_attack.federation.participants, strategies/sampling.py).
The real ``flwr run`` of tests/test_e2e_federation.py checks the same draw on Flower's runtime."""

from __future__ import annotations

import csv
from collections import Counter

import pytest

from fl_attack.federation.participants import sample_participants, sample_size
from tests.inprocess import federate, serve

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
    """The real ServerApp twice with seed 1 and fraction-train=0.5 (2 of 4 clients a round), node ids
    random per run: rounds.csv and attacks.csv are identical but for wall times and node ids, and
    the participants are seed 1's draw, which is not seed 0's (so a run that ignored its seed fails)."""
    rounds, attacks = _study(tmp_path / "a", seed=1)
    again = _study(tmp_path / "b", seed=1)
    assert (rounds, attacks) == again
    drawn = {
        s: [",".join(map(str, sample_participants(range(4), 2, seed=s, server_round=r))) for r in (1, 2, 3)]
        for s in (0, 1)
    }
    assert drawn[0] != drawn[1]
    assert [r["participants"] for r in rounds] == drawn[1]
    assert all(r["clients"] == "2" for r in rounds)
    assert {(a["round"], a["partition_id"]) for a in attacks} == {
        (r["round"], p) for r in rounds for p in r["participants"].split(",")
    }


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


def test_unit_a_node_without_a_partition_id_is_never_drawn_and_said_so():
    """Unit test (a grid that answers in process): NodePartitions asks each node once; a node whose
    answer is an error (no partition-id in its node config) is left out of every draw, with an
    event; with no partition known at all the round falls back to Flower's draw, also said."""
    from types import SimpleNamespace

    from strategies.sampling import NodePartitions

    class Grid:
        def __init__(self, partitions):
            self.partitions, self.asked = partitions, []

        def send_and_receive(self, messages, timeout=None):
            replies = []
            for msg in messages:
                node = msg.metadata.dst_node_id
                self.asked.append(node)
                p = self.partitions[node]
                content = {} if p is None else {"simulation": {"partition-id": p}}
                replies.append(
                    SimpleNamespace(
                        has_error=lambda p=p: p is None,
                        content=content,
                        metadata=SimpleNamespace(src_node_id=node),
                    )
                )
            return replies

    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    events = []
    grid = Grid({11: 0, 12: 1, 13: None, 14: 3})
    nodes = NodePartitions(seed=0, event=events.append)
    nodes.learn(grid, [11, 12, 13, 14])
    nodes.learn(grid, [11, 12, 13, 14])  # asked once
    assert sorted(grid.asked) == [11, 12, 13, 14]
    assert any("[13] gave no partition-id" in e for e in events)
    for r in range(1, 20):
        drawn = nodes.sample([11, 12, 13, 14], 2, r, "train")
        assert 13 not in drawn and len(drawn) == 2
        by_partition = {11: 0, 12: 1, 14: 3}
        assert sorted(by_partition[n] for n in drawn) == sample_participants([0, 1, 3], 2, seed=0, server_round=r)
    alone = NodePartitions(seed=0, event=events.append)
    alone.learn(Grid({21: None, 22: None}), [21, 22])
    assert len(alone.sample([21, 22], 1, 1, "train")) == 1
    assert "round 1: no node gave a partition-id; train participants drawn by Flower" in events
