"""The attacks: the vectorised objectives against literal references, and the shared harness.

THE REFERENCE TEST: on real client updates, PathIntegralSME.objective (all nodes in one vmapped
pass, flat parameter vectors) equals tests/reference.py:pisme_objective_reference (one
autograd call per node, dict parameters, Algorithm 1 as written), in value and in its gradients with
respect to X_hat, the control point P1 and the calibration d. NL-SME, SME and IG are checked the
same way against literal loops written here.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

import fl_attack.attacker.api as api
from fl_attack import ATTACKS, AttackConfig, ObservedUpdate, reconstruct
from fl_attack.attacker.attacks import get_attack, parse_methods
from fl_attack.attacker.attacks.base import lr_milestones
from fl_attack.federation.data import client_partition, get_spec, load_pool
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local
from fl_attack.federation.update import flatten, layout, unflatten
from tests.reference import pisme_objective_reference


def _victim(dataset, partition, k, batch_size, local_epochs, lr=0.004):
    split = client_partition(load_pool(dataset), partition, k)
    result = train_local(
        build_model(dataset, seed=0),
        split.train.images,
        split.train.labels,
        dataset=dataset,
        lr=lr,
        batch_size=batch_size,
        local_epochs=local_epochs,
    )
    return result.update, split.train.images, split.train.labels


@pytest.fixture(scope="module")
def femnist50():
    """A real FEMNIST writer, k=50, B=10, E=1: T=5 local SGD steps."""
    return _victim("femnist", 0, 50, 10, 1)


@pytest.fixture(scope="module")
def cifar10():
    """A real CIFAR-100 client, k=10, B=5, E=1: T=2 local SGD steps."""
    return _victim("cifar100", 0, 10, 5, 1)


@pytest.fixture(scope="module")
def femnist_small():
    """A small real FEMNIST update for the harness tests: k=10, B=5, E=2 (T=4)."""
    return _victim("femnist", 3, 10, 5, 2)


# --- literal references ------------------------------------------------------------------------


def _lsim(a, b):
    return 1 - (a * b).sum() / (a.norm() * b.norm())


def _tv(x):
    return (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().mean() + (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().mean()


def _grad_at(model, w: dict, x, y):
    """grad_w CE(f_w(x), y) as one flat vector, differentiable (create_graph)."""
    loss = F.cross_entropy(functional_call(model, w, (x,)), y)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(w.values()), create_graph=True)])


def _nlsme_reference(model, w0, wT, control_point, calibration, position, x, y, config):
    t = position
    w = {k: (1 - t) ** 2 * w0[k] + 2 * (1 - t) * t * control_point[k] + t**2 * wT[k] for k in w0}
    g = _grad_at(model, w, x, y)
    delta_w = torch.cat([(w0[k] - wT[k]).reshape(-1) for k in w0])
    d = torch.cat([calibration[k].reshape(-1) for k in w0])
    r_p = sum((control_point[k] - (w0[k] + wT[k]) / 2).pow(2).sum() for k in w0)
    r_d = sum((calibration[k] - 1).pow(2).sum() for k in w0)
    return (
        _lsim(d * g, delta_w)
        + config.tv_weight * _tv(x)
        + config.control_point_weight * r_p
        + config.calibration_weight * r_d
    )


def _sme_reference(model, w0, wT, alpha, x, y, config):
    w = {k: w0[k] + alpha * (wT[k] - w0[k]) for k in w0}  # SME's straight line, one parameter at a time
    delta_w = torch.cat([(w0[k] - wT[k]).reshape(-1) for k in w0])
    return _lsim(_grad_at(model, w, x, y), delta_w) + config.tv_weight * _tv(x)


def _ig_reference(model, w0, wT, x, y, config):
    w = {k: v.clone().requires_grad_(True) for k, v in w0.items()}
    delta_w = torch.cat([(w0[k] - wT[k]).reshape(-1) for k in w0])
    return _lsim(_grad_at(model, w, x, y), delta_w) + config.tv_weight * _tv(x)


# --- the setup shared by the reference tests -------------------------------------------------------


def _setup(victim, method, nodes=3, dtype=torch.float64, seed=0):
    """The library attack at a perturbed state (P1 off the midpoint, d != 1, t and alpha != 0.5)
    and X_hat drawn as the attack draws it; all in ``dtype``."""
    update, _, labels = victim
    dataset = update.metadata.dataset
    model = build_model(dataset)
    for p in model.parameters():
        p.requires_grad_(False)
    shapes = layout(update.w0)
    w0, wT = flatten(update.w0).to(dtype), flatten(update.wT).to(dtype)
    config = AttackConfig(nodes=nodes)
    attack = get_attack(method)(model, w0, wT, shapes, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        rms = attack.delta_w.norm() / math.sqrt(attack.delta_w.numel())
        if hasattr(attack, "control_point"):
            attack.control_point.add_(0.5 * rms * torch.randn(w0.shape, generator=gen, dtype=dtype))
            attack.calibration.copy_(0.5 + torch.rand(w0.shape, generator=gen, dtype=dtype))
        for name in ("position", "alpha"):
            if hasattr(attack, name):
                getattr(attack, name).fill_(0.3)
    spec = get_spec(dataset)
    lo, hi = spec.pixel_box()
    x = torch.randn(len(labels), *spec.image_shape, generator=gen, dtype=dtype)
    x = torch.maximum(torch.minimum(x, hi.to(dtype)), lo.to(dtype)).requires_grad_(True)
    return attack, model, shapes, x, labels


def _assert_close(actual, expected, rel, what):
    actual, expected = actual.detach(), expected.detach()
    scale = float(expected.abs().max())
    err = float((actual - expected).abs().max())
    assert scale > 0, f"{what}: the reference is identically zero"
    assert err <= rel * scale, f"{what}: max abs error {err:.3g} vs max abs value {scale:.3g}"


def _leaf(t):
    return t.detach().clone().requires_grad_(True)


# float64: the two computations agree to rounding (1e-9 of the largest value). float32, the attacks'
# working precision: measured 2e-5 at m=7 on dL/dX_hat (second derivatives summed in a different
# order), hence 1e-4 there.
REFERENCE_CASES = [(victim, m, torch.float64, 1e-9) for victim in ("femnist50", "cifar10") for m in (1, 3, 7)]
REFERENCE_CASES.append(("femnist50", 7, torch.float32, 1e-4))


@pytest.mark.heavy
@pytest.mark.parametrize(
    "victim, m, dtype, rel", REFERENCE_CASES, ids=[f"{v}-m{m}-{str(d).split('.')[1]}" for v, m, d, _ in REFERENCE_CASES]
)
def test_pisme_objective_matches_reference(victim, m, dtype, rel, request):
    attack, model, shapes, x, y = _setup(request.getfixturevalue(victim), "pisme", nodes=m, dtype=dtype)
    terms = attack.objective(x, y)
    g_x, g_p, g_d = torch.autograd.grad(terms["loss"], [x, attack.control_point, attack.calibration])

    x_ref, p_ref, d_ref = _leaf(x), _leaf(attack.control_point), _leaf(attack.calibration)
    c = attack.config
    ref = pisme_objective_reference(
        model,
        unflatten(attack.w0, shapes),
        unflatten(attack.wT, shapes),
        unflatten(p_ref, shapes),
        unflatten(d_ref, shapes),
        x_ref,
        y,
        m,
        tv_weight=c.tv_weight,
        control_point_weight=c.control_point_weight,
        calibration_weight=c.calibration_weight,
        tv_reduction=c.tv_reduction,
    )
    r_x, r_p, r_d = torch.autograd.grad(ref, [x_ref, p_ref, d_ref])
    _assert_close(terms["loss"], ref, rel, "loss")
    _assert_close(g_x, r_x, rel, "dL/dX_hat")
    _assert_close(g_p, r_p, rel, "dL/dP1")
    _assert_close(g_d, r_d, rel, "dL/dd")
    # the regulariser terms are really active at this state
    with torch.no_grad():
        assert float((attack.control_point - attack.anchor).norm()) > 0
        assert float((attack.calibration - 1).abs().max()) > 0


@pytest.mark.heavy
@pytest.mark.parametrize("victim", ["femnist50", "cifar10"])
def test_pisme_honest_lsim_is_the_uncalibrated_reference(victim, request):
    attack, model, shapes, x, y = _setup(request.getfixturevalue(victim), "pisme", nodes=3)
    honest = pisme_objective_reference(
        model,
        unflatten(attack.w0, shapes),
        unflatten(attack.wT, shapes),
        unflatten(_leaf(attack.control_point), shapes),
        unflatten(torch.ones_like(attack.w0), shapes),
        x.detach(),
        y,
        3,
        tv_weight=0.0,
        control_point_weight=0.0,
        calibration_weight=0.0,
    )
    terms = attack.objective(x, y)
    _assert_close(terms["lsim_honest"], honest, 1e-9, "honest Lsim")
    assert abs(float(terms["lsim_calibrated"]) - float(terms["lsim_honest"])) > 1e-6  # d != 1 matters


@pytest.mark.heavy
@pytest.mark.parametrize("victim", ["femnist50", "cifar10"])
def test_nlsme_objective_matches_literal_loop(victim, request):
    attack, model, shapes, x, y = _setup(request.getfixturevalue(victim), "nlsme")
    terms = attack.objective(x, y)
    leaves = [x, attack.control_point, attack.calibration, attack.position]
    grads = torch.autograd.grad(terms["loss"], leaves)
    refs = [_leaf(v) for v in leaves]
    ref = _nlsme_reference(
        model,
        unflatten(attack.w0, shapes),
        unflatten(attack.wT, shapes),
        unflatten(refs[1], shapes),
        unflatten(refs[2], shapes),
        refs[3],
        refs[0],
        y,
        attack.config,
    )
    ref_grads = torch.autograd.grad(ref, refs)
    _assert_close(terms["loss"], ref, 1e-9, "loss")
    for g, r, name in zip(grads, ref_grads, ["X_hat", "P1", "d", "t"]):
        _assert_close(g, r, 1e-9, f"dL/d{name}")


@pytest.mark.heavy
@pytest.mark.parametrize("victim", ["femnist50", "cifar10"])
def test_sme_objective_matches_literal_loop(victim, request):
    attack, model, shapes, x, y = _setup(request.getfixturevalue(victim), "sme")
    terms = attack.objective(x, y)
    g_x, g_a = torch.autograd.grad(terms["loss"], [x, attack.alpha])
    x_ref, a_ref = _leaf(x), _leaf(attack.alpha)
    ref = _sme_reference(
        model, unflatten(attack.w0, shapes), unflatten(attack.wT, shapes), a_ref, x_ref, y, attack.config
    )
    r_x, r_a = torch.autograd.grad(ref, [x_ref, a_ref])
    _assert_close(terms["loss"], ref, 1e-9, "loss")
    _assert_close(g_x, r_x, 1e-9, "dL/dX_hat")
    _assert_close(g_a, r_a, 1e-9, "dL/dalpha")
    assert float(terms["lsim_honest"]) == float(terms["lsim_calibrated"])  # no calibration in SME


@pytest.mark.heavy
@pytest.mark.parametrize("victim", ["femnist50", "cifar10"])
def test_ig_objective_matches_literal_loop(victim, request):
    attack, model, shapes, x, y = _setup(request.getfixturevalue(victim), "ig")
    terms = attack.objective(x, y)
    (g_x,) = torch.autograd.grad(terms["loss"], [x])
    x_ref = _leaf(x)
    ref = _ig_reference(model, unflatten(attack.w0, shapes), unflatten(attack.wT, shapes), x_ref, y, attack.config)
    (r_x,) = torch.autograd.grad(ref, [x_ref])
    _assert_close(terms["loss"], ref, 1e-9, "loss")
    _assert_close(g_x, r_x, 1e-9, "dL/dX_hat")


def test_pisme_with_true_images_beats_random_images(femnist50):
    """Sanity of the objective on real data: the true batch matches delta_w far better than noise."""
    update, images, labels = femnist50
    attack, _, _, x, y = _setup(femnist50, "pisme", nodes=3, dtype=torch.float32)
    truth = get_spec("femnist").normalize(images)
    with torch.no_grad():
        attack.control_point.copy_(attack.anchor)
        attack.calibration.fill_(1.0)
    assert float(attack.objective(truth, labels)["lsim_honest"]) < 0.05
    assert float(attack.objective(x.detach(), y)["lsim_honest"]) > 0.2


# --- the harness: reconstruct() --------------------------------------------------------------------


FAST = dict(iterations=8, nodes=2, trace_every=3, device="cpu")


@pytest.mark.heavy
@pytest.mark.parametrize("method", sorted(ATTACKS))
def test_each_method_lowers_its_honest_lsim(femnist_small, method):
    update = femnist_small[0]
    rec = reconstruct(update, method, **{**FAST, "iterations": 10, "lr_decay": False})
    assert rec.method == method
    assert rec.images.shape == (10, 1, 28, 28) and rec.images.dtype == torch.float32
    assert float(rec.images.min()) >= 0 and float(rec.images.max()) <= 1
    if method == "dimitrov":  # its own match, L2 of the simulated update; its prior dominates its first steps
        first, last = rec.trace[0]["update_distance"], rec.trace[-1]["update_distance"]
        assert last < 0.95 * first, (first, last)
    else:
        assert rec.lsim_honest < rec.trace[0]["lsim_honest"] - 0.05, (rec.trace[0]["lsim_honest"], rec.lsim_honest)
    assert 0 <= rec.lsim_honest <= 2 and 0 <= rec.lsim_calibrated <= 2


def _spy_optimizers(monkeypatch):
    seen = {}
    original = api.build_optimizers

    def spy(x, attack, config):
        seen["x"], seen["attack"] = x, attack
        seen["optimizers"] = original(x, attack, config)
        return seen["optimizers"]

    monkeypatch.setattr(api, "build_optimizers", spy)
    return seen


@pytest.mark.heavy
@pytest.mark.parametrize("clamp", [True, False])
def test_box_clamp_keeps_x_hat_in_the_pixel_box(femnist_small, monkeypatch, clamp):
    seen = _spy_optimizers(monkeypatch)
    reconstruct(femnist_small[0], "ig", box_clamp=clamp, **FAST)
    lo, hi = get_spec("femnist").pixel_box()
    x = seen["x"].detach()
    inside = bool(((x >= lo - 1e-6) & (x <= hi + 1e-6)).all())
    assert inside == clamp  # without the clamp the N(0, I) start leaves the FEMNIST box [-6.11, 0.227]


@pytest.mark.heavy
def test_lr_decay_milestones(femnist_small, monkeypatch):
    assert lr_milestones(1000) == [375, 625, 875]
    assert lr_milestones(8) == [3, 5, 7]
    assert lr_milestones(300) == [112, 187, 262]
    seen = _spy_optimizers(monkeypatch)
    reconstruct(femnist_small[0], "pisme", **FAST)  # 8 iterations: three drops of x0.1
    lrs = [g["lr"] for o in seen["optimizers"] for g in o.param_groups]
    config = AttackConfig()
    assert lrs == pytest.approx([config.lr_images * 1e-3, config.lr_control_point * 1e-3, config.lr_calibration * 1e-3])
    reconstruct(femnist_small[0], "pisme", lr_decay=False, **FAST)
    lrs = [g["lr"] for o in seen["optimizers"] for g in o.param_groups]
    assert lrs == pytest.approx([config.lr_images, config.lr_control_point, config.lr_calibration])


@pytest.mark.heavy
def test_control_point_sgd_optimizer(femnist_small, monkeypatch):
    seen = _spy_optimizers(monkeypatch)
    reconstruct(femnist_small[0], "pisme", control_point_optimizer="sgd", lr_decay=False, **FAST)
    kinds = [type(o).__name__ for o in seen["optimizers"]]
    assert kinds == ["Adam", "SGD"]
    assert seen["optimizers"][1].param_groups[0]["params"][0] is seen["attack"].control_point


COMMON_KEYS = {"iteration", "loss", "lsim_honest", "lsim_calibrated", "tv", "probe"}
METHOD_KEYS = {
    "pisme": {"control_point_shift", "calibration_mean"},
    "nlsme": {"control_point_shift", "calibration_mean", "position"},
    "sme": {"alpha"},
    "ig": set(),
}


def test_the_paper_methods_are_registered():
    assert set(METHOD_KEYS) <= set(ATTACKS)


@pytest.mark.heavy
@pytest.mark.parametrize("method", sorted(METHOD_KEYS))
def test_trace_keys_every_trace_every(femnist_small, method):
    calls = []

    def callback(iteration, images):
        calls.append((iteration, images.shape, float(images.min()), float(images.max())))
        return {"probe": iteration}

    rec = reconstruct(femnist_small[0], method, callback=callback, **{**FAST, "iterations": 5})
    assert [row["iteration"] for row in rec.trace] == [0, 3, 4]  # every 3, and always the last
    for row in rec.trace:
        assert set(row) == COMMON_KEYS | METHOD_KEYS[method]
        assert row["probe"] == row["iteration"]
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in row.values())
    # the callback sees images in [0,1], NCHW
    assert [c[0] for c in calls] == [0, 3, 4]
    assert all(c[1] == (10, 1, 28, 28) and c[2] >= 0 and c[3] <= 1 for c in calls)


def test_label_sources(femnist_small):
    update, _, truth = femnist_small
    oracle = reconstruct(update, "ig", labels=truth, **{**FAST, "iterations": 1})
    assert oracle.label_source == "oracle" and torch.equal(oracle.labels, truth)
    recovered = reconstruct(update, "ig", **{**FAST, "iterations": 1})
    assert recovered.label_source == "recovered" and recovered.labels.shape == truth.shape
    with pytest.raises(ValueError, match="oracle labels must be 10 class ids"):
        reconstruct(update, "ig", labels=truth[:5], **FAST)
    with pytest.raises(ValueError, match="oracle labels must be 10 class ids"):
        reconstruct(update, "ig", labels=torch.full((10,), 62), **FAST)
    with pytest.raises(ValueError, match="labels must be 'recovered' or 'oracle', got 'true'"):
        reconstruct(update, "ig", labels="true", **FAST)
    with pytest.raises(ValueError, match="reconstruct takes oracle labels as the labels themselves"):
        reconstruct(update, "ig", labels="oracle", **FAST)


@pytest.mark.heavy
def test_identical_seeds_give_identical_results(femnist_small):
    update = femnist_small[0]
    a = reconstruct(update, "pisme", **FAST)
    b = reconstruct(update, "pisme", **FAST)
    c = reconstruct(update, "pisme", seed=1, **FAST)
    assert torch.equal(a.images, b.images) and a.lsim_honest == b.lsim_honest
    assert a.trace == b.trace
    assert not torch.equal(a.images, c.images)
    assert a.config["seed"] == 0 and c.config["seed"] == 1 and a.config["nodes"] == 2


def test_unknown_method_lists_the_choices(femnist_small):
    with pytest.raises(ValueError, match="unknown attack method 'dlgx'; choose from: ") as info:
        reconstruct(femnist_small[0], "dlgx")
    assert info.value.args[0].split("choose from: ")[1].split(", ") == sorted(ATTACKS)


CHOICES = "dggi, dimitrov, ginas, ig, nlsme, pisme, pisme-adaptive, sme"


@pytest.mark.parametrize(
    "text, message",
    [
        (" , ", f"where: no attack method given; choose from: {CHOICES}"),
        ("pisme,dlg", f"where: unknown attack method 'dlg'; choose from: {CHOICES}"),
        ("pisme, ig,pisme", "where: method 'pisme' is listed more than once in 'pisme, ig,pisme'"),
    ],
)
def test_the_one_method_list_check(text, message):
    assert parse_methods(" pisme, ig ") == ("pisme", "ig")
    with pytest.raises(ValueError) as info:
        parse_methods(text, "where")
    assert str(info.value) == message


def test_gradients_per_iteration_is_the_attacks_own():
    config = AttackConfig(nodes=5)
    assert [get_attack(m).gradients_per_iteration(config) for m in ("ig", "sme", "nlsme", "pisme")] == [1, 1, 1, 5]
    trace = [{"iteration": 0, "nodes": 2}, {"iteration": 10, "nodes": 5}, {"iteration": 20}]
    assert get_attack("pisme-adaptive").gradients_per_iteration(config, trace) == 3.5
    assert get_attack("pisme-adaptive").gradients_per_iteration({"nodes": 4}) == 4  # no trace: its largest m


def test_unknown_override_is_rejected(femnist_small):
    with pytest.raises(ValueError, match=r"unknown attack setting\(s\) \['learning_rate'\]"):
        reconstruct(femnist_small[0], "pisme", learning_rate=0.1)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(nodes=0), "quadrature nodes m must be an integer >= 1"),
        (dict(nodes=2.5), "quadrature nodes m must be an integer >= 1"),
        (dict(iterations=0), "iterations must be an integer >= 1"),
        (dict(tv_reduction="max"), "tv_reduction must be 'mean' or 'sum'"),
        (dict(control_point_optimizer="lbfgs"), "control_point_optimizer must be 'adam' or 'sgd'"),
        (dict(trace_every=0), "trace_every must be >= 1"),
        (dict(lr_images=-1.0), "lr_images must be >= 0"),
    ],
)
def test_bad_settings_are_rejected(femnist_small, bad, message):
    with pytest.raises(ValueError, match=message):
        reconstruct(femnist_small[0], "pisme", **bad)


def test_update_type_and_device_are_checked(femnist_small):
    with pytest.raises(TypeError, match="update must be an ObservedUpdate"):
        reconstruct({"w0": {}}, "ig")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        reconstruct(femnist_small[0], "ig", device="tpu", iterations=1)
    assert isinstance(femnist_small[0], ObservedUpdate)
