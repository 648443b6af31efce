"""The observed-update boundary: ObservedUpdate and TrainingMetadata (what the server sees)."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fl_attack.federation.config import ClientOptimizer
from fl_attack.federation.data import client_partition, get_spec, load_pool
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local
from fl_attack.federation.update import ObservedUpdate, TrainingMetadata, flatten, layout, local_steps, unflatten


def _meta(**kw):
    base = dict(dataset="femnist", lr=0.004, batch_size=10, local_epochs=20, num_samples=50)
    return TrainingMetadata(**{**base, **kw})


def _state(seed=0):
    return OrderedDict((k, v.clone()) for k, v in build_model("femnist", seed=seed).state_dict().items())


@pytest.fixture(scope="module")
def femnist_batch():
    split = client_partition(load_pool("femnist"), 0, 10)
    return split.train.images, split.train.labels


# --- TrainingMetadata -------------------------------------------------------------------------


def test_local_steps():
    assert local_steps(50, 10, 20) == 100
    assert local_steps(50, 10, 50) == 250
    assert local_steps(45, 10, 2) == 10  # the last, smaller batch is a step too
    assert _meta().local_steps == 100


def test_metadata_rejects_batch_larger_than_k():
    with pytest.raises(ValueError, match=r"batch size B=60 is larger than the client's k=50 samples"):
        _meta(batch_size=60)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("batch_size", 0, "batch_size must be >= 1"),
        ("local_epochs", 0, "local_epochs must be >= 1"),
        ("num_samples", 0, "num_samples must be >= 1"),
        ("lr", 0.0, "lr must be a positive finite"),
        ("lr", float("nan"), "lr must be a positive finite"),
        ("lr", float("inf"), "lr must be a positive finite"),
        ("local_steps", 0, "local_steps must be >= 1"),
    ],
)
def test_metadata_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        _meta(**{field: value})


def test_metadata_round_trip():
    meta = _meta()
    assert TrainingMetadata(**meta.to_dict()) == meta


# --- ObservedUpdate validation ----------------------------------------------------------------


def test_rejects_different_keys():
    w0, wT = _state(0), _state(1)
    wT["extra.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match="w0 and wT have different keys"):
        ObservedUpdate(w0, wT, _meta())
    del wT["extra.weight"]
    del wT["fc2.bias"]
    with pytest.raises(ValueError, match=r"different keys \(differing: \['fc2.bias'\]\)"):
        ObservedUpdate(w0, wT, _meta())


def test_rejects_different_order():
    w0 = _state(0)
    wT = OrderedDict(reversed(list(_state(1).items())))
    with pytest.raises(ValueError, match="same keys in a different order"):
        ObservedUpdate(w0, wT, _meta())


def test_rejects_different_shapes():
    w0, wT = _state(0), _state(1)
    wT["fc2.bias"] = torch.zeros(61)
    with pytest.raises(ValueError, match=r"differ in shape at 'fc2.bias': \(62,\) vs \(61,\)"):
        ObservedUpdate(w0, wT, _meta())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("side", ["w0", "wT"])
def test_rejects_non_finite(bad, side):
    states = {"w0": _state(0), "wT": _state(1)}
    states[side]["conv1.weight"][0, 0, 0, 0] = bad
    with pytest.raises(ValueError, match=rf"{side}\['conv1.weight'\] contains NaN or inf"):
        ObservedUpdate(states["w0"], states["wT"], _meta())


def test_rejects_batch_larger_than_k_through_metadata():
    with pytest.raises(ValueError, match="larger than the client's k"):
        ObservedUpdate(_state(0), _state(1), TrainingMetadata("femnist", 0.004, 11, 1, 10))


@pytest.mark.parametrize("value", [torch.zeros(3), np.zeros(2), [1, 2], {"a": 1}, None])
def test_rejects_non_scalar_client_info(value):
    with pytest.raises(TypeError, match=r"client\['extra'\] must be a public scalar identifier"):
        ObservedUpdate(_state(0), _state(1), _meta(), {"round": 3, "extra": value})


def test_accepts_scalar_client_info_and_copies_weights():
    w0 = _state(0)
    client = {"round": 3, "node_id": "7", "partition_id": 2, "client_id": "f0123_45", "participants": 1.0}
    update = ObservedUpdate(w0, _state(1), _meta(), client)
    assert update.client == client
    w0["fc2.bias"].add_(1.0)  # later edits of the caller's dict do not leak into the update
    assert not torch.equal(update.w0["fc2.bias"], w0["fc2.bias"])
    assert all(v.dtype == torch.float32 for v in update.w0.values())


def test_rejects_wrong_types():
    with pytest.raises(TypeError, match="metadata must be a TrainingMetadata"):
        ObservedUpdate(_state(0), _state(1), _meta().to_dict())
    with pytest.raises(TypeError, match="w0 must be a non-empty dict"):
        ObservedUpdate({}, _state(1), _meta())


def test_no_field_can_hold_images():
    """The attacker is handed an ObservedUpdate: it has no slot for private images or labels."""
    assert {f.name for f in dataclasses.fields(ObservedUpdate)} == {"w0", "wT", "metadata", "client"}
    assert {f.name for f in dataclasses.fields(TrainingMetadata)} == {
        "dataset",
        "lr",
        "batch_size",
        "local_epochs",
        "num_samples",
        "local_steps",
        "optimizer",
        "train_mode",
    }
    assert {f.name for f in dataclasses.fields(ClientOptimizer)} == {"name", "momentum", "weight_decay", "adam_betas"}
    update = ObservedUpdate(_state(0), _state(1), _meta())
    with pytest.raises(dataclasses.FrozenInstanceError):
        update.images = torch.zeros(1)  # frozen: nothing can be attached afterwards


# --- delta_w and the array round trip --------------------------------------------------------


def test_delta_w_is_lr_times_gradient_for_one_step(femnist_batch):
    """One SGD step on one batch: delta_w = w0 - wT = +eta * grad (an update, not a gradient)."""
    images, labels = femnist_batch
    lr = 0.05
    model = build_model("femnist", seed=3)
    reference = build_model("femnist", seed=3)
    update = train_local(model, images, labels, dataset="femnist", lr=lr, batch_size=10, local_epochs=1).update
    assert update.metadata.local_steps == 1
    x = get_spec("femnist").normalize(images)
    loss = F.cross_entropy(reference(x), labels)
    grads = dict(
        zip((n for n, _ in reference.named_parameters()), torch.autograd.grad(loss, list(reference.parameters())))
    )
    for key, delta in update.delta_w.items():
        torch.testing.assert_close(delta, lr * grads[key], rtol=1e-4, atol=1e-7)
    # the sign: the output bias of a present class goes UP, so its delta_w is negative
    present = labels.unique()
    assert bool((update.delta_w["fc2.bias"][present] < 0).all())


def test_from_arrays_round_trip():
    w0, wT = _state(0), _state(1)
    keys = list(w0)
    meta = _meta()
    update = ObservedUpdate.from_arrays(
        keys, [w0[k].numpy() for k in keys], [wT[k].numpy() for k in keys], meta, {"round": 1}
    )
    assert list(update.w0) == keys and update.metadata == meta and update.client == {"round": 1}
    for k in keys:
        assert torch.equal(update.w0[k], w0[k]) and torch.equal(update.wT[k], wT[k])
    again = ObservedUpdate.from_arrays(
        keys, [update.w0[k].numpy() for k in keys], [update.wT[k].numpy() for k in keys], meta
    )
    assert all(torch.equal(again.delta_w[k], update.delta_w[k]) for k in keys)


def test_from_arrays_rejects_length_mismatch():
    w0 = _state(0)
    keys = list(w0)
    with pytest.raises(ValueError, match="different numbers of arrays"):
        ObservedUpdate.from_arrays(keys, [w0[k].numpy() for k in keys], [w0[k].numpy() for k in keys[:-1]], _meta())


def test_flatten_unflatten_round_trip():
    state = _state(0)
    flat = flatten(state)
    assert flat.shape == (sum(v.numel() for v in state.values()),)
    back = unflatten(flat, layout(state))
    assert list(back) == list(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


# --- the update is checked against the model it claims -------------------------------------------


@pytest.mark.parametrize("key", ["private_images", "labels", "num_samples"])
def test_a_client_key_that_is_not_a_public_identifier_is_rejected(key):
    with pytest.raises(
        ValueError,
        match=rf"client\['{key}'\] is not a public identifier; client may only hold "
        "client_id, node_id, participants, partition_id, round",
    ):
        ObservedUpdate(_state(0), _state(1), _meta(), {"round": 1, key: 3})


def test_non_floating_weights_are_rejected():
    w0, wT = _state(0), _state(1)
    with pytest.raises(ValueError, match=r"wT\['fc2.bias'\] has dtype torch.bool; an update holds floating-point"):
        ObservedUpdate(w0, {**wT, "fc2.bias": torch.ones(62, dtype=torch.bool)}, _meta())
    with pytest.raises(ValueError, match="w0 and wT differ in dtype at 'fc2.bias': torch.float32 vs torch.int64"):
        ObservedUpdate(w0, {**wT, "fc2.bias": torch.arange(62)}, _meta())
    # integer tensors are buffers (tests/test_batchnorm.py); as a model's float parameter they are refused
    ints = ObservedUpdate({**w0, "fc2.bias": torch.arange(62)}, {**wT, "fc2.bias": torch.arange(62)}, _meta())
    assert ints.w0["fc2.bias"].dtype == torch.int64
    with pytest.raises(ValueError, match="the update's 'fc2.bias' has dtype torch.int64, the model's torch.float32"):
        ints.check_against(build_model("femnist"))


@pytest.mark.parametrize("dataset", ["femnist", "cifar100"])
def test_an_update_of_the_real_model_passes_its_check(dataset):
    model = build_model(dataset, seed=0)
    update = ObservedUpdate(model.state_dict(), build_model(dataset, seed=1).state_dict(), _meta(dataset=dataset))
    assert update.check_against(model) is None and update.check_against(model.state_dict()) is None
    other = build_model("cifar100" if dataset == "femnist" else "femnist", seed=0)
    with pytest.raises(ValueError):  # the same check refuses another architecture
        update.check_against(other)


def test_a_tensor_that_is_not_the_models_is_rejected_by_name():
    w0, wT = _state(0), _state(1)
    w0["private_images"], wT["private_images"] = torch.rand(50, 1, 28, 28), torch.rand(50, 1, 28, 28)
    update = ObservedUpdate(w0, wT, _meta())  # well-formed on its own
    with pytest.raises(ValueError, match="the update has tensor 'private_images', which is not one of the model's"):
        update.check_against(build_model("femnist"))


def test_a_missing_tensor_or_another_shape_is_rejected():
    w0, wT = _state(0), _state(1)
    del w0["fc2.bias"], wT["fc2.bias"]
    with pytest.raises(ValueError, match="the update lacks the model's tensor 'fc2.bias'"):
        ObservedUpdate(w0, wT, _meta()).check_against(build_model("femnist"))
    cifar = build_model("cifar100", seed=0).state_dict()
    with pytest.raises(
        ValueError,
        match=r"the update's 'conv1.weight' has shape \(64, 3, 3, 3\), the model's "
        r"\(32, 1, 3, 3\)",
    ):
        ObservedUpdate(cifar, cifar, _meta()).check_against(build_model("femnist"))


def test_reconstruct_checks_the_update_against_the_model_before_any_work(monkeypatch):
    import fl_attack.attacker.api as api
    from fl_attack import reconstruct

    w0, wT = _state(0), _state(1)
    w0["private_images"] = wT["private_images"] = torch.rand(50, 1, 28, 28)
    update = ObservedUpdate(w0, wT, _meta())
    monkeypatch.setattr(api, "recover_labels", lambda *a, **k: pytest.fail("labels recovered before the check"))
    with pytest.raises(ValueError, match="'private_images', which is not one of the model's parameters"):
        reconstruct(update, "ig", iterations=1)
    # a femnist-shaped update claiming to be cifar100 fails the same way
    meta = TrainingMetadata("cifar100", 0.004, 10, 1, 50)
    with pytest.raises(ValueError, match="has shape"):
        reconstruct(ObservedUpdate(_state(0), _state(1), meta), "ig", iterations=1)


def test_metadata_goes_to_the_reply_metrics_and_back():
    meta = TrainingMetadata(dataset="femnist", lr=0.05, batch_size=4, local_epochs=3, num_samples=10)
    metrics = meta.to_metrics()
    assert metrics == {
        "num-examples": 10,
        "local-steps": 9,
        "lr": 0.05,
        "batch-size": 4,
        "local-epochs": 3,
        **{"optimizer": 0, "momentum": 0.0, "weight-decay": 0.0, "adam-beta1": 0.9, "adam-beta2": 0.999},
        "train-mode": 0,
    }
    assert TrainingMetadata.from_metrics("femnist", {**metrics, "train-loss": 1.0}) == meta
    heavy = dataclasses.replace(meta, optimizer=ClientOptimizer("nesterov", 0.9, 5e-4))
    assert TrainingMetadata.from_metrics("femnist", heavy.to_metrics()) == heavy
    assert TrainingMetadata(**heavy.to_dict()) == heavy  # the recorded form
    old = {k: v for k, v in metrics.items() if k not in ClientOptimizer().to_metrics()}
    assert TrainingMetadata.from_metrics("femnist", old) == meta  # a reply without them is plain SGD
    with pytest.raises(KeyError):
        TrainingMetadata.from_metrics("femnist", {k: v for k, v in metrics.items() if k != "lr"})
