"""Batched attacks: ``reconstruct_batch`` on N clients equals N unbatched ``reconstruct`` runs.

THE EXACTNESS TEST: three real FEMNIST clients (two sharing w0, one trained from another w0), each
method in float64 for a few Adam steps: the batched run's X_hat, images, labels, Lsim (honest and
calibrated), trace, P1, d and the path position equal those of the unbatched runs to 1e-6. The
unbatched runs take the structured paper-CNN path, the batched one the vmapped generic path, so this
also checks that the two compute the same G and double backward step after step.
"""

from __future__ import annotations

import pytest
import torch

import fl_attack.attacker.api as api
from fl_attack import reconstruct, reconstruct_batch
from fl_attack.attacker.attacks.gradients import path_gradient
from fl_attack.evaluation.victims import train_victim
from fl_attack.federation.config import PAPER
from fl_attack.federation.models import build_model
from fl_attack.federation.update import ObservedUpdate, flatten, layout

K = 6
TOL = 1e-6  # float64; measured differences are ~1e-13
FAST = dict(iterations=6, trace_every=2, device="cpu", dtype=torch.float64)


def _victim(partition: int, seed: int, samples: int = K):
    return train_victim(
        "femnist", partition, samples=samples, batch_size=3, local_epochs=1, lr=PAPER.lr, seed=seed, data_seed=0
    )


@pytest.fixture(scope="module")
def victims():
    """Three real FEMNIST clients, k=6, B=3, E=1 (T=2): clients 0 and 1 from one w0 (one FedAvg
    round), client 2 from another w0 (per-client w0 is supported too)."""
    return [_victim(0, 0), _victim(1, 0), _victim(2, 1)]


def _spy(monkeypatch) -> list:
    """Record (X_hat leaf, attack) of every run: the variables Reconstruction does not return."""
    seen = []
    original = api.build_optimizers

    def spy(x, attack, config):
        seen.append((x, attack))
        return original(x, attack, config)

    monkeypatch.setattr(api, "build_optimizers", spy)
    return seen


def _diff(a, b) -> float:
    a, b = (torch.as_tensor(v).detach().to(torch.float64) for v in (a, b))
    return float((a - b).abs().max())


# Each method with a setting that exercises one more per-client path of the loop.
CASES = {
    "pisme": dict(nodes=3),
    "nlsme": dict(label_refine=0.5),  # each client re-estimates its own labels at iteration 3
    "sme": dict(observed_only=True, tv_reduction="sum"),
    "ig": dict(lr_decay=False, box_clamp=False),
}
VARIABLES = {"pisme": ("control_point", "calibration"), "nlsme": ("control_point", "calibration", "position")}
VARIABLES["sme"] = ("alpha",)
VARIABLES["ig"] = ()


@pytest.mark.heavy
@pytest.mark.parametrize("method", sorted(CASES))
def test_batch_equals_the_unbatched_runs(victims, method, monkeypatch):
    updates = [v.update for v in victims]
    labels = "recovered" if method != "ig" else [victims[0].labels, "recovered", victims[2].labels]
    seen = _spy(monkeypatch)
    per_client = [labels] * 3 if isinstance(labels, str) else labels
    alone = [reconstruct(u, method, labels=y, **FAST, **CASES[method]) for u, y in zip(updates, per_client)]
    batch = reconstruct_batch(updates, method, labels=labels, **FAST, **CASES[method])
    (x_batch, attack), runs = seen[-1], seen[:-1]
    assert x_batch.shape == (3, K, 1, 28, 28) and x_batch.dtype == torch.float64
    assert attack.batch_shape == (3,)
    for i, (one, many) in enumerate(zip(alone, batch)):
        x_one, attack_one = runs[i]
        assert _diff(x_batch[i].detach(), x_one.detach()) <= TOL, f"client {i}: X_hat"
        assert many.images.shape == one.images.shape == (K, 1, 28, 28) and many.images.dtype == torch.float32
        assert _diff(many.images, one.images) <= TOL, f"client {i}: images"
        assert torch.equal(many.labels, one.labels) and many.label_source == one.label_source
        assert abs(many.lsim_honest - one.lsim_honest) <= TOL
        assert abs(many.lsim_calibrated - one.lsim_calibrated) <= TOL
        for name in VARIABLES[method]:
            assert _diff(getattr(attack, name)[i].detach(), getattr(attack_one, name).detach()) <= TOL, name
        assert [set(r) for r in many.trace] == [set(r) for r in one.trace]
        for r_many, r_one in zip(many.trace, one.trace):
            assert all(abs(r_many[key] - r_one[key]) <= TOL for key in r_one), (i, r_many, r_one)
        assert many.method == method and many.config == one.config
    # the clients really differ: the batch did not compute one client three times
    assert _diff(batch[0].images, batch[1].images) > 1e-3
    assert abs(batch[0].lsim_honest - batch[2].lsim_honest) > 1e-6
    if method == "ig":
        assert [r.label_source for r in batch] == ["oracle", "recovered", "oracle"]


def test_one_client_batch_equals_reconstruct(victims):
    update = victims[1].update
    one = reconstruct(update, "pisme", nodes=2, **FAST)
    (many,) = reconstruct_batch([update], "pisme", nodes=2, **FAST)
    assert _diff(many.images, one.images) <= TOL
    assert abs(many.lsim_honest - one.lsim_honest) <= TOL and abs(many.lsim_calibrated - one.lsim_calibrated) <= TOL
    assert torch.equal(many.labels, one.labels)


def test_batched_path_gradient_is_each_clients_own(victims):
    """path_gradient on (N, P) anchors and (N, m, J) bases: row n is client n's unbatched G, and the
    double backward to X_hat and the anchors too (float64, 1e-10 of the largest value)."""
    model = build_model("femnist")
    shapes = layout(victims[0].update.w0)
    gen = torch.Generator().manual_seed(0)
    w0 = torch.stack([flatten(v.update.w0) for v in victims]).double()
    wT = torch.stack([flatten(v.update.wT) for v in victims]).double()
    p1 = ((w0 + wT) / 2).requires_grad_(True)
    x = torch.randn(3, K, 1, 28, 28, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.stack([v.labels for v in victims])
    t = torch.tensor([[0.2, 0.7], [0.4, 0.9], [0.1, 0.5]], dtype=torch.float64)
    basis = torch.stack([(1 - t) ** 2, 2 * (1 - t) * t, t**2], -1)  # (3, 2, 3): per-client nodes
    coeffs = torch.tensor([0.25, 0.75], dtype=torch.float64)
    probe = torch.randn(w0.shape, generator=gen, dtype=torch.float64)
    g = path_gradient(model, shapes, [w0, p1, wT], basis, coeffs, x, y)
    assert g.shape == w0.shape
    g_x, g_p = torch.autograd.grad((g * probe).sum(), [x, p1])
    for n in range(3):
        x_n, p_n = x[n].detach().requires_grad_(True), p1[n].detach().requires_grad_(True)
        ref = path_gradient(model, shapes, [w0[n], p_n, wT[n]], basis[n], coeffs, x_n, y[n])
        r_x, r_p = torch.autograd.grad((ref * probe[n]).sum(), [x_n, p_n])
        for got, want in ((g[n], ref), (g_x[n], r_x), (g_p[n], r_p)):
            assert _diff(got, want) <= 1e-10 * float(want.detach().abs().max())


def test_inputs_are_checked_before_any_work(victims, monkeypatch):
    updates = [v.update for v in victims]
    calls = []
    monkeypatch.setattr(api, "recover_labels", lambda *a, **k: calls.append(1))  # the first real work
    other_k = _victim(3, 0, samples=8).update
    with pytest.raises(ValueError, match="client 2 has k=8 samples, client 0 has k=6; a batch needs one k"):
        reconstruct_batch([updates[0], updates[1], other_k], "pisme", **FAST)
    cifar = train_victim("cifar100", 0, samples=K, batch_size=3, local_epochs=1, lr=PAPER.lr, width=4).update
    with pytest.raises(ValueError, match="client 1 is a 'cifar100' update, client 0 a 'femnist' one"):
        reconstruct_batch([updates[0], cifar], "pisme", **FAST)
    smuggled = ObservedUpdate(
        {**updates[1].w0, "private_images": torch.zeros(2)},
        {**updates[1].wT, "private_images": torch.zeros(2)},
        updates[1].metadata,
    )
    with pytest.raises(ValueError, match="client 1's update has another state-dict layout"):
        reconstruct_batch([updates[0], smuggled], "pisme", **FAST)
    with pytest.raises(ValueError, match="client 0: the update has tensor 'private_images'"):
        reconstruct_batch([smuggled, smuggled], "pisme", **FAST)
    with pytest.raises(TypeError, match=r"updates\[1\] must be an ObservedUpdate"):
        reconstruct_batch([updates[0], {"w0": {}}], "pisme", **FAST)
    with pytest.raises(ValueError, match="at least one update"):
        reconstruct_batch([], "pisme", **FAST)
    with pytest.raises(ValueError, match="method 'pisme-adaptive' cannot be batched"):
        reconstruct_batch(updates, "pisme-adaptive", **FAST)
    with pytest.raises(ValueError, match="client 1: oracle labels must be 6 class ids"):
        reconstruct_batch(updates, "pisme", labels=[victims[0].labels, victims[1].labels[:3], "recovered"], **FAST)
    with pytest.raises(ValueError, match="oracle labels for 2 clients were given, the batch has N=3"):
        reconstruct_batch(updates, "pisme", labels=torch.stack([v.labels for v in victims[:2]]), **FAST)
    with pytest.raises(ValueError, match=r"oracle labels for a batch must be \(N=3, k=6\)"):
        reconstruct_batch(updates, "pisme", labels=victims[0].labels, **FAST)
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        reconstruct_batch(updates, "pisme", **{**FAST, "dtype": torch.float16})
    assert calls == []


def test_default_precision_and_labels(victims):
    """float32 (the default) runs too, returns each client's own recovered labels, and the callback
    sees the whole batch and feeds each client's trace."""
    updates = [v.update for v in victims[:2]]
    seen = []

    def callback(iteration, images):  # all clients' images at once, one dict back per client
        seen.append((iteration, tuple(images.shape)))
        return [{"probe": 10 * iteration + i} for i in range(2)]

    recs = reconstruct_batch(updates, "sme", iterations=2, trace_every=1, device="cpu", callback=callback)
    assert seen == [(0, (2, K, 1, 28, 28)), (1, (2, K, 1, 28, 28))]
    assert [[row["probe"] for row in rec.trace] for rec in recs] == [[0, 10], [1, 11]]
    assert [r.images.shape for r in recs] == [(K, 1, 28, 28)] * 2
    for rec in recs:
        assert rec.label_source == "recovered" and rec.labels.shape == (K,)
        assert 0 <= rec.lsim_honest <= 2 and rec.seconds > 0
        assert float(rec.images.min()) >= 0 and float(rec.images.max()) <= 1
