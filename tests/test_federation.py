"""The honest-but-curious strategy with constructed Flower Messages, outside the Flower runtime."""

from __future__ import annotations

import csv
import math
import os

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity

from fl_attack.attacker.runtime.workers import AttackJob, InlineWorkers, RayWorkers
from fl_attack.audit.service import AuditService
from fl_attack.audit.settings import RunSettings, usable_cpus
from fl_attack.evaluation.victims import ground_truth
from fl_attack.federation.config import ClientOptimizer
from fl_attack.federation.data import client_partition, load_pool
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local
from fl_attack.federation.update import AttackTarget
from strategies.audit import AuditedStrategy, observed_update
from strategies.strategy import SeededFedAvg
from tests.mounts import tmpfs

SETTINGS = dict(
    dataset="femnist",
    samples_per_client=10,
    batch_size=5,
    local_epochs=1,
    attack_iterations=2,
    attack_nodes=2,
    attack_clients="all",
    seed=0,
)


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield


def _round(settings: RunSettings, partitions=(0, 1), poison=None, timed=None):
    """Global arrays w0 and one real client reply per partition (the ClientApp's training code).

    ``timed``: {partition: (train-seconds, train-started)} the reply reports, as the ClientApp does."""
    w0_model = build_model(settings.dataset, seed=settings.seed)
    w0 = ArrayRecord(w0_model.state_dict())
    pool = load_pool(settings.dataset)
    replies, truth = [], {}
    for i, p in enumerate(partitions):
        split = client_partition(pool, p, settings.samples)
        model = build_model(settings.dataset)
        model.load_state_dict(w0.to_torch_state_dict())
        res = train_local(
            model,
            split.train.images,
            split.train.labels,
            dataset=settings.dataset,
            lr=settings.lr,
            batch_size=settings.batch_size,
            local_epochs=settings.local_epochs,
            seed=p,
        )
        state = model.state_dict()
        if poison == p:
            state["fc2.bias"][0] = float("nan")
        instruction = Message(
            content=RecordDict({"arrays": w0, "config": ConfigRecord({"server-round": 1})}),
            message_type="train",
            dst_node_id=100 + p + 1000 * list(partitions[:i]).count(p),  # a repeated partition: another node
        )
        meta = res.update.metadata
        metrics = {
            "num-examples": meta.num_samples,
            "local-steps": meta.local_steps,
            "lr": meta.lr,
            "batch-size": meta.batch_size,
            "local-epochs": meta.local_epochs,
            "train-loss": res.train_loss,
        }
        simulation = {"partition-id": p, "client-id": split.train.client_id}
        if timed:
            metrics["train-seconds"], simulation["train-started"] = timed[p]
        content = RecordDict(
            {"arrays": ArrayRecord(state), "metrics": MetricRecord(metrics), "simulation": ConfigRecord(simulation)}
        )
        replies.append(Message(content=content, reply_to=instruction))
        truth[p] = split.train
    return w0, replies, truth


class RecordingWorkers(InlineWorkers):
    """In-process workers (fl_attack.attacker.runtime.workers), keeping every job they were given."""

    def __init__(self):
        super().__init__(device="cpu")
        self.jobs: list[AttackJob] = []

    def submit(self, job):
        self.jobs.append(job)
        super().submit(job)


def _strategy(tmp_path, **overrides):
    settings = RunSettings(**{**SETTINGS, **overrides})
    dispatcher = RecordingWorkers()
    return settings, audited(settings, tmp_path, dispatcher), dispatcher


def audited(settings, tmp_path, dispatcher, clients_per_round=None):
    """The project's FedAvg audited as server_app.build_strategy audits it, attacking in process."""
    service = AuditService(
        settings,
        tmp_path,
        workers=dispatcher,
        clients_per_round=clients_per_round,
        truth=lambda partition_ids: ground_truth(settings.data, partition_ids),
    )
    fedavg = SeededFedAvg(settings.seed, service.folder.event, min_train_nodes=1, min_available_nodes=1)
    return AuditedStrategy(fedavg, service, finish_on_return=False, check=settings.check_prescribed)


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_observed_update_is_w0_and_the_returned_arrays(tmp_path):
    settings, strategy, dispatcher = _strategy(tmp_path)
    w0, replies, _ = _round(settings)
    strategy.global_arrays = {1: w0}
    strategy.aggregate_train(1, replies)
    assert len(dispatcher.jobs) == 2
    for job, reply in zip(sorted(dispatcher.jobs, key=lambda j: j.target.partition_id), replies):
        sent_w0, sent_wT = job.update.w0, job.update.wT
        for key, value in w0.to_torch_state_dict().items():
            assert torch.equal(sent_w0[key], value)
        for key, value in reply.content["arrays"].to_torch_state_dict().items():
            assert torch.equal(sent_wT[key], value)
        assert job.update.metadata.local_steps == 2 and job.update.metadata.num_samples == 10


def test_the_attacker_gets_no_private_data(tmp_path):
    settings, strategy, dispatcher = _strategy(tmp_path)
    w0, replies, truth = _round(settings)
    strategy.global_arrays = {1: w0}
    strategy.aggregate_train(1, replies)
    for job in dispatcher.jobs:
        assert set(vars(job.update)) == {"w0", "wT", "metadata", "client"}
        assert set(job.update.client) <= {"round", "node_id"}  # no partition id, no client id
        assert job.labels == "recovered"
        private = truth[job.target.partition_id].images
        tensors = [*job.update.w0.values(), *job.update.wT.values()]
        assert not any(t.shape == private.shape for t in tensors)


def test_aggregation_is_plain_fedavg(tmp_path):
    settings, strategy, _ = _strategy(tmp_path)
    w0, replies, _ = _round(settings)
    strategy.global_arrays = {1: w0}
    ours, our_metrics = strategy.aggregate_train(1, replies)
    theirs, their_metrics = FedAvg(min_train_nodes=1, min_available_nodes=1).aggregate_train(1, replies)
    for key, value in theirs.to_torch_state_dict().items():
        assert torch.equal(ours.to_torch_state_dict()[key], value)
    assert dict(our_metrics) == dict(their_metrics)


def test_each_attack_is_scored_and_recorded(tmp_path):
    settings, strategy, _ = _strategy(tmp_path, attack_method="pisme,ig")
    w0, replies, _ = _round(settings)
    strategy.global_arrays = {1: w0}
    strategy.aggregate_train(1, replies)
    strategy.service.drain(60)
    rows = _rows(tmp_path / "attacks.csv")
    assert sorted((r["partition_id"], r["method"]) for r in rows) == [
        ("0", "ig"),
        ("0", "pisme"),
        ("1", "ig"),
        ("1", "pisme"),
    ]
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert math.isfinite(float(r["psnr"])) and -1 <= float(r["ssim"]) <= 1
        assert 0 <= float(r["label_accuracy"]) <= 1 and r["labels"] == "recovered"
        assert (tmp_path / r["image"]).is_file()
        # the problem's size: the paper's FEMNIST CNN against k 28x28 grey images; plain SGD
        assert int(r["parameters"]) == sum(p.numel() for p in build_model("femnist").parameters())
        assert int(r["unknowns"]) == settings.samples_per_client * 28 * 28 and r["optimizer"] == "sgd"


def test_the_prior_based_baselines_run_in_a_federation(tmp_path):
    """GI-NAS (its own generator, not batchable) and DGGI (the server's diffusion prior) as a run
    config's attack-method: scored and recorded like the others, labels recovered."""
    settings, strategy, _ = _strategy(
        tmp_path, attack_method="ginas,dggi", attack_options="generator_candidates=2,prior_every=1"
    )
    w0, replies, _ = _round(settings, partitions=(0,))
    strategy.global_arrays = {1: w0}
    strategy.aggregate_train(1, replies)
    strategy.service.drain(60)
    rows = _rows(tmp_path / "attacks.csv")
    assert sorted(r["method"] for r in rows) == ["dggi", "ginas"]
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert math.isfinite(float(r["psnr"])) and r["labels"] == "recovered" and r["gradients_per_iteration"] == "1"
        assert (tmp_path / r["image"]).is_file()


def test_selection_by_partition_ids(tmp_path):
    settings, strategy, dispatcher = _strategy(tmp_path, attack_clients="1")
    w0, replies, _ = _round(settings)
    strategy.global_arrays = {1: w0}
    strategy.aggregate_train(1, replies)
    assert [j.target.partition_id for j in dispatcher.jobs] == [1]


def test_a_partition_id_sent_by_two_nodes_is_aggregated_but_not_attacked(tmp_path):
    """A deployment whose SuperNodes share a partition-id: whose data an attack saw is unknowable."""
    settings, strategy, dispatcher = _strategy(tmp_path)
    w0, replies, _ = _round(settings, partitions=(0, 0, 1))
    strategy.global_arrays = {1: w0}
    strategy.aggregate_train(1, replies)
    assert [j.target.partition_id for j in dispatcher.jobs] == [1]
    assert (
        "partition-id(s) [0] came from more than one node (node ids {0: [100, 1100]})"
        in (tmp_path / "events.log").read_text()
    )


def test_nan_update_is_recorded_as_failed_and_the_round_goes_on(tmp_path):
    settings, strategy, dispatcher = _strategy(tmp_path)
    w0, replies, _ = _round(settings, poison=0)
    strategy.global_arrays = {1: w0}
    arrays, _ = strategy.aggregate_train(1, replies)
    # The poisoned update is left out of the aggregate: FedAvg of the one valid reply is that reply.
    aggregate, valid = arrays.to_torch_state_dict(), replies[1].content["arrays"].to_torch_state_dict()
    assert all(torch.isfinite(v).all() and torch.allclose(v, valid[k]) for k, v in aggregate.items())
    strategy.evaluate_fn()(1, arrays)
    strategy.service.drain(60)
    rows = {r["partition_id"]: r for r in _rows(tmp_path / "attacks.csv")}
    assert rows["0"]["status"] == "failed" and "NaN" in rows["0"]["error"]
    assert rows["1"]["status"] == "ok"
    (round_row,) = _rows(tmp_path / "rounds.csv")
    assert round_row["excluded"] == "0" and round_row["clients"] == "1"
    assert (
        "excluded 1 non-finite update(s) from the aggregate (partitions [0])" in (tmp_path / "events.log").read_text()
    )
    # A round with no valid update keeps the previous global model (Flower keeps it on None).
    _, replies, _ = _round(settings, partitions=(0,), poison=0)
    assert strategy.aggregate_train(2, replies) == (None, None)


def test_a_reply_trained_otherwise_than_prescribed_is_not_attacked_as_if_it_were(tmp_path):
    """A client whose reply says it trained with another optimizer (or lr) than the run config
    prescribes: its update is still aggregated, its attack recorded as failed naming the difference."""
    settings, strategy, _ = _strategy(tmp_path)
    w0, replies, _ = _round(settings)
    for reply, optimizer in zip(replies, (ClientOptimizer("momentum", 0.9), ClientOptimizer())):
        reply.content["metrics"].update(optimizer.to_metrics())  # Flower wants the same keys in every reply
    replies[1].content["metrics"]["lr"] = settings.lr * 2
    strategy.global_arrays = {1: w0}
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    strategy.service.drain(60)
    rows = {r["partition_id"]: r for r in _rows(tmp_path / "attacks.csv")}
    assert rows["0"]["status"] == "failed"
    assert "reply says client-optimizer momentum 0.9, the run config prescribes sgd" in rows["0"]["error"]
    assert rows["1"]["status"] == "failed" and f"prescribes {settings.lr}" in rows["1"]["error"]


def test_raising_and_timed_out_attacks_are_recorded_as_failed(tmp_path, monkeypatch):
    settings, strategy, _ = _strategy(tmp_path, attack_timeout=1e-9)
    w0, replies, _ = _round(settings)
    strategy.global_arrays = {1: w0}
    strategy.aggregate_train(1, replies)
    strategy.service.drain(60)
    rows = _rows(tmp_path / "attacks.csv")
    assert {r["status"] for r in rows} == {"failed"}
    assert all("TimeoutError" in r["error"] for r in rows)

    import fl_attack.attacker.runtime.run as attacker  # where run_job calls reconstruct

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(attacker, "reconstruct", broken)
    settings, strategy, _ = _strategy(tmp_path / "b")
    strategy.global_arrays = {1: w0}
    strategy.aggregate_train(1, replies)
    strategy.service.drain(60)
    assert all(r["status"] == "failed" and "boom" in r["error"] for r in _rows(tmp_path / "b" / "attacks.csv"))


def test_run_config_errors_name_the_key():
    with pytest.raises(ValueError, match="invalid run config: attack-method: unknown attack method 'foo'"):
        RunSettings.from_run_config({"attack-method": "pisme,foo"})
    with pytest.raises(ValueError, match="attack-nodes"):
        RunSettings.from_run_config({"attack-nodes": -1})  # 0: the audit's rule
    with pytest.raises(ValueError, match="batch-size"):
        RunSettings.from_run_config({"batch-size": 64, "samples-per-client": 16})
    with pytest.raises(ValueError, match="unknown dataset"):
        RunSettings.from_run_config({"dataset": "mnist"})
    with pytest.raises(ValueError, match="attack-options: unknown attack setting 'foo'"):
        RunSettings.from_run_config({"attack-options": "foo=1"})
    with pytest.raises(ValueError, match="attack-clients"):
        RunSettings.from_run_config({"attack-clients": "fraction:2"})


def test_fraction_selection_is_seeded_per_round():
    s = RunSettings(attack_clients="fraction:0.5", seed=3)
    first = s.select_clients(list(range(8)), 1)
    assert len(first) == 4 and first == s.select_clients(list(range(8)), 1)
    assert any(s.select_clients(list(range(8)), r) != first for r in range(2, 6))


@pytest.mark.runtime
# 33 s on 2 busy cores: slow for the suite's 15-minute budget. CI keeps the property on the real federation:
# test_e2e_federation.py counts round 1's attacks in flight while round 2 trains on Flower's Ray client pool.
@pytest.mark.slow
def test_ray_dispatch_does_not_block(tmp_path):
    """submit() returns at once while the attack runs on a num_cpus=0 actor."""
    ray = pytest.importorskip("ray")

    settings = RunSettings(**SETTINGS)
    w0, replies, _ = _round(settings, partitions=(0,))
    update = observed_update(w0, replies[0], "femnist", {"round": 1})

    class CpuHolder:  # defined here so that Ray pickles it by value
        def ping(self):
            return True

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        holder = ray.remote(num_cpus=1)(CpuHolder).remote()  # holds every CPU, as Flower's client pool does
        ray.get(holder.ping.remote())
        dispatcher = RayWorkers(num_actors=1, threads=1, device="cpu")
        config = settings.attack_config()
        config.iterations = 5  # the submit, not the attack, is under test
        dispatcher.submit(AttackJob(1, update, "pisme", config, AttackTarget(1, (0,))))  # returns: no CPU is free
        assert dispatcher.in_flight == 1
        outcomes = dispatcher.drain(timeout=240)
        assert [o.status for o in outcomes] == ["ok"] and outcomes[0].images.shape == (10, 1, 28, 28)
        dispatcher.shutdown()
    finally:
        ray.shutdown()


# -- timings and the attacker's thread count --------------------------------------------------------


def test_attack_threads_default_to_the_cores_the_training_clients_leave_idle():
    rule = lambda cpus, per_client, clients, **kw: RunSettings(client_num_cpus=per_client, **kw).attack_thread_count(  # noqa: E731
        clients_per_round=clients, cpus=cpus
    )
    assert rule(8, 1, 4) == 4  # 4 clients on 1 core each leave 4
    assert rule(8, 2, 2) == 4  # 2 clients on 2 cores each
    assert rule(8, 2, 10) == 1  # Ray runs 8 // 2 = 4 clients at once: no core left, still 1 thread
    assert rule(2, 1, 4) == 1  # the demo on 2 cores
    assert rule(16, 3, 10) == 1  # 5 clients at once on 15 cores
    assert rule(16, 3, 3) == 7
    assert rule(4, 8, 2) == 4  # clients asking more than the machine: Ray runs none at once
    assert rule(8, 2, 2, attack_threads=3) == 3  # an explicit attack-threads wins
    assert RunSettings(client_num_cpus=1).attack_thread_count(cpus=8) == 1  # clients per round unknown: Ray's cap
    assert RunSettings().attack_drain_thread_count(cpus=8) == 8
    assert RunSettings(attack_threads=3).attack_drain_thread_count(cpus=8) == 3
    # without an explicit count, the cores this process may use (taskset and containers narrow them)
    assert RunSettings().attack_drain_thread_count() == usable_cpus()
    if hasattr(os, "sched_getaffinity"):
        assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))
    assert RunSettings.from_run_config({"client-num-cpus": 1}).client_num_cpus == 1
    with pytest.raises(ValueError, match="client-num-cpus"):
        RunSettings.from_run_config({"client-num-cpus": 0})
    with pytest.raises(ValueError, match="attack-threads"):
        RunSettings.from_run_config({"attack-threads": -1})


@pytest.mark.heavy
def test_the_last_rounds_attacks_get_every_core_and_the_choice_is_logged(tmp_path):
    settings = RunSettings(**{**SETTINGS, "num_server_rounds": 2, "client_num_cpus": 1})
    dispatcher = RecordingWorkers()
    strategy = audited(settings, tmp_path, dispatcher, clients_per_round=2)
    idle = settings.attack_thread_count(clients_per_round=2)
    service = strategy.service
    assert (service.attack_threads, service.drain_threads) == (idle, settings.attack_drain_thread_count())
    w0, replies, _ = _round(settings)
    for server_round in (1, 2):
        strategy.global_arrays = {server_round: w0}
        strategy.aggregate_train(server_round, replies)
    threads = {j.target.round: j.threads for j in dispatcher.jobs}
    assert threads == {1: idle, 2: settings.attack_drain_thread_count()}
    events = (tmp_path / "events.log").read_text()
    assert f"attacker: {idle} torch thread(s) per attack while clients train" in events
    assert "clients per round=2" in events


def test_the_attacker_actor_sets_each_jobs_thread_count(monkeypatch):
    import fl_attack.attacker.runtime.actor as attacker  # where the actor calls run_job

    seen = []
    monkeypatch.setattr(attacker, "run_job", lambda job, device: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    try:
        actor = attacker.AttackWorker(threads=1, device="cpu")
        actor.run(AttackJob(1, None, "pisme", None, None))
        actor.run(AttackJob(2, None, "pisme", None, None, threads=2))
        assert seen == [1, 2]
    finally:
        torch.set_num_threads(before)


def test_the_strategy_accumulates_the_rounds_timings(tmp_path):
    settings, strategy, _ = _strategy(tmp_path, attack_method="pisme")
    w0, replies, _ = _round(settings, timed={0: (1.5, 1000.0), 1: (2.5, 999.0)})
    strategy.global_arrays = {1: w0}
    strategy.service.round_times[1] = {"configured": 990.0}
    strategy.aggregate_train(1, replies)
    strategy.aggregate_evaluate(1, [])
    strategy.evaluate_fn()(1, w0)
    strategy.service.drain(60)
    record = strategy.service.timing_record()
    seconds, counts = record["seconds"], record["counts"]
    assert seconds["client_train"] == pytest.approx(4.0) and counts["client_train"] == 2
    assert counts["attack"] == 2 and seconds["attack"] > 0  # the attacks' own seconds (AttackOutcome.attack_seconds)
    # writing: 2 recorded updates, 2 attacks.csv rows, rounds.csv with the checkpoint
    assert counts["scoring"] == 2 and counts["images"] == 2 and counts["writing"] == 5
    assert counts["strategy"] == 2 and counts["drain_wait"] == 1
    assert all(v >= 0 for v in seconds.values())
    times = record["rounds"]["1"]
    assert times["fit_started"] == 999.0 and times["configured"] == 990.0  # the earliest client's start
    assert times["fit_started"] < times["trained"] <= times["aggregated"] <= times["evaluating"]
    assert record["attacker_threads"] == {
        "while_training": strategy.service.attack_threads,
        "last_round": strategy.service.drain_threads,
    }


def test_replies_without_timings_still_aggregate(tmp_path):
    settings, strategy, _ = _strategy(tmp_path)
    w0, replies, _ = _round(settings)
    strategy.global_arrays = {1: w0}
    strategy.aggregate_train(1, replies)
    record = strategy.service.timing_record()
    assert "client_train" not in record["seconds"] and "fit_started" not in record["rounds"]["1"]


def test_the_breakdown_splits_the_wall_time_and_keeps_busy_sums_apart():
    from fl_attack.audit.timings import Timings, breakdown, table

    t = Timings()
    t.add("client_train", 6.0)
    t.add("client_train", 4.0)
    t.add("attack", 30.0)
    t.add("attack", float("nan"))  # an attack that never finished adds nothing
    for phase, value in [("strategy", 0.5), ("scoring", 2.0), ("images", 0.4), ("writing", 0.1), ("drain_wait", 12.0)]:
        t.add(phase, value)
    record = {
        **t.as_dict(),
        "main_started": 110.0,
        "rounds_finished": 150.0,
        "main_finished": 166.0,
        "rounds": {
            "1": {
                "configured": 112.0,
                "fit_started": 120.0,
                "trained": 130.0,
                "aggregated": 131.0,
                "evaluating": 133.0,
            },
            "2": {
                "configured": 134.0,
                "fit_started": 134.5,
                "trained": 140.0,
                "aggregated": 141.0,
                "evaluating": 142.0,
            },
        },
        "launcher": {"launched": 100.0, "flwr_exited": 170.0},
    }
    rows = {label.split(":")[0].split(",")[0]: (value, note) for label, value, note in breakdown(record)}
    assert rows["flwr run"][0] == 70.0
    assert rows["start-up"][0] == 20.0 and "Flower + SuperLink 10.0" in rows["start-up"][1]
    assert (
        "ServerApp set-up 2.0" in rows["start-up"][1]
        and "client start-up (Ray actors or ClientApp processes) 8.0" in rows["start-up"][1]
    )
    assert rows["client training"][0] == pytest.approx(10 + 5.5)
    assert "busy 10.0 s summed over 2 fits" in rows["client training"][1]
    assert rows["federated evaluation"][0] == pytest.approx(2 + 1)
    assert rows["attacks"][0] == 12.0 and "busy 30.0 s summed over 1 attacks" in rows["attacks"][1]
    assert rows["evaluation"][0] == 2.0 and rows["writing results"][0] == pytest.approx(0.5)
    spans = [v for k, (v, _) in rows.items() if k != "flwr run"]
    assert sum(spans) == pytest.approx(70.0)  # the spans and "other" add up to the wall time
    assert rows["other"][0] == pytest.approx(70 - 20 - 15.5 - 0.5 - 3 - 12 - 2 - 0.5)
    assert "where the time went" in table(record)
    # Without the launcher (plain flwr run): the ServerApp's own clock.
    del record["launcher"]
    rows = {label.split(":")[0]: value for label, value, _ in breakdown(record)}
    assert rows["flwr run"] == 56.0 and rows["start-up"] == 10.0


@pytest.mark.runtime
def test_the_launcher_passes_the_run_config_through_with_the_client_cpus(tmp_path):
    import tomllib

    from strategies.launch import _run_config

    def parsed(overrides, federation="num-supernodes=4 client-resources-num-cpus=3"):
        path, _ = _run_config(overrides, federation, tmp_path)
        return tomllib.loads(path.read_text())

    assert parsed(['run-name="x"']) == {"run-name": "x", "client-num-cpus": 3}
    assert parsed(["client-num-cpus=1"])["client-num-cpus"] == 1  # the user's value wins
    assert "client-num-cpus" not in parsed([], "num-supernodes=4")  # Flower's default (2) is ours too
    # Several strings and a TOML file are read with Flower's own parser (dotted TOML tables flatten
    # to "a.b" keys, which the run config then has to know).
    assert parsed(["seed=3 lr=0.05", 'attack-options="tv_weight=0.02"']) == {
        "seed": 3,
        "lr": 0.05,
        "attack-options": "tv_weight=0.02",
        "client-num-cpus": 3,
    }
    (tmp_path / "mine.toml").write_text('dataset = "cifar100"\nseed = 4\n')
    assert parsed([str(tmp_path / "mine.toml")]) == {"dataset": "cifar100", "seed": 4, "client-num-cpus": 3}
    (tmp_path / "dotted.toml").write_text('[defense]\nkind = "x"\n')
    with pytest.raises(ValueError, match="unknown run-config key 'defense.kind'"):
        parsed([str(tmp_path / "dotted.toml")])


@pytest.mark.runtime
def test_the_launcher_refuses_a_bad_run_config_in_a_second(tmp_path, capsys):
    """What Flower would drop silently or reject without naming the key, and what the ServerApp
    would only reject after the SuperLink and Ray started: exit 2, one line, nothing launched."""
    from strategies.launch import main

    cases = {
        "num-server-rounds=": "expected key=value pairs, got 'num-server-rounds='",
        'attack-round="all"': "unknown run-config key 'attack-round'",
        'attack-rounds="every:0"': "attack-rounds must be",
        'attack-clients="7"': "attack-clients lists partition id 7, but the federation has 3 node(s)",
        'num-server-rounds=1 num-server-rounds="abc"': "run-config key 'num-server-rounds' is given more than once",
        "lr=0.1 seed=1 lr=0.2": "run-config key 'lr' is given more than once; give it once",
        "num-server-rounds=2.5": "num-server-rounds' must be an integer",
    }
    for text, message in cases.items():
        code = main(["--run-config", text, "--federation-config", "num-supernodes=3 client-resources-num-cpus=1"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and err.startswith("fl-attack: error: --run-config:"), err
        assert message in err, (text, err)


def test_a_refused_row_is_kept_and_written_once_the_disk_recovers(tmp_path, monkeypatch):
    """A failing write (ENOSPC from a patched os.write on attacks.csv, past the writer's retries): the
    round goes on, the finished reconstruction is kept, and its row lands at the next collect."""
    import errno

    settings, strategy, _ = _strategy(tmp_path, attack_clients="0")
    w0, replies, _ = _round(settings)
    strategy.global_arrays = {1: w0}
    real_write, full = os.write, {"on": True}

    def write(fd, data):
        if full["on"] and os.readlink(f"/proc/self/fd/{fd}").endswith("attacks.csv"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    arrays, _ = strategy.aggregate_train(1, replies)  # the attack runs (in process) and its row is refused
    unwritten = strategy.service.unwritten
    assert arrays is not None and len(unwritten) == 1 and unwritten[0].images is not None
    assert not strategy.service.rows
    assert "kept in memory, tried again later" in (tmp_path / "events.log").read_text()
    full["on"] = False
    strategy.service.drain(60)
    (row,) = _rows(tmp_path / "attacks.csv")
    assert row["status"] == "ok" and row["round"] == "1" and row["partition_id"] == "0"
    assert not strategy.service.unwritten


def test_results_the_disk_never_takes_are_saved_apart_at_shutdown(tmp_path, monkeypatch):
    settings, strategy, _ = _strategy(tmp_path, attack_clients="0")
    w0, replies, _ = _round(settings)
    strategy.global_arrays = {1: w0}
    real_write = os.write

    def write(fd, data):  # a disk that never takes attacks.csv again: ENOSPC past every retry
        if os.readlink(f"/proc/self/fd/{fd}").endswith("attacks.csv"):
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    strategy.aggregate_train(1, replies)
    strategy.service.drain(5)
    strategy.service.keep_unwritten()  # does not raise
    (saved,) = tmp_path.glob("unwritten-*.pt")
    (kept,) = torch.load(saved, weights_only=False)
    assert kept["target"].partition_id == 0 and kept["images"].shape[0] == settings.samples_per_client


@pytest.fixture
def full_disk(tmp_path):
    """A real filesystem to fill: a 64 MiB tmpfs mounted in tmp_path, and ``fill()``, which writes
    a file until the kernel answers ENOSPC. Skips where this machine refuses the mount."""
    import errno

    def fill():
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)

    with tmpfs(tmp_path / "disk", "size=64m") as mount:
        yield mount, fill


@pytest.mark.heavy
def test_a_disk_full_before_shutdown_is_reported_and_never_raised(full_disk, caplog):
    """A real full filesystem (the kernel's ENOSPC, not a patched call) under the run folder from
    round 1's update on: the attack still runs, its row and the update are refused and counted, and
    the shutdown path (drain, unwritten-*.pt, the workers' stop) logs what it lost and never raises."""
    import errno
    import logging

    mount, fill = full_disk
    settings, strategy, _ = _strategy(mount, attack_clients="0")
    w0, replies, _ = _round(settings)
    strategy.global_arrays = {1: w0}
    fill()
    arrays, _ = strategy.aggregate_train(1, replies)  # the round goes on
    unwritten = strategy.service.unwritten
    assert arrays is not None and len(unwritten) == 1 and unwritten[0].images is not None
    with caplog.at_level(logging.ERROR):
        counts = strategy.service.finish(timeout=5)  # must not raise
    assert counts["attacks"] == 0 and counts["attacks_unwritten"] == 1
    assert counts["writes_refused"]["updates"] == [1]
    assert "1 attack result(s) could not be written at all" in caplog.text
    assert not list(mount.glob("unwritten-*.pt"))
    assert not (mount / "attacks.csv").exists() or not _rows(mount / "attacks.csv")  # no row, not half of one
    with pytest.raises(OSError) as refused:  # what the ServerApp catches and prints in one line
        strategy.service.folder.write_summary({"attacks": 0, **counts})
    assert refused.value.errno == errno.ENOSPC and not strategy.service.folder.summary_file.exists()


def test_the_aggregate_does_not_depend_on_the_order_replies_arrive_in(tmp_path):
    """Floating-point sums depend on their order; replies are aggregated in partition order, so all
    24 arrival orders of 4 replies give one bit-identical global model."""
    import itertools

    settings, strategy, _ = _strategy(tmp_path, attack_clients="none")
    w0, replies, _ = _round(settings, partitions=(0, 1, 2, 3))
    strategy.global_arrays = {1: w0}
    aggregates = set()
    for order in itertools.permutations(replies):
        arrays, _ = strategy.aggregate_train(1, list(order))
        aggregates.add(b"".join(v.numpy().tobytes() for v in arrays.to_torch_state_dict().values()))
    assert len(aggregates) == 1
    # Plain FedAvg on the same replies does depend on the order (what the sorting fixes).
    plain = FedAvg(min_train_nodes=1, min_available_nodes=1)
    plain_results = {
        b"".join(v.numpy().tobytes() for v in plain.aggregate_train(1, list(order))[0].to_torch_state_dict().values())
        for order in itertools.permutations(replies)
    }
    assert len(plain_results) > 1 and aggregates <= plain_results
