"""``reconstruct``: the library's entry point, from an observed update to images and a trace;
``reconstruct_batch``: the same attack on N clients of one architecture as one batched computation.
Over 600 lines on purpose: the two entry points, their input checks and the one loop ``_optimise``
must change together (a batch's rows equal the single ones: tests/test_batched.py), and the tests
reach that loop through this module's names (``build_optimizers``, ``recover_labels``).

Both drive the one optimisation loop of every attack (``_optimise``: Adam over X_hat and the
attack's variables, the box clamp, the learning-rate schedule, the trace; docs/PISME.md, "Optimisation").

The attacks match the model's parameters only (``fl_attack.federation.models.parameter_keys``; ``_attack_vector``
is where the flat vectors are built): its buffers, batch norm's running statistics and counter, are
not part of delta_w. Each attack runs its forward passes with its own update's w0 buffers
(``_buffers``; the attacker's private copy of the model holds those of the update it reads labels
from), and ``fl_attack.attacker.attacks.batchnorm.surrogate_mode`` puts that copy in the client's mode (a
train-mode update: batch norm on X_hat's batch statistics, no running statistic ever updated;
dropout in eval mode).
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from fl_attack.attacker.attacks import AttackConfig, get_attack
from fl_attack.attacker.attacks.base import JointAttack, build_optimizers, lr_milestones  # noqa: F401
from fl_attack.attacker.attacks.batchnorm import check_statistics_use, surrogate_mode
from fl_attack.attacker.attacks.compiled import prepare_step
from fl_attack.attacker.labels import NEEDS_AUX, AuxiliaryData, check_label_mode, recover_labels, refine_labels
from fl_attack.attacker.precision import autocast, precision_scope, resolve_precision
from fl_attack.attacker.rule import for_update
from fl_attack.attacker.start import initial_images
from fl_attack.federation.data import get_spec
from fl_attack.federation.models import check_model, parameter_keys, resolve_model
from fl_attack.federation.update import ObservedUpdate, flatten, layout


@dataclass
class Reconstruction:
    """The result of one attack on one client update.

    images: (k,C,H,W) float32 in [0,1] on the CPU, in the attack's own order (match before scoring).
    labels: (k,) int64, the labels the attack used; label_source: "recovered" or "oracle".
    lsim_honest / lsim_calibrated: final Lsim(G, delta_w) with d = 1 and with the learned d (of a
    joint attack on several updates: their weighted means; lsim_per_update: the honest one of each).
    trace: one dict every ``trace_every`` iterations (iteration, loss, lsim_honest,
    lsim_calibrated, tv, the attack's own variables, and whatever ``callback`` returned).
    seconds: wall time of the attack; from ``reconstruct_batch``, the batch's wall time / N.
    precision: the arithmetic precision the attack ran with, "fp32", "bf16" or "tf32" (its
    ``AttackConfig.precision`` resolved on its device, "auto" included; ``fl_attack.attacker.precision``).
    compile: how its steps ran (``AttackConfig.compile``): "compiled" (one ``torch.compile``d
    ``torch.func`` step, ``fl_attack.attacker.attacks.compiled``), "eager", or "eager (<reason>)" where
    compiling was asked for and not possible (an attack without a compiled form, or a compile that
    failed: then its one-line error).
    snapshots: X_hat part-way, {iteration: (k,C,H,W) float32 in [0,1] on the CPU} at each of
    ``AttackConfig.snapshots`` (fractions of the iterations, e.g. 50 and 100 of 200); the evaluator scores
    them to say whether the count was still rising at the end (the attacker never sees the scores).
    start_images: (k,C,H,W) in [0,1], where X_hat started when it started from public images
    (``AttackConfig.start`` "public"; None for noise): the verdict scores it as an update-free guess.
    """

    method: str
    images: torch.Tensor
    labels: torch.Tensor
    label_source: str
    lsim_honest: float
    lsim_calibrated: float
    seconds: float
    config: dict
    trace: list = field(default_factory=list)
    lsim_per_update: list = field(default_factory=list)  # honest Lsim on each given update, in their order
    precision: str = "fp32"
    compile: str = "eager"  # "compiled", "eager", or "eager (<why>)" (fl_attack.attacker.attacks.compiled)
    snapshots: dict = field(default_factory=dict)  # iteration -> images (k,C,H,W) in [0,1]
    start_images: torch.Tensor | None = None  # the public start, scored as an update-free guess


DEVICES = ("auto", "cpu", "cuda")  # where attacks run ("cuda:N" names one GPU)


def check_device(device: str | torch.device) -> str:
    """The name of ``device`` when it is one of ``DEVICES`` or "cuda:N" (a torch.device of those too);
    ValueError otherwise. Probes nothing (a run recorded on a GPU machine is read back anywhere):
    ``resolve_device`` does. The one check of a device's name (``reconstruct``, the run config's
    attack-device, ``fl-attack attack`` / ``replay`` --device, the experiments)."""
    name = str(device)
    if name not in DEVICES and not re.fullmatch(r"cuda:\d+", name):
        raise ValueError(f"unknown device '{device}'; use auto, cpu or cuda")
    return name


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """ "auto" -> CUDA when available, else CPU. ValueError for an unknown name (``check_device``) or
    missing CUDA."""
    name = check_device(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device")
    return torch.device(name)


def reconstruct(
    update: ObservedUpdate | Sequence[ObservedUpdate],
    method: str = "pisme",
    *,
    labels: str | torch.Tensor = "recovered",
    config: AttackConfig | None = None,
    device: str | torch.device = "auto",
    callback: Callable[[int, torch.Tensor], dict] | None = None,
    progress: bool = False,
    time_limit: float | None = None,
    model: torch.nn.Module | str | None = None,
    label_aux: AuxiliaryData | None = None,
    dtype: torch.dtype = torch.float32,
    weights: Sequence[float] | None = None,
    init: torch.Tensor | None = None,
    **overrides,
) -> Reconstruction:
    """Reconstruct a client's k private images from its observed update (w0, wT, metadata), or
    from several observed updates of the same k samples (a client watched over several rounds).

    method: "pisme" (default), "nlsme", "sme", "ig", "pisme-adaptive", "ginas", "dggi" or "dimitrov"
    (``fl_attack.attacker.attacks.ATTACKS``).
    labels: "recovered" (from the output-bias update, fl_attack.attacker.labels) or an (k,) int64 tensor of
    oracle labels, recorded as label_source "oracle".
    config / overrides: AttackConfig fields, e.g. ``iterations=300, nodes=7``.
    callback(iteration, images in [0,1] NCHW) may return metrics to add to the trace (the evaluator
    uses it in standalone runs; the attacker itself never sees the ground truth).
    label_aux: public labelled images (fl_attack.attacker.labels.AuxiliaryData, disjoint from the clients'
    training data) for ``label_estimator="aux"``; ignored by the other estimators.
    time_limit: seconds; past it the attack stops with TimeoutError (the federation records it as
    failed and goes on).
    model: the victim's architecture: an nn.Module (copied; its weights are not used, they come from
    the update), a spec for ``fl_attack.federation.models.resolve_model`` ("paper" or "package.module:factory"),
    or None for the paper's CNN of the update's dataset. The paper's CNNs take the structured fast
    path of ``fl_attack.attacker.attacks.gradients``, any other model the generic one. The attack matches the
    model's parameters; its buffers (batch norm's running statistics) come from w0. An update with
    ``metadata.train_mode`` is attacked with batch norm on X_hat's batch statistics, which never
    updates a running statistic of the model, the update or the attacker's copy
    (``fl_attack.attacker.attacks.batchnorm``); ``bn_stats_weight`` > 0 also matches the client's feature
    statistics estimated from the change of the running statistics.
    dtype: the attack's working precision, torch.float32 (default) or torch.float64 (for exactness
    checks; X_hat is drawn in float32 either way, so both start from the same images).
    precision (an AttackConfig field, so a keyword like ``nodes``): the arithmetic of the attack's
    steps (``fl_attack.attacker.precision``): "fp32" (default, float32 throughout), "bf16" (bfloat16 autocast
    of the forwards, the node gradients and so their double backward, with float32 master copies of
    X_hat, P1 and d, float32 sums of the quadrature nodes and of the cosine objective), "tf32" (CUDA
    only: TF32 tensor cores for float32 GEMMs and convolutions, the flags restored afterwards) or
    "auto" (the fastest one the device really accelerates, probed once per process; fp32 on a CPU
    without native bf16). The label recovery, the final Lsim and every metric are float32 whatever
    it is; ``Reconstruction.precision`` says which one ran. bf16 and tf32 need dtype torch.float32.
    compile (an AttackConfig field too): "off", "on" or "auto" (default): each step's objective and
    gradient as one ``torch.compile``d ``torch.func`` function (``fl_attack.attacker.attacks.compiled``: the
    structured form for the paper's CNNs, the generic one for any model), compiled once per process
    and problem (method, architecture, shapes, dtype, device) and reused by later attacks; "auto"
    compiles on CUDA only (docs/performance.md, "Compiled step"). The same numbers up to rounding
    (tests/test_compiled.py: 1e-9 in float64). ig, sme, nlsme and pisme in fp32 or float64 have a
    compiled form; the others, bf16 / tf32, bn_stats_weight > 0 and the diffusion prior run eagerly,
    and a compile that fails falls back to eager; ``Reconstruction.compile`` says which ran and why.
    update as a sequence of n ObservedUpdates of one client (one dataset, layout and k): one X_hat
    is fitted to all of them (``fl_attack.attacker.attacks.base.JointAttack``: the weighted sum of each
    update's own objective, each update with its own path variables); n = 1 is exactly the single
    update's attack. Recovered labels are read from the update of the largest weight.
    weights: (n,) non-negative, not all 0, normalised to sum 1 (default: equal).
    init: (k,C,H,W) images in [0,1] to start X_hat from (a warm start, e.g. a remembered estimate)
    instead of N(0, I) noise (ginas, whose X_hat is its generator's output, does not use it; dimitrov starts
    its first epoch's set there).
    Returns a Reconstruction. Raises ValueError for an unknown method, bad settings, a model that
    breaks the contract (``fl_attack.federation.models.check_model``), an update that is not the model's
    (``ObservedUpdate.check_against``: foreign keys such as 'private_images', missing keys, other
    shapes) or oracle labels of the wrong length, and KeyError for recovered labels without an
    output-layer bias, before any optimisation; ValueError too for updates of a joint attack of both
    train and eval mode, for bn_stats_weight > 0 on an eval-mode update or a model without
    batch-norm running statistics, for a precision not in ``fl_attack.attacker.precision.PRECISIONS``, tf32
    off CUDA, and bf16 or tf32 with dtype torch.float64.
    """
    attack_cls = get_attack(method)
    config = AttackConfig.from_overrides(config, **overrides)
    if config.auto:  # the audit's rule (fl_attack.attacker.rule), from the (first) update's metadata
        first = update if isinstance(update, ObservedUpdate) else next(iter(update), None)
        config = for_update(config, first.metadata) if isinstance(first, ObservedUpdate) else config
    _check_dtype(dtype)
    dev = resolve_device(device)
    precision = _precision(config.precision, dev, dtype)
    if not isinstance(update, (ObservedUpdate, list, tuple)):
        raise TypeError(f"update must be an ObservedUpdate or a list of them, got {type(update).__name__}")
    updates = [update] if isinstance(update, ObservedUpdate) else list(update)
    for i, u in enumerate(updates):
        if not isinstance(u, ObservedUpdate):
            raise TypeError(f"update {i} must be an ObservedUpdate, got {type(u).__name__}")
    share = _joint_weights(updates, weights, config)
    update = updates[int(share.argmax())]  # labels and refinement read from the strongest update
    spec = get_spec(update.metadata.dataset)
    model = _victim_model(model, update.metadata.dataset)
    for u in updates:
        u.check_against(model)
    statistics = [check_statistics_use(u, model, config.bn_stats_weight) for u in updates]
    if init is not None and tuple(init.shape) != (update.metadata.num_samples, *spec.image_shape):
        raise ValueError(
            f"init must be (k,C,H,W) = {(update.metadata.num_samples, *spec.image_shape)} images in [0,1], "
            f"got {tuple(init.shape)}"
        )
    oracle = _check_labels(labels, update.metadata.num_samples, spec.num_classes, config, label_aux)
    if oracle is None:
        y = recover_labels(update, model, seed=config.seed, estimator=config.label_estimator, aux=label_aux)
    else:
        y = oracle
    label_source = "recovered" if oracle is None else "oracle"
    start = time.perf_counter()

    model = _frozen(model, dev, update)
    keys = parameter_keys(model)
    shapes = layout(_attack_vector(update.w0, keys))
    attacks = [
        attack_cls(
            model,
            *(flatten(_attack_vector(w, keys)).to(device=dev, dtype=dtype) for w in (u.w0, u.wT)),
            shapes,
            config,
            training=u.metadata,
            buffers=_buffers(u.w0, keys, dev, dtype),
            statistics=s,
        )
        for u, s in zip(updates, statistics)
    ]
    attack = attacks[0] if len(attacks) == 1 else JointAttack(attacks, share.to(device=dev, dtype=dtype))
    if init is None:
        x = initial_images(config.start, config.seed, y, update.metadata.dataset, _public(label_aux), dev, dtype)
    else:
        x = spec.normalize(init.detach().to(device=dev, dtype=dtype).clamp(0, 1))
    start_images = _shown(spec, x) if init is None and config.start != "noise" else None
    x.requires_grad_(True)

    def refine(x_now, y_now):  # once, on the current reconstruction (AttackConfig.label_refine)
        return refine_labels(update, x_now.detach().to(torch.float32), y_now, model)

    y, (trace,), final, compiled, snapshots = _optimise(
        attack,
        x,
        y.to(dev),
        spec,
        config,
        method=method,
        refine=refine if label_source == "recovered" else None,
        callback=callback,
        progress=progress,
        time_limit=time_limit,
        start=start,
        precision=precision,
    )
    return Reconstruction(
        method=method,
        images=spec.denormalize(x.detach()).clamp(0, 1).to(device="cpu", dtype=torch.float32),
        labels=y.cpu(),
        label_source=label_source,
        lsim_honest=float(final["lsim_honest"]),
        lsim_calibrated=float(final["lsim_calibrated"]),
        seconds=time.perf_counter() - start,
        config=asdict(config),
        trace=trace,
        lsim_per_update=[float(v) for v in final.get("lsim_per_update", final["lsim_honest"].reshape(1))],
        precision=precision,
        compile=compiled,
        snapshots=snapshots,
        start_images=start_images,
    )


def reconstruct_batch(
    updates: Sequence[ObservedUpdate],
    method: str = "pisme",
    *,
    labels: str | torch.Tensor | Sequence[torch.Tensor] = "recovered",
    config: AttackConfig | None = None,
    device: str | torch.device = "auto",
    callback: Callable[[int, torch.Tensor], list[dict] | None] | None = None,
    progress: bool = False,
    time_limit: float | None = None,
    model: torch.nn.Module | str | None = None,
    label_aux: AuxiliaryData | None = None,
    dtype: torch.dtype = torch.float32,
    **overrides,
) -> list[Reconstruction]:
    """N attacks of one method and config on N clients of one architecture, as ONE optimisation.

    Equal to ``[reconstruct(u, method, ...) for u in updates]`` up to rounding (tests/test_batched.py:
    1e-6 in float64 after several steps), in one loop whose tensors are stacked over the clients:
    X_hat (N,k,C,H,W), w0 and wT (N,P) (each client its own w0 and wT; in one FedAvg round they share
    w0), P1 and d (N,P) (eqs. 4 and 10), SME's alpha and NL-SME's t (N,). The surrogate gradients of
    all clients and all nodes (eq. 8) are one vmapped pass (``fl_attack.attacker.attacks.gradients``); each
    client's objective (eq. 10: Lsim, TV, R_p, R_d) is computed on its own and the N losses are
    summed, so each client's gradient is exactly its own, and Adam, the clamps and the learning-rate
    schedule act element-wise, so each client takes exactly its own steps. On a GPU this is where the
    speed is; on a few CPU cores N sequential attacks are faster (docs/performance.md, "Batched
    attacks"), because the unbatched paper-CNN path is hand-fused for the CPU and the vmapped one is not.

    updates: N >= 1 ObservedUpdates of one dataset and one state-dict layout, each with the same
    number of samples k. method, config, overrides (precision included), model, label_aux, device,
    dtype, progress, compile: as ``reconstruct`` (one value for all clients; pisme-adaptive cannot be
    batched; the compiled step vmaps the one-client form over the N clients).
    labels: "recovered" (each client's own, from its update) or oracle labels for every client,
    an (N, k) int64 tensor, or N entries, each a (k,) tensor or "recovered".
    callback(iteration, images in [0,1], (N,k,C,H,W)) may return N dicts, one per client, to add to
    the clients' traces.
    time_limit: seconds for the whole batch; past it every attack stops with TimeoutError.
    Returns N Reconstructions in the order of ``updates``; ``seconds`` is each client's share of the
    batch's wall time (wall time / N).
    Raises, before any work: TypeError for a non-ObservedUpdate (naming its index), ValueError for an
    empty list, an unknown or unbatchable method, bad settings, updates of different datasets,
    layouts, k or train mode (naming the first offending client index and the value it differs
    from), an update that is not the model's, bn_stats_weight > 0 on an update it cannot use (as
    ``reconstruct``), or oracle labels of the wrong number or shape (naming the client); KeyError for
    recovered labels without an output-layer bias; ValueError for a bad precision (as ``reconstruct``).
    Each client's buffers (batch norm's running statistics) are its own w0's, vmapped with its weights.
    """
    attack_cls = get_attack(method)
    if not attack_cls.batchable:
        raise ValueError(f"method '{method}' cannot be batched: its clients cannot share one computation")
    config = AttackConfig.from_overrides(config, **overrides)
    if config.auto:  # the audit's rule must choose one attack for every update of the batch
        chosen = [for_update(config, u.metadata) for u in updates if isinstance(u, ObservedUpdate)]
        if any(c != chosen[0] for c in chosen[1:]):
            raise ValueError(
                "the audit's rule chooses other attacks for these updates (their T differs): batch them apart"
            )
        config = chosen[0] if chosen else config
    _check_dtype(dtype)
    dev = resolve_device(device)
    precision = _precision(config.precision, dev, dtype)
    updates = list(updates)
    if not updates:
        raise ValueError("reconstruct_batch needs at least one update")
    for i, update in enumerate(updates):
        if not isinstance(update, ObservedUpdate):
            raise TypeError(f"updates[{i}] must be an ObservedUpdate, got {type(update).__name__}")
    first = updates[0].metadata
    for i, update in enumerate(updates[1:], start=1):
        meta = update.metadata
        if meta.dataset != first.dataset:
            raise ValueError(
                f"client {i} is a '{meta.dataset}' update, client 0 a '{first.dataset}' one; "
                "a batch attacks one architecture"
            )
        if meta.num_samples != first.num_samples:
            raise ValueError(
                f"client {i} has k={meta.num_samples} samples, client 0 has k={first.num_samples}; "
                "a batch needs one k (X_hat is stacked as (N,k,C,H,W))"
            )
        if config.optimizer_aware and (meta.optimizer, meta.local_steps) != (first.optimizer, first.local_steps):
            raise ValueError(
                f"client {i} trained with {meta.optimizer.describe()} for T={meta.local_steps} steps, client 0 "
                f"with {first.optimizer.describe()} for T={first.local_steps}: an optimizer-aware batch needs "
                "one optimizer and one T (attack them one by one, or set optimizer_aware=False)"
            )
        if layout(update.w0) != layout(updates[0].w0):
            raise ValueError(f"client {i}'s update has another state-dict layout (keys, order, shapes) than client 0's")
        if meta.train_mode != first.train_mode:
            raise ValueError(
                f"client {i} trained in {_mode(meta)} mode, client 0 in {_mode(first)} mode: a batch attacks one "
                "mode (attack them one by one)"
            )
    spec = get_spec(first.dataset)
    model = _victim_model(model, first.dataset)
    statistics = []
    for i, update in enumerate(updates):
        try:
            update.check_against(model)
            statistics.append(check_statistics_use(update, model, config.bn_stats_weight))
        except ValueError as error:
            raise ValueError(f"client {i}: {error}") from None
    n, k = len(updates), first.num_samples
    if isinstance(labels, str):
        oracle = [_check_labels(labels, k, spec.num_classes, config, label_aux)] * n
    else:
        if isinstance(labels, torch.Tensor) and labels.dim() != 2:
            raise ValueError(
                f"oracle labels for a batch must be (N={n}, k={k}) or N entries, got {tuple(labels.shape)}"
            )
        given = list(labels.unbind(0)) if isinstance(labels, torch.Tensor) else list(labels)
        if len(given) != n:
            raise ValueError(f"oracle labels for {len(given)} clients were given, the batch has N={n}")
        oracle = []
        for i, y in enumerate(given):
            try:
                oracle.append(_check_labels(y, k, spec.num_classes, config, label_aux))
            except ValueError as error:
                raise ValueError(f"client {i}: {error}") from None
    ys = [
        recover_labels(u, model, seed=config.seed, estimator=config.label_estimator, aux=label_aux) if o is None else o
        for u, o in zip(updates, oracle)
    ]
    sources = ["recovered" if o is None else "oracle" for o in oracle]
    start = time.perf_counter()

    model = _frozen(model, dev, updates[0])
    keys = parameter_keys(model)
    shapes = layout(_attack_vector(updates[0].w0, keys))
    w0 = torch.stack([flatten(_attack_vector(u.w0, keys)) for u in updates]).to(device=dev, dtype=dtype)  # (N, P)
    wT = torch.stack([flatten(_attack_vector(u.wT, keys)) for u in updates]).to(device=dev, dtype=dtype)
    per_client = [_buffers(u.w0, keys, dev, dtype) for u in updates]
    buffers = {k: torch.stack([b[k] for b in per_client]) for k in per_client[0]}  # (N, ...) each
    statistics = statistics if any(statistics) else None  # one list per client, or no term
    attack = attack_cls(model, w0, wT, shapes, config, training=first, buffers=buffers, statistics=statistics)
    # every client starts where it would alone (its own labels' public images with start="public")
    x = torch.stack(
        [initial_images(config.start, config.seed, y, first.dataset, _public(label_aux), dev, dtype) for y in ys]
    )  # (N, k, C, H, W)
    start_images = _shown(spec, x) if config.start != "noise" else None
    x.requires_grad_(True)

    def refine(x_now, y_now):  # each client on its own reconstruction (AttackConfig.label_refine)
        return torch.stack(
            [
                refine_labels(u, x_now[i].detach().to(torch.float32), y_now[i], model)
                if sources[i] == "recovered"
                else y_now[i]
                for i, u in enumerate(updates)
            ]
        )

    y, traces, final, compiled, snapshots = _optimise(
        attack,
        x,
        torch.stack(ys).to(dev),
        spec,
        config,
        method=method,
        refine=refine if "recovered" in sources else None,
        callback=callback,
        progress=progress,
        time_limit=time_limit,
        start=start,
        precision=precision,
    )
    seconds = (time.perf_counter() - start) / n
    images = spec.denormalize(x.detach()).clamp(0, 1).to(device="cpu", dtype=torch.float32)
    return [
        Reconstruction(
            method=method,
            images=images[i].clone(),  # not a view of the whole batch's storage
            labels=y[i].cpu().clone(),
            label_source=sources[i],
            lsim_honest=float(final["lsim_honest"][i]),
            lsim_calibrated=float(final["lsim_calibrated"][i]),
            seconds=seconds,
            config=asdict(config),
            trace=traces[i],
            precision=precision,
            compile=compiled,
            snapshots={it: shot[i].clone() for it, shot in snapshots.items()},
            start_images=None if start_images is None else start_images[i].clone(),
        )
        for i in range(n)
    ]


def _joint_weights(updates: list, weights, config: AttackConfig) -> torch.Tensor:
    """(n,) float64 weights summing to 1 for the updates of one client; ValueError for none, a
    mismatch of dataset, layout or k, bad weights, or label refinement on several updates."""
    if not updates:
        raise ValueError("reconstruct needs at least one update")
    first = updates[0]
    for i, u in enumerate(updates[1:], start=1):
        if u.metadata.dataset != first.metadata.dataset or u.metadata.num_samples != first.metadata.num_samples:
            raise ValueError(
                f"update {i} is ({u.metadata.dataset}, k={u.metadata.num_samples}), update 0 "
                f"({first.metadata.dataset}, k={first.metadata.num_samples}): "
                "a joint attack needs one client's k samples"
            )
        if layout(u.w0) != layout(first.w0):
            raise ValueError(f"update {i} has another state-dict layout (keys, order, shapes) than update 0")
        if u.metadata.train_mode != first.metadata.train_mode:
            raise ValueError(
                f"update {i} was trained in {_mode(u.metadata)} mode, update 0 in {_mode(first.metadata)} mode: "
                "a joint attack needs one mode"
            )
    share = (
        torch.ones(len(updates), dtype=torch.float64)
        if weights is None
        else torch.as_tensor(weights, dtype=torch.float64)
    )
    if share.shape != (len(updates),) or not bool(torch.isfinite(share).all()) or share.min() < 0 or share.sum() <= 0:
        raise ValueError(f"weights must be {len(updates)} finite values >= 0, not all 0, got {list(share.tolist())}")
    if len(updates) > 1 and config.label_refine:
        raise ValueError("label_refine works on one update; a joint attack keeps its labels fixed")
    return share / share.sum()


def _check_dtype(dtype) -> None:
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")


def _precision(precision: str, device: torch.device, dtype: torch.dtype) -> str:
    """The attack's resolved precision (``fl_attack.attacker.precision.resolve_precision``); with dtype
    float64 (an exactness check) "auto" is "fp32", and bf16 and tf32 are refused (ValueError)."""
    if dtype == torch.float64 and precision in ("bf16", "tf32"):
        raise ValueError(
            f"precision '{precision}' lowers float32 arithmetic; dtype=torch.float64 is an exactness check: "
            "use precision 'fp32' with it"
        )
    return "fp32" if dtype == torch.float64 else resolve_precision(precision, device)


def _victim_model(model, dataset: str) -> torch.nn.Module:
    """The victim's architecture from ``reconstruct``'s ``model`` argument (a copy, in eval mode)."""
    if model is None or isinstance(model, str):
        return resolve_model(model or "", dataset, seed=0)  # seeded: the global RNG is left as it was
    check_model(model, dataset)
    return copy.deepcopy(model).eval()


def _frozen(model: torch.nn.Module, device: torch.device, update: ObservedUpdate) -> torch.nn.Module:
    """The attacker's private copy ``model`` ready to be differentiated: on ``device``, parameters
    frozen, ``update``'s w0 buffers loaded, in the update's mode (``surrogate_mode``)."""
    model = model.to(device)
    for p in model.parameters():
        p.requires_grad_(False)
    params = set(parameter_keys(model))
    with torch.no_grad():
        for key, value in update.w0.items():
            if key not in params:
                model.get_buffer(key).copy_(value)
    return surrogate_mode(model, update.metadata.train_mode)


def _attack_vector(state: dict, keys: list[str]) -> dict:
    """The entries of ``state`` the attacks match: the model's parameters ``keys``, in their order.
    For a model without buffers, the whole state dict (the same keys, so the same flat vectors)."""
    return {k: state[k] for k in keys}


def _buffers(state: dict, keys: list[str], device, dtype) -> dict:
    """The other entries of ``state``, the model's buffers, as the attack's own copies on ``device``:
    floating ones in the attack's ``dtype``, integer ones (counters) in theirs. {} without buffers."""
    params = set(keys)
    return {
        k: (v.to(dtype) if v.is_floating_point() else v).to(device).clone() for k, v in state.items() if k not in params
    }


def _mode(meta) -> str:
    return "train" if meta.train_mode else "eval"


def _check_labels(labels, k: int, num_classes: int, config: AttackConfig, label_aux) -> torch.Tensor | None:
    """None for "recovered" (after checking the estimator has what it needs), else the oracle labels
    as (k,) int64. ValueError for another name (``check_label_mode``), "oracle" without the labels
    themselves, missing auxiliary data or bad oracle labels."""
    if config.start == "public" and label_aux is None:
        raise ValueError(
            "start='public' needs the server's public pool: pass label_aux=fl_attack.attacker.labels.AuxiliaryData"
            "(images, labels)"
        )
    if isinstance(labels, str):
        if check_label_mode(labels) == "oracle":
            raise ValueError("reconstruct takes oracle labels as the labels themselves: a (k,) int64 tensor")
        if config.label_estimator in NEEDS_AUX and label_aux is None:
            raise ValueError(
                f"label_estimator '{config.label_estimator}' needs public auxiliary data: "
                "pass label_aux=fl_attack.attacker.labels.AuxiliaryData(images, labels)"
            )
        return None
    y = torch.as_tensor(labels).long().reshape(-1)
    if y.numel() != k or y.min() < 0 or y.max() >= num_classes:
        raise ValueError(f"oracle labels must be {k} class ids in [0,{num_classes}), got {y.numel()} labels")
    return y


def _public(label_aux: AuxiliaryData | None):
    """The public pool as (images, labels) for ``start="public"``, or None."""
    return None if label_aux is None else (label_aux.images, label_aux.labels)


def _row(iteration: int, values: dict, client: int | None) -> dict:
    """One trace row of one client: tensors of the batch shape are indexed, numbers pass through."""
    row = {"iteration": iteration}
    for name, v in values.items():
        if isinstance(v, torch.Tensor):
            v = v.detach()
            if client is None and v.dim():  # a joint attack's per-update vector: not a trace column
                continue
            row[name] = float(v if client is None or v.dim() == 0 else v[client])
        else:
            row[name] = v
    return row


def _optimise(attack, x, y, spec, config, *, method, refine, callback, progress, time_limit, start, precision="fp32"):
    """The one optimisation loop of every attack (docs/PISME.md, "Optimisation"), on one client or a batch.

    x: X_hat, a leaf of shape (k,C,H,W) or (N,k,C,H,W), updated in place; y: (k,) or (N,k) labels.
    Minimises the sum of the clients' losses (each client's gradient is its own), with Adam (or SGD
    for P1), the pixel-box clamp, the attack's projection and SME's schedule, all element-wise.
    The attack's hooks: ``prepare(x, y)`` once before the loop; ``images(x)``, what the objective
    scores (an attack that ``generates_images`` optimises its generator, and x then holds the
    generator's output); ``guide_images(x, it)`` after each step (the diffusion prior's projection).
    refine(x, y) -> y: the label re-estimation at ``label_refine`` (None: labels stay fixed).
    precision: a resolved one (``fl_attack.attacker.precision``): "tf32" holds for each step's forward and
    backward (``precision_scope``), "bf16" autocasts each step's objective, i.e. the forwards and node
    gradients whose graph the backward then follows in their dtypes (``autocast``). The labels'
    refinement, the trace's callback and the final objective (the returned Lsim) run in float32.
    The step's objective and gradient run as one compiled ``torch.func`` function when
    ``config.compile`` resolves to it on x's device and the attack has one
    (``fl_attack.attacker.attacks.compiled.prepare_step``); a compile that fails falls back to this eager step.
    Returns (y, one trace per client, the final objective terms at the returned X_hat, how the steps
    ran: "compiled", "eager" or "eager (<reason>)", the snapshots {iteration: images in [0,1]} at
    ``snapshot_iterations(config)``).
    Raises TimeoutError past ``time_limit`` seconds since ``start``.
    """
    batched = bool(attack.batch_shape)
    clients = list(range(attack.batch_shape[0])) if batched else [None]
    lo, hi = (b.to(device=x.device, dtype=x.dtype) for b in spec.pixel_box())
    attack.prepare(x, y)
    step, compiled = prepare_step(attack, x, config.compile, precision)
    optimizers = build_optimizers(x, attack, config)
    schedulers = attack.schedulers(optimizers)  # SME's x0.1 drops (config.lr_decay), or the attack's own
    traces = [[] for _ in clients]
    steps = range(config.iterations)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc=method, leave=False)
    refine_at = round(config.label_refine * config.iterations) if refine is not None else 0
    snap_at = snapshot_iterations(config)
    snapshots = {}
    for it in steps:
        if refine_at and it == refine_at:
            y = refine(x, y)
        if time_limit is not None and time.perf_counter() - start > time_limit:
            raise TimeoutError(f"attack '{method}' exceeded its time limit of {time_limit:g} s at iteration {it}")
        for o in optimizers:
            o.zero_grad(set_to_none=True)
        terms = step(x, y) if step is not None else None  # the compiled step sets the .grad itself
        if terms is None and step is not None:  # its compile failed: eager from here, the reason recorded
            step, compiled = None, step.note
        if terms is None:
            with precision_scope(precision, x.device):  # tf32: the flags, for this step's forward and backward
                with autocast(precision, x.device):  # bf16: the forwards and node gradients
                    shown = attack.images(x)  # X_hat itself, or a generator's output (ginas)
                    terms = attack.objective(shown, y)
                terms["loss"].sum().backward()  # the clients' losses share no variable: each gradient is its own
        for o in optimizers:
            o.step()
        for s in schedulers:
            if isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau):  # lr_schedule "plateau"
                s.step(float(terms["loss"].detach().sum()))
            else:
                s.step()
        with torch.no_grad():
            if attack.generates_images:  # X_hat follows the generator (its output before this step)
                x.copy_(shown.detach())
            elif config.box_clamp:
                x.copy_(torch.maximum(torch.minimum(x, hi), lo))
            attack.project()
            attack.guide_images(x, it)  # the image prior's projection, when the attack uses one
            if it + 1 in snap_at:
                snapshots[it + 1] = _shown(spec, x)
        if it % config.trace_every == 0 or it == config.iterations - 1:
            values = {**terms, **attack.summary()}
            rows = [_row(it, values, n) for n in clients]
            if callback is not None:
                extra = callback(it, spec.denormalize(x.detach()).clamp(0, 1).cpu())
                if extra and batched:
                    if len(extra) != len(clients):
                        raise ValueError(f"the callback returned {len(extra)} dicts for {len(clients)} clients")
                    for row, more in zip(rows, extra):
                        row.update(more or {})
                elif extra:
                    rows[0].update(extra)
            for trace, row in zip(traces, rows):
                trace.append(row)
    # Final Lsim at the returned images, with and without the calibration (in float32, whatever the precision).
    if attack.generates_images:
        with torch.no_grad():
            x.copy_(attack.images(x))  # the generator's output at its final weights
    final = attack.objective(x, y)
    return y, traces, final, compiled, snapshots


def snapshot_iterations(config: AttackConfig) -> list[int]:
    """The iterations after which X_hat is kept (``AttackConfig.snapshots``: fractions of the iterations, the
    whole budget left out: that is the result), ascending and distinct, each in [1, iterations)."""
    its = {round(f * config.iterations) for f in config.snapshots}
    return sorted(i for i in its if 1 <= i < config.iterations)


def _shown(spec, x: torch.Tensor) -> torch.Tensor:
    """X_hat (normalised, any leading shape) as images in [0,1], float32 on the CPU."""
    return spec.denormalize(x.detach()).clamp(0, 1).to(device="cpu", dtype=torch.float32)
