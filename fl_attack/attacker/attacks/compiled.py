"""The attack step as one ``torch.func`` function that ``torch.compile`` takes whole (``compile``).

``torch.compile`` cannot trace a double backward through autograd (``torch.autograd.grad`` with
create_graph inside the compiled region; PyTorch issues #92348 and #183603), and the eager paths of
``fl_attack.attacker.attacks.gradients`` are exactly that. So the compiled step is the same objective written
with function transforms only: the surrogate gradient G (eq. 8) is ``torch.func.grad`` of the
cross-entropy of a functional call, and the step's gradient in X_hat and the attack's variables is
``torch.func.grad_and_value`` of the objective (eq. 10: Lsim, TV, R_p, R_d) built on that G. One
call returns the loss terms and the gradients; Adam, the clamps, the schedule and the trace stay
eager in ``fl_attack.attacker.api._optimise``.

Two forms of G, as in the eager module:
- structured, for the paper's CNNs (``gradients._is_paper_cnn``): conv1 is linear in its weights, so
  its output at node i is sum_j basis[i, j] conv(X_hat, anchor_j) (J = 3 convolutions for m nodes),
  and conv1's part of G is one weight gradient (a ``torch.func.vjp`` of the linear map) of X_hat
  against the quadrature-summed output gradients; the rest of the network is ``torch.func.grad`` per
  node;
- generic, for any model: ``torch.func.grad`` of ``functional_call`` at each node's flat weights
  (with the update's w0 buffers).
Batched (N clients, ``fl_attack.reconstruct_batch``): ``torch.func.vmap`` over the clients of the
one-client G; each client's loss is its own and the losses are summed, as eagerly.

Methods: ig, sme, nlsme, pisme (the paper's Table 1), fp32 or float64, with ``optimizer_aware``
weights, weight decay and ``observed_only``. Everything else (pisme-adaptive, ginas, dggi, a joint
attack on several updates, ``bn_stats_weight`` > 0, the diffusion prior, bf16 / tf32) runs eagerly;
``prepare_step`` says why in one line.

One compiled function per worker process and problem: a module-level cache keyed by the method, the
architecture (class and ``repr``, train or eval mode, parameter and buffer layout), the shapes of
X_hat, the batch, dtype, device and the objective's constants (``_key``). Its function holds its own
template of the model (weights are never read from it: every parameter comes from the anchors, every
buffer from the update), so a later attack of the same problem reuses it without a recompilation.
``COMPILATIONS`` counts the graphs handed to the compiler backend per key (tests assert a second
attack adds none). A compile that fails is remembered for its key, logged once with a one-line reason,
and the attack runs eagerly (``Reconstruction.compile`` then reads "eager (compile failed: ...)").

Where it pays is measured in docs/performance.md ("Compiled step"); ``resolve_compile`` holds the rule
of ``compile="auto"``. Sources: torch.func (``grad``, ``grad_and_value``, ``vjp``, ``vmap``: the
composable function transforms), torch.compile (``fullgraph=True``: one graph or an error) and
TorchInductor's ``triton.cudagraphs`` (what ``mode="reduce-overhead"`` sets).
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fl_attack.attacker.attacks.base import check_compile, lsim, total_variation
from fl_attack.attacker.attacks.gradients import _CNN_KEYS, _is_paper_cnn
from fl_attack.attacker.quadrature import bezier_coefficients

log = logging.getLogger(__name__)

COMPILABLE = ("ig", "sme", "nlsme", "pisme")
# the attack's learnable variables (besides X_hat) by method, in the order the step returns their gradients
VARIABLES = {
    "ig": (),
    "sme": ("alpha",),
    "nlsme": ("control_point", "calibration", "position"),
    "pisme": ("control_point", "calibration"),
}
COMPILATIONS: collections.Counter = collections.Counter()  # key -> graphs compiled for it (backend calls)
_STEPS: dict[tuple, Callable] = {}  # key -> the compiled step
_FAILED: dict[tuple, str] = {}  # key -> the one-line reason its compile failed


def resolve_compile(mode: str, device: torch.device | str) -> bool:
    """Whether an attack with ``compile=mode`` compiles its step on ``device``.

    "on": yes; "off": no; "auto": on CUDA yes (the step there is bound by kernel launches, which
    compiling fuses and a CUDA graph replays; docs/gpu-check/), on the CPU no. Measured on this
    project's 2-core CPU with 1 thread (docs/performance-2026-12-05.md, "Compiled step"; k=10, m=3 and
    k=16, m=5, one client and N=4 batched): a compiled step ran 1.06-1.70x as fast as eager for the paper's CNNs
    and 0.93-1.22x for a max-pooling user model (the generic path), but each compile took 32-84 s,
    repaid only after 70 to 15,000 steps of one problem shape in one process (for the user model
    often never), more than a short run or a test has. Long CPU runs of the paper's CNNs gain from
    asking for "on".
    """
    check_compile(mode)
    if mode == "auto":
        return torch.device(device).type == "cuda"
    return mode == "on"


def compile_count(key: tuple | None = None) -> int:
    """Graphs compiled in this process: for one problem ``key`` (``Step.key``), or in all."""
    return COMPILATIONS[key] if key is not None else sum(COMPILATIONS.values())


# ------------------------------------------------------------------------------ the objective


@dataclass(frozen=True, eq=False)
class _Static:
    """What the compiled step closes over: the model template and the objective's constants."""

    method: str
    model: torch.nn.Module
    shapes: tuple
    structured: bool
    batched: bool
    tv_weight: float
    tv_reduction: str
    control_point_weight: float
    calibration_weight: float
    weight_decay: float
    masked: bool


def unflatten(flat: torch.Tensor, shapes) -> dict:
    """Views of a flat (P,) vector as a state dict: ``fl_attack.federation.update.unflatten`` with the sizes as
    python integers, which dynamo traces (numpy's prod of a torch.Size it does not)."""
    out, start = {}, 0
    for key, shape in shapes:
        size = math.prod(shape)
        out[key] = flat[start : start + size].view(tuple(shape))
        start += size
    return out


def _node_loss(model, shapes, w, x, y, buffers):
    """CE(f_w(x), y) at flat weights w (P,), with the update's buffers (a dict, maybe empty)."""
    return F.cross_entropy(functional_call(model, {**unflatten(w, shapes), **buffers}, (x,)), y)


def _mix(parts, row):
    """sum_j row[j] * parts[j] (row: 0-dim tensors)."""
    out = row[0] * parts[0]
    for c, p in zip(row[1:], parts[1:]):
        out = out + c * p
    return out


def _generic_g(static, anchors, basis, coeffs, x, y, buffers):
    """One client's G (P,): sum_i c_i grad_w CE at w_i = sum_j basis[i, j] anchors[j] (eq. 8)."""
    grad = torch.func.grad(partial(_node_loss, static.model, static.shapes))
    total = None
    for i in range(coeffs.shape[0]):
        w_i = anchors[i] if basis is None else _mix(anchors, basis[i])
        g = coeffs[i] * grad(w_i, x, y, buffers)
        total = g if total is None else total + g
    return total


def _cnn_g(static, anchors, basis, coeffs, x, y, buffers):
    """One client's G (P,) for a paper CNN (module docstring: conv1 by linearity, the rest per node)."""
    model = static.model
    c1, c2 = model.conv1, model.conv2
    conv1 = dict(stride=c1.stride, padding=c1.padding, dilation=c1.dilation, groups=c1.groups)
    conv2 = dict(stride=c2.stride, padding=c2.padding, dilation=c2.dilation, groups=c2.groups)
    params = [unflatten(a, static.shapes) for a in anchors]
    rest = _CNN_KEYS[2:]

    def head(z1, w):  # CE of the network after conv1's output z1 (k, C1, H, W), weights w (rest keys)
        h = F.avg_pool2d(torch.relu(z1), 2)
        h = F.avg_pool2d(torch.relu(F.conv2d(h, w["conv2.weight"], w["conv2.bias"], **conv2)), 2)
        h = torch.relu(F.linear(h.flatten(1), w["fc1.weight"], w["fc1.bias"]))
        return F.cross_entropy(F.linear(h, w["fc2.weight"], w["fc2.bias"]), y)

    head_grad = torch.func.grad(head, argnums=(0, 1))
    z_anchor = [F.conv2d(x, p["conv1.weight"], p["conv1.bias"], **conv1) for p in params]
    g_z, total = None, {}
    for i in range(coeffs.shape[0]):
        if basis is None:
            z1, w = z_anchor[i], {k: params[i][k] for k in rest}
        else:
            z1, w = _mix(z_anchor, basis[i]), {k: _mix([p[k] for p in params], basis[i]) for k in rest}
        gz, gw = head_grad(z1, w)
        g_z = coeffs[i] * gz if g_z is None else g_z + coeffs[i] * gz
        for k in rest:
            total[k] = coeffs[i] * gw[k] if k not in total else total[k] + coeffs[i] * gw[k]
    # conv1's part: the adjoint of the linear map W -> conv(x, W) at the summed output gradients
    _, vjp = torch.func.vjp(lambda weight: F.conv2d(x, weight, None, **conv1), params[0]["conv1.weight"])
    (total["conv1.weight"],) = vjp(g_z)
    total["conv1.bias"] = g_z.sum((0, 2, 3))
    return torch.cat([total[k].reshape(-1) for k in _CNN_KEYS])


def _surrogate(static, anchors, basis, coeffs, x, y, buffers):
    """G (P,) or, batched, (N, P): the structured or generic form, vmapped over the clients."""
    one = partial(_cnn_g if static.structured else _generic_g, static)
    if not static.batched:
        return one(anchors, basis, coeffs, x, y, buffers)
    basis_dim = None if basis is None or basis.dim() == 2 else 0
    return torch.func.vmap(one, in_dims=(0, basis_dim, None, 0, 0, 0))(anchors, basis, coeffs, x, y, buffers)


def _objective(static: _Static, x, y, variables: dict, consts: dict) -> tuple[torch.Tensor, dict]:
    """(sum of the clients' losses, the terms) of ``Attack.objective`` (eq. 10), as a pure function.

    x: (k,C,H,W) or (N,k,C,H,W); y: (k,) or (N,k); variables: the attack's (``VARIABLES``), P1 and d
    (P,) or (N,P), SME's alpha and NL-SME's t () or (N,); consts: ``Step``'s. Terms: loss, lsim_honest,
    lsim_calibrated (in [0, 2]) and tv, each () or (N,), detached.
    """
    w0, wT = consts["w0"], consts["wT"]
    method = static.method
    if method == "ig":
        anchors, basis = [w0], None
    elif method == "sme":
        alpha = variables["alpha"]
        anchors, basis = [w0, wT], torch.stack([1 - alpha, alpha], -1).unsqueeze(-2)
    elif method == "nlsme":
        anchors = [w0, variables["control_point"], wT]
        basis = bezier_coefficients(variables["position"].unsqueeze(-1))
    else:  # pisme
        anchors, basis = [w0, variables["control_point"], wT], consts["basis"]
    coeffs = consts["coeffs"]
    stacked = torch.stack(anchors, -2) if static.batched else anchors  # (N, J, P), or J of (P,)
    g = _surrogate(static, stacked, basis, coeffs, x, y, consts["buffers"])
    if static.weight_decay:  # Attack.path_surrogate's lambda w_i term
        if basis is None:
            mix = [c * a for c, a in zip(coeffs, anchors)]
        else:
            per_anchor = (basis * coeffs.unsqueeze(-1)).sum(-2)
            mix = [per_anchor[..., j : j + 1] * a for j, a in enumerate(anchors)]
        g = g + static.weight_decay * torch.stack(mix).sum(0)
    if static.masked:
        g = g * consts["mask"]
    tv = total_variation(x, static.tv_reduction)
    delta_w = consts["delta_w"]
    calibration = variables.get("calibration")
    if calibration is not None:
        matched = lsim(calibration * g, delta_w)
        honest = lsim(g.detach(), delta_w)
        r_p = (variables["control_point"] - consts["anchor"]).pow(2).sum(-1)
        r_d = (calibration - 1).pow(2).sum(-1)
        regularizer = static.control_point_weight * r_p + static.calibration_weight * r_d
    else:
        matched = lsim(g, delta_w)
        honest = matched.detach()
        regularizer = 0.0
    loss = matched + static.tv_weight * tv + regularizer
    terms = {"loss": loss.detach(), "lsim_honest": honest, "lsim_calibrated": matched.detach(), "tv": tv.detach()}
    return loss.sum(), terms


def _step(static: _Static, x, variables: tuple, y, consts: dict):
    """(grad in x, grads in the variables, the terms): one ``torch.func.grad_and_value`` call."""
    names = VARIABLES[static.method]

    def f(x, variables):
        return _objective(static, x, y, dict(zip(names, variables)), consts)

    (gx, gv), (_, terms) = torch.func.grad_and_value(f, argnums=(0, 1), has_aux=True)(x, variables)
    return gx, gv, terms


# ------------------------------------------------------------------------------ the driver


def _counting_backend(key: tuple, cuda: bool):
    """Inductor, counting each graph it is handed for ``key``; on CUDA with CUDA graphs (what
    ``mode="reduce-overhead"`` sets: the whole step replayed as one graph with static buffers)."""
    from torch._inductor.compile_fx import compile_fx

    patches = {"triton.cudagraphs": True} if cuda else {}

    def backend(gm, example_inputs):
        COMPILATIONS[key] += 1
        return compile_fx(gm, example_inputs, config_patches=patches)

    return backend


def _why_not(attack, precision: str) -> str:
    """'' when the attack's step can be compiled, else the one-line reason it cannot."""
    name = getattr(attack, "name", None)
    if name is None:
        return "a joint attack on several updates runs eagerly"
    if name not in COMPILABLE or type(attack).name != name:
        return f"method '{name}' has no compiled step (compiled: {', '.join(COMPILABLE)})"
    if precision != "fp32":
        return f"precision {precision} runs eagerly (the compiled step is fp32 or float64)"
    if attack.statistics is not None:
        return "bn_stats_weight > 0 runs eagerly"
    if attack.prior is not None:
        return "the diffusion image prior runs eagerly"
    return ""


def _key(attack, static: _Static, x: torch.Tensor, consts: dict) -> tuple:
    model = static.model
    buffers = tuple((k, tuple(v.shape), v.dtype) for k, v in consts["buffers"].items())
    return (
        static.method,
        f"{type(model).__module__}.{type(model).__qualname__}",
        repr(model),
        model.training,
        tuple((k, tuple(s)) for k, s in static.shapes),
        buffers,
        tuple(x.shape),
        x.dtype,
        str(x.device),
        static.structured,
        attack.config.nodes if static.method == "pisme" else 1,
        static.tv_weight,
        static.tv_reduction,
        static.control_point_weight,
        static.calibration_weight,
        static.weight_decay,
        static.masked,
    )


class Step:
    """The compiled step of one attack: ``step(x, y)`` sets ``.grad`` of X_hat and of the attack's
    variables and returns the objective's terms (each () or (N,)), as the eager step's backward would.
    x: X_hat, (k,C,H,W) normalised images, or (N,k,C,H,W) batched, float32 or float64; y: (k,) or
    (N,k) int64 labels. Built once per attack (``prepare_step``): it reads the attack's constants
    (w0, wT, delta_w (P,) or (N,P), the midpoint, the quadrature coefficients weighted by the client's
    optimizer, the buffers, the observed mask) and its variables by name (``VARIABLES``).

    ``note``: "compiled", or after a failed compile "eager (compile failed: ...)"; ``failed`` then
    says the caller must take the eager step (this one and every later one).
    """

    def __init__(self, attack, x: torch.Tensor):
        self.attack, self.failed = attack, False
        names = VARIABLES[attack.name]
        self.variables = [getattr(attack, n) for n in names]
        coeffs = attack.w0.new_ones(1)
        basis = None
        if attack.name == "pisme":
            coeffs, basis = attack.node_weights, attack.basis.to(attack.w0)
            if attack.step_weights is not None:
                coeffs = coeffs * attack.path_weights(attack.nodes)
        model, batched = attack.model, bool(attack.batch_shape)
        self.static = _Static(
            method=attack.name,
            model=model,
            shapes=tuple(attack.shapes),
            structured=attack.buffers is None and _is_paper_cnn(model, attack.shapes, x[0] if batched else x),
            batched=batched,
            tv_weight=float(attack.config.tv_weight),
            tv_reduction=attack.config.tv_reduction,
            control_point_weight=float(attack.config.control_point_weight),
            calibration_weight=float(attack.config.calibration_weight),
            weight_decay=float(attack.weight_decay),
            masked=attack.observed_mask is not None,
        )
        self.consts = {
            "w0": attack.w0,
            "wT": attack.wT,
            "delta_w": attack.delta_w,
            "coeffs": coeffs.detach(),
            "buffers": dict(attack.buffers or {}),
        }
        if basis is not None:
            self.consts["basis"] = basis.detach()
        if hasattr(attack, "anchor"):
            self.consts["anchor"] = attack.anchor
        if attack.observed_mask is not None:
            self.consts["mask"] = attack.observed_mask
        self.key = _key(attack, self.static, x, self.consts)
        self.note = "compiled"
        if self.key in _FAILED:
            self.failed, self.note = True, f"eager (compile failed: {_FAILED[self.key]})"
        elif self.key not in _STEPS:
            # the template is a copy: later attacks of the key need not keep this attack's model alive
            static = _Static(**{**self.static.__dict__, "model": _template(model)})
            backend = _counting_backend(self.key, x.device.type == "cuda")
            _STEPS[self.key] = torch.compile(partial(_step, static), backend=backend, fullgraph=True, dynamic=False)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> dict | None:
        """One step's gradients (set as ``.grad``) and terms; None after a failed compile."""
        if self.failed:
            return None
        variables = tuple(v.detach() for v in self.variables)
        if x.device.type == "cuda":  # CUDA graphs: the last step's outputs (the .grad Adam used) may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        try:
            gx, gv, terms = _STEPS[self.key](x.detach(), variables, y, self.consts)
        except Exception as exc:  # the compiler's failure: remembered for the key, reported, eager from here
            reason = _one_line(exc)
            _FAILED[self.key] = reason
            _STEPS.pop(self.key, None)
            log.warning("compiling the %s step failed, running it eagerly: %s", self.attack.name, reason)
            self.failed, self.note = True, f"eager (compile failed: {reason})"
            return None
        x.grad = gx
        for v, g in zip(self.variables, gv):
            v.grad = g
        return terms


def _template(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    template = copy.deepcopy(model)
    for p in template.parameters():
        p.requires_grad_(False)
    return template


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def prepare_step(attack, x: torch.Tensor, mode: str, precision: str) -> tuple[Step | None, str]:
    """(the compiled step or None, the note for ``Reconstruction.compile``) of ``attack`` on X_hat ``x``
    (its shape and device) with ``compile=mode``: "eager" when not asked, "eager (<reason>)" when the
    attack cannot be compiled (``_why_not``), else a ``Step`` ("compiled")."""
    if not resolve_compile(mode, x.device):
        return None, "eager"
    why = _why_not(attack, precision)
    if why:
        if mode == "on":
            log.info("compile=on: %s", why)
        return None, f"eager ({why})"
    step = Step(attack, x)
    return (None if step.failed else step), step.note


def reset() -> None:
    """Forget every compiled step, failure and count of this process (tests)."""
    _STEPS.clear()
    _FAILED.clear()
    COMPILATIONS.clear()
