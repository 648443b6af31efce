"""Batch norm in train mode (issue 23, item 3): the update carries batch norm's buffers (float running
statistics, an int64 counter) through ObservedUpdate, its record and a replay; the clients can train
in train mode; the attacks match the parameters only, run their surrogate on X_hat's batch statistics
without ever updating a running statistic, and can match the client's feature statistics that the
running statistics leak; the federation's aggregate keeps the counter an integer.

Real FEMNIST samples (fl_attack.federation.data.client_partition), tests.user_models.BatchNormNet (batch norm on
the input and after each conv, max pooling, dropout), fixed seeds, the CPU.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from fl_attack import reconstruct, reconstruct_batch
from fl_attack.attacker.attacks import AttackConfig
from fl_attack.attacker.attacks.base import lsim
from fl_attack.attacker.attacks.batchnorm import client_statistics, statistics_loss, surrogate_mode
from fl_attack.audit.settings import RunSettings
from fl_attack.federation.data import client_partition, get_spec, load_pool
from fl_attack.federation.models import parameter_keys, resolve_model
from fl_attack.federation.training import train_local
from fl_attack.federation.update import (
    AttackTarget,
    ObservedUpdate,
    TrainingMetadata,
    flatten,
    layout,
    load_update,
    read_update_index,
    save_update,
    verify_update,
)
from strategies.strategy import integer_arrays_as_max
from tests.user_models import BatchNormNet, lenet

BN = "tests.user_models:batch_norm_net"
COUNTERS = ("features.0.num_batches_tracked", "features.2.num_batches_tracked", "features.6.num_batches_tracked")


@pytest.fixture(scope="module")
def client():
    """k=8 real samples of FEMNIST writer 0 (client_partition's draw, seed 0)."""
    return client_partition(load_pool("femnist"), 0, 8).train


def _train(client, *, train_mode=True, batch_size=4, local_epochs=2, seed=0, model=None, **kwargs):
    """(the model at w0, its update): BatchNormNet (seed 0) trained on ``client`` from its w0."""
    torch.manual_seed(seed)  # dropout's masks in train mode
    net = model if model is not None else resolve_model(BN, "femnist", seed=0)
    start = copy.deepcopy(net)
    result = train_local(
        net,
        client.images,
        client.labels,
        dataset="femnist",
        lr=0.05,
        batch_size=batch_size,
        local_epochs=local_epochs,
        seed=seed,
        train_mode=train_mode,
        **kwargs,
    )
    return start, result.update


@pytest.fixture(scope="module")
def trained(client):
    """A train-mode update from a w0 whose running statistics are not torch's defaults (a first
    train-mode update, aggregated as is), so eval and train mode differ everywhere."""
    _, first = _train(client, seed=1)
    net = resolve_model(BN, "femnist", seed=0)
    net.load_state_dict(first.wT)
    return _train(client, model=net)


# --- (a) training in train mode, and the metadata that says so ---------------------------------------


def test_train_mode_training_moves_the_running_statistics_and_counts_the_steps(client):
    model, update = _train(client)
    T = update.metadata.local_steps
    assert T == 4 and update.metadata.train_mode
    for key in COUNTERS:
        assert update.w0[key].dtype == update.wT[key].dtype == torch.int64  # kept an integer, not float32
        assert int(update.wT[key]) - int(update.w0[key]) == T
    for key in [k for k in update.w0 if "running" in k]:
        assert update.w0[key].dtype == torch.float32 and not torch.equal(update.w0[key], update.wT[key])
    update.check_against(model)  # the model's int64 buffers are accepted
    assert update.num_parameters == sum(p.numel() for p in model.parameters())  # the rows' "parameters"
    # eval mode (the default): nothing of batch norm changes, bit for bit
    _, still = _train(client, train_mode=False)
    assert not still.metadata.train_mode
    assert all(torch.equal(still.w0[k], still.wT[k]) for k in still.w0 if k not in parameter_keys(model))


def test_train_mode_goes_to_the_reply_metrics_and_the_run_config():
    meta = TrainingMetadata("femnist", 0.05, 4, 2, 8, train_mode=True)
    metrics = meta.to_metrics()
    assert metrics["train-mode"] == 1 and isinstance(metrics["train-mode"], int)
    MetricRecord(metrics)  # Flower's numbers only
    assert TrainingMetadata.from_metrics("femnist", metrics) == meta
    assert TrainingMetadata(**meta.to_dict()) == meta  # the recorded form
    old = {k: v for k, v in metrics.items() if k != "train-mode"}
    assert not TrainingMetadata.from_metrics("femnist", old).train_mode  # an older client: eval mode
    with pytest.raises(TypeError, match="train_mode must be a bool"):
        TrainingMetadata("femnist", 0.05, 4, 2, 8, train_mode=1)
    assert not RunSettings().client_train_mode
    assert RunSettings.from_run_config({"client-train-mode": True}).client_train_mode


def test_the_update_keeps_integer_buffers_and_refuses_what_is_not_a_model_tensor(client):
    model, update = _train(client)
    w0, wT = dict(update.w0), dict(update.wT)
    with pytest.raises(ValueError, match="w0 and wT differ in dtype at 'features.0.num_batches_tracked'"):
        ObservedUpdate(w0, {**wT, COUNTERS[0]: wT[COUNTERS[0]].float()}, update.metadata)
    with pytest.raises(ValueError, match=r"wT\['mask'\] has dtype torch.bool; an update holds floating-point"):
        ObservedUpdate({**w0, "mask": torch.ones(2)}, {**wT, "mask": torch.ones(2, dtype=torch.bool)}, update.metadata)
    with pytest.raises(ValueError, match=r"w0\['z'\] has dtype torch.complex64"):
        ObservedUpdate({**w0, "z": torch.ones(2, dtype=torch.complex64)}, wT, update.metadata)
    other = ObservedUpdate(
        {**w0, COUNTERS[0]: w0[COUNTERS[0]].int()}, {**wT, COUNTERS[0]: wT[COUNTERS[0]].int()}, update.metadata
    )
    with pytest.raises(
        ValueError, match="the update's 'features.0.num_batches_tracked' has dtype torch.int32, the model's torch.int64"
    ):
        other.check_against(model)
    bias = "head.bias"
    ints = ObservedUpdate({**w0, bias: w0[bias].long()}, {**wT, bias: wT[bias].long()}, update.metadata)
    with pytest.raises(ValueError, match="the update's 'head.bias' has dtype torch.int64, the model's torch.float32"):
        ints.check_against(model)


# --- (b) the record of an update and its replay read it back exactly -------------------------------------


def test_a_recorded_update_round_trips_exactly_with_its_integer_buffers(client, trained, tmp_path):
    _, update = trained
    row = save_update(update, AttackTarget(3, (0,), 7, "w0"), tmp_path)
    verify_update(tmp_path, row)
    ((back, target),) = [load_update(tmp_path, r) for r in read_update_index(tmp_path)]
    assert back.metadata == update.metadata and back.metadata.train_mode and target.round == 3
    for side in ("w0", "wT"):
        ours, theirs = getattr(update, side), getattr(back, side)
        assert list(ours) == list(theirs)
        for key in ours:
            assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), (side, key)
    assert back.wT[COUNTERS[0]].dtype == torch.int64 and int(back.wT[COUNTERS[0]]) == 8


# --- (c) train-mode attacks: batch statistics of X_hat, never a running-statistics update ------------------


def _literal_lsim(model, update, images, labels, train_mode):
    """Lsim(grad_w CE(f_{w0}(x), y), delta_w) over the parameters, by plain autograd through a copy of
    ``model`` at w0 (buffers included): for a train-mode update with batch norm in train mode and not
    tracking (its batch statistics), else everything in eval mode; dropout in eval mode."""
    net = copy.deepcopy(model).double()
    net.load_state_dict(update.w0)
    net.eval()
    if train_mode:
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.train()
                m.track_running_stats = False
    x = get_spec("femnist").normalize(images.double())
    loss = F.cross_entropy(net(x), labels)
    names = [n for n, _ in net.named_parameters()]
    grads = torch.autograd.grad(loss, [p for _, p in net.named_parameters()])
    delta = torch.cat([(update.w0[n].double() - update.wT[n].double()).reshape(-1) for n in names])
    return float(lsim(torch.cat([g.reshape(-1) for g in grads]), delta))


def _at_the_truth(update, client, model):
    """IG started at the true images with oracle labels, which lr_images=0 and no box clamp (the box
    is float32's) keep there: its final honest Lsim is that of its surrogate (the gradient at w0) at
    the truth."""
    settings = dict(iterations=1, lr_images=0.0, tv_weight=0.0, box_clamp=False, device="cpu", model=model)
    settings["dtype"] = torch.float64
    return reconstruct(update, "ig", labels=client.labels, init=client.images, **settings)


def test_a_train_mode_attack_uses_batch_statistics_and_never_updates_a_running_statistic(client, trained):
    model, update = trained
    before_model = copy.deepcopy(model.state_dict())
    before_update = [copy.deepcopy(dict(update.w0)), copy.deepcopy(dict(update.wT))]
    seen = []  # in every forward of every batch norm (the hooks travel into the attacker's copy)

    def watch(module, args, output):
        seen.append(
            (module.training, module.track_running_stats, module.running_mean.clone(), int(module.num_batches_tracked))
        )

    handles = [m.register_forward_hook(watch) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    try:
        rec = _at_the_truth(update, client, model)
        reconstruct(
            update, "pisme", labels=client.labels, iterations=3, nodes=2, device="cpu", model=model, bn_stats_weight=0.1
        )
    finally:
        for h in handles:
            h.remove()
    # the surrogate is the literal train-mode gradient (batch statistics), not the eval-mode one
    assert rec.lsim_honest == pytest.approx(_literal_lsim(model, update, client.images, client.labels, True), abs=1e-9)
    assert abs(rec.lsim_honest - _literal_lsim(model, update, client.images, client.labels, False)) > 1e-3
    # every forward ran on w0's running statistics and counter, which no forward changed
    trains = [s for s in seen if s[0]]
    assert trains and all(not track for _, track, _, _ in trains)
    w0_counts = {int(update.w0[k]) for k in COUNTERS}
    assert all(count in w0_counts for *_, count in seen)
    assert all(  # the layers have 1, 4 and 8 channels: equal to a w0 running mean is equal to its own
        any(torch.equal(mean, update.w0[k]) for k in update.w0 if k.endswith("running_mean")) for _, _, mean, _ in seen
    )
    # the caller's model and the update, bit for bit
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before_model.items())
    for ours, side in zip(before_update, (update.w0, update.wT)):
        assert all(torch.equal(v, side[k]) and v.dtype == side[k].dtype for k, v in ours.items())


def test_a_train_mode_batch_is_each_clients_attack_through_the_vmapped_path(client, trained):
    """reconstruct_batch (torch.func.vmap over the clients, their buffers included) equals the clients'
    own reconstruct calls, in train mode and with the running-statistics term."""
    model, update = trained
    _, second = _train(client_partition(load_pool("femnist"), 1, 8).train, model=resolve_model(BN, "femnist", seed=0))
    settings = dict(iterations=4, nodes=2, device="cpu", model=model, dtype=torch.float64, bn_stats_weight=0.05)
    batch = reconstruct_batch([update, second], "pisme", **settings)
    for one, u in zip(batch, (update, second)):
        alone = reconstruct(u, "pisme", **settings)
        assert torch.allclose(one.images, alone.images, atol=1e-6) and one.lsim_honest == pytest.approx(
            alone.lsim_honest, abs=1e-6
        )
    assert all(torch.equal(update.w0[k], model.state_dict()[k]) for k in COUNTERS)
    eval_mode = dataclasses.replace(second, metadata=dataclasses.replace(second.metadata, train_mode=False))
    with pytest.raises(ValueError, match="client 1 trained in eval mode, client 0 in train mode"):
        reconstruct_batch([update, eval_mode], "pisme", iterations=1, device="cpu", model=model)
    with pytest.raises(ValueError, match="update 1 was trained in eval mode, update 0 in train mode"):
        reconstruct([update, eval_mode], "pisme", iterations=1, device="cpu", model=model)


# --- (d) eval mode: the parameters only, w0's running statistics, buffer-free models unchanged -------------


def test_the_attack_vector_is_the_parameters_and_for_a_buffer_free_model_the_whole_state():
    net = BatchNormNet()
    keys = parameter_keys(net)
    assert keys == [n for n, _ in net.named_parameters()]
    assert not [k for k in keys if "running" in k or "num_batches" in k]
    for buffer_free in (lenet(), resolve_model("", "femnist")):  # the same keys in the same order: the same vectors
        assert parameter_keys(buffer_free) == list(buffer_free.state_dict())


def test_an_eval_mode_update_is_attacked_in_eval_mode_with_w0s_running_statistics(client, trained):
    model, _ = trained  # w0's running statistics are a client's, not torch's defaults
    _, update = _train(client, train_mode=False, model=copy.deepcopy(model))
    fresh = resolve_model(BN, "femnist", seed=0)  # the architecture, at torch's default running statistics
    assert not torch.equal(fresh.state_dict()["features.2.running_var"], update.w0["features.2.running_var"])
    rec = _at_the_truth(update, client, fresh)
    assert rec.lsim_honest == pytest.approx(_literal_lsim(fresh, update, client.images, client.labels, False), abs=1e-9)
    settings = dict(iterations=2, device="cpu", model=BN, dtype=torch.float64)
    batch = reconstruct_batch([update, update], "ig", labels=torch.stack([client.labels] * 2), **settings)
    alone = reconstruct(update, "ig", labels=client.labels, **settings)
    assert batch[0].lsim_honest == pytest.approx(alone.lsim_honest, abs=1e-9)
    assert torch.allclose(batch[1].images, alone.images, atol=1e-9)


def test_each_update_of_a_joint_attack_runs_on_its_own_w0s_running_statistics(client, trained):
    """Two eval-mode updates of one client from two w0 with other running statistics: the model copy
    holds the first update's, and each update's surrogate still runs on its own."""
    model, later = trained
    other = resolve_model(BN, "femnist", seed=0)
    other.load_state_dict(later.wT)
    updates = [_train(client, train_mode=False, model=copy.deepcopy(m))[1] for m in (model, other)]
    assert not torch.equal(updates[0].w0["features.2.running_var"], updates[1].w0["features.2.running_var"])
    settings = dict(iterations=1, lr_images=0.0, tv_weight=0.0, box_clamp=False, device="cpu", model=BN)
    rec = reconstruct(updates, "ig", labels=client.labels, init=client.images, dtype=torch.float64, **settings)
    fresh = resolve_model(BN, "femnist", seed=0)
    literal = [_literal_lsim(fresh, u, client.images, client.labels, False) for u in updates]
    assert rec.lsim_per_update == pytest.approx(literal, abs=1e-9)


# --- (e) the running statistics leak the client's feature statistics ------------------------------------------


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum-0.1", "cumulative"])
def test_the_estimated_feature_statistics_are_the_clients_when_every_batch_is_the_whole_client(client, momentum):
    net = resolve_model(BN, "femnist", seed=0)
    net.features[0].momentum = momentum  # the batch norm on the input: its features are the images
    model, update = _train(client, model=net, batch_size=8, local_epochs=3)
    (first, *rest) = client_statistics(update, model)
    assert first.name == "features.0" and len(rest) == 2 and update.metadata.local_steps == 3
    x = get_spec("femnist").normalize(client.images).double()
    assert torch.allclose(first.mean, x.mean((0, 2, 3)), atol=1e-5, rtol=0)
    assert torch.allclose(first.var, x.var((0, 2, 3)), atol=1e-5, rtol=0)  # unbiased, as torch keeps it
    # the term is ~0 at the true images for that layer, and not at noise
    w0, wT = (flatten({k: s[k] for k in parameter_keys(model)}).double() for s in (update.w0, update.wT))
    shapes = layout({k: update.w0[k] for k in parameter_keys(model)})
    attacker = surrogate_mode(copy.deepcopy(model).double(), True)
    at_truth = statistics_loss(attacker, shapes, w0, wT, x, [first])
    at_noise = statistics_loss(attacker, shapes, w0, wT, torch.randn_like(x), [first])
    assert float(at_truth) < 1e-8 < 1e-2 < float(at_noise)


def test_running_statistics_matching_is_refused_where_it_cannot_work(client, monkeypatch):
    import fl_attack.attacker.api as api

    monkeypatch.setattr(api, "recover_labels", lambda *a, **k: pytest.fail("work started before the check"))
    model, eval_update = _train(client, train_mode=False)
    with pytest.raises(ValueError, match="this update was trained in eval mode"):
        reconstruct(eval_update, "pisme", iterations=1, device="cpu", model=model, bn_stats_weight=1.0)
    net = lenet()
    torch.manual_seed(0)
    no_bn = train_local(
        net, client.images, client.labels, dataset="femnist", lr=0.05, batch_size=4, train_mode=True
    ).update
    with pytest.raises(ValueError, match="needs batch-norm running statistics in the update"):
        reconstruct(no_bn, "pisme", iterations=1, device="cpu", model=lenet(), bn_stats_weight=1.0)
    with pytest.raises(ValueError, match="client 0: bn_stats_weight > 0"):
        reconstruct_batch([eval_update], "pisme", iterations=1, device="cpu", model=model, bn_stats_weight=1.0)
    with pytest.raises(ValueError, match="bn_stats_weight must be >= 0"):
        AttackConfig(bn_stats_weight=-1.0)


def test_running_statistics_matching_adds_its_term_to_the_trace(client, trained):
    model, update = trained
    rec = reconstruct(
        update, "pisme", labels=client.labels, iterations=3, nodes=2, device="cpu", model=model, bn_stats_weight=0.1
    )
    assert all(math.isfinite(row["bn_stats"]) and row["bn_stats"] > 0 for row in rec.trace)
    plain = reconstruct(update, "pisme", labels=client.labels, iterations=3, nodes=2, device="cpu", model=model)
    assert "bn_stats" not in plain.trace[0] and not torch.equal(plain.images, rec.images)


# --- (f, g) the federation: integer buffers are counters, never averaged as floats ---------------------------


def test_unit_integer_arrays_aggregate_as_the_clients_maximum_in_their_dtype():
    """A unit test of strategies.strategy.integer_arrays_as_max on Flower's own FedAvg aggregate."""
    records = [
        RecordDict(
            {
                "arrays": ArrayRecord({"w": torch.full((2,), float(v)), "n": torch.tensor(n)}),
                "metrics": MetricRecord({"num-examples": e}),
            }
        )
        for v, n, e in ((1.0, 4, 1), (4.0, 9, 3))
    ]
    flower = aggregate_arrayrecords(records, "num-examples")
    assert flower["n"].numpy().dtype == np.float64  # what FedAvg alone does to a counter: a float mean
    out = integer_arrays_as_max(flower, [r["arrays"] for r in records])
    assert list(out) == ["w", "n"]
    assert out["n"].numpy().dtype == np.int64 and int(out["n"].numpy()) == 9
    assert np.array_equal(out["w"].numpy(), flower["w"].numpy())  # floats: FedAvg's weighted mean, unchanged
    mixed = [records[0]["arrays"], ArrayRecord({"w": torch.ones(2), "n": torch.tensor(3, dtype=torch.int32)})]
    with pytest.raises(ValueError, match="the clients' 'n' arrays differ in dtype"):
        integer_arrays_as_max(flower, mixed)


def test_an_in_process_train_mode_federation_records_and_replays_its_integer_buffers(tmp_path):

    from fl_attack.cli import main
    from fl_attack.records import read_csv
    from strategies.server_app import write_run_config
    from tests.inprocess import federate, flower_run_config

    run = dict(
        num_rounds=2,
        model=BN,
        client_train_mode=True,
        attack_clients="0",
        attack_iterations=3,
        attack_threads=1,
        server_test_samples=50,
    )
    settings, strategy, _, jobs = federate(tmp_path, **run, torch_threads=1)
    assert settings.client_train_mode and [job.update.metadata.train_mode for job in jobs] == [True, True]
    write_run_config(tmp_path, settings, flower_run_config(**run), num_nodes=2)
    rows = read_update_index(tmp_path / "updates")
    (u1, _), (u2, t2) = [load_update(tmp_path / "updates", r) for r in rows]
    T = u1.metadata.local_steps
    for key in COUNTERS:  # round 2's w0: the clients' counters' maximum, an int64 buffer again
        assert u2.w0[key].dtype == u2.wT[key].dtype == torch.int64
        assert (int(u1.w0[key]), int(u2.w0[key]), int(u2.wT[key])) == (0, T, 2 * T)
    assert t2.round == 2 and u2.metadata.train_mode
    _, attacked = read_csv(tmp_path / "attacks.csv")
    assert [r["status"] for r in attacked] == ["ok", "ok"]
    assert main(["replay", str(tmp_path), "--threads", "1", "--device", "cpu", "--name", "again"]) == 0
    _, replayed = read_csv(tmp_path / "replays" / "again" / "attacks.csv")
    assert [r["status"] for r in replayed] == ["ok", "ok"] and [r["psnr"] for r in replayed] == [
        r["psnr"] for r in attacked
    ]
