"""Dimitrov et al.'s FedAvg attack (Dimitrov, Balunovic, Konstantinov and Vechev, "Data Leakage in Federated
Averaging", TMLR 2022, arXiv 2206.12395, sections 4-5; the authors' code eth-sri/fedavg_leakage:
fedavg/utils/flax_losses.py and fedavg/attacks/grad_attack.py, their scripts reconstruct_*_table1.sh).

Instead of one gradient, it inverts the whole local run (Dimitrov et al., "Data Leakage in Federated
Averaging", TMLR 2022, section 4, and the authors' eth-sri/fedavg_leakage code):

1. the target is D = (w0 - wT) / eta, the sum of the client's T minibatch-mean gradients;
2. the variables are one set X[e] of k dummy images per local epoch e (E sets, N(0, 1) in normalised
   space); every epoch uses the same label list, and batch j of epoch e is slots jB .. jB+B-1 of X[e]
   (the last batch of an epoch is smaller when B does not divide k, as the client's); separate sets
   per epoch absorb the unknown per-epoch shuffle;
3. the client's T steps are simulated from w0 on those batches with unrolled, differentiable updates
   at the client's eta (``simulate_update``), following the update's optimizer metadata: plain SGD,
   SGD with momentum or Nesterov, Adam or AdamW, with weight decay (``config.optimizer_aware`` False:
   plain SGD, as the authors' code); D~ = (w0 - w~T) / eta;
4. the loss (``Dimitrov.objective``) is
   f(i) (1/T) sum_l a_l ||D~_l - D_l||^2 + lambda_TV TV(X) + lambda_clip sum (u - clip(u, 0, 1))^2
   + lambda_inv L_inv(X), with a_l = exp(-(l - 1)) for layer l counted from the input (a layer's weight
   and bias share a_l; a layer is a module, the parameter names' prefix), TV the sum of squared
   neighbour differences of each image averaged over the E k images, the clip term summed over
   pixels of the de-normalised images u averaged over the E k images (the authors' clip_prior), and
   L_inv the epoch-order-invariant prior: the mean over all E^2 ordered pairs of epochs (e, e')
   (the authors' meshgrid, the diagonal included) of mean((g(X[e]) - g(X[e']))^2), g pooling an
   epoch's k images: their elementwise mean (FEMNIST), or the elementwise max over the images after
   ONE fixed random 3x3 convolution with 96 output channels and zero bias (CIFAR-100; drawn once
   from the attack's seed, LeCun-normal truncated at 2 std as Flax's default, padding 1). The data
   weight f(i) goes geometrically from f0 to f1 over the first half of the iterations, then stays;
5. all X[e] are fitted with Adam at the rate lr * decay^(i / every) (optax's exponential_decay);
   a non-finite loss or iterate restarts the client from fresh N(0, 1) sets with zeroed Adam
   moments (at most ``dimitrov_restarts`` times), after which its last finite sets are kept;
6. the output merges the E sets: each epoch's images are Hungarian-matched to epoch 1's by PSNR
   (de-normalised, unclamped, data range 1; scipy.optimize.linear_sum_assignment) and the E matched
   copies are averaged into k images (``merge_epochs``).

The hyperparameters are the authors' per dataset (``DATASET_DEFAULTS``, PEERS.md's table), overridable
with the ``dimitrov_*`` fields of ``AttackConfig``; the iterations are ``config.iterations`` (the
authors: 400).

Labels: the labels the harness gives every method (``reconstruct``'s ``labels``: recovered from the
update by ``config.label_estimator``, or oracle), held in their given order as the label list of every
epoch. PEERS.md's label estimator along the trajectory (step 7) is NOT implemented here.

Shapes: the attack's variable is X of shape (E, k, C, H, W), or (N, E, k, C, H, W) for N clients
(``reconstruct_batch``: the simulation is vmapped over the clients by ``path_gradient``); what the
harness scores and returns is the merge, (k, C, H, W) normalised, which ``reconstruct`` hands back
de-normalised and clamped to [0, 1] NCHW. The trace's "lsim_honest" (and "lsim_calibrated", the same:
no calibration) is Lsim(D~, delta_w) of the per-epoch sets; "tv" is the squared TV above; the
"update_distance", "clip" and "invariance" terms, the data weight, the restarts and T are traced too.

Errors: ValueError without the update's metadata, for a dataset without defaults, for metadata whose
local_steps is not E ceil(k/B), for ``image_prior`` other than "none" or ``bn_stats_weight`` > 0 (not
defined for this objective); a joint attack on several updates is refused (``JointAttack``).

Where the ports differ (PEERS.md, section 1), this follows the authors' code, except: the optimizer
metadata is simulated (the authors simulate plain SGD whatever the client ran); the labels are the
harness's; on a non-finite loss the authors stop and keep the last finite images, here the client
restarts first; the authors' scripts pick the best of ``att_restarts`` runs by PSNR against the
ground truth, which a server cannot, so here there is one run; their measures.total_variation is not
in the public copy, so TV is PEERS.md's (squared differences, per image, averaged over the images,
as the code's ``.mean()``); epoch 1's set starts from the harness's start (the seed's N(0, 1) draw or a
warm start), the other epochs' from fresh N(0, 1) draws of the seed; the random convolution is
drawn by torch, not Flax. Not LeakPro's preset (cosine over all parameters, no layer weights, 8,000
iterations, an L2 merge) nor fleak's (one dummy set shared by the epochs).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from fl_attack.attacker.attacks.base import Attack, lsim, register
from fl_attack.attacker.attacks.gradients import path_gradient
from fl_attack.federation.config import ClientOptimizer
from fl_attack.federation.data import get_spec

# The authors' scripts (fedavg/scripts/reconstruct_{femnist,cifar}_table1.sh), PEERS.md's table.
DATASET_DEFAULTS = {
    "femnist": dict(
        lr=0.4, lr_decay=0.995, decay_every=10, data_start=1.0, data_end=2.0, tv=1e-3, clip=2.0, invariance=1000.0
    ),
    "cifar100": dict(
        lr=0.1, lr_decay=0.997, decay_every=20, data_start=4.0, data_end=2.0, tv=2e-4, clip=10.0, invariance=6.075
    ),
}
POOLING = {"femnist": "mean", "cifar100": "conv-max"}  # g of the epoch-order-invariant prior
CONV_CHANNELS = 96


def resolve_settings(config, dataset: str) -> dict:
    """The attack's hyperparameters for ``dataset``: ``DATASET_DEFAULTS`` where a ``dimitrov_*`` field of
    ``config`` (an AttackConfig) holds its default (0, or -1 for the three weights), else the field.
    ValueError for a dataset without defaults."""
    Dimitrov.check_dataset(dataset)
    out = dict(DATASET_DEFAULTS[dataset])
    for key in ("lr", "lr_decay", "decay_every", "data_start", "data_end"):
        value = getattr(config, f"dimitrov_{key}")
        if value:
            out[key] = value
    for key in ("tv", "clip", "invariance"):
        value = getattr(config, f"dimitrov_{key}")
        if value != -1:
            out[key] = value
    out["pool"] = POOLING[dataset]
    return out


def _safe_sqrt(v: torch.Tensor) -> torch.Tensor:
    """sqrt(v) for v >= 0 whose derivative at v = 0 is 0, not inf (Adam's sqrt of a second moment that
    is exactly 0 where a coordinate has had no gradient yet; the value is the plain sqrt)."""
    tiny = torch.finfo(v.dtype).tiny
    return torch.where(v > 0, v.clamp_min(tiny).sqrt(), torch.zeros_like(v))


def client_step(w: torch.Tensor, g: torch.Tensor, optimizer: ClientOptimizer, lr: float, state: dict, t: int):
    """One differentiable step of the client's optimizer (torch.optim's update rules, written out):
    w, g: (P,) or (N, P) weights and minibatch-mean gradient; t: the step number from 1; state: the
    optimizer's running tensors (momentum buffer, Adam's moments), updated in place of the dict.
    Returns the next weights. sgd / momentum / nesterov: torch.optim.SGD (L2 weight decay added to g,
    no dampening, buffer = g at t = 1); adam: torch.optim.Adam (L2 weight decay); adamw:
    torch.optim.AdamW (w (1 - lr lambda) first); Adam's eps is torch's 1e-8."""
    name, wd = optimizer.name, optimizer.weight_decay
    if name == "adamw":
        if wd:
            w = w * (1 - lr * wd)
    elif wd:
        g = g + wd * w
    if name == "sgd":
        return w - lr * g
    if name in ("momentum", "nesterov"):
        mu = optimizer.momentum
        buf = g if t == 1 else mu * state["buf"] + g
        state["buf"] = buf
        return w - lr * (g + mu * buf if name == "nesterov" else buf)
    b1, b2 = optimizer.adam_betas
    m = (1 - b1) * g if t == 1 else b1 * state["m"] + (1 - b1) * g
    v = (1 - b2) * g * g if t == 1 else b2 * state["v"] + (1 - b2) * g * g
    state["m"], state["v"] = m, v
    denom = _safe_sqrt(v) / math.sqrt(1 - b2**t) + 1e-8
    return w - (lr / (1 - b1**t)) * m / denom


def simulate_update(
    model, shapes, w0: torch.Tensor, images: torch.Tensor, y: torch.Tensor, metadata, optimizer=None, buffers=None
) -> torch.Tensor:
    """D~ = (w0 - w~T) / eta: the client's local run simulated on per-epoch dummy sets, differentiable
    in ``images`` (and w0).

    images: (E, k, C, H, W) normalised, or (N, E, k, C, H, W) for N clients with w0 (N, P) and y (N, k);
    y: (k,) int64, the label list of every epoch. metadata: the update's TrainingMetadata (eta = lr,
    B = batch_size); step t = e ceil(k/B) + j runs batch j of epoch e, slots jB .. min(jB + B, k) - 1.
    optimizer: a ClientOptimizer (None: plain SGD). Each step's gradient is ``path_gradient`` at one
    anchor (the paper's CNNs take its structured path). Returns (P,) or (N, P).
    """
    opt = optimizer if optimizer is not None else ClientOptimizer()
    E, k = images.shape[-5], images.shape[-4]
    B, lr = int(metadata.batch_size), float(metadata.lr)
    one = w0.new_ones(1)
    w, state, t = w0, {}, 0
    for e in range(E):
        for start in range(0, k, B):
            t += 1
            xb = images[..., e, start : start + B, :, :, :]
            g = path_gradient(model, shapes, [w], None, one, xb, y[..., start : start + B], buffers)
            w = client_step(w, g, opt, lr, state, t)
    return (w0 - w) / lr


def layer_weights(shapes, dtype, device) -> torch.Tensor:
    """(P,) a_l = exp(-(l - 1)) per coordinate, l the layer of its parameter counted from 1 in the
    layout's order, a layer being the parameters of one module (name prefix before the last dot)."""
    layers, out = [], []
    for name, shape in shapes:
        prefix = name.rsplit(".", 1)[0]
        if prefix not in layers:
            layers.append(prefix)
        out.append(torch.full((math.prod(shape),), math.exp(-layers.index(prefix)), dtype=dtype, device=device))
    return torch.cat(out)


def squared_tv(x: torch.Tensor) -> torch.Tensor:
    """The sum of squared neighbour differences of each image, averaged over the E k images:
    x (..., E, k, C, H, W) -> (...)."""
    dh = (x[..., 1:, :] - x[..., :-1, :]).pow(2).sum((-3, -2, -1))
    dw = (x[..., :, 1:] - x[..., :, :-1]).pow(2).sum((-3, -2, -1))
    return (dh + dw).mean((-2, -1))


def clip_term(x: torch.Tensor, spec) -> torch.Tensor:
    """sum over pixels of the mean over the E k images of (u - clip(u, 0, 1))^2, u the de-normalised
    images: x (..., E, k, C, H, W) -> (...)."""
    u = spec.denormalize(x)
    return (u - u.clamp(0, 1)).pow(2).mean((-5, -4)).sum((-3, -2, -1))


def invariance_prior(x: torch.Tensor, conv: torch.Tensor | None = None) -> torch.Tensor:
    """L_inv: the mean over all E^2 ordered pairs (e, e') of mean((g(X[e]) - g(X[e']))^2).
    x: (..., E, k, C, H, W) -> (...). g: the mean over an epoch's k images (conv None), or the max over
    them of conv2d(X[e], conv, padding 1), conv (96, C, 3, 3). Computed as 2 mean_{e,d}(G - mean_e G)^2,
    the same sum over the pairs."""
    if conv is None:
        pooled = x.mean(-4)
    else:
        c, h, w = x.shape[-3:]
        z = F.conv2d(x.reshape(-1, c, h, w), conv.to(x.dtype), padding=1)
        pooled = z.reshape(*x.shape[:-3], *z.shape[-3:]).amax(-4)
    pooled = pooled.flatten(-3)  # (..., E, D)
    return 2 * (pooled - pooled.mean(-2, keepdim=True)).pow(2).mean((-2, -1))


def random_conv(channels: int, seed: int) -> torch.Tensor:
    """The prior's fixed random 3x3 convolution, (96, channels, 3, 3) float32: Flax's default kernel
    init (LeCun normal: a normal truncated at 2 std, std sqrt(1 / fan_in) / 0.8796), from ``seed``."""
    gen = torch.Generator().manual_seed(int(seed))
    std = math.sqrt(1.0 / (channels * 9)) / 0.87962566103423978
    weight = torch.empty(CONV_CHANNELS, channels, 3, 3)
    torch.nn.init.trunc_normal_(weight, 0.0, std, -2 * std, 2 * std, generator=gen)
    return weight


@torch.no_grad()
def merge_epochs(x: torch.Tensor, spec) -> torch.Tensor:
    """Epoch 1's k images and every other epoch's, matched to them one to one by PSNR (de-normalised,
    unclamped, data range 1; Hungarian, maximising the summed PSNR), averaged over the E matched copies.
    x: (E, k, C, H, W) normalised, or (N, E, k, C, H, W); returns (k, C, H, W) or (N, k, C, H, W)."""
    if x.dim() == 6:
        return torch.stack([merge_epochs(one, spec) for one in x.unbind(0)])
    E, k = x.shape[:2]
    if E == 1:
        return x[0].clone()
    u = spec.denormalize(x.float()).flatten(2)  # (E, k, D)
    mse = torch.cdist(u[:1].expand(E - 1, -1, -1), u[1:]).pow(2) / u.shape[-1]  # (E-1, k, k)
    cost = (10 * torch.log10(mse.clamp_min(1e-30))).cpu().numpy()  # -PSNR
    copies = [x[0]]
    for e in range(1, E):
        rows, cols = linear_sum_assignment(cost[e - 1])
        order = torch.as_tensor(cols[np.argsort(rows)], device=x.device)
        copies.append(x[e][order])
    return torch.stack(copies).mean(0)


@register
class Dimitrov(Attack):
    """The FedAvg attack: per-epoch dummy sets fitted through the unrolled local run (module docstring)."""

    name = "dimitrov"
    generates_images = True  # X_hat is the merge of the per-epoch sets, the attack's own variables
    own_variables = "per-epoch image sets"

    def __init__(self, model, w0, wT, shapes, config, training=None, buffers=None, statistics=None):
        if config.image_prior != "none":
            raise ValueError("dimitrov does not take the diffusion prior (image_prior must be 'none')")
        if config.bn_stats_weight > 0:
            raise ValueError("dimitrov does not take bn_stats_weight > 0")
        super().__init__(model, w0, wT, shapes, config, training, buffers, statistics)
        if training is None:
            raise ValueError("dimitrov simulates the client's local run: it needs the update's metadata")
        self.spec = get_spec(training.dataset)
        self.settings = resolve_settings(config, self.spec.name)
        k, B, E = int(training.num_samples), int(training.batch_size), int(training.local_epochs)
        self.epochs, self.samples, self.steps = E, k, E * math.ceil(k / B)
        if int(training.local_steps) != self.steps:
            raise ValueError(
                f"dimitrov simulates T = E ceil(k/B) = {self.steps} steps, the update's metadata says "
                f"local_steps = {training.local_steps}"
            )
        self.client_optimizer = training.optimizer if config.optimizer_aware else ClientOptimizer()
        self.target = self.delta_w / float(training.lr)  # D
        self.weights = layer_weights(shapes, w0.dtype, w0.device)
        self.conv = None
        if self.settings["pool"] == "conv-max":
            self.conv = random_conv(self.spec.image_shape[0], config.seed).to(device=w0.device, dtype=w0.dtype)
        self.iteration = 0
        self.restarts = torch.zeros(self.batch_shape, dtype=torch.int64)
        self.frozen = torch.zeros(self.batch_shape, dtype=torch.bool)
        self.dummy = self._scored = self._last_good = self._loss_finite = None
        self._optimizers = []

    @classmethod
    def check_dataset(cls, dataset: str) -> None:
        """The authors' hyperparameters exist for FEMNIST and CIFAR-100 only (``DATASET_DEFAULTS``)."""
        if dataset not in DATASET_DEFAULTS:
            raise ValueError(f"dimitrov has hyperparameters for {', '.join(DATASET_DEFAULTS)}, not {dataset!r}")

    @classmethod
    def gradients_per_iteration(cls, config, trace=None):
        """The client steps unrolled per iteration, T (from the trace; 1 without one)."""
        steps = [r["unrolled_steps"] for r in trace or [] if "unrolled_steps" in r]
        return steps[-1] if steps else 1

    def _draw(self, restart: int) -> torch.Tensor:
        """Fresh N(0, 1) sets (E, k, C, H, W) in float32 from the seed (restart 0: epochs 2.. of the start)."""
        gen = torch.Generator().manual_seed(int(self.config.seed) + 1 + 7919 * restart)
        return torch.randn(self.epochs, self.samples, *self.spec.image_shape, generator=gen)

    def prepare(self, x, y):
        """X[1] = the harness's start x (k, C, H, W) (or (N, k, ...)); X[2..E] fresh N(0, 1) draws."""
        rest = self._draw(0)[1:].to(x)
        if self.batch_shape:
            rest = rest.expand(x.shape[0], *rest.shape)
        self.dummy = torch.cat([x.detach().unsqueeze(-5), rest], dim=-5).clone().requires_grad_(True)

    def param_groups(self):
        if self.dummy is None:
            raise RuntimeError("dimitrov: prepare(x, y) must run before the optimiser is built")
        return [{"params": [self.dummy], "lr": self.settings["lr"]}]

    def schedulers(self, optimizers):
        """Adam's rate times lr_decay^(i / decay_every) (optax's exponential_decay), the authors' schedule
        whatever config.lr_decay (SME's) says: dimitrov_lr_decay=1 holds the rate. Keeps the optimizers,
        whose moments a restart zeroes."""
        self._optimizers = list(optimizers)
        decay, every = self.settings["lr_decay"], self.settings["decay_every"]
        return [torch.optim.lr_scheduler.LambdaLR(o, lambda i: decay ** (i / every)) for o in optimizers]

    def data_weight(self) -> float:
        """f(i): f0 alpha^(i+1), alpha = (f1/f0)^(2/K), held at f1 once reached (the authors' curr_fac)."""
        f0, f1 = self.settings["data_start"], self.settings["data_end"]
        if f0 == f1:
            return float(f1)
        alpha = (f1 / f0) ** (2.0 / self.config.iterations)
        f = f0 * alpha ** (self.iteration + 1)
        return float(min(f, f1) if alpha >= 1 else max(f, f1))

    def images(self, x):
        return merge_epochs(self.dummy.detach(), self.spec)

    def simulated_update(self, y) -> torch.Tensor:
        """D~ of the current sets, (P,) or (N, P), differentiable in them."""
        return simulate_update(
            self.model, self.shapes, self.w0, self.dummy, y, self.training, self.client_optimizer, self.buffers
        )

    def objective(self, x, y):
        """The loss of step 4 (module docstring) on the per-epoch sets; ``x`` (their merge) is not used."""
        s, X = self.settings, self.dummy
        simulated = self.simulated_update(y)
        diff = simulated - self.target
        if self.observed_mask is not None:
            diff, simulated = diff * self.observed_mask, simulated * self.observed_mask
        distance = (self.weights * diff.pow(2)).sum(-1) / self.steps
        tv, clip = squared_tv(X), clip_term(X, self.spec)
        inv = invariance_prior(X, self.conv) if self.epochs > 1 else X.new_zeros(self.batch_shape)
        loss = self.data_weight() * distance + s["tv"] * tv + s["clip"] * clip + s["invariance"] * inv
        honest = lsim(simulated.detach(), self.delta_w)
        self._loss_finite = torch.isfinite(loss.detach()).cpu()
        self._scored = X.detach().clone()
        return {
            "loss": loss,
            "lsim_honest": honest,
            "lsim_calibrated": honest,
            "tv": tv.detach(),
            "update_distance": distance.detach(),
            "clip": clip.detach(),
            "invariance": inv.detach(),
        }

    @torch.no_grad()
    def project(self):
        """After each step: count the iteration; a client whose loss or sets are not finite restarts
        (fresh sets, zeroed Adam moments) or, out of restarts, keeps its last finite sets from then on."""
        self.iteration += 1
        X = self.dummy
        finite = torch.isfinite(X).flatten(len(self.batch_shape)).all(-1).cpu()
        scored = self._loss_finite
        if self._last_good is None:
            self._last_good = self._scored.clone()
        good = scored.reshape(-1)
        if bool(good.all()):
            self._last_good = self._scored
        elif self.batch_shape:
            keep = good.to(X.device)
            self._last_good[keep] = self._scored[keep]
        bad = (~scored | ~finite | self.frozen).reshape(-1)
        restarts, frozen = self.restarts.reshape(-1), self.frozen.reshape(-1)  # views, one entry per client
        for n in torch.nonzero(bad).flatten().tolist():
            index = (n,) if self.batch_shape else ()
            if not bool(frozen[n]) and int(restarts[n]) < self.config.dimitrov_restarts:
                restarts[n] += 1
                X[index] = self._draw(int(restarts[n])).to(X)
                self._last_good[index] = X[index]
            else:
                frozen[n] = True
                X[index] = self._last_good[index]
            self._zero_moments(index)

    def _zero_moments(self, index: tuple) -> None:
        for o in self._optimizers:
            state = o.state.get(self.dummy)
            if not state:
                continue
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key][index] = 0

    def summary(self):
        return {
            "data_weight": self.data_weight(),
            "restarts": self.restarts.to(torch.float64),
            "unrolled_steps": self.steps,
        }
