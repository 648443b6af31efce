"""The shared attack interface: the settings (AttackConfig), the registry and the objective's parts.

Over 600 lines on purpose: most of it is AttackConfig, every attack's settings documented and checked in
one place (a split would scatter one dataclass's fields and their checks).

Each attack (IG, SME, NL-SME, PI-SME) only says how it builds its surrogate gradient G(X_hat) and
which extra variables it learns. The one optimisation loop that drives every attack (Adam over
X_hat and those variables, the box clamp, the learning-rate schedule and the trace; the paper's
"Optimisation" section) lives in ``fl_attack.attacker.api``, behind ``reconstruct`` and ``reconstruct_batch``.

An attack holds one client (w0, wT of shape (P,)) or N clients of one architecture at once (shape
(N, P), ``fl_attack.reconstruct_batch``). Every per-client quantity then has a leading client
dimension (X_hat (N,k,C,H,W), P1 and d (N,P), SME's alpha and NL-SME's t (N,)), and every reduction
(Lsim, TV, R_p, R_d, the summary) is taken per client: ``objective`` returns (N,) terms, and the loop
minimises their sum, whose gradient with respect to client n's variables is client n's own.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields

import torch

from fl_attack.attacker.attacks.batchnorm import statistics_loss
from fl_attack.attacker.attacks.gradients import path_gradient
from fl_attack.attacker.quadrature import check_nodes
from fl_attack.federation.pools import get_spec

_EPS = 1e-12


STARTS = ("noise", "public")  # AttackConfig.start
COMPILE_MODES = ("off", "on", "auto")  # AttackConfig.compile (fl_attack.attacker.attacks.compiled)
LR_SHAPES = ("steps", "cosine", "plateau")  # AttackConfig.lr_schedule
# Learning-rate schedules of X_hat, by name: the AttackConfig values each sets (the audit's attack-lr-schedule).
# "steps" is the paper's (docs/PISME.md: Adam at 1.0, SME's x0.1 at 3/8, 5/8 and 7/8 of the iterations);
# "constant" holds 0.3; "plateau" starts at 1.0 and cuts x0.3 whenever the attack's own loss stalls for 10
# iterations. All three are measured, over seeds and on three sets of recorded updates, in
# docs/time-to-quality.md.
LR_SCHEDULES = {
    "steps": {"lr_images": 1.0, "lr_decay": True, "lr_schedule": "steps"},
    "constant": {"lr_images": 0.3, "lr_decay": False},
    "plateau": {"lr_images": 1.0, "lr_decay": True, "lr_schedule": "plateau"},
}
# What AttackConfig.auto may name: the settings the audit's rule picks per update (fl_attack.attacker.rule);
# "schedule" stands for the LR_SCHEDULES fields (lr_images, lr_decay, lr_schedule).
AUTO_SETTINGS = ("nodes", "iterations", "schedule")
_AUTO_FIELDS = {
    "nodes": ("nodes",),
    "iterations": ("iterations",),
    "schedule": ("lr_images", "lr_decay", "lr_schedule"),
}


def schedule_name(config) -> str:
    """The name of X_hat's learning-rate schedule an AttackConfig runs: the ``LR_SCHEDULES`` name whose
    values it has ("steps", "plateau", "constant"), else its shape ("cosine", "steps" at another rate) or
    "none" (lr_decay off at another rate): attacks.csv's lr_schedule column."""
    for name, values in LR_SCHEDULES.items():
        if all(getattr(config, key) == value for key, value in values.items()):
            return name
    return config.lr_schedule if config.lr_decay else "none"


def check_iterations(k, allow_auto: bool = False) -> int:
    """``k`` when it is a number of attack iterations: an integer >= 1 (with ``allow_auto``, 0 too: a
    run config's "chosen per update by a rule"). ValueError otherwise: the one check of the
    iterations (``AttackConfig``, the run config's attack-iterations, ``fl-attack attack`` /
    ``replay`` --iterations, the experiments' --iterations)."""
    floor = 0 if allow_auto else 1
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < floor:
        auto = " (0: chosen per update)" if allow_auto else ""
        raise ValueError(f"iterations must be an integer >= {floor}{auto}, got {k!r}")
    return int(k)


def check_compile(mode) -> str:
    """``mode`` when it is one of ``COMPILE_MODES`` ("off", "on", "auto"; ``compiled.resolve_compile``
    says what each does); ValueError otherwise. The one check of it (``AttackConfig.compile``, the run
    config's attack-compile, the CLI's --compile, the experiments' --compile)."""
    if not isinstance(mode, str) or mode not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    return mode


def check_own_settings(options, own: dict) -> None:
    """The one check that AttackConfig overrides given as text (a run config's attack-options, the
    CLI's --option, replay's --options, AttackSettings.overrides; the caller prefixes the message with
    which) set none of the settings the caller takes through a setting of its own: ``own`` maps each
    such AttackConfig field to that setting's name (a run-config key, a flag). ValueError naming both."""
    clash = sorted(set(options) & set(own))
    if clash:
        raise ValueError(f"{clash[0]} is set here and by {own[clash[0]]}; give one")


@dataclass
class AttackConfig:
    """Every hyperparameter of the attacks. Defaults are the paper's (docs/PISME.md) unless noted.

    iterations: Adam steps K. nodes: Gauss-Legendre nodes m (PI-SME). lr_images, lr_control_point,
    lr_calibration, lr_position: Adam learning rates of X_hat, P1, d and the path position
    (SME's alpha, NL-SME's t). control_point_optimizer: "adam" or "sgd" for P1.
    tv_weight (lambda_tv), tv_reduction ("mean" as SME's code, or "sum" as eq. 9),
    control_point_weight (lambda_p), calibration_weight (lambda_d), calibration bounds [0.1, 10].
    box_clamp: clamp X_hat to the valid pixel box after each step. lr_decay: decay every rate of the
    attacks that use it (all but dimitrov, which has its own) as lr_schedule says: "steps" (SME's x0.1 at
    3/8, 5/8 and 7/8 of the iterations), "cosine" (a half cosine to 0) or "plateau" (x lr_plateau_factor
    whenever the attack's own loss has not reached a new low for lr_plateau_patience iterations; not in
    the paper, nor is cosine);
    ``LR_SCHEDULES`` names the measured combinations of lr_images, lr_decay and lr_schedule. trace_every: record the
    trace every N iterations. seed: X_hat's init.
    start: where X_hat starts: "noise" (default: N(0, I) in normalised space, docs/PISME.md) or "public"
    (for each label the attack uses, a random image of that class from the server's public pool,
    ``reconstruct(..., label_aux=...)``; a class the pool lacks starts from noise). Not in the paper: a
    lever for short budgets (docs/time-to-quality.md); the verdict scores the same start as an
    update-free guess ("public start"), so a start that is already close is not counted as leakage.
    snapshots: fractions of the iterations after which X_hat is kept (``Reconstruction.snapshots``) for the
    evaluator to say whether the count was still rising at the end; () keeps none.
    observed_only: match delta_w only on its non-zero coordinates, the adaptive attacker against
    sparsified (top-k) updates, whose zeros were never sent (not in the paper).
    node_tolerance, node_check_every: pisme-adaptive only (fl_attack.attacker.attacks.pisme_adaptive): the
    largest accepted relative quadrature-error estimate, and the iterations between re-choices of m
    (0: at the learning-rate schedule's phases); ``nodes`` is then the largest m allowed.
    label_refine: with recovered labels, the fraction of the iterations after which the label counts
    are re-estimated once on the current X_hat and re-assigned (``fl_attack.attacker.labels.refine_labels``;
    not in the paper); 0 (default) keeps the labels fixed.
    label_estimator: how recovered labels are estimated from the output-layer update, one of
    ``fl_attack.attacker.labels.LABEL_ESTIMATORS`` (docs/label-recovery.md): "support" (default; data-free:
    the paper's counts restricted to the classes present, read exactly from the signs of the
    output-weight update, each present class >= 1), "paper" (docs/PISME.md: p_bar on dummy inputs at w0
    and wT) or "aux" (p_bar class-conditional on public auxiliary data along simulated local
    training, solved jointly with the counts; needs ``reconstruct(..., label_aux=AuxiliaryData(...))``).
    "support" is the default because it lost nothing against "paper" on any measured client: an
    untrained w0 (20 FEMNIST clients, k=16), the paper's protocol (10 FEMNIST + 3 CIFAR-100 clients,
    T=100 and 250) and top-k, low-rank and quantised updates; under update noise (DP) or
    quantisation the sign test finds more than k classes and it falls back to the paper's rounding.
    optimizer_aware: weigh the surrogate by the client's optimizer, read from the update's public
    metadata (docs/PISME.md, "Optimizers": momentum's per-step weights along the path, the weight
    decay term lambda w(t)); False is the naive attack that assumes plain SGD. No effect on plain SGD.
    bn_stats_weight: on a train-mode update of a model with batch norm, the weight of the match of
    X_hat's feature means and variances at each batch norm's input to the client's, estimated from
    the change of the running statistics (``fl_attack.attacker.attacks.batchnorm``; not in the paper); 0
    (default) is off. ``fl_attack.reconstruct`` refuses it > 0 on an eval-mode update or a model
    without batch-norm running statistics.
    precision: the arithmetic of the attack's steps, one of ``fl_attack.attacker.precision.PRECISIONS``:
    "fp32" (default, the paper's float32), "bf16" (bfloat16 autocast with float32 master copies and
    sums), "tf32" (CUDA only) or "auto" (the fastest the device accelerates; not in the paper;
    docs/performance.md, "Mixed precision"). Checked here for its value; ``fl_attack.reconstruct``
    resolves it on the attack's device (tf32 off CUDA: ValueError).
    generator_width, generator_candidates, lr_generator: ginas only (``fl_attack.attacker.attacks.ginas``): the
    channels of the generator's levels (0: the smallest power of two >= 16 whose generator has more
    than 4x the k C H W pixel values, GION's over-parameterisation rule, at most 128), the number of
    architectures the training-free search scores, and Adam's learning rate of the generator's weights
    (GI-NAS's code: 1e-3 over 30,000 iterations; 1e-2 here, measured in docs/attack-core.md).
    image_prior: "none" (default) or "diffusion": every ``prior_every`` iterations X_hat is diffused
    to a noise level and denoised back by the dataset's diffusion prior (``fl_attack.attacker.diffusion``;
    ``fl_attack.attacker.attacks.dggi``), the noise level falling linearly from ``prior_strength`` (a fraction
    of the diffusion's 1000 steps) at the start to 0 at 7/8 of the iterations, after which no
    projection is made, so the last phase fits the update. ``prior_steps``: DDIM steps per projection.
    dggi always uses the prior; for the other attacks it is an option (docs/results.md, "the diffusion
    prior for the other attacks").
    compile: "off", "on" or "auto" (default): whether the step (objective and gradient) runs as one
    ``torch.compile``d ``torch.func`` function (``fl_attack.attacker.attacks.compiled``; not in the paper; the same
    numbers up to rounding). "auto" compiles on CUDA, not on the CPU, as measured in
    docs/performance.md ("Compiled step"); attacks without a compiled form run eagerly whatever it is,
    and a compile that fails falls back to eager (``Reconstruction.compile`` says which ran).
    dimitrov_*: dimitrov only (``fl_attack.attacker.attacks.dimitrov``, Dimitrov et al. TMLR 2022; the authors'
    scripts in eth-sri/fedavg_leakage); each default stands for the update's dataset's value
    (``dimitrov.DATASET_DEFAULTS``: FEMNIST / CIFAR-100): dimitrov_lr, Adam's initial rate (0: 0.4 / 0.1);
    dimitrov_lr_decay and dimitrov_decay_every, the rate times dimitrov_lr_decay^(i / dimitrov_decay_every)
    at iteration i (0: 0.995 and 10 / 0.997 and 20); dimitrov_data_start, dimitrov_data_end, the data
    term's weight f ramped geometrically from f0 to f1 over the first half of the iterations (0: 1 -> 2 /
    4 -> 2); dimitrov_tv, dimitrov_clip, dimitrov_invariance, the weights of the squared TV, the pixel-box
    term and the epoch-order-invariant prior (-1: 1e-3, 2, 1000 / 2e-4, 10, 6.075; 0 turns a term off);
    dimitrov_restarts: fresh starts allowed after a non-finite loss (then the last finite images are kept).
    auto: the settings (``AUTO_SETTINGS``: nodes, iterations, schedule) the audit's rule chooses per update from
    its public metadata (fl_attack.attacker.rule.for_update, called by AttackJob and ``reconstruct``); until
    then they hold the rule's short-trajectory choice. () (the library's default): every value as given.
    """

    iterations: int = 1000
    nodes: int = 7
    lr_images: float = 1.0
    lr_control_point: float = 1e-5  # not the paper's 1e-3: see docs/attack-core.md
    control_point_optimizer: str = "adam"
    lr_calibration: float = 2.5e-3
    lr_position: float = 1e-3
    tv_weight: float = 1e-2
    tv_reduction: str = "mean"
    control_point_weight: float = 1e-3
    calibration_weight: float = 1e-6
    calibration_min: float = 0.1
    calibration_max: float = 10.0
    box_clamp: bool = True
    lr_decay: bool = True
    lr_schedule: str = "steps"
    lr_plateau_patience: int = 10
    lr_plateau_factor: float = 0.3
    trace_every: int = 10
    seed: int = 0
    start: str = "noise"
    snapshots: tuple = (0.25, 0.5)
    observed_only: bool = False
    node_tolerance: float = 0.05
    node_check_every: int = 0
    label_refine: float = 0.0
    label_estimator: str = "support"
    optimizer_aware: bool = True
    bn_stats_weight: float = 0.0
    precision: str = "fp32"
    generator_width: int = 0
    generator_candidates: int = 16
    lr_generator: float = 1e-2  # not GI-NAS' 1e-3 (30,000 iterations there): see docs/attack-core.md
    image_prior: str = "none"
    prior_every: int = 10
    prior_strength: float = 0.3
    prior_steps: int = 10
    compile: str = "auto"
    dimitrov_lr: float = 0.0  # 0: the dataset's (dimitrov.DATASET_DEFAULTS)
    dimitrov_lr_decay: float = 0.0
    dimitrov_decay_every: int = 0
    dimitrov_data_start: float = 0.0
    dimitrov_data_end: float = 0.0
    dimitrov_tv: float = -1.0  # -1: the dataset's; 0: off
    dimitrov_clip: float = -1.0
    dimitrov_invariance: float = -1.0
    dimitrov_restarts: int = 1
    auto: tuple = ()

    def __post_init__(self):
        if isinstance(self.auto, str):
            self.auto = tuple(a.strip() for a in self.auto.split(",") if a.strip())
        if not set(self.auto) <= set(AUTO_SETTINGS):
            raise ValueError(f"auto may name {', '.join(AUTO_SETTINGS)}, got {', '.join(map(str, self.auto))}")
        self.auto = tuple(a for a in AUTO_SETTINGS if a in self.auto)  # one order, whatever the order given
        self.iterations = check_iterations(self.iterations)
        self.nodes = check_nodes(self.nodes)
        if self.tv_reduction not in ("mean", "sum"):
            raise ValueError(f"tv_reduction must be 'mean' or 'sum', got {self.tv_reduction!r}")
        if self.control_point_optimizer not in ("adam", "sgd"):
            raise ValueError(f"control_point_optimizer must be 'adam' or 'sgd', got {self.control_point_optimizer!r}")
        if not 0 < self.calibration_min <= 1 <= self.calibration_max:
            raise ValueError("calibration bounds must satisfy 0 < calibration_min <= 1 <= calibration_max")
        for f in ("lr_images", "lr_control_point", "lr_calibration", "lr_position"):
            if not getattr(self, f) >= 0:
                raise ValueError(f"{f} must be >= 0, got {getattr(self, f)}")
        if not self.node_tolerance > 0:
            raise ValueError(f"node_tolerance must be > 0, got {self.node_tolerance}")
        if int(self.node_check_every) < 0:
            raise ValueError(
                f"node_check_every must be >= 0 (0: at the schedule's phases), got {self.node_check_every}"
            )
        if not 0 <= self.label_refine < 1:
            raise ValueError(f"label_refine must be in [0, 1) (a fraction of the iterations), got {self.label_refine}")
        from fl_attack.attacker.labels import LABEL_ESTIMATORS

        if self.label_estimator not in LABEL_ESTIMATORS:
            raise ValueError(
                f"label_estimator must be one of {', '.join(LABEL_ESTIMATORS)}, got {self.label_estimator!r}"
            )
        if not all(0 < float(f) < 1 for f in self.snapshots):
            raise ValueError(f"snapshots must be fractions of the iterations in (0, 1), got {self.snapshots!r}")
        self.snapshots = tuple(float(f) for f in self.snapshots)
        if self.lr_schedule not in LR_SHAPES:
            raise ValueError(f"lr_schedule must be one of {', '.join(LR_SHAPES)}, got {self.lr_schedule!r}")
        if int(self.lr_plateau_patience) < 1 or not 0 < self.lr_plateau_factor < 1:
            raise ValueError(
                "lr_plateau_patience must be >= 1 and lr_plateau_factor in (0, 1), got "
                f"{self.lr_plateau_patience} and {self.lr_plateau_factor}"
            )
        if self.start not in STARTS:
            raise ValueError(f"start must be one of {', '.join(STARTS)}, got {self.start!r}")
        if int(self.trace_every) < 1:
            raise ValueError(f"trace_every must be >= 1, got {self.trace_every}")
        if not self.bn_stats_weight >= 0:
            raise ValueError(f"bn_stats_weight must be >= 0 (0: off), got {self.bn_stats_weight}")
        if not isinstance(self.generator_width, int) or not 0 <= self.generator_width <= 512:
            raise ValueError(
                f"generator_width must be an integer in [0, 512] (0: GION's rule), got {self.generator_width!r}"
            )
        if not isinstance(self.generator_candidates, int) or self.generator_candidates < 1:
            raise ValueError(f"generator_candidates must be an integer >= 1, got {self.generator_candidates!r}")
        if not self.lr_generator >= 0:
            raise ValueError(f"lr_generator must be >= 0, got {self.lr_generator}")
        if self.image_prior not in ("none", "diffusion"):
            raise ValueError(f"image_prior must be 'none' or 'diffusion', got {self.image_prior!r}")
        if int(self.prior_every) < 1 or int(self.prior_steps) < 1:
            raise ValueError(f"prior_every and prior_steps must be >= 1, got {self.prior_every} and {self.prior_steps}")
        if not 0 < self.prior_strength < 1:
            raise ValueError(
                f"prior_strength must be in (0, 1) (a fraction of the diffusion steps), got {self.prior_strength}"
            )
        from fl_attack.attacker.precision import check_precision

        check_precision(self.precision)
        check_compile(self.compile)
        for f in ("dimitrov_lr", "dimitrov_data_start", "dimitrov_data_end"):
            if not getattr(self, f) >= 0:
                raise ValueError(f"{f} must be >= 0 (0: the dataset's), got {getattr(self, f)}")
        if not 0 <= self.dimitrov_lr_decay <= 1:
            raise ValueError(f"dimitrov_lr_decay must be in [0, 1] (0: the dataset's), got {self.dimitrov_lr_decay}")
        for f in ("dimitrov_decay_every", "dimitrov_restarts"):
            if int(getattr(self, f)) < 0:
                raise ValueError(f"{f} must be an integer >= 0, got {getattr(self, f)}")
        for f in ("dimitrov_tv", "dimitrov_clip", "dimitrov_invariance"):
            if not (getattr(self, f) >= 0 or getattr(self, f) == -1):
                raise ValueError(f"{f} must be >= 0, or -1 for the dataset's, got {getattr(self, f)}")

    @property
    def needs_public(self) -> str:
        """What needs the server's public pool (``label_aux``): "label_estimator=NAME", "start=public", or ""."""
        from fl_attack.attacker.labels import NEEDS_AUX

        if self.label_estimator in NEEDS_AUX:
            return f"label_estimator={self.label_estimator}"
        return "start=public" if self.start == "public" else ""

    @classmethod
    def from_overrides(cls, config: AttackConfig | None = None, **overrides) -> AttackConfig:
        """A copy of ``config`` (or the defaults) with ``overrides``; unknown names raise ValueError. An override
        of a setting in ``config.auto`` (nodes, iterations, a schedule field) takes it out of ``auto``."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown attack setting(s) {unknown}; known: {sorted(known)}")
        base = asdict(config) if config is not None else {}
        if "auto" not in overrides:  # an explicit value wins over the rule: it is no longer the rule's to pick
            base["auto"] = tuple(a for a in base.get("auto", ()) if not set(_AUTO_FIELDS[a]) & set(overrides))
        base.update(overrides)
        return cls(**base)


def lsim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine dissimilarity 1 - <a,b>/(|a||b|) of two flat vectors (eq. 3), in [0, 2].

    a, b: (P,), or (N, P) for N clients (one value per row); returns a scalar, or (N,).
    """
    return 1 - (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1) + _EPS)


_IMAGE_DIMS = (-4, -3, -2, -1)


def total_variation(x: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Anisotropic TV of (k,C,H,W) images (eq. 9): mean (SME's code) or sum of |neighbour differences|.

    x: (k,C,H,W), a scalar result; or (N,k,C,H,W) for N clients, one value per client, (N,).
    """
    dh = (x[..., 1:, :] - x[..., :-1, :]).abs()
    dw = (x[..., :, 1:] - x[..., :, :-1]).abs()
    if reduction == "sum":
        return dh.sum(_IMAGE_DIMS) + dw.sum(_IMAGE_DIMS)
    return dh.mean(_IMAGE_DIMS) + dw.mean(_IMAGE_DIMS)


def node_gradients(
    model: torch.nn.Module, shapes, weights: torch.Tensor, coeffs: torch.Tensor, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """G = sum_i c_i * grad_w CE(f_{w_i}(x), y) at given nodes (eq. 8), differentiable in x and the weights.

    weights: (m, P) flat weights of the m nodes; coeffs: (m,) quadrature weights. Returns (P,).
    For N clients: weights (m, N, P), x (N,k,C,H,W), y (N,k); returns (N, P).
    Nodes on a path of a few anchors (w0, P1, wT) are cheaper through
    ``fl_attack.attacker.attacks.gradients.path_gradient``, which this calls with one anchor per node.
    """
    return path_gradient(model, shapes, list(weights.unbind(0)), None, coeffs, x, y)


class Attack:
    """Base class: a surrogate gradient G(X_hat) matched to delta_w = w0 - wT under cosine loss.

    Subclasses set ``name`` and implement ``surrogate_gradient``; those that learn more than X_hat
    override ``param_groups``, ``regularizer``, ``project`` and ``summary``. ``calibration`` is the
    per-coordinate vector d when the attack uses one (NL-SME, PI-SME), else None.
    w0, wT: flat (P,) weights of one client, or (N, P) for N clients attacked as one batch (module
    docstring); ``batch_shape`` is () or (N,), the leading shape of every per-client variable.
    ``batchable``: False for an attack whose clients cannot share one computation (pisme-adaptive
    chooses its m per client); ``fl_attack.reconstruct_batch`` refuses those.
    w0, wT and ``shapes`` are the model's parameters only. buffers: the model's buffers from w0
    (name -> tensor, batched (N, ...); batch norm's running statistics, constants of every forward
    pass), None for a model without any. statistics: the client's batch-norm feature statistics
    (``fl_attack.attacker.attacks.batchnorm.client_statistics``; batched, one list per client), matched with
    weight ``config.bn_stats_weight``; None: no such term.
    """

    name = "base"
    batchable = True
    generates_images = False  # True: X_hat is the output of the attack's own variables (ginas, dimitrov)
    own_variables = "generator"  # what those variables are, for the message refusing a joint attack
    uses_prior = False  # True: the diffusion prior guides X_hat whatever config.image_prior says (dggi)

    @classmethod
    def check_dataset(cls, dataset: str) -> None:
        """ValueError when this attack cannot run on ``dataset`` (a name of the dataset registry); the run
        config's preflight asks it before round 1. Every dataset by default."""

    def __init__(
        self,
        model,
        w0: torch.Tensor,
        wT: torch.Tensor,
        shapes,
        config: AttackConfig,
        training=None,
        buffers: dict | None = None,
        statistics: list | None = None,
    ):
        if w0.dim() not in (1, 2) or wT.shape != w0.shape:
            raise ValueError(f"w0 and wT must both be (P,) or (N, P), got {tuple(w0.shape)} and {tuple(wT.shape)}")
        self.model, self.w0, self.wT, self.shapes, self.config = model, w0, wT, shapes, config
        self.buffers = buffers or None
        self.statistics = statistics if statistics and config.bn_stats_weight > 0 else None
        # training: the update's public TrainingMetadata; with optimizer_aware, its optimizer shapes G.
        optimizer = training.optimizer if training is not None and config.optimizer_aware else None
        self.step_weights = None  # (T,) c_s of ClientOptimizer.step_weights, None for plain SGD
        self.weight_decay = 0.0
        if optimizer is not None and not optimizer.plain:
            weights = torch.as_tensor(optimizer.step_weights(training.local_steps), dtype=w0.dtype, device=w0.device)
            if not bool((weights == 1).all()):  # uniform (sgd, adam): G is path_gradient's, unweighted
                self.step_weights = weights / weights.mean()
            self.weight_decay = 0.0 if optimizer.name == "adamw" else optimizer.weight_decay
        self.batch_shape = tuple(w0.shape[:-1])
        self.delta_w = w0 - wT
        self.calibration = None
        # observed_only: the surrogate gradient is compared on the observed coordinates only.
        self.observed_mask = (self.delta_w != 0).to(w0.dtype) if config.observed_only else None
        self.training = training
        self.prior = None
        if self.uses_prior or config.image_prior == "diffusion":
            if training is None:
                raise ValueError(
                    f"attack '{self.name}' with the diffusion prior needs the update's metadata (its dataset)"
                )
            from fl_attack.attacker.diffusion import load_prior

            self.spec = get_spec(training.dataset)
            self.prior = load_prior(self.spec.name, w0.device)
            self.prior_generator = torch.Generator().manual_seed(int(config.seed) + 1)
            self.prior_level = 0.0  # the last projection's noise level, a fraction of the diffusion steps

    @classmethod
    def gradients_per_iteration(cls, config, trace: list | None = None) -> int | float:
        """Gradient evaluations per iteration, the ``gradients_per_iteration`` column of a row: 1 for
        the single-gradient attacks (IG, SME, NL-SME), PI-SME's m (``AttackConfig.nodes``). config: an
        AttackConfig or its dict; trace: the attack's trace rows (pisme-adaptive averages the m it used)."""
        return 1

    def path_surrogate(self, anchors, basis, coeffs, x, y, nodes=None) -> torch.Tensor:
        """sum_i c_i a(t_i) (grad_w CE(f_{w_i}(x), y) + lambda w_i): the update's surrogate (eq. 8)
        weighted by the client's optimizer (docs/PISME.md, "Optimizers"). w_i = sum_j basis[i, j]
        anchors[j] (``path_gradient``'s convention; basis None: w_i = anchors[i]); nodes: (m,) path
        positions t_i in [0, 1] of the nodes, for the momentum weights a(t) (None: a = 1, a single
        node); lambda: the weight decay. For plain SGD (or optimizer_aware False) this is
        ``path_gradient`` unchanged. Returns (P,) or (N, P)."""
        if self.step_weights is not None and nodes is not None:
            coeffs = coeffs * self.path_weights(nodes)
        g = path_gradient(self.model, self.shapes, anchors, basis, coeffs, x, y, self.buffers)
        if self.weight_decay:
            if basis is None:
                mix = [c * a for c, a in zip(coeffs, anchors)]
            else:
                per_anchor = (basis * coeffs.unsqueeze(-1)).sum(-2)  # (..., J): sum_i c_i basis[i, j]
                mix = [per_anchor[..., j : j + 1] * a for j, a in enumerate(anchors)]
            g = g + self.weight_decay * torch.stack(mix).sum(0)
        return g

    def path_weights(self, nodes: torch.Tensor) -> torch.Tensor:
        """a(t) at path positions ``nodes`` (m,) in [0, 1]: the optimizer's step weight c_s
        (``ClientOptimizer.step_weights``, normalised to mean 1) at step s - 1 = t T, linearly
        interpolated between steps. Ones for plain SGD."""
        if self.step_weights is None:
            return torch.ones_like(nodes)
        T = self.step_weights.shape[0]
        pos = (nodes.to(self.step_weights) * T).clamp(0, T - 1)
        lo = pos.floor().long().clamp(max=T - 1)
        hi = (lo + 1).clamp(max=T - 1)
        frac = pos - lo.to(pos)
        return self.step_weights[lo] * (1 - frac) + self.step_weights[hi] * frac

    def param_groups(self) -> list[dict]:
        return []

    def schedulers(self, optimizers: list) -> list:
        """The learning-rate schedules the loop steps after each iteration, given the loop's optimizers:
        SME's x0.1 at 3/8, 5/8 and 7/8 of the iterations when ``config.lr_decay`` (``sme_schedulers``);
        an attack with its own schedule overrides this."""
        return sme_schedulers(optimizers, self.config)

    def prepare(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Called once before the loop with the initial X_hat and the labels (ginas searches its
        generator's architecture here)."""

    def images(self, x: torch.Tensor) -> torch.Tensor:
        """The normalised images the objective scores at this step: X_hat itself, or, for an attack that
        ``generates_images``, its generator's output (differentiable in the generator's weights)."""
        return x

    @torch.no_grad()
    def guide_images(self, x: torch.Tensor, iteration: int) -> None:
        """After step ``iteration``: the diffusion prior's projection of X_hat, in place, when the attack
        uses it (``config.image_prior``; AttackConfig's docstring): every ``prior_every`` iterations
        until 7/8 of the run, X_hat (k,C,H,W) or (N,k,C,H,W) in normalised space is diffused to the
        level prior_strength * (1 - (iteration+1) / (7/8 K)) and denoised back with ``prior_steps``
        DDIM steps (``fl_attack.attacker.diffusion.DiffusionPrior.denoise``)."""
        if self.prior is None:
            return
        c = self.config
        last = math.floor(c.iterations * 7 / 8)
        done = iteration + 1
        if done % c.prior_every or done >= last:
            return
        self.prior_level = c.prior_strength * (1 - done / last)
        start = max(1, round(self.prior_level * 1000))
        flat = x.reshape(-1, *x.shape[-3:])
        cleaned = self.prior.denoise(
            self.spec.denormalize(flat).clamp(0, 1), start, c.prior_steps, self.prior_generator
        )
        x.copy_(self.spec.normalize(cleaned.to(x)).reshape(x.shape))

    def surrogate_gradient(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def regularizer(self) -> torch.Tensor:
        """The attack's regularisers, one value per client: shape ``batch_shape``."""
        return self.w0.new_zeros(self.batch_shape)

    @torch.no_grad()
    def project(self) -> None:
        """Clamp the learnable variables to their valid sets after each step."""

    def summary(self) -> dict:
        """The attack's own variables for the trace: name -> detached tensor of shape ``batch_shape``
        (one value per client) or a python number shared by all clients."""
        return {}

    def objective(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        """The loss to minimise (eq. 10 for PI-SME) and its parts, as a dict of tensors.

        x: X_hat, (k,C,H,W) normalised images, or (N,k,C,H,W); y: (k,) or (N,k) int64 labels.
        Each term is a scalar, or (N,) with one value per client (nothing mixes clients).
        "loss" is differentiable; "lsim_honest" is Lsim(G, delta_w) with d = 1 and
        "lsim_calibrated" is Lsim(d * G, delta_w) (both detached, in [0, 2]). With ``observed_only``,
        G is restricted to the coordinates where delta_w is non-zero. With ``statistics``, the loss
        adds bn_stats_weight * "bn_stats" (``fl_attack.attacker.attacks.batchnorm.statistics_loss``).
        """
        g = self.surrogate_gradient(x, y)
        if self.observed_mask is not None:
            g = g * self.observed_mask
        tv = total_variation(x, self.config.tv_reduction)
        if self.calibration is not None:
            matched = lsim(self.calibration * g, self.delta_w)
            honest = lsim(g.detach(), self.delta_w)
        else:
            matched = lsim(g, self.delta_w)
            honest = matched.detach()
        loss = matched + self.config.tv_weight * tv + self.regularizer()
        terms = {"lsim_honest": honest, "lsim_calibrated": matched.detach(), "tv": tv.detach()}
        if self.statistics is not None:
            bn = statistics_loss(self.model, self.shapes, self.w0, self.wT, x, self.statistics, self.buffers)
            loss = loss + self.config.bn_stats_weight * bn
            terms["bn_stats"] = bn.detach()
        return {"loss": loss, **terms}


class JointAttack:
    """One X_hat matched to several observed updates of the same k samples at once.

    attacks: n >= 2 Attacks of one method, one per update, each with its own path variables (P1, d,
    SME's alpha, NL-SME's t); weights: (n,) non-negative, summing to 1. The loss is
    sum_j weights[j] * loss_j(X_hat), each loss_j the update's own objective (eq. 10 for PI-SME), so
    each update's variables get exactly their own gradient. Its "lsim_honest" / "lsim_calibrated"
    are the weighted means, and "lsim_per_update" is the (n,) vector of the honest Lsim of each
    update (the attacker's own signal of how well X_hat explains it). Not in the paper: the
    multi-update objective of temporal gradient inversion (Li et al., arXiv 2306.07883, eq. 5) with
    PI-SME's per-update path.
    """

    batch_shape = ()
    generates_images = False

    def __init__(self, attacks: list, weights: torch.Tensor):
        if len(attacks) < 2 or weights.shape != (len(attacks),):
            raise ValueError(
                f"a joint attack needs n >= 2 attacks and (n,) weights, got {len(attacks)} and {tuple(weights.shape)}"
            )
        own = next((a for a in attacks if a.generates_images), None)
        if own is not None:
            raise ValueError(
                f"attack '{own.name}' fits its own {own.own_variables} to one update; attack the updates one by one"
            )
        self.attacks, self.weights = attacks, weights

    def prepare(self, x: torch.Tensor, y: torch.Tensor) -> None:
        for attack in self.attacks:
            attack.prepare(x, y)

    def images(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @torch.no_grad()
    def guide_images(self, x: torch.Tensor, iteration: int) -> None:
        self.attacks[0].guide_images(x, iteration)  # one X_hat, one prior (the attacks share the config)

    def param_groups(self) -> list[dict]:
        return [group for attack in self.attacks for group in attack.param_groups()]

    def schedulers(self, optimizers: list) -> list:
        return self.attacks[0].schedulers(optimizers)  # one config for all updates

    def objective(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        terms = [attack.objective(x, y) for attack in self.attacks]
        honest = torch.stack([t["lsim_honest"] for t in terms])
        calibrated = torch.stack([t["lsim_calibrated"] for t in terms])
        return {
            "loss": sum(w * t["loss"] for w, t in zip(self.weights, terms)),
            "lsim_honest": (self.weights * honest).sum(),
            "lsim_calibrated": (self.weights * calibrated).sum(),
            "tv": terms[0]["tv"],
            "lsim_per_update": honest,
        }

    @torch.no_grad()
    def project(self) -> None:
        for attack in self.attacks:
            attack.project()

    def summary(self) -> dict:
        return {f"{name}_{j}": v for j, a in enumerate(self.attacks) for name, v in a.summary().items()}


class BezierMixin:
    """Learnable control point P1 (eq. 4) and calibration d (eq. 10), shared by NL-SME and PI-SME."""

    def _init_bezier(self):
        self.anchor = (self.w0 + self.wT) / 2
        self.control_point = self.anchor.clone().requires_grad_(True)
        self.calibration = torch.ones_like(self.w0, requires_grad=True)

    def _bezier_groups(self) -> list[dict]:
        c = self.config
        return [
            {"params": [self.control_point], "lr": c.lr_control_point, "optimizer": c.control_point_optimizer},
            {"params": [self.calibration], "lr": c.lr_calibration},
        ]

    def regularizer(self):
        """lambda_p ||P1 - (w0+wT)/2||^2 + lambda_d ||d - 1||^2 (eq. 10), per client."""
        c = self.config
        r_p = (self.control_point - self.anchor).pow(2).sum(-1)
        r_d = (self.calibration - 1).pow(2).sum(-1)
        return c.control_point_weight * r_p + c.calibration_weight * r_d

    @torch.no_grad()
    def _project_calibration(self):
        self.calibration.clamp_(self.config.calibration_min, self.config.calibration_max)

    def _bezier_summary(self) -> dict:
        """|P1 - (w0+wT)/2| / |delta_w| and the mean of d, per client."""
        with torch.no_grad():
            shift = (self.control_point - self.anchor).norm(dim=-1) / (self.delta_w.norm(dim=-1) + _EPS)
            return {"control_point_shift": shift, "calibration_mean": self.calibration.mean(-1)}


ATTACKS: dict[str, type[Attack]] = {}


def register(cls: type[Attack]) -> type[Attack]:
    """Class decorator: add an attack to the registry under ``cls.name``."""
    ATTACKS[cls.name] = cls
    return cls


def get_attack(name: str) -> type[Attack]:
    """The attack class registered as ``name``; ValueError listing the choices otherwise."""
    if name not in ATTACKS:
        raise ValueError(f"unknown attack method '{name}'; choose from: {', '.join(sorted(ATTACKS))}")
    return ATTACKS[name]


def parse_methods(text: str, what: str = "") -> tuple[str, ...]:
    """ "pisme,ig" -> ("pisme", "ig"), the one check of a list of attack methods (run config, CLI,
    replay): at least one, each registered, none twice. ValueError with a one-line message, prefixed
    with ``what`` (e.g. "invalid run config: attack-method") when given."""
    names = tuple(m.strip() for m in str(text).split(",") if m.strip())
    prefix, choices = f"{what}: " if what else "", ", ".join(sorted(ATTACKS))
    if not names:
        raise ValueError(f"{prefix}no attack method given; choose from: {choices}")
    for name in names:
        if name.endswith("+memory") and name.removesuffix("+memory") in ATTACKS:
            raise ValueError(
                f"{prefix}'{name}' attacks a client over a federation's rounds: give attack-memory in a "
                "federation, or --memory to fl-attack replay; here, choose from: " + choices
            )
        if name not in ATTACKS:
            raise ValueError(f"{prefix}unknown attack method '{name}'; choose from: {choices}")
    twice = next((m for m in names if names.count(m) > 1), None)
    if twice:
        raise ValueError(f"{prefix}method '{twice}' is listed more than once in '{text}'")
    return names


def build_optimizers(x: torch.Tensor, attack: Attack, config: AttackConfig) -> list[torch.optim.Optimizer]:
    """Adam over X_hat and the attack's variables (an SGD optimiser where a group asks for it); an
    attack that ``generates_images`` has no X_hat group (its generator's weights are its variables).

    Adam's and SGD's updates are element-wise, so on variables stacked over N clients each client
    takes exactly the step it would take alone (none of them clips or normalises across elements).
    """
    adam_groups = [] if attack.generates_images else [{"params": [x], "lr": config.lr_images}]
    sgd_groups = []
    for group in attack.param_groups():
        group = dict(group)
        (sgd_groups if group.pop("optimizer", "adam") == "sgd" else adam_groups).append(group)
    optimizers = [torch.optim.Adam(adam_groups)]
    if sgd_groups:
        optimizers.append(torch.optim.SGD(sgd_groups))
    return optimizers


def sme_schedulers(optimizers: list, config: AttackConfig) -> list:
    """The decay of every rate when ``config.lr_decay``, else none: SME's x0.1 at ``lr_milestones``
    (lr_schedule "steps"), a half cosine from the rate to 0 over the iterations ("cosine";
    Loshchilov & Hutter, ICLR 2017, without restarts) or x lr_plateau_factor when the loss stalls
    ("plateau": torch's ReduceLROnPlateau, relative threshold 1e-4; the loop steps it with the loss,
    summed over a batch's clients, which is the attacker's own objective, never a score)."""
    if not config.lr_decay:
        return []
    if config.lr_schedule == "plateau":
        return [
            torch.optim.lr_scheduler.ReduceLROnPlateau(
                o, mode="min", factor=config.lr_plateau_factor, patience=int(config.lr_plateau_patience)
            )
            for o in optimizers
        ]
    if config.lr_schedule == "cosine":
        return [torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=config.iterations) for o in optimizers]
    return [torch.optim.lr_scheduler.MultiStepLR(o, lr_milestones(config.iterations), 0.1) for o in optimizers]


def lr_milestones(iterations: int) -> list[int]:
    """SME's schedule: the learning rates drop x0.1 at 3/8, 5/8 and 7/8 of the iterations."""
    return sorted({math.floor(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)})
