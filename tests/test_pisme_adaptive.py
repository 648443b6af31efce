"""pisme-adaptive: the quadrature-error estimate on a real client's batch, the choice of m, the attack."""

from __future__ import annotations

import math

import pytest
import torch

from fl_attack import reconstruct
from fl_attack.attacker.attacks import AttackConfig, get_attack
from fl_attack.attacker.attacks.pisme_adaptive import (
    choose_nodes,
    direction_error,
    quadrature_error,
    surrogate_at_order,
)
from fl_attack.attacker.quadrature import midpoint
from fl_attack.federation.data import client_partition, get_spec, load_bundled
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local
from fl_attack.federation.update import flatten, layout


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a shared 2-core machine more threads oversubscribe it (about 10x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def real_batch(one_thread):
    """A real FEMNIST writer's 8 images after T=10 local SGD steps: (model, shapes, w0, P1, wT, x, y, update)."""
    split = client_partition(load_bundled("femnist"), 0, 8)
    result = train_local(
        build_model("femnist", seed=0),
        split.train.images,
        split.train.labels,
        dataset="femnist",
        batch_size=4,
        local_epochs=5,
    )
    model = build_model("femnist")
    for p in model.parameters():
        p.requires_grad_(False)
    w0, wT = flatten(result.update.w0), flatten(result.update.wT)
    x = get_spec("femnist").normalize(split.train.images)
    return model, layout(result.update.w0), w0, midpoint(w0, wT), wT, x, split.train.labels, result.update


def test_error_estimate_shrinks_with_m_on_a_real_batch(real_batch):
    model, shapes, w0, p1, wT, x, y, _ = real_batch
    cache = {}
    errors = {m: quadrature_error(model, shapes, w0, p1, wT, x, y, m, cache) for m in (1, 2, 4, 8)}
    assert all(0 < e < 2 for e in errors.values())
    assert errors[1] > errors[2] > errors[4] > errors[8], errors
    assert errors[8] < errors[1] / 3, errors
    # the shared cache holds exactly the orders m and 2m+1 that were asked for
    assert sorted(cache) == [1, 2, 3, 4, 5, 8, 9, 17]


def test_estimate_tracks_the_true_error(real_batch):
    """The m vs 2m+1 estimate is within a factor of 2 of the error against a 31-node reference."""
    model, shapes, w0, p1, wT, x, y, _ = real_batch
    reference = surrogate_at_order(model, shapes, w0, p1, wT, x, y, 31)
    for m in (1, 2, 4):
        true = direction_error(surrogate_at_order(model, shapes, w0, p1, wT, x, y, m), reference)
        estimate = quadrature_error(model, shapes, w0, p1, wT, x, y, m)
        assert true / 2 < estimate < 2 * true, (m, true, estimate)


def test_direction_error_ignores_scale_and_is_bounded():
    g = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert direction_error(3 * g, g) == pytest.approx(0, abs=1e-6)  # float32 rounding of 3*g
    assert direction_error(-g, g) == pytest.approx(2, abs=1e-6)


def test_choose_nodes_takes_the_smallest_m_within_tolerance(real_batch):
    model, shapes, w0, p1, wT, x, y, _ = real_batch
    errors = {m: quadrature_error(model, shapes, w0, p1, wT, x, y, m) for m in range(1, 5)}
    tolerance = (errors[2] + errors[1]) / 2  # between m=1 and m=2 (errors[1] > errors[2], tested above)
    m, error, cost = choose_nodes(model, shapes, w0, p1, wT, x, y, tolerance, max_nodes=4)
    assert m == min(k for k in errors if errors[k] <= tolerance)
    assert error == pytest.approx(errors[m])
    assert cost == sum({1, 3, 2, 5} if m == 2 else {1, 3})
    # nothing meets a tiny tolerance: the largest m allowed is used
    m, error, _ = choose_nodes(model, shapes, w0, p1, wT, x, y, 1e-9, max_nodes=3)
    assert m == 3 and error == pytest.approx(errors[3])
    # anything meets tolerance 2: one node
    assert choose_nodes(model, shapes, w0, p1, wT, x, y, 2.0, max_nodes=7)[0] == 1


def test_adaptive_attack_runs_and_reports_its_nodes(real_batch):
    update = real_batch[-1]
    rec = reconstruct(update, "pisme-adaptive", iterations=8, nodes=5, node_tolerance=0.05, trace_every=1, device="cpu")
    assert rec.images.shape == (8, 1, 28, 28) and math.isfinite(rec.lsim_honest)
    nodes = [row["nodes"] for row in rec.trace]
    assert all(1 <= m <= 5 for m in nodes)
    # m changes only at the schedule's phases (iterations 0, 3, 5, 7 of 8)
    changes = [row["iteration"] for prev, row in zip(rec.trace, rec.trace[1:]) if row["nodes"] != prev["nodes"]]
    assert set(changes) <= {3, 5, 7}
    evaluations = [row["gradient_evaluations"] for row in rec.trace]
    assert evaluations == sorted(evaluations) and evaluations[-1] > sum(nodes[:-1])


@pytest.mark.parametrize("tolerance, m", [(2.0, 1), (1e-12, 5)])
def test_the_tolerance_sets_the_nodes_the_attack_uses(real_batch, tolerance, m):
    """Any error meets tolerance 2 (one node); none meets 1e-12 (the largest m): m really moves."""
    model, shapes, w0, p1, wT, x, y, _ = real_batch
    config = AttackConfig(iterations=4, nodes=5, node_tolerance=tolerance)
    attack = get_attack("pisme-adaptive")(model, w0, wT, shapes, config)
    attack.surrogate_gradient(x, y)
    assert len(attack.nodes) == m and attack.checks[0][1] == m


def test_adaptive_attack_checks_every_n_iterations(real_batch):
    model, shapes, w0, p1, wT, x, y, _ = real_batch
    config = AttackConfig(iterations=10, nodes=3, node_check_every=4)
    attack = get_attack("pisme-adaptive")(model, w0, wT, shapes, config)
    for _ in range(10):
        attack.surrogate_gradient(x, y)
    assert [it for it, _, _ in attack.checks] == [0, 4, 8]


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(node_tolerance=0.0), "node_tolerance must be > 0"),
        (dict(node_check_every=-1), "node_check_every must be >= 0"),
    ],
)
def test_bad_adaptive_settings_raise(bad, message):
    with pytest.raises(ValueError, match=message):
        AttackConfig(**bad)
