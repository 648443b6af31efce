"""tests/reference.py against the shipped attack, piece by piece and over a few whole steps.

The reference imports nothing from fl_attack (checked here), so each comparison below sets two
independent implementations of the same formula side by side: the Gauss-Legendre rule, Lsim, TV
(both reductions), the projections of d, SME's alpha and NL-SME's t, and finally a few steps of
the whole optimisation (Algorithm 1: Adam, schedule, clamps) against ``fl_attack.reconstruct``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import fl_attack.attacker.api as api
from fl_attack import AttackConfig, reconstruct
from fl_attack.attacker.attacks import get_attack
from fl_attack.attacker.attacks.base import lsim, total_variation
from fl_attack.attacker.quadrature import gauss_legendre
from fl_attack.federation.config import ClientOptimizer
from fl_attack.federation.data import get_spec
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local
from fl_attack.federation.update import flatten, layout
from tests import reference as R
from tests.inprocess import femnist_update

FEMNIST_MEAN, FEMNIST_STD = (0.9642,), (0.1577,)  # docs/PISME.md, "Input normalisation"


@pytest.fixture(scope="module")
def victim():
    """A real FEMNIST writer, k=6, B=3, E=1 (T=2 local SGD steps at the paper's lr 0.004)."""
    update, train = femnist_update(0, 6, batch_size=3, local_epochs=1)
    return update, train.images, train.labels


def _rel_err(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    scale = float(expected.abs().max())
    assert scale > 0, "the reference is identically zero"
    return float((actual - expected).abs().max()) / scale


# --- the reference is independent ------------------------------------------------------------------


def test_reference_imports_nothing_from_fl_attack():
    tree = ast.parse((Path(__file__).parent / "reference.py").read_text())
    imported = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            imported.append("." * node.level + (node.module or ""))
    assert imported, "no imports parsed"
    bad = [name for name in imported if name.split(".")[0] in ("fl_attack", "") or name.startswith(".")]
    assert not bad, f"tests/reference.py imports the code it checks: {bad}"


# --- the pieces --------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", range(1, 13))
def test_gauss_legendre_reference_is_exact_and_matches_shipped(m):
    t_ref, c_ref = R.gauss_legendre_reference(m)
    # the reference on its own: exact for x^d, d <= 2m-1, on [0,1]
    for d in range(2 * m):
        assert float((c_ref * t_ref**d).sum()) == pytest.approx(1 / (d + 1), abs=1e-14), (m, d)
    t, c = gauss_legendre(m)
    torch.testing.assert_close(t, t_ref, rtol=0, atol=1e-14)
    torch.testing.assert_close(c, c_ref, rtol=0, atol=1e-14)


def test_tv_reference_on_a_hand_computed_image():
    x = torch.tensor([[[[0.0, 1.0, 3.0], [2.0, 2.0, 2.0]]]], dtype=torch.float64)  # (1,1,2,3)
    # vertical |2-0| + |2-1| + |2-3| = 4 over 3 pairs; horizontal 1 + 2 + 0 + 0 = 3 over 4 pairs
    assert float(R.total_variation_reference(x, "sum")) == 7.0
    assert float(R.total_variation_reference(x, "mean")) == pytest.approx(4 / 3 + 3 / 4, abs=1e-15)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_tv_reference_matches_shipped(victim, reduction):
    _, images, _ = victim
    spec = get_spec("femnist")
    x = spec.normalize(images.double())  # (6,1,28,28) real handwriting
    noisy = x + torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    for z in (x, noisy):
        ref = R.total_variation_reference(z, reduction)
        assert _rel_err(total_variation(z, reduction), ref) < 1e-13
    # batched over N clients: one value per client, each the client's own
    batch = torch.stack([x, noisy])
    got = total_variation(batch, reduction)
    assert got.shape == (2,)
    for n in range(2):
        assert _rel_err(got[n], R.total_variation_reference(batch[n], reduction)) < 1e-13


def test_lsim_reference_matches_shipped(victim):
    update = victim[0]
    delta_w = flatten(update.w0).double() - flatten(update.wT).double()
    gen = torch.Generator().manual_seed(1)
    others = [torch.randn(delta_w.shape, generator=gen, dtype=delta_w.dtype), delta_w * 3 + 1e-3]
    assert float(R.lsim_reference(delta_w, delta_w)) == pytest.approx(0.0, abs=1e-12)
    assert float(R.lsim_reference(delta_w, -delta_w)) == pytest.approx(2.0, abs=1e-12)
    # the shipped Lsim adds 1e-12 to the product of the norms (|delta_w| is about 1e-2 here): 1e-9 relative
    for b in others:
        assert float(lsim(b, delta_w)) == pytest.approx(float(R.lsim_reference(b, delta_w)), rel=1e-9)
    rows = torch.stack(others)  # (N, P): one value per row
    got = lsim(rows, delta_w.expand_as(rows))
    for n, b in enumerate(others):
        assert float(got[n]) == pytest.approx(float(R.lsim_reference(b, delta_w)), rel=1e-9)


def _attack(victim, method, batch=1):
    update = victim[0]
    model = build_model("femnist")
    w0, wT = flatten(update.w0).double(), flatten(update.wT).double()
    if batch > 1:
        w0, wT = w0.expand(batch, -1).clone(), wT.expand(batch, -1).clone()
    return get_attack(method)(model, w0, wT, layout(update.w0), AttackConfig(calibration_min=0.2, calibration_max=5.0))


@pytest.mark.parametrize("method", ["pisme", "nlsme"])
def test_calibration_clamp_matches_reference(victim, method):
    attack = _attack(victim, method)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        attack.calibration.copy_(-3 + 12 * torch.rand(attack.calibration.shape, generator=gen, dtype=torch.float64))
    before = attack.calibration.detach().clone()
    assert bool((before < 0.2).any()) and bool((before > 5.0).any()) and bool(((before > 0.2) & (before < 5)).any())
    attack.project()
    expected = R.project_calibration_reference({"d": before}, 0.2, 5.0)["d"]
    assert torch.equal(attack.calibration.detach(), expected)


@pytest.mark.parametrize("method, name", [("sme", "alpha"), ("nlsme", "position")])
def test_position_projection_matches_reference(victim, method, name):
    attack = _attack(victim, method, batch=5)
    values = torch.tensor([-0.4, 0.0, 0.37, 1.0, 1.6], dtype=torch.float64)
    with torch.no_grad():
        getattr(attack, name).copy_(values)
    attack.project()
    assert torch.equal(getattr(attack, name).detach(), R.project_position_reference(values))
    assert R.project_position_reference(values).tolist() == [0.0, 0.0, 0.37, 1.0, 1.0]


def test_lr_schedule_reference_matches_shipped():
    for iterations in (1, 2, 3, 4, 5, 8, 13, 300):
        x = torch.zeros(1, requires_grad=True)
        opt = torch.optim.Adam([x], lr=1.0)
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, api.lr_milestones(iterations), 0.1)
        for it in range(iterations):
            assert opt.param_groups[0]["lr"] == pytest.approx(R.lr_factor_reference(it, iterations), rel=1e-12), (
                iterations,
                it,
            )
            opt.step()
            sched.step()


# --- a few whole steps: Algorithm 1 against reconstruct ----------------------------------------------

LOOPS = {
    # the paper's settings (m=3 to stay fast), 4 steps: the schedule drops the rates after steps 1, 2, 3
    "paper": dict(nodes=3, iterations=4),
    # eq. 9's summed TV, and d's bounds tight enough that its clamp acts from the first step
    "sum-tv-clamped": dict(
        nodes=2, iterations=4, tv_reduction="sum", tv_weight=1e-4, calibration_min=0.999, calibration_max=1.001
    ),
}


# Two rounding-level choices of the shipped code that eq. 10 does not make: Lsim's denominator gets
# 1e-12 added (a guard against 0/0), and the pixel box is computed in float32 even in float64 runs
# (hi 1.3e-7 below (1 - mean)/std). With both reproduced, the reference and reconstruct agree to
# rounding (measured: X_hat 2e-13, P1's displacement 2e-10, d's 2e-12 of their largest values); with
# eq. 10 as written they differ by these two choices only (measured: X_hat 1.3e-7, P1 1.2e-5, d 3.4e-6;
# Adam divides P1's tiny gradients by their own size, so a relative change shows there most).
SHIPPED_ROUNDING = dict(lsim_guard=1e-12, box_dtype=torch.float32)
TIGHT = {"X_hat": 1e-11, "P1": 1e-8, "d": 1e-10}
AS_WRITTEN = {"X_hat": 1e-6, "P1": 1e-4, "d": 1e-4}


@pytest.mark.parametrize("case", sorted(LOOPS))
def test_reference_loop_matches_reconstruct(victim, monkeypatch, case):
    update, _, labels = victim
    settings = LOOPS[case]
    seen = {}
    original = api.build_optimizers

    def spy(x, attack, config):  # keeps a handle on X_hat and the attack, changes nothing
        seen["x"], seen["attack"] = x, attack
        return original(x, attack, config)

    monkeypatch.setattr(api, "build_optimizers", spy)
    rec = reconstruct(update, "pisme", labels=labels, device="cpu", dtype=torch.float64, seed=3, **settings)
    got = {
        "X_hat": seen["x"].detach(),
        "P1": seen["attack"].control_point.detach(),
        "d": seen["attack"].calibration.detach(),
    }

    model = build_model("femnist")
    for p in model.parameters():
        p.requires_grad_(False)
    w0 = {k: v.double() for k, v in update.w0.items()}
    wT = {k: v.double() for k, v in update.wT.items()}
    anchor = torch.cat([((w0[k] + wT[k]) / 2).reshape(-1) for k in w0])
    x0 = torch.randn(len(labels), 1, 28, 28, generator=torch.Generator().manual_seed(3)).double()  # N(0, I)
    defaults = AttackConfig()
    options = dict(
        tv_weight=defaults.tv_weight,
        tv_reduction=defaults.tv_reduction,
        calibration_min=defaults.calibration_min,
        calibration_max=defaults.calibration_max,
    )
    options.update({k: v for k, v in settings.items() if k not in ("nodes", "iterations")})

    def run_reference(**rounding):
        x, p, d = R.pisme_reconstruct_reference(
            model,
            w0,
            wT,
            x0,
            labels,
            settings["nodes"],
            mean=FEMNIST_MEAN,
            std=FEMNIST_STD,
            iterations=settings["iterations"],
            **options,
            **rounding,
        )
        return {
            "X_hat": x,
            "P1": torch.cat([p[k].reshape(-1) for k in w0]),
            "d": torch.cat([d[k].reshape(-1) for k in w0]),
        }

    ref = run_reference(**SHIPPED_ROUNDING)
    # the steps really moved everything, and the clamps acted
    assert float((ref["X_hat"] - x0).abs().max()) > 0.5
    assert float((ref["P1"] - anchor).abs().max()) > 1e-6
    assert float((ref["d"] - 1).abs().max()) > 1e-3
    hi = R.pixel_box_reference(FEMNIST_MEAN, FEMNIST_STD, torch.float32)[1].double()
    assert bool((ref["X_hat"] == hi).any())
    if case == "sum-tv-clamped":
        assert bool((ref["d"] == 0.999).any()) and bool((ref["d"] == 1.001).any())

    # X_hat, and P1 and d as displacements from their start (P1 itself is dominated by w0)
    start = {"X_hat": torch.zeros_like(x0), "P1": anchor, "d": torch.ones_like(anchor)}
    for name, tol in TIGHT.items():
        err = _rel_err(got[name] - start[name], ref[name] - start[name])
        assert err < tol, f"{name}: {err:.3g} of its largest displacement"
    # the images reconstruct returns are that X_hat, denormalised, in [0,1]
    images = (ref["X_hat"] * FEMNIST_STD[0] + FEMNIST_MEAN[0]).clamp(0, 1).float()
    assert float((rec.images - images).abs().max()) < 1e-6
    # eq. 10 as written: the two rounding choices move nothing beyond rounding noise
    as_written = run_reference()
    for name, tol in AS_WRITTEN.items():
        err = _rel_err(got[name] - start[name], as_written[name] - start[name])
        assert err < tol, f"{name} against eq. 10 as written: {err:.3g}"


# --- several updates of one client: the joint attack against the same loop --------------------------


@pytest.fixture(scope="module")
def second_update(victim):
    """The same writer's samples one round later: trained again from the first update's wT."""
    update, images, labels = victim
    model = build_model("femnist", seed=0)
    model.load_state_dict(update.wT)
    return train_local(model, images, labels, dataset="femnist", lr=0.01, batch_size=3, local_epochs=1).update


def test_joint_reference_loop_matches_reconstruct(victim, second_update, monkeypatch):
    """Two updates, unequal weights, float64: one X_hat and each update's own P1 and d agree with the
    literal loop (one autograd call per node per update) to rounding."""
    update, _, labels = victim
    seen = {}
    original = api.build_optimizers

    def spy(x, attack, config):
        seen["x"], seen["attack"] = x, attack
        return original(x, attack, config)

    monkeypatch.setattr(api, "build_optimizers", spy)
    settings = dict(nodes=3, iterations=4)
    rec = reconstruct(
        [update, second_update],
        "pisme",
        labels=labels,
        weights=[3, 1],
        device="cpu",
        dtype=torch.float64,
        seed=3,
        **settings,
    )
    assert len(rec.lsim_per_update) == 2
    attacks = seen["attack"].attacks
    model = build_model("femnist")
    for p in model.parameters():
        p.requires_grad_(False)
    pairs = [
        ({k: v.double() for k, v in u.w0.items()}, {k: v.double() for k, v in u.wT.items()})
        for u in (update, second_update)
    ]
    x0 = torch.randn(len(labels), 1, 28, 28, generator=torch.Generator().manual_seed(3)).double()
    defaults = AttackConfig()
    x, points, calibrations = R.pisme_joint_reconstruct_reference(
        model,
        pairs,
        [0.75, 0.25],
        x0,
        labels,
        3,
        mean=FEMNIST_MEAN,
        std=FEMNIST_STD,
        iterations=4,
        tv_weight=defaults.tv_weight,
        **SHIPPED_ROUNDING,
    )
    assert _rel_err(seen["x"].detach(), x) < TIGHT["X_hat"]
    for j, (w0, wT) in enumerate(pairs):
        anchor = torch.cat([((w0[k] + wT[k]) / 2).reshape(-1) for k in w0])
        p_ref = torch.cat([points[j][k].reshape(-1) for k in w0])
        d_ref = torch.cat([calibrations[j][k].reshape(-1) for k in w0])
        assert float((p_ref - anchor).abs().max()) > 1e-6  # each path moved on its own
        assert _rel_err(attacks[j].control_point.detach() - anchor, p_ref - anchor) < TIGHT["P1"]
        assert _rel_err(attacks[j].calibration.detach() - 1, d_ref - 1) < TIGHT["d"]


def test_one_update_joint_call_is_the_single_attack_exactly(victim):
    """A list of one update (any weight) is today's reconstruct, bit for bit."""
    update, _, _ = victim
    single = reconstruct(update, "pisme", device="cpu", iterations=6, nodes=3, seed=1)
    listed = reconstruct([update], "pisme", weights=[5.0], device="cpu", iterations=6, nodes=3, seed=1)
    assert torch.equal(single.images, listed.images) and torch.equal(single.labels, listed.labels)
    assert single.lsim_honest == listed.lsim_honest and listed.lsim_per_update == [single.lsim_honest]


@pytest.mark.parametrize("method", ["ig", "sme", "nlsme", "pisme"])
def test_joint_attack_of_every_method_weighs_each_update(victim, second_update, method):
    """Every method runs on several updates through the one loop: an update at weight 0 changes
    nothing (X_hat is the other update's attack exactly), and at a real weight it changes X_hat."""
    update, _, _ = victim
    run = dict(device="cpu", iterations=5, nodes=2, seed=2, labels="recovered")
    alone = reconstruct(update, method, **run)
    ignored = reconstruct([update, second_update], method, weights=[1, 0], **run)
    both = reconstruct([update, second_update], method, weights=[1, 1], **run)
    assert torch.equal(alone.images, ignored.images)
    assert float((both.images - alone.images).abs().max()) > 1e-3
    assert len(both.lsim_per_update) == 2 and all(0 <= v <= 2 for v in both.lsim_per_update)


# --- the optimizer-aware objective (docs/PISME.md, "Optimizers") ------------------------------------

OPTIMIZERS = {
    "momentum+wd": ClientOptimizer("momentum", momentum=0.9, weight_decay=5e-3),
    "nesterov+wd": ClientOptimizer("nesterov", momentum=0.8, weight_decay=1e-2),
}


def test_step_weights_reference_is_the_closed_form():
    """The recursion run on unit gradients gives docs/PISME.md's closed forms: heavy ball
    (1 - beta^(T-r+1)) / (1 - beta), Nesterov 1 + beta (1 - beta^(T-r+1)) / (1 - beta), SGD 1."""
    T, beta = 7, 0.9
    tail = torch.tensor([(1 - beta ** (T - r + 1)) / (1 - beta) for r in range(1, T + 1)], dtype=torch.float64)
    assert torch.allclose(R.step_weights_reference("momentum", beta, T), tail, rtol=1e-12)
    assert torch.allclose(R.step_weights_reference("nesterov", beta, T), 1 + beta * tail, rtol=1e-12)
    assert torch.equal(R.step_weights_reference("sgd", beta, T), torch.ones(T, dtype=torch.float64))


@pytest.mark.parametrize("regime", sorted(OPTIMIZERS))
def test_the_optimizer_aware_objective_matches_the_extended_reference(regime):
    """PI-SME's objective on a real momentum (Nesterov) + weight-decay update, float64, at a point
    where P1 and d have left their start: its value and its gradients with respect to X_hat, P1 and
    d equal the literal node-by-node reference with the step weights run out of the optimizer's
    recursion and lambda w(t_i) added (tests/reference.py imports nothing of fl_attack). The naive
    reference (plain SGD's eq. 8) differs, so the comparison can tell them apart."""
    opt = OPTIMIZERS[regime]
    update, train = femnist_update(1, 6, batch_size=2, local_epochs=2, lr=0.01, optimizer=opt)
    T, labels = update.metadata.local_steps, train.labels
    assert T == 6 and update.metadata.optimizer == opt
    model = build_model("femnist")
    for p in model.parameters():
        p.requires_grad_(False)
    w0, wT = flatten(update.w0).double(), flatten(update.wT).double()
    attack = get_attack("pisme")(model, w0, wT, layout(update.w0), AttackConfig(nodes=3), training=update.metadata)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 1, 28, 28, generator=gen, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        attack.control_point += 1e-3 * torch.randn(w0.shape, generator=gen, dtype=torch.float64)
        attack.calibration.copy_(1 + 0.2 * torch.rand(w0.shape, generator=gen, dtype=torch.float64))
    shipped = attack.objective(x, labels)["loss"]
    grads = torch.autograd.grad(shipped, [x, attack.control_point, attack.calibration])

    def as_dict(flat):
        out, i = {}, 0
        for k, v in update.w0.items():
            out[k] = flat[i : i + v.numel()].view(v.shape)
            i += v.numel()
        return out

    x_ref = x.detach().clone().requires_grad_(True)
    p_ref = attack.control_point.detach().clone().requires_grad_(True)
    d_ref = attack.calibration.detach().clone().requires_grad_(True)

    def reference(**optimizer):
        return R.pisme_objective_reference(
            model,
            as_dict(w0),
            as_dict(wT),
            as_dict(p_ref),
            as_dict(d_ref),
            x_ref,
            labels,
            3,
            lsim_guard=1e-12,
            **optimizer,
        )

    step_weights = R.step_weights_reference(opt.name, opt.momentum, T)
    expected = reference(step_weights=step_weights, weight_decay=opt.weight_decay)
    ref_grads = torch.autograd.grad(expected, [x_ref, p_ref, d_ref])
    assert float(shipped.detach()) == pytest.approx(float(expected.detach()), rel=1e-10)
    for name, got, want in zip(("X_hat", "P1", "d"), grads, ref_grads):
        assert _rel_err(got, want) < 1e-8, name
    naive = reference()
    assert abs(float(naive.detach()) - float(expected.detach())) > 1e-4 * abs(float(expected.detach()))
