"""The surrogate-gradient engine: the structured fast path against the generic one, its custom
autograd Functions against finite differences, and the benchmark that times it.

The literal Algorithm-1 comparison of the whole PI-SME objective lives in tests/test_attacks.py;
here each rewrite is checked on its own, in float64, on a real client update.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fl_attack.attacker.attacks import gradients
from fl_attack.attacker.attacks.gradients import avg_pool2, conv2d, path_gradient, relu
from fl_attack.attacker.quadrature import bezier_coefficients, gauss_legendre
from fl_attack.federation.data import client_partition, get_spec, load_pool
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local
from fl_attack.federation.update import flatten, layout
from tests.user_models import PlainPaperCNN


@pytest.fixture(scope="module", params=["femnist", "cifar100"])
def real_update(request):
    """A real client update (k=6, B=3, E=1: T=2) of a narrowed victim, in float64, and its batch."""
    dataset = request.param
    split = client_partition(load_pool(dataset), 1, 6)
    model = build_model(dataset, seed=0, width=8)
    update = train_local(
        model, split.train.images, split.train.labels, dataset=dataset, batch_size=3, local_epochs=1
    ).update
    victim = build_model(dataset, width=8).double()
    for p in victim.parameters():
        p.requires_grad_(False)
    w0, wT = flatten(update.w0).double(), flatten(update.wT).double()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, *get_spec(dataset).image_shape, generator=gen, dtype=torch.float64)
    return victim, layout(update.w0), w0, wT, x, split.train.labels


def _grads(model, shapes, anchors, basis, coeffs, x, y, probe):
    """G and the gradient of <probe, G> with respect to x, every anchor and the basis (double backward)."""
    g = path_gradient(model, shapes, anchors, basis, coeffs, x, y)
    wrt = [x] + [a for a in anchors if a.requires_grad] + ([basis] if basis is not None and basis.requires_grad else [])
    return [g] + list(torch.autograd.grad((g * probe).sum(), wrt))


@pytest.mark.parametrize("path", ["bezier-m3", "line-learned-alpha", "bezier-learned-t", "given-nodes"])
def test_structured_path_equals_generic_path(real_update, path):
    model, shapes, w0, wT, x, y = real_update
    assert gradients._is_paper_cnn(model, shapes, x)
    assert not gradients._is_paper_cnn(PlainPaperCNN(model), shapes, x)
    gen = torch.Generator().manual_seed(1)
    control_point = ((w0 + wT) / 2 + 1e-3 * torch.randn(w0.shape, generator=gen, dtype=w0.dtype)).requires_grad_(True)
    x = x.clone().requires_grad_(True)
    if path == "bezier-m3":
        t, c = gauss_legendre(3)
        anchors, basis, coeffs = [w0, control_point, wT], bezier_coefficients(t), c
    elif path == "line-learned-alpha":
        alpha = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        anchors, basis, coeffs = (
            [w0, wT],
            torch.stack([1 - alpha, alpha]).reshape(1, 2),
            torch.ones(1, dtype=torch.float64),
        )
    elif path == "bezier-learned-t":
        t = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
        anchors, basis, coeffs = [w0, control_point, wT], bezier_coefficients(t), torch.ones(1, dtype=torch.float64)
    else:
        anchors, basis, coeffs = [w0, control_point * 1.0], None, torch.tensor([0.25, 0.75], dtype=torch.float64)
    probe = torch.randn(w0.shape, generator=gen, dtype=w0.dtype)
    fast = _grads(model, shapes, anchors, basis, coeffs, x, y, probe)
    slow = _grads(PlainPaperCNN(model), shapes, anchors, basis, coeffs, x, y, probe)
    for name, f, s in zip(["G", "d/dX", "d/danchor", "d/dbasis"], fast, slow):
        f, s = f.detach(), s.detach()
        scale = float(s.abs().max())
        assert scale > 0, name
        assert float((f - s).abs().max()) <= 1e-10 * scale, name


def test_structured_path_runs_channels_last_end_to_end(real_update, monkeypatch):
    """Rewrite 6: every pooling, forward and backward, sees NHWC tensors, also for FEMNIST's 1-channel
    input (whose plain .contiguous(channels_last) would keep NCHW strides)."""
    model, shapes, w0, wT, x, y = real_update
    seen = []
    original = gradients._is_nhwc
    monkeypatch.setattr(gradients, "_is_nhwc", lambda t: seen.append(original(t)) or seen[-1])
    control_point = ((w0 + wT) / 2).requires_grad_(True)
    t, c = gauss_legendre(3)
    g = path_gradient(
        model, shapes, [w0, control_point, wT], bezier_coefficients(t), c, x.clone().requires_grad_(True), y
    )
    torch.autograd.grad(g.sum(), [control_point])
    assert seen and all(seen), f"{seen.count(False)} of {len(seen)} poolings saw NCHW"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_structured_path_on_cuda_equals_cpu(real_update):
    """The GPU path (cuDNN, channels_last) computes the CPU's G and double backward, in float64."""
    model, shapes, w0, wT, x, y = real_update
    gen = torch.Generator().manual_seed(1)
    control_point = (w0 + wT) / 2 + 1e-3 * torch.randn(w0.shape, generator=gen, dtype=w0.dtype)
    probe = torch.randn(w0.shape, generator=gen, dtype=w0.dtype)
    t, c = gauss_legendre(3)
    basis = bezier_coefficients(t)
    results = []
    for device in ("cpu", "cuda"):  # copies: the module's shared fixture stays on the CPU, without grad
        move = lambda v, device=device: v.detach().to(device, copy=True)  # noqa: E731
        anchors = [move(w0), move(control_point).requires_grad_(True), move(wT)]
        out = _grads(
            copy.deepcopy(model).to(device),
            shapes,
            anchors,
            move(basis),
            move(c),
            move(x).requires_grad_(True),
            move(y),
            move(probe),
        )
        results.append([o.detach().cpu() for o in out])
    for name, on_cpu, on_gpu in zip(["G", "d/dX", "d/dP1"], *results):
        assert float((on_gpu - on_cpu).abs().max()) <= 1e-10 * float(on_cpu.abs().max()), name


def test_path_gradient_rejects_bad_paths(real_update):
    model, shapes, w0, wT, x, y = real_update
    one = torch.ones(1, dtype=torch.float64)
    with pytest.raises(ValueError, match="sum to 1"):
        path_gradient(model, shapes, [w0, wT], torch.tensor([[0.5, 0.6]], dtype=torch.float64), one, x, y)
    with pytest.raises(ValueError, match="shape"):
        path_gradient(model, shapes, [w0, wT], torch.tensor([[1.0]], dtype=torch.float64), one, x, y)
    with pytest.raises(ValueError, match="coeffs"):
        path_gradient(model, shapes, [w0], None, torch.ones(2, dtype=torch.float64), x, y)


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_relu_and_pool_have_torch_values_and_exact_derivatives(layout):
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(2, 3, 6, 4, generator=gen, dtype=torch.float64)
    z = (z + 0.2 * z.sign()).contiguous(memory_format=layout).requires_grad_(True)  # off the kink
    assert torch.equal(relu(z), torch.relu(z))
    pooled = avg_pool2(z)
    assert torch.allclose(pooled, F.avg_pool2d(z, 2), rtol=0, atol=1e-15)
    assert pooled.is_contiguous(memory_format=layout)  # the layout carries through
    assert torch.autograd.gradcheck(lambda u: avg_pool2(relu(u)) ** 2, (z,))
    assert torch.autograd.gradgradcheck(lambda u: avg_pool2(relu(u)) ** 2, (z,))
    # a plainly contiguous cotangent (as from flatten) into a channels_last pooling, and vice versa
    v = torch.randn(2, 3, 3, 2, generator=gen, dtype=torch.float64)
    for cot in (v, v.contiguous(memory_format=torch.channels_last)):
        ours = torch.autograd.grad(avg_pool2(z), z, cot)[0]
        assert torch.allclose(ours, torch.autograd.grad(F.avg_pool2d(z, 2), z, cot)[0], rtol=0, atol=1e-15)
    odd = torch.randn(1, 2, 5, 5, generator=gen, dtype=torch.float64)
    assert torch.equal(avg_pool2(odd), F.avg_pool2d(odd, 2))  # odd sizes fall back to torch


def test_conv2d_second_order_terms_match_torch():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, 6, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(4, 3, 3, 3, generator=gen, dtype=torch.float64)

    def second_order(conv):  # d/d(a, w, b) of <v, d/dw sum(conv(a, w, b)^2)>: a double backward
        out = conv(a, w, b, (1, 1), (1, 1), (1, 1), 1)
        (gw,) = torch.autograd.grad((out**2).sum(), [w], create_graph=True)
        return torch.autograd.grad((gw * v).sum(), [a, w, b])

    ours = second_order(conv2d)
    theirs = second_order(F.conv2d)
    for o, t in zip(ours, theirs):
        assert torch.allclose(o, t, rtol=1e-12, atol=1e-12)


def test_third_order_derivatives_stay_exact(real_update):
    """A Hessian-vector product of <G(x), delta_w> in x: the custom backward passes are themselves
    differentiable, so the structured path agrees with the generic one beyond second order."""
    model, shapes, w0, wT, x, y = real_update
    one = torch.ones(1, dtype=torch.float64)
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=x.dtype)

    def hvp(m):
        fn = lambda z: (path_gradient(m, shapes, [w0], None, one, z, y) * (wT - w0)).sum()
        return torch.autograd.functional.hvp(fn, x.clone(), v)[1]

    fast, slow = hvp(model), hvp(PlainPaperCNN(model))
    assert float(slow.abs().max()) > 0
    assert float((fast - slow).abs().max()) <= 1e-9 * float(slow.abs().max())


def test_structured_path_only_for_the_unchanged_forward(real_update):
    model, shapes, w0, wT, x, y = real_update

    class Leaky(type(model)):
        def forward(self, inp):
            inp = self.pool(F.leaky_relu(self.conv1(inp)))
            inp = self.pool(F.leaky_relu(self.conv2(inp)))
            return self.fc2(F.leaky_relu(self.fc1(inp.flatten(1))))

    leaky = Leaky(**({"width": 8}))
    assert not gradients._is_paper_cnn(leaky, shapes, x)
    circular = build_model("femnist" if x.shape[1] == 1 else "cifar100", width=8)
    circular.conv2.padding_mode = "circular"
    assert not gradients._is_paper_cnn(circular, shapes, x)
    hooked = build_model("femnist" if x.shape[1] == 1 else "cifar100", width=8)
    hooked.conv1.register_forward_hook(lambda mod, inp, out: out)
    assert not gradients._is_paper_cnn(hooked, shapes, x)


def test_path_gradient_under_no_grad_and_input_checks(real_update):
    model, shapes, w0, wT, x, y = real_update
    one = torch.ones(1, dtype=torch.float64)
    g = path_gradient(model, shapes, [w0], None, one, x, y)
    with torch.no_grad():
        g_nograd = path_gradient(model, shapes, [w0], None, one, x, y)
    assert not g.requires_grad and not g_nograd.requires_grad  # nothing asked for a graph
    assert torch.equal(g, g_nograd)
    with pytest.raises(ValueError, match="int64"):
        path_gradient(model, shapes, [w0], None, one, x, y.int())
    with pytest.raises(ValueError, match="flat vectors"):
        path_gradient(model, shapes, [w0[:-1]], None, one, x, y)
    with pytest.raises(ValueError, match="at least one anchor"):
        path_gradient(model, shapes, [], None, one[:0], x, y)
