"""dimitrov (Dimitrov et al., TMLR 2022; fl_attack.attacker.attacks.dimitrov) against a literal unrolled loop.

THE REFERENCE: ``literal_loss`` below simulates the client's local run step by step with one
``torch.autograd.grad`` per step on dict parameters (torch.optim's update rules written out: plain
SGD, heavy-ball and Nesterov momentum, Adam, AdamW, with weight decay) and builds the attack's loss
(layer-weighted squared distance of the simulated update, squared TV, clip term, the
epoch-order-invariant prior over all E^2 pairs of epochs) from Dimitrov et al., TMLR 2022, and the
authors' eth-sri/fedavg_leakage code. That section uses torch alone: nothing from fl_attack. In float64
the attack's loss and its gradient with respect to the per-epoch image sets agree with it to 1e-10,
on the FEMNIST CNN (the structured gradient path), a tanh MLP (the generic path), the CIFAR-100 CNN
(the random-convolution prior) and two clients batched (the vmapped path). Then the merge, the
schedules, the restart on NaN, and on a real FEMNIST client the attack against its update-free null.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

# --- the literal reference: torch only ------------------------------------------------------------

FEMNIST_MEAN, FEMNIST_STD = (0.9642,), (0.1577,)
CIFAR_MEAN, CIFAR_STD = (0.5071, 0.4866, 0.4409), (0.2673, 0.2564, 0.2762)


def literal_update(model, w0: dict, X, y, B: int, lr: float, opt: dict) -> dict:
    """{name: (w0 - wT) / lr} after the client's E epochs on X (E, k, C, H, W): batch j of epoch e is
    X[e, jB:(j+1)B] with y[jB:(j+1)B]; opt: name, momentum, weight_decay, betas."""
    E, k = X.shape[0], X.shape[1]
    names = list(w0)
    w = {n: p.detach().clone().requires_grad_(True) for n, p in w0.items()}
    start = dict(w)
    buf, m, v = {}, {}, {}
    t = 0
    for e in range(E):
        for j in range(math.ceil(k / B)):
            t += 1
            loss = F.cross_entropy(functional_call(model, w, (X[e, j * B : (j + 1) * B],)), y[j * B : (j + 1) * B])
            grads = torch.autograd.grad(loss, [w[n] for n in names], create_graph=True)
            new = {}
            for n, g in zip(names, grads):
                p, wd, lr_ = w[n], opt["weight_decay"], lr
                if opt["name"] == "adamw":
                    p = p * (1 - lr_ * wd)
                else:
                    g = g + wd * p
                if opt["name"] == "sgd":
                    new[n] = p - lr_ * g
                elif opt["name"] in ("momentum", "nesterov"):
                    mu = opt["momentum"]
                    buf[n] = g if t == 1 else mu * buf[n] + g
                    step = g + mu * buf[n] if opt["name"] == "nesterov" else buf[n]
                    new[n] = p - lr_ * step
                else:  # adam, adamw
                    b1, b2 = opt["betas"]
                    m[n] = (1 - b1) * g if t == 1 else b1 * m[n] + (1 - b1) * g
                    v[n] = (1 - b2) * g**2 if t == 1 else b2 * v[n] + (1 - b2) * g**2
                    # as torch.optim.Adam's code: lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), with a
                    # sqrt whose derivative is 0 where v == 0 (a coordinate without gradient so far)
                    root = torch.where(v[n] > 0, v[n].clamp_min(1e-300).sqrt(), torch.zeros_like(v[n]))
                    new[n] = p - lr_ / (1 - b1**t) * m[n] / (root / math.sqrt(1 - b2**t) + 1e-8)
            w = new
    return {n: (start[n] - w[n]) / lr for n in names}


def literal_pieces(model, w0, target, X, y, B, lr, opt, *, mean, std, conv=None) -> dict:
    """The loss's pieces, literally (PEERS.md section 1): "simulated" D~ per parameter, "distance"
    (1/T) sum_l a_l |D~_l - D_l|^2 (a_l = exp(-(l-1)), l the layer, weight and bias alike), "tv" (squared
    neighbour differences summed per image, averaged over the E k images), "clip" (per pixel the mean
    over the images of (u - clip(u, 0, 1))^2 on the de-normalised u, summed), "inv" (the mean over all
    E^2 ordered pairs of epochs of mean((g(X[e]) - g(X[e']))^2), g the mean of an epoch's images, or
    their max after ``conv``)."""
    E, k = X.shape[0], X.shape[1]
    T = E * math.ceil(k / B)
    simulated = literal_update(model, w0, X, y, B, lr, opt)
    layers = []
    for n in w0:
        if n.rsplit(".", 1)[0] not in layers:
            layers.append(n.rsplit(".", 1)[0])
    distance = sum(math.exp(-layers.index(n.rsplit(".", 1)[0])) * ((simulated[n] - target[n]) ** 2).sum() for n in w0)
    images = X.reshape(E * k, *X.shape[2:])
    squared_tv = sum(
        ((img[:, 1:, :] - img[:, :-1, :]) ** 2).sum() + ((img[:, :, 1:] - img[:, :, :-1]) ** 2).sum() for img in images
    ) / (E * k)
    mean_t = torch.tensor(mean, dtype=X.dtype).view(-1, 1, 1)
    std_t = torch.tensor(std, dtype=X.dtype).view(-1, 1, 1)
    u = images * std_t + mean_t
    clipped = ((u - u.clamp(0, 1)) ** 2).mean(0).sum()

    def pool(e):
        if conv is None:
            return X[e].mean(0)
        return F.conv2d(X[e], conv, padding=1).amax(0)

    pairs = [((pool(a) - pool(b)) ** 2).mean() for a in range(E) for b in range(E)]
    invariance = sum(pairs) / len(pairs)
    return {"simulated": simulated, "distance": distance / T, "tv": squared_tv, "clip": clipped, "inv": invariance}


# --- the checks ----------------------------------------------------------------------------------

from fl_attack.attacker.attacks import AttackConfig, get_attack  # noqa: E402
from fl_attack.attacker.attacks import dimitrov as dimitrov_module  # noqa: E402
from fl_attack.federation.config import ClientOptimizer  # noqa: E402
from fl_attack.federation.models import build_model  # noqa: E402
from fl_attack.federation.update import TrainingMetadata, flatten, layout  # noqa: E402

OPTIMIZERS = {
    "sgd": ClientOptimizer(),
    "momentum+wd": ClientOptimizer("momentum", momentum=0.9, weight_decay=5e-3),
    "nesterov": ClientOptimizer("nesterov", momentum=0.8),
    "adam": ClientOptimizer("adam", weight_decay=1e-3),
    "adamw": ClientOptimizer("adamw", weight_decay=1e-2, adam_betas=(0.8, 0.99)),
}


def _opt_dict(o: ClientOptimizer) -> dict:
    return {"name": o.name, "momentum": o.momentum, "weight_decay": o.weight_decay, "betas": o.adam_betas}


class TanhMLP(torch.nn.Module):
    """A smooth two-layer net for FEMNIST inputs: the attack's generic gradient path."""

    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(784, 12)
        self.out = torch.nn.Linear(12, 62)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x.flatten(1))))


def _case(model, dataset, k, B, E, optimizer, seed=0, lr=0.01, iterations=50, **options):
    """The attack on a synthetic update of ``model`` in float64, and the literal's inputs."""
    torch.manual_seed(seed)
    model = model.double().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    wT = {n: p - 1e-2 * torch.randn_like(p) for n, p in w0.items()}
    meta = TrainingMetadata(dataset, lr, B, E, k, optimizer=optimizer)
    config = AttackConfig(iterations=iterations, **options)
    attack = get_attack("dimitrov")(model, flatten(w0), flatten(wT), layout(w0), config, training=meta)
    image = (1, 28, 28) if dataset == "femnist" else (3, 32, 32)
    X = torch.randn(E, k, *image, dtype=torch.float64)
    y = torch.randint(0, 62 if dataset == "femnist" else 100, (k,))
    attack.prepare(X[0].clone(), y)
    with torch.no_grad():
        attack.dummy.copy_(X)
    target = {n: (w0[n] - wT[n]) / lr for n in w0}
    return attack, model, w0, target, X, y, meta


def _grad(value, x):
    return torch.autograd.grad(value, x, retain_graph=True)[0]


def _close(a, b, what):
    a, b = float(a.detach()), float(b.detach())
    assert abs(a - b) <= 1e-10 * abs(b), (what, a, b)


def _close_grads(a, b, what, tol=1e-10):
    scale = float(b.abs().max())
    assert scale > 0 and float((a - b).abs().max()) <= tol * scale, (what, float((a - b).abs().max()), scale)


def _compare(attack, model, w0, target, X, y, meta, mean, std, conv=None):
    """Each piece's value and gradient in X, the simulated update's, and the whole loss's, to 1e-10 (the
    gradients under Adam to 1e-9: its 1/sqrt(v) amplifies float64 rounding, measured 4e-11 to 1.1e-10
    between two orders of the same sums, against 1e-15 for the SGD family)."""
    tol = 1e-9 if meta.optimizer.adaptive else 1e-10
    s = attack.settings
    f = s["data_start"] * (s["data_end"] / s["data_start"]) ** (2 / attack.config.iterations)  # iteration 0
    Xr = X.clone().requires_grad_(True)
    ref = literal_pieces(
        model, w0, target, Xr, y, meta.batch_size, meta.lr, _opt_dict(meta.optimizer), mean=mean, std=std, conv=conv
    )
    total = f * ref["distance"] + s["tv"] * ref["tv"] + s["clip"] * ref["clip"] + s["invariance"] * ref["inv"]
    terms = attack.objective(None, y)
    assert terms["loss"].dtype == torch.float64
    for name, key in (("update_distance", "distance"), ("tv", "tv"), ("clip", "clip"), ("invariance", "inv")):
        _close(terms[name], ref[key], name)
    _close(terms["loss"], total, "loss")
    _close_grads(_grad(terms["loss"], attack.dummy), _grad(total, Xr), "loss", tol)
    probe = {n: torch.randn_like(p) for n, p in w0.items()}  # the simulated update's gradient, whatever its scale
    ours = (attack.simulated_update(y) * flatten(probe)).sum()
    theirs = sum((ref["simulated"][n] * probe[n]).sum() for n in w0)
    _close(ours, theirs, "simulated update")
    _close_grads(_grad(ours, attack.dummy), _grad(theirs, Xr), "simulated update", tol)
    pieces = (
        ("tv", dimitrov_module.squared_tv),
        ("clip", lambda x: dimitrov_module.clip_term(x, attack.spec)),
        ("inv", lambda x: dimitrov_module.invariance_prior(x, conv)),
    )
    for key, piece in pieces:
        _close_grads(_grad(piece(attack.dummy), attack.dummy), _grad(ref[key], Xr), key)


@pytest.mark.parametrize(
    "optimizer", [o if o in ("sgd", "adam") else pytest.param(o, marks=pytest.mark.heavy) for o in OPTIMIZERS]
)
def test_loss_and_gradient_equal_the_literal_loop_on_the_femnist_cnn(optimizer):
    """The paper's FEMNIST CNN (the structured path), k=3, B=2 (a last batch of 1), E=2: T=4 steps."""
    case = _case(build_model("femnist", seed=0), "femnist", 3, 2, 2, OPTIMIZERS[optimizer])
    _compare(*case, FEMNIST_MEAN, FEMNIST_STD)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "nesterov"])
def test_loss_and_gradient_equal_the_literal_loop_on_a_generic_model(optimizer):
    case = _case(TanhMLP(), "femnist", 4, 2, 3, OPTIMIZERS[optimizer], lr=0.05, dimitrov_invariance=3.0)
    _compare(*case, FEMNIST_MEAN, FEMNIST_STD)


def test_cifar_prior_is_the_max_after_one_fixed_random_convolution():
    attack, *rest = _case(build_model("cifar100", seed=0, width=4), "cifar100", 3, 2, 2, OPTIMIZERS["momentum+wd"])
    conv = attack.conv
    assert conv.shape == (96, 3, 3, 3) and conv.dtype == torch.float64
    std = math.sqrt(1 / 27) / 0.87962566103423978  # Flax's LeCun normal, truncated at 2 std
    assert float(conv.abs().max()) <= 2 * std and 0.5 * std < float(conv.std()) < 1.2 * std
    assert torch.equal(conv, dimitrov_module.random_conv(3, 0).double())  # fixed by the seed
    _compare(attack, *rest, CIFAR_MEAN, CIFAR_STD, conv=conv)


@pytest.mark.heavy
def test_two_clients_batched_equal_each_alone():
    """reconstruct_batch's form: w0 (2, P), sets (2, E, k, C, H, W); each client's loss and gradient its own."""
    model = build_model("femnist", seed=0).double().eval()
    singles = [_case(copy.deepcopy(model), "femnist", 3, 2, 2, OPTIMIZERS["adam"], seed=s) for s in (1, 2)]
    attacks = [c[0] for c in singles]
    meta, y = singles[0][6], torch.stack([c[5] for c in singles])
    stacked = [torch.stack([a.w0 for a in attacks]), torch.stack([a.wT for a in attacks])]
    config = attacks[0].config
    batch = get_attack("dimitrov")(attacks[0].model, *stacked, attacks[0].shapes, config, training=meta)
    X = torch.stack([a.dummy.detach() for a in attacks])
    batch.prepare(X[:, 0].clone(), y)
    with torch.no_grad():
        batch.dummy.copy_(X)
    loss = batch.objective(None, y)["loss"]
    (grad,) = torch.autograd.grad(loss.sum(), batch.dummy)
    for i, (a, c) in enumerate(zip(attacks, singles)):
        alone = a.objective(None, c[5])["loss"]
        (g,) = torch.autograd.grad(alone, a.dummy)
        _close(loss[i], alone, f"client {i}")
        _close_grads(grad[i], g, f"client {i}", 1e-9)  # Adam (see _compare)


def test_the_merge_matches_every_epoch_to_epoch_one_by_psnr_and_averages():
    from fl_attack.federation.data import get_spec

    spec = get_spec("femnist")
    torch.manual_seed(0)
    base = torch.randn(6, 1, 28, 28, dtype=torch.float64)
    epochs = [base] + [base[torch.randperm(6)] + 0.01 * torch.randn_like(base) for _ in range(3)]
    merged = dimitrov_module.merge_epochs(torch.stack(epochs), spec)
    assert merged.shape == (6, 1, 28, 28)
    assert float((merged - base).abs().max()) < 0.03  # each slot averaged with its own image's copies
    batched = dimitrov_module.merge_epochs(torch.stack([torch.stack(epochs)] * 2), spec)
    assert torch.equal(batched[0], merged) and torch.equal(batched[1], merged)


def test_schedules_data_weight_and_rate():
    attack = _case(build_model("femnist", seed=0), "femnist", 4, 2, 2, OPTIMIZERS["sgd"], iterations=100)[0]
    assert attack.settings == {**dimitrov_module.DATASET_DEFAULTS["femnist"], "pool": "mean"}
    weights = []
    for i in range(100):
        attack.iteration = i
        weights.append(attack.data_weight())
    assert weights[0] == pytest.approx(2 ** (1 / 50)) and weights[49] == pytest.approx(2.0) and weights[99] == 2.0
    assert all(a < b for a, b in zip(weights[:49], weights[1:50]))
    opt = torch.optim.Adam(attack.param_groups())
    (schedule,) = attack.schedulers([opt])
    rates = []
    for _ in range(20):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
    assert rates[0] == 0.4 and rates[10] == pytest.approx(0.4 * 0.995) and rates[19] == pytest.approx(0.4 * 0.995**1.9)
    cifar = _case(build_model("cifar100", seed=0, width=4), "cifar100", 2, 1, 2, OPTIMIZERS["sgd"], dimitrov_tv=0.0)[0]
    assert cifar.settings["lr"] == 0.1 and cifar.settings["tv"] == 0.0 and cifar.settings["invariance"] == 6.075


def test_a_non_finite_loss_restarts_then_keeps_the_last_finite_sets():
    attack = _case(build_model("femnist", seed=0), "femnist", 4, 2, 2, OPTIMIZERS["sgd"], dimitrov_restarts=1)[0]
    y = torch.zeros(4, dtype=torch.int64)
    attack.objective(None, y)
    attack.project()
    with torch.no_grad():
        attack.dummy[0, 0, 0, 0, 0] = math.nan
    assert not torch.isfinite(attack.objective(None, y)["loss"])
    attack.project()
    fresh = attack._draw(1).double()
    assert int(attack.restarts) == 1 and torch.equal(attack.dummy.detach(), fresh)
    with torch.no_grad():
        attack.dummy[1, 2, 0, 5, 5] = math.inf
    attack.objective(None, y)
    attack.project()
    assert bool(attack.frozen) and torch.equal(attack.dummy.detach(), fresh)  # out of restarts: the last finite
    assert attack.summary()["restarts"] == 1


def test_refusals():
    model = build_model("femnist", seed=0)
    w = flatten({n: p.detach() for n, p in model.named_parameters()})
    shapes = layout(dict(model.named_parameters()))
    cls = get_attack("dimitrov")
    with pytest.raises(ValueError, match="needs the update's metadata"):
        cls(model, w, w, shapes, AttackConfig())
    meta = TrainingMetadata("femnist", 0.004, 2, 2, 4, local_steps=3)
    with pytest.raises(ValueError, match="T = E ceil"):
        cls(model, w, w, shapes, AttackConfig(), training=meta)
    with pytest.raises(ValueError, match="image_prior must be 'none'"):
        cls(model, w, w, shapes, AttackConfig(image_prior="diffusion"), training=meta)
    with pytest.raises(ValueError, match="dimitrov_tv must be >= 0, or -1"):
        AttackConfig(dimitrov_tv=-0.5)


@pytest.mark.heavy
def test_on_a_real_femnist_client_it_beats_its_update_free_null():
    """k=4, B=2, E=2 on a bundled FEMNIST writer, 200 iterations, the true labels: the matched PSNR of
    the attack on the client's update against the same attack on an update that says nothing (wT = w0:
    the same labels, priors and start). Measured on writers 0-2: +2.9 to +3.8 dB."""
    from fl_attack import ObservedUpdate, reconstruct
    from fl_attack.evaluation.metrics import match_pairs, psnr
    from fl_attack.federation.data import client_partition, load_pool
    from fl_attack.federation.training import train_local

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        split = client_partition(load_pool("femnist"), 1, 4)
        truth, labels = split.train.images.float(), split.train.labels
        result = train_local(
            build_model("femnist", seed=0), truth, labels, dataset="femnist", lr=0.004, batch_size=2, local_epochs=2
        )
        update = result.update
        null = ObservedUpdate(update.w0, copy.deepcopy(update.w0), update.metadata, {})

        def matched_psnr(u):
            rec = reconstruct(u, "dimitrov", labels=labels, iterations=200, trace_every=50, device="cpu")
            r, t = match_pairs(rec.images, truth)
            return float(psnr(rec.images[r], truth[t]).mean()), rec

        attacked, rec = matched_psnr(update)
        free, _ = matched_psnr(null)
    finally:
        torch.set_num_threads(threads)
    assert rec.images.shape == (4, 1, 28, 28) and 0 <= float(rec.images.min()) and float(rec.images.max()) <= 1
    assert rec.trace[-1]["unrolled_steps"] == 4 and rec.trace[-1]["restarts"] == 0
    assert attacked > free + 1.5, (attacked, free)
