"""The surrogate gradient of every attack: G = sum_i c_i grad_w CE(f_{w_i}(X_hat), Y) (docs/PISME.md, eq. 8).

The nodes w_i lie on a weight path given by J anchors (w0, P1, wT for the Bezier path of eq. 4) and
an (m, J) basis: w_i = sum_j basis[i, j] * anchor_j. G stays differentiable in X_hat, the anchors
and the basis, so the attack can take the double backward through it.

Two implementations compute the same G:
- a generic one for any ``nn.Module`` (one functional forward and one autograd call per node);
- a structured one for the paper's CNNs (``fl_attack.federation.models.PaperCNN``), which is the step's hot path.
  It uses six exact rewrites, measured in docs/performance.md:
  1. conv1 is linear in its weights and all nodes share its input X_hat, so its output at node i is
     sum_j basis[i, j] * conv(X_hat, anchor_j): 3 convolutions instead of m, and conv1's part of G is
     one weight gradient of X_hat against the summed output gradients instead of m;
  2. ReLU and 2x2 average pooling are autograd Functions whose backward passes are again such
     Functions (a masked pass and its adjoint), so the double backward does no zero-filled gradient
     for the saved input and no slow NCHW pooling kernel;
  3. conv2 is an autograd Function whose second-order terms are one mkldnn convolution_backward call
     and two convolutions, instead of torch's transposed-convolution fallbacks;
  4. fc1's part of G is one GEMM over the m*k samples of all nodes (its input and output gradients
     stacked), instead of m thin GEMMs; so is its double backward;
  5. each node's gradient is taken right after its forward, while its activations are in cache;
  6. the activations are channels_last (NHWC), oneDNN's native layout: the convolutions skip their
     layout reorders and pooling works on contiguous channel vectors.
tests/test_attacks.py checks both against each other and against the literal Algorithm 1.
Under bf16 autocast (``fl_attack.attacker.precision``, precision "bf16") the generic path is lowered by
autocast itself; the structured one lowers its operators explicitly (autocast does not reach into
its autograd Functions, and their oneDNN calls need one dtype): bf16 activations, convolutions,
double backward and GEMMs, float32 sums over the nodes and samples, conv1's weight gradient in
float32. Both return G in float32 (tests/test_precision.py).

A third computes G for N clients at once (``fl_attack.reconstruct_batch``): anchors of shape (N, P),
images (N, k, C, H, W); at each node, torch.func.vmap over the clients of one node gradient
(torch.func.grad of a functional call), so each node of all N clients is one batched pass (on a GPU,
where the speed is; docs/performance.md, "Batched attacks"). Each client's G is its own: nothing is
reduced over the clients. tests/test_batched.py checks it against N unbatched computations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fl_attack.attacker.precision import full_precision, lowered_dtype
from fl_attack.federation.models import PaperCNN
from fl_attack.federation.update import unflatten

_CNN_KEYS = (
    "conv1.weight",
    "conv1.bias",
    "conv2.weight",
    "conv2.bias",
    "fc1.weight",
    "fc1.bias",
    "fc2.weight",
    "fc2.bias",
)


def path_gradient(
    model: torch.nn.Module,
    shapes,
    anchors: Sequence[torch.Tensor],
    basis: torch.Tensor | None,
    coeffs: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    buffers: dict | None = None,
) -> torch.Tensor:
    """G = sum_i c_i grad_w CE(f_{w_i}(x), y) with w_i = sum_j basis[i, j] anchors[j] (eq. 8).

    model: the victim (its own parameters are not used; its modules' modes are, e.g. batch norm in
    train mode, ``fl_attack.attacker.attacks.batchnorm.surrogate_mode``); shapes: ``fl_attack.federation.update.layout``
    of its parameters, the weights w. buffers: the model's buffers to run with (name -> tensor, e.g.
    batch norm's running statistics from the update's w0; batched: each of shape (N, ...), client n's
    at row n), constants of the forward pass, not part of G; None: the model's own (the paper's CNNs
    have none).
    anchors: J >= 1 flat (P,) weight vectors. basis: (m, J), each row summing to 1 (the nodes are affine
    combinations of the anchors, as on any path through w0 and wT), or None for w_i = anchors[i].
    coeffs: (m,) quadrature weights c_i. x: the model's input batch, (k, C, H, W) normalised images for
    the paper's CNNs; y: (k,) int64 labels in [0, classes). Anchors, basis, coeffs and x share a dtype
    and a device.
    Batched, for N clients at once: anchors of shape (N, P), basis (m, J) shared or (N, m, J) per
    client, x (N, k, ...) and y (N, k); then G has shape (N, P), row n client n's own G (the vmapped
    engine of the module docstring; any model torch.func.vmap can run, the paper's CNNs included).
    Returns G, shape (P,) (batched: (N, P)). When grad mode is on and x, an anchor or the basis
    requires grad, G is differentiable in them to any order (create_graph); otherwise it is detached.
    An anchor whose coefficient is 0 at every node gets no gradient (autograd's None), as in torch.
    Under bf16 autocast on x's device the node forwards and gradients run in bf16 and G is summed
    and returned in the anchors' dtype (float32; module docstring); without autocast nothing is cast.
    Raises ValueError for inconsistent shapes, labels that are not int64, or a basis whose rows do
    not sum to 1.
    """
    if len(anchors) < 1:
        raise ValueError("path_gradient needs at least one anchor")
    size = sum(math.prod(shape) for _, shape in shapes)
    batch = tuple(anchors[0].shape[:-1])  # () for one client, (N,) for N clients
    if len(batch) > 1:
        raise ValueError(f"anchors must be (P,) or (N, P) weight vectors, got shape {tuple(anchors[0].shape)}")
    bad = [tuple(a.shape) for a in anchors if tuple(a.shape) != (*batch, size)]
    if bad:
        raise ValueError(
            f"anchors must be flat vectors of the layout's {size} weights, all of shape {(*batch, size)}, "
            f"got shapes {bad}"
        )
    if basis is None:
        m = len(anchors)
    else:
        if basis.dim() < 2 or tuple(basis.shape[:-2]) not in ((), batch) or basis.shape[-1] != len(anchors):
            shape = f"(m >= 1, {len(anchors)})" + (f" or ({batch[0]}, m >= 1, {len(anchors)})" if batch else "")
            raise ValueError(f"basis must have shape {shape}, got {tuple(basis.shape)}")
        m = basis.shape[-2]
        if m < 1:
            raise ValueError(f"basis must have shape (m >= 1, {len(anchors)}), got {tuple(basis.shape)}")
    if basis is not None and not torch.allclose(basis.detach().sum(-1), basis.new_ones(()), atol=1e-6):
        raise ValueError("each row of the path basis must sum to 1 (nodes are affine combinations of the anchors)")
    if not isinstance(coeffs, torch.Tensor) or coeffs.shape != (m,):
        raise ValueError(f"coeffs must be a tensor of shape ({m},), got {getattr(coeffs, 'shape', type(coeffs))}")
    samples = tuple(x.shape[: len(batch) + 1])  # (k,) or (N, k)
    if y.dtype != torch.int64 or tuple(y.shape) != samples:
        raise ValueError(f"labels must be int64 of shape {samples}, got {y.dtype} {tuple(y.shape)}")
    create_graph = torch.is_grad_enabled() and (
        x.requires_grad or any(a.requires_grad for a in anchors) or (basis is not None and basis.requires_grad)
    )
    with torch.enable_grad():  # the node gradients need autograd even under no_grad
        if batch:
            g = _batched_path_gradient(model, shapes, anchors, basis, coeffs, x, y, create_graph, buffers)
        elif buffers is None and _is_paper_cnn(model, shapes, x):
            g = _cnn_path_gradient(model, shapes, anchors, basis, coeffs, x, y, create_graph)
        else:
            g = _generic_path_gradient(model, shapes, anchors, basis, coeffs, x, y, create_graph, buffers)
    return g if create_graph else g.detach()


def _is_paper_cnn(model, shapes, x) -> bool:
    """True when ``model`` computes exactly PaperCNN.forward with zero-padded convolutions, 2x2
    average pooling and no hooks, so the structured path may replace its forward."""
    pool = getattr(model, "pool", None)
    convs = (getattr(model, "conv1", None), getattr(model, "conv2", None))
    hooked = any(mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks for mod in model.modules())
    return (
        isinstance(model, PaperCNN)
        and type(model).forward is PaperCNN.forward
        and not hooked
        and all(
            type(c) is torch.nn.Conv2d and c.padding_mode == "zeros" and not isinstance(c.padding, str) for c in convs
        )
        and type(pool) is torch.nn.AvgPool2d
        and pool.kernel_size in (2, (2, 2))
        and pool.stride in (2, (2, 2))
        and pool.padding in (0, (0, 0))
        and not pool.ceil_mode
        and tuple(name for name, _ in shapes) == _CNN_KEYS
        and x.dim() == 4
    )


def _rows(basis, m: int, j: int) -> list[list]:
    """The basis as python floats (fast scalar kernels) unless it is learned, then as 0-dim tensors;
    no rows without a basis (node i is anchor i)."""
    if basis is None:
        return [None] * m
    if basis.requires_grad:
        return [[basis[i, a] for a in range(j)] for i in range(m)]
    return basis.tolist()


def _combine(parts: Sequence[torch.Tensor], row: list) -> torch.Tensor:
    """sum_j row[j] * parts[j]; skips zero float coefficients; the result never aliases an input."""
    out = None
    for part, c in zip(parts, row):
        if isinstance(c, float):
            if c == 0.0:
                continue
            out = part * c if out is None else torch.add(out, part, alpha=c)
        else:
            out = part * c if out is None else out + part * c
    return out if out is not None else torch.zeros_like(parts[0])


def _with_grad(t: torch.Tensor) -> torch.Tensor:
    return t if t.requires_grad else t.detach().requires_grad_(True)


def _generic_path_gradient(model, shapes, anchors, basis, coeffs, x, y, create_graph=True, buffers=None):
    m, keys = len(coeffs), [name for name, _ in shapes]
    params = [unflatten(a, shapes) for a in anchors]
    rows = _rows(basis, m, len(anchors))
    total = {}
    for i in range(m):
        w_i = {k: _with_grad(_node_weight(params, k, rows[i], basis, i)) for k in keys}
        state = w_i if buffers is None else {**w_i, **buffers}
        loss = coeffs[i] * F.cross_entropy(functional_call(model, state, (x,)), y)
        for k, g in zip(keys, torch.autograd.grad(loss, list(w_i.values()), create_graph=create_graph)):
            total[k] = g if k not in total else total[k] + g
    return torch.cat([total[k].reshape(-1) for k in keys])


def _batched_path_gradient(model, shapes, anchors, basis, coeffs, x, y, create_graph=True, buffers=None):
    """(N, P): each client's G. Node by node, one torch.func.vmap over the clients (node weights,
    x, y, and each client's buffers when given) of one node's gradient torch.func.grad(CE at w),
    scaled by c_i and summed over the nodes.

    The outer autograd differentiates through the transforms (torch.func composes with it), so G
    keeps its graph to X_hat, the anchors and the basis whether or not ``create_graph`` is asked;
    ``path_gradient`` detaches it when not. Nothing is reduced over the clients. Vmapping the nodes
    too (one pass over all N*m) was 1.3x slower on the CPU (docs/performance-2026-12-01.md, "Batched
    attacks on the CPU").
    """
    stacked = torch.stack(list(anchors), dim=1)  # (N, J, P)

    def node_loss(w, xn, yn, bn=None):  # CE of one client at one node's flat weights w, (P,)
        state = unflatten(w, shapes) if bn is None else {**unflatten(w, shapes), **bn}
        return F.cross_entropy(functional_call(model, state, (xn,)), yn)

    vmapped = torch.func.vmap(torch.func.grad(node_loss))
    node_grad = vmapped if buffers is None else lambda w, xn, yn: vmapped(w, xn, yn, buffers)
    total = None
    for i in range(len(coeffs)):
        with full_precision(x):  # the node weights stay float32 under bf16 autocast (einsum is a bmm)
            if basis is None:
                w_i = anchors[i]  # (N, P)
            elif basis.dim() == 2:
                w_i = torch.einsum("j,njp->np", basis[i], stacked)
            else:
                w_i = torch.einsum("nj,njp->np", basis[:, i], stacked)
        g = coeffs[i] * node_grad(w_i, x, y)
        total = g if total is None else total + g
    return total


def _node_weight(params, key, row, basis, i):
    if basis is None:
        return params[i][key]
    return _combine([p[key] for p in params], row)


def _cnn_path_gradient(model, shapes, anchors, basis, coeffs, x, y, create_graph=True):
    m = len(coeffs)
    params = [unflatten(a, shapes) for a in anchors]
    rows = _rows(basis, m, len(anchors))
    # Mixed precision (fl_attack.attacker.precision): under bf16 autocast ``low`` is bf16 and every convolution,
    # GEMM and activation below is lowered explicitly (autocast does not reach into the hand-written
    # Functions, whose oneDNN calls need one dtype); G's sums over nodes and samples come out in
    # ``high`` (float32). Without autocast low == high and every ``.to`` returns its tensor itself.
    high, low = x.dtype, lowered_dtype(x)
    x = _channels_last(x)  # rewrite 6: every activation follows
    xl = x.to(low)
    c1, c2 = model.conv1, model.conv2
    conv1 = dict(stride=c1.stride, padding=c1.padding, dilation=c1.dilation, groups=c1.groups)
    conv2 = dict(stride=c2.stride, padding=c2.padding, dilation=c2.dilation, groups=c2.groups)
    if basis is not None:  # rewrite 1: conv1 at each anchor, once for all nodes
        if basis.requires_grad:
            conv1_at_anchor = [
                F.conv2d(xl, p["conv1.weight"].to(low), p["conv1.bias"].to(low), **conv1) for p in params
            ]
        else:  # anchor differences: z1_i = conv(x, A_0) + sum_j basis[i, j] conv(x, A_j - A_0)
            first = params[0]
            diffs = [
                F.conv2d(
                    xl,
                    (p["conv1.weight"] - first["conv1.weight"]).to(low),
                    (p["conv1.bias"] - first["conv1.bias"]).to(low),
                    **conv1,
                )
                for p in params[1:]
            ]
            anchor = F.conv2d(xl, first["conv1.weight"].to(low), first["conv1.bias"].to(low), **conv1)
            node_inputs = _PathCombine.apply([row[1:] for row in rows], anchor, *diffs)
    rest = _CNN_KEYS[2:]
    per_node = ("conv2.weight", "conv2.bias", "fc2.weight", "fc2.bias")  # their G is summed node by node
    out_grad, total, fc1_inputs, fc1_out_grads = None, {}, [], []
    for i in range(m):
        if basis is None:
            z1 = F.conv2d(xl, params[i]["conv1.weight"].to(low), params[i]["conv1.bias"].to(low), **conv1)
        elif basis.requires_grad:
            z1 = _combine(conv1_at_anchor, rows[i])
        else:
            z1 = node_inputs[i]
        z1 = _with_grad(z1)
        w_i = {k: _with_grad(_node_weight(params, k, rows[i], basis, i)) for k in rest}
        w = {k: v.to(low) for k, v in w_i.items()}  # the node's weights as the operators use them
        h = avg_pool2(relu(z1))
        h = avg_pool2(relu(conv2d(h, w["conv2.weight"], w["conv2.bias"], **conv2)))
        flat = h.flatten(1)
        u = F.linear(flat, w["fc1.weight"], w["fc1.bias"])
        logits = F.linear(torch.relu(u), w["fc2.weight"], w["fc2.bias"]).to(high)  # CE in float32, as autocast
        loss = coeffs[i] * F.cross_entropy(logits, y)
        grads = torch.autograd.grad(loss, [z1, u] + [w_i[k] for k in per_node], create_graph=create_graph)
        g1 = grads[0].to(high)  # the quadrature sum of conv1's output gradients, in float32
        out_grad = g1 if out_grad is None else out_grad + g1
        fc1_inputs.append(flat)
        fc1_out_grads.append(grads[1])
        for k, g in zip(per_node, grads[2:]):
            total[k] = g if k not in total else total[k] + g
    # fc1's part of G: one GEMM over all nodes' samples (rewrite 4) instead of m GEMMs with K = k
    fc1_out_grad = torch.cat(fc1_out_grads)
    total["fc1.weight"] = (fc1_out_grad.t() @ torch.cat(fc1_inputs)).to(high)  # accumulated in float32 by the GEMM
    total["fc1.bias"] = _sum(fc1_out_grad, 0, high)
    # conv1's part of G: one weight gradient of x against the summed output gradients (rewrite 1),
    # in float32 (conv1 has 1 or 3 input channels: memory-bound, nothing to gain from bf16)
    weight = params[0]["conv1.weight"].detach()
    total["conv1.weight"] = torch.ops.aten.convolution_backward(
        out_grad,
        x,
        weight,
        None,
        list(c1.stride),
        list(c1.padding),
        list(c1.dilation),
        False,
        [0, 0],
        c1.groups,
        [False, True, False],
    )[1]
    total["conv1.bias"] = out_grad.sum((0, 2, 3))
    return torch.cat([total[k].reshape(-1) for k in _CNN_KEYS])


def _sum(t: torch.Tensor, dim, dtype: torch.dtype) -> torch.Tensor:
    """t.sum(dim) with the result in ``dtype``: a lowered (bf16) t is accumulated and returned in
    float32, a t already in ``dtype`` is summed exactly as before (bit for bit)."""
    return t.sum(dim) if t.dtype == dtype else t.sum(dim, dtype=dtype)


class _PathCombine(torch.autograd.Function):
    """All m node inputs z_i = base + sum_j coeffs[i][j] * diffs[j] in one Function, so the backward
    sums the m cotangents into one accumulator per operand (one fused pass per node and operand)
    instead of autograd's scale-then-accumulate. Coefficients are python floats (a fixed basis)."""

    @staticmethod
    def forward(ctx, coeffs, base, *diffs):
        ctx.coeffs = coeffs
        outs = []
        for row in coeffs:
            z = base.clone()
            for d, c in zip(diffs, row):
                z.add_(d, alpha=c)
            outs.append(z)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *cots):  # differentiable ops only: higher orders stay exact
        n = len(ctx.coeffs[0]) if ctx.coeffs else 0
        sums = [None] * (n + 1)
        for row, cot in zip(ctx.coeffs, cots):
            if cot is None:
                continue
            for j, c in enumerate([1.0] + list(row)):
                if c == 0.0:
                    continue
                if sums[j] is None:
                    sums[j] = cot * c if c != 1.0 else cot.clone()
                else:
                    sums[j].add_(cot, alpha=c)
        return (None, *sums)


# --- ReLU and 2x2 average pooling with cheap higher-order derivatives (rewrite 2) -------------------
# ReLU's backward is the mask "g where z > 0", a linear map of g that is its own adjoint; pooling's
# backward is nearest upsampling / 4, whose adjoint is the pooling. Writing each backward as the
# other Function makes every derivative order one cheap kernel and drops torch's zero gradient for
# the saved input.


class _ReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return z.clamp_min(0)

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        return _Mask.apply(g, z)


class _Mask(torch.autograd.Function):
    """g where z > 0, else 0 (torch's ReLU derivative, 0 at z = 0); linear and self-adjoint in g."""

    @staticmethod
    def forward(ctx, g, z):
        ctx.save_for_backward(z)
        return torch.ops.aten.threshold_backward(g, z, 0)

    @staticmethod
    def backward(ctx, h):
        (z,) = ctx.saved_tensors
        return _Mask.apply(h, z), None


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """A differentiable copy of (N,C,H,W) ``x`` with NHWC strides. ``x.contiguous(memory_format=
    torch.channels_last)`` returns a 1-channel tensor unchanged, with strides torch then reads as NCHW."""
    return torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last).copy_(x)


def _is_nhwc(t: torch.Tensor) -> bool:
    """True for a channels_last (N,C,H,W) tensor that is not also plainly contiguous."""
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def _pool2(u: torch.Tensor) -> torch.Tensor:
    n, c, hh, ww = u.shape
    if _is_nhwc(u):
        v = u.permute(0, 2, 3, 1).view(n, hh // 2, 2, ww, c)
        r = (v[:, :, 0] + v[:, :, 1]).view(n, hh // 2, ww // 2, 2, c)
        return torch.add(r[:, :, :, 0], r[:, :, :, 1]).mul_(0.25).permute(0, 3, 1, 2)
    r = u.contiguous().view(n, c, hh // 2, 2, ww)
    r = r[:, :, :, 0] + r[:, :, :, 1]
    return torch.add(r[..., 0::2], r[..., 1::2]).mul_(0.25)


def _unpool2(g: torch.Tensor, nhwc: bool = False) -> torch.Tensor:
    """Nearest 2x upsampling / 4 (the adjoint of _pool2), channels_last when ``nhwc``."""
    n, c, h, w = g.shape
    if nhwc:
        gp = g.permute(0, 2, 3, 1)
        out = g.new_empty(n, h, 2, w, 2, c)
        quarter = gp * 0.25
        out[:, :, 0, :, 0] = quarter
        out[:, :, 0, :, 1] = quarter
        out[:, :, 1] = out[:, :, 0]
        return out.view(n, 2 * h, 2 * w, c).permute(0, 3, 1, 2)
    out = g.new_empty(n, c, h, 2, w, 2)  # slice assignment: 3x faster here than a broadcast copy
    quarter = g * 0.25
    out[:, :, :, 0, :, 0] = quarter
    out[:, :, :, 0, :, 1] = quarter
    out[:, :, :, 1] = out[:, :, :, 0]
    return out.view(n, c, 2 * h, 2 * w)


class _AvgPool2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u):
        ctx.nhwc = _is_nhwc(u)
        return _pool2(u)

    @staticmethod
    def backward(ctx, g):
        return _Unpool2.apply(g, ctx.nhwc)


class _Unpool2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, nhwc):
        return _unpool2(g, nhwc)

    @staticmethod
    def backward(ctx, h):
        return _AvgPool2.apply(h), None


def relu(z: torch.Tensor) -> torch.Tensor:
    """torch.relu with cheap derivatives of every order (same values, same subgradient 0 at 0)."""
    return _ReLU.apply(z)


def avg_pool2(u: torch.Tensor) -> torch.Tensor:
    """nn.AvgPool2d(2) on (N,C,H,W) with cheap derivatives of every order; odd H or W use torch's."""
    if u.shape[-1] % 2 or u.shape[-2] % 2:
        return F.avg_pool2d(u, 2)
    return _AvgPool2.apply(u)


# --- conv2 with a cheap double backward (rewrite 3) ------------------------------------------------
# First order: (dgrad(gO, W), wgrad(a, gO)) in one convolution_backward call. Second order, for the
# cotangents (ggI, ggW) of those two outputs: d/dgO = conv(ggI, W) + conv(a, ggW); d/da = dgrad(gO, ggW)
# and d/dW = wgrad(ggI, gO), which are again one convolution_backward call (input ggI, weight ggW).


class _Conv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, weight, bias, stride, padding, dilation, groups):
        ctx.save_for_backward(a, weight)
        ctx.conf = (list(stride), list(padding), list(dilation), groups)
        ctx.has_bias = bias is not None
        return F.conv2d(a, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, g_out):
        a, weight = ctx.saved_tensors
        g_a, g_w = _ConvGrads.apply(g_out, a, weight, ctx.conf)
        g_b = g_out.sum((0, 2, 3)) if ctx.has_bias else None
        return g_a, g_w, g_b, None, None, None, None


class _ConvGrads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g_out, a, weight, conf):
        ctx.save_for_backward(g_out, a, weight)
        ctx.conf = conf
        stride, padding, dilation, groups = conf
        g_a, g_w, _ = torch.ops.aten.convolution_backward(
            g_out, a, weight, None, stride, padding, dilation, False, [0, 0], groups, [True, True, False]
        )
        return g_a, g_w

    @staticmethod
    def backward(ctx, gg_a, gg_w):  # differentiable ops only: higher orders stay exact
        g_out, a, weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conf
        conv = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        d_out = None
        if gg_a is not None:
            d_out = F.conv2d(gg_a, weight, None, **conv)
        if gg_w is not None:
            t = F.conv2d(a, gg_w, None, **conv)
            d_out = t if d_out is None else d_out + t
        mask = [gg_w is not None and ctx.needs_input_grad[1], gg_a is not None and ctx.needs_input_grad[2], False]
        d_a = d_w = None
        if any(mask):
            d_a, d_w, _ = torch.ops.aten.convolution_backward(
                g_out,
                gg_a if gg_a is not None else a,
                gg_w if gg_w is not None else weight,
                None,
                stride,
                padding,
                dilation,
                False,
                [0, 0],
                groups,
                mask,
            )
        return d_out, d_a, d_w, None


def conv2d(a, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """F.conv2d (NCHW, zero padding) with a cheaper double backward; every order stays exact."""
    return _Conv2d.apply(a, weight, bias, stride, padding, dilation, groups)
