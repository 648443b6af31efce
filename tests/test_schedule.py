"""Attack scheduling, centralised evaluation, checkpoints and recorded updates, on an in-process
federation of real FEMNIST writers (the real ClientApp and server side, several rounds)."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest
import torch
from flwr.supercore.task_identity import TaskIdentity

from fl_attack.attacker.runtime.workers import Pipeline
from fl_attack.audit.run_folder import RunFolder
from fl_attack.audit.settings import RunSettings
from fl_attack.federation.data import get_spec, load_pool, server_test_set
from fl_attack.federation.models import build_model
from fl_attack.federation.update import load_update, read_update_index
from tests.inprocess import federate, serve

FAST = dict(attack_iterations=1, partitions=(0, 1, 2, 3), server_test_samples=200)


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _attacked(jobs) -> set[tuple[int, int, str]]:
    return {(j.target.round, j.target.partition_id, j.method) for j in jobs}


@pytest.mark.heavy
def test_every_n_rounds_on_a_fixed_panel(tmp_path):
    _, _, _, jobs = federate(tmp_path, num_rounds=4, attack_rounds="every:2", attack_clients="0,2", **FAST)
    assert _attacked(jobs) == {(r, p, "pisme") for r in (2, 4) for p in (0, 2)}
    rounds = _rows(tmp_path / "rounds.csv")
    assert [int(r["attacks_dispatched"]) for r in rounds] == [0, 2, 0, 2]
    assert "round 1: not attacked (attack-rounds=every:2)" in (tmp_path / "events.log").read_text()


@pytest.mark.heavy
def test_listed_rounds_under_a_budget(tmp_path):
    _, _, _, jobs = federate(
        tmp_path,
        num_rounds=3,
        attack_rounds="1,3",
        attack_clients="all",
        attack_budget=3,
        attack_method="pisme,ig",
        **FAST,
    )
    # 4 clients x 2 methods = 8 attacks per round; a budget of 3 keeps one whole client (2 attacks).
    assert _attacked(jobs) == {(r, 0, m) for r in (1, 3) for m in ("pisme", "ig")}
    rounds = _rows(tmp_path / "rounds.csv")
    assert [(int(r["attacks_dispatched"]), int(r["attacks_skipped"])) for r in rounds] == [(2, 6), (0, 0), (2, 6)]


class HeldWorkers:
    """Unit-test workers that keep every job and finish none."""

    def submit(self, job):
        pass

    def poll(self):
        return []


@pytest.mark.heavy
def test_first_rounds_and_a_full_backlog_skips(tmp_path):
    settings, strategy, _, jobs = federate(tmp_path, num_rounds=3, attack_rounds="first:2", **FAST)
    assert {j.target.round for j in jobs} == {1, 2} and len(jobs) == 8
    # With attack-max-backlog, a round is skipped while that many attacks are still in flight.
    strategy.settings = dataclasses.replace(settings, attack_max_backlog=4, attack_rounds="all")
    strategy.pipeline = Pipeline(HeldWorkers())  # workers that finish nothing: the jobs stay in flight
    for job in jobs[:3]:
        strategy.pipeline.submit(job)
    assert strategy.plan(4, [0, 1, 2, 3]) == [0, 1, 2, 3]  # 3 in flight: below the backlog
    strategy.pipeline.submit(jobs[3])
    assert strategy.plan(4, [0, 1, 2, 3]) == []
    assert strategy._round[4]["skipped"] == 4
    assert "4 attack(s) skipped: 4 still in flight (attack-max-backlog=4)" in (tmp_path / "events.log").read_text()


def test_each_round_is_evaluated_centrally_and_checkpointed(tmp_path):
    settings, _, _, _ = federate(tmp_path, num_rounds=2, attack_clients="none", lr=0.05, **FAST)
    rounds = _rows(tmp_path / "rounds.csv")
    assert [r["round"] for r in rounds] == ["1", "2"]
    checkpoint = torch.load(RunFolder(tmp_path).checkpoint_file, weights_only=True)
    assert checkpoint["round"] == 2
    # The recorded accuracy is the checkpointed model's on the server's held-out set.
    test = server_test_set(load_pool("femnist"), 200, seed=0)
    net = build_model("femnist")  # computed here in one batch, not with the server's batched evaluation
    net.load_state_dict(checkpoint["arrays"])
    with torch.no_grad():
        logits = net.eval()(get_spec("femnist").normalize(test.images))
    loss = float(torch.nn.functional.cross_entropy(logits, test.labels))
    accuracy = float((logits.argmax(1) == test.labels).float().mean())
    assert float(rounds[-1]["global_accuracy"]) == pytest.approx(accuracy)
    assert float(rounds[-1]["global_loss"]) == pytest.approx(loss)
    assert all(0 <= float(r["global_accuracy"]) <= 1 for r in rounds)
    assert "initial global model: test accuracy" in (tmp_path / "events.log").read_text()


def test_the_server_test_set_is_disjoint_from_every_clients_training_data():
    from fl_attack.federation.data import client_partition, num_partitions

    for dataset, k in (("femnist", 10), ("cifar100", 16)):
        pool = load_pool(dataset)
        test = server_test_set(pool, 300, seed=0)
        held = {bytes(x.numpy()) for x in (test.images * 255).round().to(torch.uint8)}
        for p in range(min(20, num_partitions(pool, k, held_out=300))):
            train = client_partition(pool, p, k, seed=0, held_out=300).train
            assert not held & {bytes(x.numpy()) for x in (train.images * 255).round().to(torch.uint8)}, (dataset, p)
        restricted = (
            client_partition(pool, 0, k, classes=5, seed=0, held_out=300).train if dataset == "cifar100" else None
        )
        if restricted is not None:
            assert not held & {bytes(x.numpy()) for x in (restricted.images * 255).round().to(torch.uint8)}


@pytest.mark.heavy
def test_every_attacked_update_is_recorded_with_a_checksum(tmp_path):
    _, _, _, jobs = federate(tmp_path, num_rounds=2, attack_clients="1,3", **FAST)
    index = read_update_index(tmp_path / "updates")
    assert sorted((int(r["round"]), r["partition_ids"]) for r in index) == [(1, "1"), (1, "3"), (2, "1"), (2, "3")]
    by_target = {(j.target.round, j.target.partition_id): j for j in jobs}
    for row in index:
        update, target = load_update(tmp_path / "updates", row)
        job = by_target[(target.round, target.partition_id)]
        assert target == job.target and update.metadata == job.update.metadata
        assert all(
            torch.equal(update.wT[k], job.update.wT[k]) and torch.equal(update.w0[k], job.update.w0[k])
            for k in update.w0
        )
    # A record that was altered is refused.
    path = tmp_path / "updates" / index[0]["file"]
    data = bytearray(path.read_bytes())
    data[-10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match its checksum"):
        load_update(tmp_path / "updates", index[0])


def _refuse_writes(monkeypatch, *names: str) -> None:
    """os.write patched to fail with ENOSPC on every file whose path holds one of ``names`` (past the
    writer's retries, which are not waited for)."""
    import errno
    import os

    from fl_attack import records

    monkeypatch.setattr(records, "RETRY_DELAYS", (0.0,))
    real_write = os.write

    def write(fd, data):
        if any(name in os.readlink(f"/proc/self/fd/{fd}") for name in names):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def _errors(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("fl-attack: error:")]


@pytest.mark.heavy
def test_checkpoints_and_updates_the_disk_refuses_are_counted_not_hidden(tmp_path, monkeypatch, capsys):
    """Through the ServerApp's main, a refused write (ENOSPC from a patched os.write, past the
    writer's retries) of every checkpoint and recorded update: the federation goes on, and
    summary.json's writes_refused and the ServerApp's last line name what is missing, instead of
    '2/2 attacks succeeded' alone."""
    from fl_attack.audit.service import incomplete

    _refuse_writes(monkeypatch, ".checkpoint.pt.", "/updates/")
    run = serve(tmp_path, num_rounds=2, **FAST)
    monkeypatch.undo()
    summary = json.loads((run / "summary.json").read_text())
    refused = summary["writes_refused"]
    assert refused["checkpoints"] == [1, 2] and set(refused["updates"]) == {1, 2} and "rounds" not in refused
    assert summary["attacks_ok"] == summary["attacks"] > 0  # the attacks themselves were not lost
    assert not RunFolder(run).checkpoint_file.exists()
    (line,) = _errors(capsys.readouterr().out)
    assert line == f"fl-attack: error: the disk refused part of the record: {incomplete(summary)}"
    assert "checkpoints of round(s) 1,2" in line and "recorded updates of round(s) 1,2" in line
    assert "could not write the checkpoint" in (run / "events.log").read_text()


def test_a_summary_the_disk_refuses_is_one_line_and_never_raised(tmp_path, monkeypatch, capsys):
    """The ServerApp writes summary.json last, on its shutdown path: when the disk refuses it (ENOSPC
    from a patched os.write), main prints one error line naming the file and ends normally."""
    _refuse_writes(monkeypatch, ".summary.json.")
    run = serve(tmp_path, num_rounds=1, attack_rounds="none", server_test_samples=0)  # must not raise
    monkeypatch.undo()
    out = capsys.readouterr().out
    (line,) = _errors(out)
    assert line.startswith(f"fl-attack: error: could not write {run / 'summary.json'}: [Errno 28] "), line
    assert "No space left on device" in line and "Traceback" not in out
    assert f"fl-attack: 0/0 attacks succeeded; results in {run}" in out  # main went on to its end
    assert not (run / "summary.json").exists() and [r["round"] for r in _rows(run / "rounds.csv")] == ["1"]


@pytest.mark.heavy
def test_record_updates_false_records_none_and_still_attacks(tmp_path):
    settings, strategy, _, jobs = federate(tmp_path, num_rounds=1, record_updates=False, **FAST)
    assert not settings.record_updates and jobs and strategy.rows
    assert not RunFolder(tmp_path).updates.exists()


@pytest.mark.heavy
def test_a_fraction_of_clients_is_attacked_seeded_by_round(tmp_path):
    """attack-clients="fraction:0.5" in the real in-process federation: half of the 4 clients each
    round, the ones RunSettings.select_clients draws for that round and seed (rounds may differ)."""
    settings, _, _, jobs = federate(tmp_path, num_rounds=2, attack_clients="fraction:0.5", **FAST)
    for rnd in (1, 2):
        attacked = sorted({j.target.partition_id for j in jobs if j.target.round == rnd})
        assert attacked == settings.select_clients([0, 1, 2, 3], rnd) and len(attacked) == 2


def test_a_panel_plus_a_fraction_attacks_the_panel_and_the_fractions_draw():
    """Unit test: attack-clients="0,3+fraction:0.2" attacks the tracked panel whenever it takes part,
    and beside it the round's "fraction:0.2" draw; the panel is what attack_client_ids tracks."""
    both = RunSettings(attack_clients="0,3+fraction:0.2", seed=5)
    alone = RunSettings(attack_clients="fraction:0.2", seed=5)
    assert both.attack_client_ids() == [0, 3] and alone.attack_client_ids() is None
    for rnd in range(1, 30):
        present = [p for p in range(10) if (p + rnd) % 3]  # who took part this round
        drawn = alone.select_clients(present, rnd)
        assert both.select_clients(present, rnd) == sorted(set(drawn) | ({0, 3} & set(present)))


@pytest.mark.heavy
def test_an_attack_memory_the_disk_refuses_is_counted_and_kept_in_the_process(tmp_path, monkeypatch):
    """A refused write (ENOSPC from a patched os.write) of every memory.pt: the federation and its memory
    go on (round 2's +memory row still holds round 1's estimate or a better one), and summary.json's
    counts name it."""
    import errno
    import os

    from fl_attack.audit.service import incomplete

    real_write = os.write

    def write(fd, data):
        if ".memory.pt." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    fast = {**FAST, "attack_clients": "0"}
    _, strategy, _, _ = federate(tmp_path, num_rounds=2, attack_memory="keep", **fast)
    counts = strategy.finish(60)
    assert counts["writes_refused"]["memory"] and not (tmp_path / "memory.pt").exists()
    assert "the attack memory (memory.pt) of round(s)" in incomplete(counts)
    remembered = [r for r in strategy.rows if r["method"].endswith("+memory")]
    assert [r["round"] for r in remembered] == [1, 2] and all(r["status"] == "ok" for r in remembered)
    assert remembered[1]["lsim_honest"] <= remembered[0]["lsim_honest"]
    assert "could not write the attack memory" in (tmp_path / "events.log").read_text()
