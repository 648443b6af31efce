"""Gauss-Legendre quadrature on [0,1] and the Bezier surrogate path (PI-SME eqs. 4-8)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.func import grad

from fl_attack.attacker.quadrature import bezier_coefficients, bezier_path, gauss_legendre, linear_path, midpoint

ORDERS = list(range(1, 13))


@pytest.mark.parametrize("m", ORDERS)
def test_weights_sum_to_one_and_nodes_inside(m):
    t, c = gauss_legendre(m)
    assert t.shape == c.shape == (m,)
    assert t.dtype == c.dtype == torch.float64
    assert abs(float(c.sum()) - 1.0) < 1e-14
    assert bool((c > 0).all())
    assert bool(((t > 0) & (t < 1)).all())
    assert bool((t[1:] > t[:-1]).all())  # distinct, increasing
    # symmetric about 1/2
    torch.testing.assert_close(t + t.flip(0), torch.ones(m, dtype=torch.float64), rtol=0, atol=1e-14)


@pytest.mark.parametrize("m", ORDERS)
def test_exact_up_to_degree_2m_minus_1_and_not_at_2m(m):
    t, c = gauss_legendre(m)
    for d in range(2 * m):
        approx = float((c * t**d).sum())
        assert approx == pytest.approx(1 / (d + 1), abs=1e-14), f"m={m} fails at degree {d}"
    # degree 2m: the classical error term (m!)^4 / ((2m+1) ((2m)!)^2) on [0,1] for f = x^(2m)
    error = 1 / (2 * m + 1) - float((c * t ** (2 * m)).sum())
    expected = math.factorial(m) ** 4 / ((2 * m + 1) * math.factorial(2 * m) ** 2)
    assert error > 0
    assert error == pytest.approx(expected, rel=1e-2)


@pytest.mark.parametrize("bad", [0, -3, 2.0, 1.5, "7", None])
def test_bad_number_of_nodes_raises(bad):
    with pytest.raises(ValueError, match="quadrature nodes m must be an integer >= 1"):
        gauss_legendre(bad)


def test_numpy_integer_nodes_accepted():
    t, _ = gauss_legendre(np.int64(4))
    assert t.shape == (4,)


def _weights(p=257, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(p, generator=gen, dtype=torch.float64) for _ in range(3)]


def test_bezier_endpoints_and_shapes():
    w0, p1, wT = _weights()
    torch.testing.assert_close(bezier_path(torch.tensor(0.0), w0, p1, wT), w0, rtol=0, atol=0)
    torch.testing.assert_close(bezier_path(torch.tensor(1.0), w0, p1, wT), wT, rtol=0, atol=0)
    assert bezier_path(0.3, w0, p1, wT).shape == w0.shape
    assert bezier_path(torch.tensor([0.1, 0.5, 0.9]), w0, p1, wT).shape == (3, w0.numel())
    coef = bezier_coefficients(torch.linspace(0, 1, 11, dtype=torch.float64))
    torch.testing.assert_close(coef.sum(-1), torch.ones(11, dtype=torch.float64))  # a partition of unity


def test_midpoint_control_point_gives_the_straight_line():
    w0, _, wT = _weights()
    t = torch.linspace(0, 1, 17, dtype=torch.float64)
    curve = bezier_path(t, w0, midpoint(w0, wT), wT)
    line = torch.stack([linear_path(s, w0, wT) for s in t])
    torch.testing.assert_close(curve, line, rtol=0, atol=1e-14)


def test_bezier_is_differentiable_in_t_and_control_point():
    w0, p1, wT = _weights()
    p1 = p1.clone().requires_grad_(True)
    t = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    bezier_path(t, w0, p1, wT).sum().backward()
    torch.testing.assert_close(p1.grad, torch.full_like(p1, 2 * 0.7 * 0.3))
    # d/dt w(t) = 2(1-t)(P1-w0) + 2t(wT-P1)
    expected = (2 * 0.7 * (p1 - w0) + 2 * 0.3 * (wT - p1)).sum()
    assert float(t.grad) == pytest.approx(float(expected.detach()), rel=1e-12)


# --- the integrated gradient of a loss quadratic in w ------------------------------------------


def _quadratic_loss(p=40, n=60, seed=1):
    """L(w) = 0.5 mean_i (x_i.w - y_i)^2, a linear model under MSE: grad L(w) = A w - b is linear."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, p, generator=gen, dtype=torch.float64)
    y = torch.randn(n, generator=gen, dtype=torch.float64)

    def loss(w):
        return 0.5 * ((x @ w - y) ** 2).mean()

    return loss, p


def _integrated_gradient(loss, w0, p1, wT, m):
    t, c = gauss_legendre(m)
    path = bezier_path(t, w0, p1, wT)  # (m, P)
    return sum(ci * grad(loss)(wi) for ci, wi in zip(c, path))


@pytest.mark.parametrize("m", [2, 3, 5, 7, 12])
def test_straight_path_integrated_gradient_is_the_midpoint_gradient(m):
    loss, p = _quadratic_loss()
    w0, _, wT = _weights(p, seed=2)
    g = _integrated_gradient(loss, w0, midpoint(w0, wT), wT, m)
    torch.testing.assert_close(g, grad(loss)(midpoint(w0, wT)), rtol=0, atol=1e-10)


@pytest.mark.parametrize("m", [2, 3, 7])
def test_curved_path_integrated_gradient_is_exact_from_two_nodes(m):
    """On the Bezier path grad L(w(t)) is quadratic in t, so m >= 2 nodes integrate it exactly:
    int_0^1 w(t) dt = (w0 + P1 + wT)/3 and the path average is grad L at that point."""
    loss, p = _quadratic_loss()
    w0, p1, wT = _weights(p, seed=3)
    g = _integrated_gradient(loss, w0, p1, wT, m)
    torch.testing.assert_close(g, grad(loss)((w0 + p1 + wT) / 3), rtol=0, atol=1e-10)


def test_one_node_is_not_exact_on_a_curved_path():
    loss, p = _quadratic_loss()
    w0, p1, wT = _weights(p, seed=3)
    g = _integrated_gradient(loss, w0, p1, wT, 1)
    assert float((g - grad(loss)((w0 + p1 + wT) / 3)).abs().max()) > 1e-3
