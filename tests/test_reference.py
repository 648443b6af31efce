"""tests/reference.py against the shipped attack, piece by piece and over a few whole steps.

The reference imports nothing from fl_attack (checked here), so each comparison below sets two
independent implementations of the same formula side by side: the Gauss-Legendre rule, Lsim, TV
(both reductions) and the projections of d, SME's alpha and NL-SME's t.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from fl_attack import AttackConfig
from fl_attack.attacks import get_attack
from fl_attack.attacks.base import lsim, total_variation
from fl_attack.data import client_partition, get_spec, load_pool
from fl_attack.models import build_model
from fl_attack.quadrature import gauss_legendre
from fl_attack.training import train_local
from fl_attack.update import flatten, layout
from tests import reference as R


@pytest.fixture(scope="module")
def victim():
    """A real FEMNIST writer, k=6, B=3, E=1 (T=2 local SGD steps at the paper's lr 0.004)."""
    split = client_partition(load_pool("femnist"), 0, 6)
    result = train_local(
        build_model("femnist", seed=0),
        split.train.images,
        split.train.labels,
        dataset="femnist",
        lr=0.004,
        batch_size=3,
        local_epochs=1,
    )
    return result.update, split.train.images, split.train.labels


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
