"""Label recovery from a multi-step update via the output layer (docs/PISME.md; the core of RLU,
Chen & Vikalo, ICML 2024), with estimators for models that have already learned (docs/label-recovery.md).

For SGD on mean cross-entropy, bT - b0 = -(eta/B) sum_steps sum_batch (p_ij - y_ij), hence the count
of class j among the k samples is n_j ~= k * (p_bar_j + delta_b_j / (eta * T)), with delta_b = bT - b0
(an UPDATE, of the opposite sign of a gradient) and p_bar_j the mean softmax probability of class j
over the trajectory. The estimators differ in how they get p_bar (``LABEL_ESTIMATORS``):

- "paper": p_bar from the models at w0 and wT on N(0, I) dummy inputs (docs/PISME.md).
- "support" (the default): as "paper", but the counts are restricted to the classes present in the batch, read
  exactly from the signs of the output-weight update (``class_support``), one sample at least each.
  Data-free. Not in the paper.
- "aux": p_bar modelled as M n / k with M[j, c] = E[p_j | y = c], the class-conditional softmax on a
  public auxiliary pool along a simulated local training from w0 (``simulated_confusion``), solved
  jointly with the counts on the support (``solve_counts``). Needs public labelled data
  (``AuxiliaryData``), disjoint from the clients' training data. Not in the paper.
- "rlu": RLU (Chen & Vikalo, ICML 2024): p_bar from the "erroneous confidence" on the same public pool
  at w0 and wT, refined by rolling the logits forward over the T local steps (``rlu_counts``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.func import functional_call

from fl_attack.federation.data import get_spec
from fl_attack.federation.models import build_model, output_bias_key
from fl_attack.federation.update import ObservedUpdate


def round_counts(raw: np.ndarray, total: int) -> np.ndarray:
    """Clip negative estimates to 0 and round to integers summing to ``total`` (largest remainder)."""
    raw = np.clip(np.nan_to_num(np.asarray(raw, dtype=np.float64)), 0, None)
    if raw.sum() <= 0:
        raw = np.ones_like(raw)
    scaled = raw * total / raw.sum()
    counts = np.floor(scaled).astype(np.int64)
    remainder = total - counts.sum()
    order = np.argsort(-(scaled - counts), kind="stable")
    counts[order[:remainder]] += 1
    return counts


@torch.no_grad()
def estimate_class_counts(
    update: ObservedUpdate,
    model: torch.nn.Module | None = None,
    num_dummy: int = 128,
    seed: int = 0,
    inputs: torch.Tensor | None = None,
) -> np.ndarray:
    """Raw (unrounded) per-class count estimates n_j, shape (num_classes,), summing to about k.

    p_bar is the softmax averaged, at w0 and at wT, over ``inputs`` when given (normalised model
    inputs (N,C,H,W), e.g. a reconstruction), else over ``num_dummy`` N(0, I) inputs clamped to the
    pixel box. Raises KeyError if the state has no output bias (``fl_attack.federation.models.output_bias_key``:
    ``OUTPUT_BIAS``, or for another model the last 1-D entry of size num_classes).
    """
    _require_output_bias(update)
    spec = get_spec(update.metadata.dataset)
    model = model or build_model(update.metadata.dataset)
    if inputs is None:
        gen = torch.Generator().manual_seed(seed)
        lo, hi = spec.pixel_box()
        inputs = torch.randn(num_dummy, *spec.image_shape, generator=gen)
        inputs = torch.maximum(torch.minimum(inputs, hi), lo)
    return _raw_counts(update, _mean_softmax(model, update, inputs))


def _require_output_bias(update: ObservedUpdate) -> str:
    """The output-layer bias's key (OUTPUT_BIAS for the paper's CNNs); KeyError when there is none."""
    return output_bias_key(update.w0, get_spec(update.metadata.dataset).num_classes)


def _raw_counts(update: ObservedUpdate, probs: torch.Tensor) -> np.ndarray:
    """n_j = k * (p_bar_j + delta_b_j / (eta * T)), with p_bar the mean of the (N, classes) ``probs``."""
    meta = update.metadata
    bias = _require_output_bias(update)
    delta_b = update.wT[bias] - update.w0[bias]
    return (meta.num_samples * (probs.mean(0).cpu() + delta_b / (meta.lr * meta.local_steps))).numpy()


def _mean_softmax(model, update, inputs):
    """(N, classes): the softmax of ``inputs`` averaged over the models at w0 and at wT."""
    device = inputs.device
    probs = [
        torch.softmax(functional_call(model, {k: v.to(device) for k, v in w.items()}, (inputs,)), dim=1)
        for w in (update.w0, update.wT)
    ]
    return (probs[0] + probs[1]) / 2


@torch.no_grad()
def refine_labels(
    update: ObservedUpdate, inputs: torch.Tensor, labels: torch.Tensor, model: torch.nn.Module | None = None
) -> torch.Tensor:
    """Labels re-estimated from a reconstruction (not in the paper; docs/attack-core.md).

    The counts are estimated as by ``estimate_class_counts``, with p_bar taken on ``inputs`` (the attack's
    current X_hat, normalised, (k,C,H,W)) instead of dummy inputs; after long local training the
    victim's softmax on its data departs from that on noise, and a reconstruction is closer to the
    data. When the counts are unchanged, ``labels`` is returned as is; otherwise the new multiset is
    assigned to the k images by an optimal matching (scipy.optimize.linear_sum_assignment) on
    -log p(label | image), averaged over w0 and wT. Returns (k,) int64 on ``labels``' device.
    Raises ValueError when inputs and labels disagree on k.
    """
    from scipy.optimize import linear_sum_assignment

    k = labels.shape[0]
    if inputs.shape[0] != k:
        raise ValueError(f"need one label per image, got {inputs.shape[0]} images and {k} labels")
    _require_output_bias(update)
    model = model or build_model(update.metadata.dataset).to(inputs.device)
    probs = _mean_softmax(model, update, inputs)  # one forward pass at w0 and wT serves both uses
    counts = round_counts(_raw_counts(update, probs), k)
    if np.array_equal(counts, np.bincount(labels.cpu().numpy(), minlength=len(counts))):
        return labels  # the same multiset: no image changes its label
    slots = np.repeat(np.arange(len(counts)), counts)  # the new multiset, one slot per image
    log_p = torch.log(probs.clamp_min(1e-12)).cpu().double().numpy()
    cost = -log_p[:, slots]  # (k images, k slots)
    rows, cols = linear_sum_assignment(cost)
    out = np.empty(k, dtype=np.int64)
    out[rows] = slots[cols]
    return torch.from_numpy(out).to(labels.device)


LABEL_ESTIMATORS = ("paper", "support", "aux", "rlu")
NEEDS_AUX = ("aux", "rlu")
# The labels an attack uses: recovered from the update, or the true ones handed to it (an explicit leak).
LABEL_MODES = ("recovered", "oracle")


def check_label_mode(labels) -> str:
    """``labels`` when it is one of ``LABEL_MODES``; ValueError otherwise. The one check of the label
    mode (``reconstruct``'s ``labels`` given as a name, the run config's attack-labels, ``Victim.attack_job``,
    ``fl-attack attack`` / ``replay`` --labels, the experiments' grids)."""
    if not isinstance(labels, str) or labels not in LABEL_MODES:
        raise ValueError(f"labels must be 'recovered' or 'oracle', got {labels!r}")
    return labels


@dataclass(frozen=True, eq=False)
class AuxiliaryData:
    """Public labelled images the server holds, e.g. its held-out pool for centralised evaluation.

    images: float (N,C,H,W) in [0,1] (not normalised); labels: int64 (N,) class ids. They must be
    disjoint from every client's training data (the caller's duty: nothing here can check it).
    Raises ValueError on mismatched lengths, N = 0, a non-4-D image tensor or pixels outside [0,1].
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self):
        if self.images.dim() != 4 or self.labels.dim() != 1 or self.images.shape[0] != self.labels.shape[0]:
            raise ValueError(
                f"auxiliary data needs images (N,C,H,W) and labels (N,), got "
                f"{tuple(self.images.shape)} and {tuple(self.labels.shape)}"
            )
        if self.labels.numel() == 0:
            raise ValueError("auxiliary data is empty")
        if not torch.is_floating_point(self.images) or self.images.min() < 0 or self.images.max() > 1:
            raise ValueError("auxiliary images must be floats in [0,1] (not normalised)")

    def by_class(self, num_classes: int) -> list[np.ndarray]:
        """Indices of the images of each class c, a list of num_classes int arrays (some maybe empty)."""
        labels = self.labels.cpu().numpy()
        return [np.flatnonzero(labels == c) for c in range(num_classes)]


def _output_weight_name(update: ObservedUpdate) -> str:
    """The output layer's weight: the ``.weight`` beside its bias (``fc2.weight`` for the paper's CNNs)."""
    return _require_output_bias(update).rsplit(".", 1)[0] + ".weight"


def class_support(update: ObservedUpdate) -> np.ndarray:
    """The classes present in the client's k samples, bool (num_classes,) (not in the paper).

    The output-weight update is delta_W_j = -(eta/B) sum_steps sum_batch (p_ij - y_ij) h_i, with h_i >= 0
    the ReLU features that feed the output layer. For a class j with no sample, y_ij = 0 and every
    term is <= 0, so row j of delta_W has no positive entry; with plain SGD this holds exactly in
    floating point too (each step only lowers those weights). A class is therefore declared present
    iff its row has a positive entry. Exact for the paper's CNNs under plain SGD without defences;
    noise (DP) or compression of the update breaks it. Raises KeyError without the output weight.
    """
    name = _output_weight_name(update)
    if name not in update.w0:
        raise KeyError(f"label recovery needs the output-layer weight '{name}' in the update")
    delta = (update.wT[name] - update.w0[name]).double()
    return (delta.amax(dim=1) > 0).numpy()


def round_counts_on_support(raw: np.ndarray, support: np.ndarray, total: int) -> np.ndarray:
    """Integer counts n (int64, raw's shape) summing to ``total``, with n_j >= 1 on ``support`` and 0 off it.

    The n closest to ``raw`` in squared error under those constraints: one sample per present
    class, then each remaining sample to the class with the largest raw_j - n_j (greedy, exact
    for this separable convex problem). Falls back to ``round_counts(raw, total)`` when the
    support is empty or has more than ``total`` classes (the support test then cannot be right).
    """
    raw = np.nan_to_num(np.asarray(raw, dtype=np.float64), nan=0.0)
    support = np.asarray(support, dtype=bool)
    if not 0 < support.sum() <= total:
        return round_counts(raw, total)
    counts = support.astype(np.int64)
    gap = np.where(support, raw - counts, -np.inf)
    for _ in range(total - int(counts.sum())):
        j = int(np.argmax(gap))
        counts[j] += 1
        gap[j] -= 1
    return counts


def output_bias_residual(update: ObservedUpdate) -> np.ndarray:
    """r = k * delta_b / (eta * T), float64 (num_classes,): n = k * p_bar + r (docs/PISME.md). Sums to ~0."""
    bias = _require_output_bias(update)
    meta = update.metadata
    delta_b = (update.wT[bias] - update.w0[bias]).double()
    return (meta.num_samples * delta_b / (meta.lr * meta.local_steps)).numpy()


def solve_counts(
    confusion: np.ndarray, residual: np.ndarray, total: int, support: np.ndarray | None = None, sum_weight: float = 10.0
) -> np.ndarray:
    """Raw counts n (float64, (num_classes,)) from n = M n + r with n >= 0 and sum n = total.

    confusion: M (num_classes, num_classes), M[j, c] = mean softmax probability of class j over the
    trajectory for a sample of class c (columns sum to 1); residual: r = k * delta_b / (eta * T).
    Solved as the bounded least squares min ||(I - M) n - r||^2 + (sum_weight * (sum n - total))^2 by
    scipy.optimize.lsq_linear, with bounds [1, total] on ``support`` and n = 0 off it when a
    support is given, else [0, total]. (I - M) alone is singular (its columns sum to 0, as does r):
    the sum row fixes the scale.
    """
    m = np.asarray(confusion, dtype=np.float64)
    c = m.shape[0]
    if m.shape != (c, c) or np.asarray(residual).shape != (c,):
        raise ValueError(f"confusion must be (C, C) and residual (C,), got {m.shape} and {np.asarray(residual).shape}")
    from scipy.optimize import lsq_linear

    lower, upper = np.zeros(c), np.full(c, float(total))
    if support is not None and 0 < np.sum(support) <= total:
        lower = np.where(support, 1.0, 0.0)
        upper = np.where(support, float(total), 1e-9)  # lsq_linear needs lower < upper
    a = np.vstack([np.eye(c) - m, np.full((1, c), sum_weight)])
    b = np.concatenate([np.asarray(residual, dtype=np.float64), [sum_weight * total]])
    return lsq_linear(a, b, bounds=(lower, upper), method="bvls").x


def simulated_confusion(
    update: ObservedUpdate, aux: AuxiliaryData, counts: np.ndarray, proxies: int = 2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Class-conditional softmax along simulated local trainings from w0 (not in the paper).

    Each proxy client draws counts[c] public images of each class c from ``aux`` (with replacement
    when aux has fewer), trains from w0 exactly as the metadata says (eta, B, E, plain SGD), and
    records the softmax of each batch at the weights before each step: the quantity whose mean
    enters delta_b. Returns (sums, seen): sums[j, c] the summed probability of class j over the
    steps for samples of class c, (C, C) float64, and seen[c] how many (sample, step) pairs of class
    c were recorded, (C,). A class that aux lacks is skipped. CPU, ``proxies`` x T SGD steps on a
    fresh model.
    """
    from fl_attack.federation.training import train_local

    meta = update.metadata
    spec = get_spec(meta.dataset)
    c = spec.num_classes
    pools = aux.by_class(c)
    gen = np.random.default_rng(seed)
    model = build_model(meta.dataset)  # trained in place: never the caller's
    sums, seen = torch.zeros(c, c, dtype=torch.float64), torch.zeros(c, dtype=torch.float64)
    for p in range(proxies):
        idx = [
            gen.choice(pools[j], size=int(n), replace=pools[j].size < n)
            for j, n in enumerate(np.asarray(counts))
            if n > 0 and pools[j].size > 0
        ]
        if not idx:
            break
        idx = torch.from_numpy(np.concatenate(idx))
        x, y = aux.images[idx].float().cpu(), aux.labels[idx].long().cpu()
        if x.shape[0] < meta.batch_size:
            continue
        model.load_state_dict(update.w0)
        result = train_local(
            model,
            x,
            y,
            dataset=meta.dataset,
            lr=meta.lr,
            batch_size=meta.batch_size,
            local_epochs=meta.local_epochs,
            seed=seed * 1000 + p,
            record_states=True,
        )
        xn = spec.normalize(x)
        with torch.no_grad():
            for w, batch in zip(result.states[:-1], result.batches):
                probs = torch.softmax(functional_call(model, w, (xn[batch],)), dim=1).double()
                sums.index_add_(1, y[batch], probs.T)
                seen += torch.bincount(y[batch], minlength=c).double()
    return sums.numpy(), seen.numpy()


@torch.no_grad()
def endpoint_confusion(
    update: ObservedUpdate, aux: AuxiliaryData, model: torch.nn.Module | None = None, per_class: int = 10, seed: int = 0
) -> np.ndarray:
    """M (C, C) float64: M[j, c] = mean over aux images of class c of the softmax p_j, averaged over the
    models at w0 and wT (at most ``per_class`` images per class). A class that aux lacks gets the
    mean column over all its images."""
    spec = get_spec(update.metadata.dataset)
    c = spec.num_classes
    pools = aux.by_class(c)
    gen = np.random.default_rng(seed)
    idx = np.concatenate([gen.choice(q, size=min(per_class, q.size), replace=False) for q in pools if q.size])
    idx = torch.from_numpy(idx)
    x, y = spec.normalize(aux.images[idx].float().cpu()), aux.labels[idx].long().cpu()
    probs = _mean_softmax(model or build_model(update.metadata.dataset), update, x).double()
    sums = torch.zeros(c, c, dtype=torch.float64).index_add_(1, y, probs.T)
    seen = torch.bincount(y, minlength=c).double()
    return _columns(sums.numpy(), seen.numpy(), probs.mean(0).numpy())


def _columns(sums: np.ndarray, seen: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """sums / seen per column; columns never seen take ``fallback`` (C,)."""
    out = np.repeat(np.asarray(fallback, dtype=np.float64)[:, None], sums.shape[1], axis=1)
    have = seen > 0
    out[:, have] = sums[:, have] / seen[have]
    return out


# --- RLU (Chen & Vikalo, ICML 2024) ---------------------------------------------------------------

RLU_MOVES = 5  # the refinement moves one count at most this many times (the paper's and its code's)
RLU_TOLERANCE = 0.1  # ... and stops once every rolled logit is this close to the observed one (the code's)
RLU_PER_CLASS = 20  # public images per class for the logits at w0 and wT


def rlu_step_coefficient(update: ObservedUpdate) -> float:
    """rho_bar, the mean over the T steps of the weight c_s of step s's gradient in (w0 - wT)/eta
    (``ClientOptimizer.step_weights``, docs/PISME.md "Optimizers"): 1 for plain SGD, Adam and AdamW;
    (1/T) sum_s (1 - beta^(T-s+1)) / (1 - beta) for heavy-ball momentum beta (about 6.5 at beta = 0.9,
    T = 10); 1 + beta times that for Nesterov. Dimensionless, >= 1."""
    meta = update.metadata
    return float(np.mean(meta.optimizer.step_weights(meta.local_steps)))


def rlu_output_gradients(update: ObservedUpdate) -> tuple[np.ndarray, np.ndarray]:
    """(g, G): the observed mean per-step gradient of the output bias, float64 (C,), and of the output
    weight, float64 (C, H), read from w0 - wT alone.

    g = (b0 - bT) / (eta * T * rho_bar) - lambda * (b0 + bT) / 2 (``rlu_step_coefficient``): for an SGD-family
    optimizer, (w0 - wT)/eta = sum_s c_s (g_s + lambda w_{s-1}), with the decayed weights taken at the
    midpoint of w0 and wT; AdamW's decoupled decay is removed the same way with rho_bar = 1. For Adam and
    AdamW, g is then the mean normalised step m_hat / sqrt(v_hat), in [-1, 1] per class, not a gradient
    (the fallback ``rlu_counts`` documents); Adam's L2 decay sits inside that ratio and is left in.
    Raises KeyError without the output bias or its weight (``<layer>.weight`` beside the bias).
    """
    meta, opt = update.metadata, update.metadata.optimizer
    bias = _require_output_bias(update)
    weight = _output_weight_name(update)
    if weight not in update.w0:
        raise KeyError(f"label estimator 'rlu' needs the output-layer weight '{weight}' in the update")
    scale = meta.lr * meta.local_steps * rlu_step_coefficient(update)
    decay = opt.weight_decay if (not opt.adaptive or opt.name == "adamw") else 0.0
    out = []
    for name in (bias, weight):
        w0, wT = update.w0[name].double(), update.wT[name].double()
        out.append(((w0 - wT) / scale - decay * (w0 + wT) / 2).numpy())
    return out[0], out[1].reshape(out[0].shape[0], -1)


@torch.no_grad()
def rlu_offclass_logits(
    update: ObservedUpdate,
    aux: AuxiliaryData,
    model: torch.nn.Module | None = None,
    per_class: int = RLU_PER_CLASS,
    seed: int = 0,
    chunk: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
    """(mu0, muT), float64 (C,) each: mu_c = the mean logit of class c over the public images NOT of
    class c, at w0 and at wT (RLU, step 1). Each class of aux gets equal weight (the mean over the
    classes j != c of class j's mean logit c, as in the authors' code); at most ``per_class`` images
    per class, drawn with ``default_rng(seed)``. The model runs in eval mode (the official code runs
    these passes in train mode, so dropout and batch norm perturb them); its mode is restored after.
    """
    spec = get_spec(update.metadata.dataset)
    c = spec.num_classes
    gen = np.random.default_rng(seed)
    pools = aux.by_class(c)
    idx = torch.from_numpy(
        np.concatenate([gen.choice(q, size=min(per_class, q.size), replace=False) for q in pools if q.size])
    )
    x, y = spec.normalize(aux.images[idx].float().cpu()), aux.labels[idx].long().cpu()
    present = torch.bincount(y, minlength=c) > 0
    model = model or build_model(update.metadata.dataset)
    was_training = model.training
    model.eval()
    try:
        out = []
        for w in (update.w0, update.wT):
            logits = torch.cat([functional_call(model, w, (x[i : i + chunk],)) for i in range(0, len(x), chunk)])
            sums = torch.zeros(c, c, dtype=torch.float64).index_add_(0, y, logits.double())
            means = sums[present] / torch.bincount(y, minlength=c)[present, None].double()  # (classes in aux, C)
            total = means.sum(0)
            own = torch.zeros(c, dtype=torch.float64)
            own[present] = means[torch.arange(int(present.sum())), present.nonzero().squeeze(1)]
            others = float(present.sum()) - present.double()  # how many aux classes are not c
            out.append(((total - own) / others.clamp_min(1)).numpy())
    finally:
        model.train(was_training)
    return out[0], out[1]


def _softmax(z: np.ndarray) -> np.ndarray:
    z = np.exp(z - z.max())
    return z / z.sum()


def _rlu_roll(mu0: np.ndarray, counts: np.ndarray, update: ObservedUpdate, gain: float) -> tuple[np.ndarray, ...]:
    """RLU step 4: the off-class logits rolled over the T local steps from mu0 with these counts,
    mu_{t+1} = mu_t - eta * u_t * gain, u_t the optimizer's step direction for the bias gradient
    softmax(mu_t) - counts/k (heavy ball: v = beta v + g; Nesterov: g + beta v; plain SGD: g) and gain
    = ||O||^2 + 1. Returns (mu_T, the mean of softmax(mu_t) over t = 0 .. T-1), float64 (C,) each."""
    meta = update.metadata
    opt, k = meta.optimizer, meta.num_samples
    mu, buf, mean = mu0.copy(), np.zeros_like(mu0), np.zeros_like(mu0)
    for _ in range(meta.local_steps):
        p = _softmax(mu)
        mean += p
        g = p - counts / k
        if opt.name in ("momentum", "nesterov"):
            buf = opt.momentum * buf + g
            g = buf if opt.name == "momentum" else g + opt.momentum * buf
        mu = mu - meta.lr * g * gain
    return mu, mean / meta.local_steps


def rlu_counts(
    update: ObservedUpdate,
    aux: AuxiliaryData,
    model: torch.nn.Module | None = None,
    seed: int = 0,
    per_class: int = RLU_PER_CLASS,
    moves: int = RLU_MOVES,
    tolerance: float = RLU_TOLERANCE,
) -> np.ndarray:
    """RLU's label counts, int64 (num_classes,) summing to k (Chen & Vikalo, "Recovering Labels from Local
    Updates in Federated Learning", ICML 2024, arXiv 2405.00955, section 4; docs/label-recovery.md "RLU").

    The output-bias gradient of a step is the batch mean of softmax - one-hot, so its mean over the T steps
    is g_c ~= rho_bar * e_c - rho_bar * n_c / k, e_c the softmax mass the client's samples put on class c:
    1. e = the mean of softmax(mu0) and softmax(muT), mu the off-class mean logits of the public pool
       ``aux`` at w0 and wT (``rlu_offclass_logits``: the paper's "erroneous confidence" as its code takes it);
       softmax(mu0) alone when T = 1 (the one gradient is taken at w0).
    2. g from w0 - wT (``rlu_output_gradients``), already divided by rho_bar (``rlu_step_coefficient``);
       n_c = k * max(0, e_c - g_c), which equals the paper's k * max(0, rho_bar * e_c - g_c) with g undivided
       once both are renormalised; renormalised to sum k and rounded by largest remainder (``round_counts``).
    3. T > 1 (not Adam/AdamW): roll mu0 forward over the T steps with these counts (``_rlu_roll``, the
       embedding proxy O = the |delta_b|-weighted mean over classes of delta_W_c / delta_b_c), compare
       the end with muT, move one count from the most over-predicted class (that has one) to the most
       under-predicted; at most ``moves`` times, stopping once every |difference| < ``tolerance``. Then
       step 2 again with e = the trajectory mean of softmax(mu_t) under the final counts.
    Adam and AdamW (an approximation, stated): the server never sees v_hat, so delta_b / (eta T) is the
    mean normalised step, a per-class signed consistency in [-1, 1] rather than a gradient; step 2 is
    applied to it as is (rho_bar = 1), giving each class with a rising bias a count in proportion to how
    steadily it rose, and step 3 is skipped (its step size needs the gradient's scale).
    aux: the server's public labelled pool, never the client's data. Auxiliary passes run in eval mode.

    Official-code faults avoided (CityChan/Recovering-Label-from-Update): the update is w0 - wT of the
    client's whole run (not per-step gradients of m steps with resets between groups); rho_bar comes
    from the optimizer metadata (not a decay flag that makes it 1.1 for plain SGD); the refinement
    compares the rolled logit vector with the observed one entry by entry (not with one scalar entry);
    counts are rounded to sum exactly k; O is |delta_b|-weighted, so a class whose bias barely moved
    cannot blow the ratio up (a choice of ours; the code takes the plain mean).
    Raises KeyError without the output bias or weight in the update.
    """
    meta = update.metadata
    k = meta.num_samples
    g, gw = rlu_output_gradients(update)
    mu0, mu_t = rlu_offclass_logits(update, aux, model, per_class=per_class, seed=seed)
    # T = 1: the one gradient is taken at w0, so the trajectory mean is softmax(mu0) exactly
    e = _softmax(mu0) if meta.local_steps == 1 else (_softmax(mu0) + _softmax(mu_t)) / 2
    counts = round_counts(k * np.maximum(0.0, e - g), k)
    if meta.local_steps == 1 or meta.optimizer.adaptive or moves <= 0:
        return counts
    weights = np.abs(g)
    proxy = (np.sign(g)[:, None] * gw).sum(0) / max(weights.sum(), 1e-30)  # sum_c |g_c| (G_c / g_c) / sum |g|
    gain = float(proxy @ proxy) + 1.0
    for _ in range(moves):
        end, _ = _rlu_roll(mu0, counts, update, gain)
        diff = end - mu_t
        if not np.all(np.isfinite(diff)) or np.abs(diff).max() < tolerance:
            break
        over = int(np.argmax(np.where(counts > 0, diff, -np.inf)))
        under = int(np.argmin(diff))
        if diff[over] <= 0 or diff[under] >= 0:
            break
        counts[over] -= 1
        counts[under] += 1
    _, e = _rlu_roll(mu0, counts, update, gain)
    if not np.all(np.isfinite(e)):
        return counts
    return round_counts(k * np.maximum(0.0, e - g), k)


def recover_counts(
    update: ObservedUpdate,
    estimator: str = "support",
    aux: AuxiliaryData | None = None,
    model: torch.nn.Module | None = None,
    seed: int = 0,
    iterations: int = 3,
    proxies: int = 2,
) -> np.ndarray:
    """The recovered label multiset as counts, int64 (num_classes,) summing to k.

    estimator (``LABEL_ESTIMATORS``, docs/label-recovery.md):
    - "paper": round_counts of ``estimate_class_counts`` (p_bar on dummy inputs at w0 and wT; docs/PISME.md).
    - "support": the same raw counts rounded on ``class_support`` (each present class >= 1, absent 0).
    - "aux": start from the support estimate with M at the endpoints on ``aux`` (``endpoint_confusion``);
      then ``iterations`` times: M's columns from ``proxies`` simulated clients with the current
      counts (``simulated_confusion``), n from ``solve_counts`` on the support. Needs ``aux``.
    - "rlu": RLU (Chen & Vikalo, ICML 2024) on the public pool ``aux`` (``rlu_counts``). Needs ``aux``.
    Raises ValueError for an unknown estimator or "aux" without aux data; KeyError without the
    output layer in the update.
    """
    if estimator not in LABEL_ESTIMATORS:
        raise ValueError(f"unknown label estimator {estimator!r}; choose from: {', '.join(LABEL_ESTIMATORS)}")
    if estimator in NEEDS_AUX and aux is None:
        raise ValueError(f"label estimator {estimator!r} needs public auxiliary data (AuxiliaryData)")
    k = update.metadata.num_samples
    if estimator == "rlu":
        return rlu_counts(update, aux, model, seed=seed)
    if estimator == "paper":
        return round_counts(estimate_class_counts(update, model, seed=seed), k)
    support = class_support(update)
    if estimator == "support":
        return round_counts_on_support(estimate_class_counts(update, model, seed=seed), support, k)
    residual = output_bias_residual(update)
    endpoints = endpoint_confusion(update, aux, model, seed=seed)
    counts = round_counts_on_support(solve_counts(endpoints, residual, k, support), support, k)
    for it in range(iterations):
        sums, seen = simulated_confusion(update, aux, counts, proxies=proxies, seed=seed + it)
        confusion = _columns(sums, seen, np.zeros(len(counts)))
        confusion[:, seen == 0] = endpoints[:, seen == 0]  # classes not simulated keep the endpoint columns
        counts = round_counts_on_support(solve_counts(confusion, residual, k, support), support, k)
    return counts


def recover_labels(
    update: ObservedUpdate,
    model: torch.nn.Module | None = None,
    seed: int = 0,
    estimator: str = "support",
    aux: AuxiliaryData | None = None,
) -> torch.Tensor:
    """Recovered labels, int64 shape (k,), sorted by class (their order is arbitrary to the attack).

    estimator / aux: see ``recover_counts``; "paper" is docs/PISME.md's estimator, "support" (the
    default, as in AttackConfig) the same counts restricted to the classes present.
    """
    counts = recover_counts(update, estimator, aux, model, seed=seed)
    return torch.from_numpy(np.repeat(np.arange(len(counts)), counts)).long()
