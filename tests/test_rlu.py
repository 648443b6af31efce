"""The RLU label estimator (fl_attack.attacker.labels.rlu_counts; Chen & Vikalo, ICML 2024; docs/label-recovery.md).

Literal checks on a linear softmax model whose logits do not depend on the input (zero weights, or one
shared input image), where RLU's approximations are exact and so must return the true counts, and a
real-data check on FEMNIST writers against the update-free null (the public pool's class prior).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_attack.attacker.attacks import AttackConfig
from fl_attack.attacker.labels import (
    AuxiliaryData,
    recover_counts,
    recover_labels,
    rlu_counts,
    rlu_output_gradients,
    rlu_step_coefficient,
    round_counts,
)
from fl_attack.evaluation.metrics import label_count_accuracy
from fl_attack.federation.config import ClientOptimizer
from fl_attack.federation.data import client_partition, load_pool, partition_writers
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local

C = 62  # FEMNIST's classes: the update's metadata names the dataset
TRUTH = np.zeros(C, dtype=np.int64)
TRUTH[[0, 3, 7, 20, 41]] = [4, 1, 6, 2, 3]  # k = 16
K = int(TRUTH.sum())


def _linear(bias: torch.Tensor) -> torch.nn.Module:
    """A softmax regression on the flattened 28x28 image, zero weights, the given output bias."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, C))
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].bias.copy_(bias)
    return model.eval()


def _client(images, model, **training):
    labels = torch.from_numpy(np.repeat(np.arange(C), TRUTH))
    return train_local(model, images, labels, dataset="femnist", seed=0, **training).update


def _aux(images_like: torch.Tensor, per_class: int = 2) -> AuxiliaryData:
    """Every class, ``per_class`` copies of the first image (the logits are the same on any input here)."""
    return AuxiliaryData(
        images_like[:1].repeat(C * per_class, 1, 1, 1), torch.arange(C).repeat_interleave(per_class).long()
    )


def _bias(seed: int = 0) -> torch.Tensor:
    """An output bias that gives class 0 about half the softmax mass, the rest spread unevenly."""
    bias = torch.randn(C, generator=torch.Generator().manual_seed(seed))
    bias[0] = 5.0
    return bias


def test_one_sgd_step_on_input_free_logits_gives_the_exact_counts():
    """T = 1, plain SGD, logits = b for every input: the bias gradient is softmax(b) - n/k exactly and
    the off-class logits are b, so RLU's n = k * (e - g) is the truth (before rounding)."""
    images = torch.rand(K, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    model = _linear(_bias())
    update = _client(images, model, lr=0.1, batch_size=K, local_epochs=1)
    assert update.metadata.local_steps == 1 and rlu_step_coefficient(update) == 1.0
    g, _ = rlu_output_gradients(update)
    e = torch.softmax(_bias(), 0).double().numpy()
    np.testing.assert_allclose(K * (e - g), TRUTH, atol=1e-4)
    np.testing.assert_array_equal(rlu_counts(update, _aux(images), model), TRUTH)


def test_momentum_and_weight_decay_are_divided_out():
    """Heavy ball 0.9 with weight decay 0.5, full batch, T = 10 at a rate too small to move the softmax:
    (b0 - bT)/eta = sum_s c_s (g + lambda b), so only rho_bar = mean c_s and the decay term give back
    the counts. The same update read as plain SGD (rho_bar = 1, no decay) loses class 0 entirely."""
    images = torch.rand(K, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    model = _linear(_bias())
    opt = ClientOptimizer("momentum", momentum=0.9, weight_decay=0.5)
    update = _client(images, model, lr=1e-6, batch_size=K, local_epochs=10, optimizer=opt)
    s = np.arange(1, 11)
    assert rlu_step_coefficient(update) == pytest.approx(np.mean((1 - 0.9 ** (10 - s + 1)) / 0.1))
    np.testing.assert_array_equal(rlu_counts(update, _aux(images), model), TRUTH)
    b = "1.bias"
    naive_g = ((update.w0[b] - update.wT[b]) / (1e-6 * 10)).double().numpy()
    naive = round_counts(K * np.maximum(0, torch.softmax(_bias(), 0).double().numpy() - naive_g), K)
    assert naive[0] == 0 and TRUTH[0] == 4  # the test can tell a wrong rho_bar or decay from a right one


def test_the_roll_forward_recovers_counts_the_endpoints_miss():
    """Every image is the same x, so the logits are input-free at every step and move by
    -eta * g_c * (||x||^2 + 1) a step, which is RLU's roll-forward with O = x exactly. Ten full-batch steps
    at a large rate move the softmax far, so e from the endpoints alone is wrong; the refinement
    (at most 5 one-count moves, then e along the rolled trajectory) gives the exact counts."""
    x = torch.full((1, 1, 28, 28), 0.98)  # normalised about 0.1 per pixel: ||x||^2 about 8
    images = x.repeat(K, 1, 1, 1)
    model = _linear(_bias(3))
    update = _client(images, model, lr=0.3, batch_size=K, local_epochs=10)
    aux = _aux(images)
    endpoints_only = rlu_counts(update, aux, model, moves=0)
    assert (
        label_count_accuracy(
            np.repeat(np.arange(C), endpoints_only), torch.from_numpy(np.repeat(np.arange(C), TRUTH)), C
        )
        < 1
    )
    np.testing.assert_array_equal(rlu_counts(update, aux, model), TRUTH)


# --- real data --------------------------------------------------------------------------------------

WRITERS, B, E = 4, 8, 5


@pytest.fixture(scope="module")
def femnist():
    """The public pool (writers outside the first WRITERS partitions, at most 30 images a class) and the
    first WRITERS writers' k=16 samples."""
    pool = load_pool("femnist")
    outside = ~np.isin(pool.writers, partition_writers(pool, K)[:WRITERS])
    rng = np.random.default_rng(0)
    idx = np.sort(
        np.concatenate(
            [
                rng.choice(m, size=min(30, m.size), replace=False)
                for m in (np.flatnonzero(outside & (pool.labels == c)) for c in range(C))
                if m.size
            ]
        )
    )
    aux = AuxiliaryData(
        torch.from_numpy(pool.images[idx][:, None].astype(np.float32) / 255),
        torch.from_numpy(pool.labels[idx].astype(np.int64)),
    )
    return aux, [client_partition(pool, p, K).train for p in range(WRITERS)]


@pytest.mark.heavy
@pytest.mark.parametrize(
    "optimizer, lr",
    [(ClientOptimizer(), 0.05), (ClientOptimizer("momentum", momentum=0.9), 0.05)],
    ids=["sgd", "momentum"],
)
def test_rlu_beats_the_class_prior_on_multi_epoch_femnist_clients(femnist, optimizer, lr):
    """E = 5 epochs (T = 10 steps) from w0 = build_model(seed 0), fixed seeds. The update-free null is
    the public pool's class frequencies scaled to k (measured 0.44 on these writers); RLU must beat it
    on every writer and reach 0.85 on average (measured 0.98 with plain SGD, 0.95 with momentum)."""
    aux, clients = femnist
    prior = round_counts(np.bincount(aux.labels.numpy(), minlength=C), K)
    rlu, null = [], []
    for p, data in enumerate(clients):
        update = train_local(
            build_model("femnist", seed=0),
            data.images,
            data.labels,
            dataset="femnist",
            lr=lr,
            batch_size=B,
            local_epochs=E,
            seed=p,
            optimizer=optimizer,
        ).update
        labels = recover_labels(update, estimator="rlu", aux=aux)
        assert labels.shape == (K,) and labels.dtype == torch.int64
        if p == 0:  # the counts and the label list agree (one more RLU call, so once)
            counts = recover_counts(update, "rlu", aux=aux)
            assert counts.dtype == np.int64 and counts.sum() == K
            np.testing.assert_array_equal(np.bincount(labels.numpy(), minlength=C), counts)
        rlu.append(label_count_accuracy(labels, data.labels, C))
        null.append(label_count_accuracy(np.repeat(np.arange(C), prior), data.labels, C))
    assert all(r > n for r, n in zip(rlu, null)), (rlu, null)
    assert np.mean(rlu) >= 0.85, rlu


def test_rlu_is_a_configurable_estimator_that_needs_public_data():
    assert AttackConfig(label_estimator="rlu").label_estimator == "rlu"
    update = _client(torch.rand(K, 1, 28, 28), _linear(_bias()), lr=0.1, batch_size=K, local_epochs=1)
    with pytest.raises(ValueError, match="label estimator 'rlu' needs public auxiliary data"):
        recover_counts(update, "rlu")
