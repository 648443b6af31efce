"""The configuration vocabulary, and one way to read settings written as text.

* ``TrainingProtocol``: the victims' local training (k, B, E, eta); ``PAPER`` is the paper's.
* ``Preset`` / ``PRESETS``: named sizes of an experiment ("paper", "cpu", "tiny"), a protocol
  plus the attack's iterations and nodes; the standalone CLI (``--preset``) and the paper
  experiments' --scale reads them too.
* The attack's hyperparameters are ``fl_attack.attacker.attacks.AttackConfig``; the federation's run
  config is ``fl_attack.audit.settings.RunSettings``, composed of both and the defense settings
  (the clients' part: ``fl_attack.federation.settings.FederationSettings``).

Every entry point (the run config, ``attack-options``, the CLI) converts ``key=value`` text with
``typed_value``, so "2.7" is never silently truncated to the integer 2 and "yes" is a bool
everywhere. Light: no torch import.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields, replace


def typed_value(key: str, value, default):
    """``value`` converted to the type of ``default``; ValueError starting with ``key`` (e.g.
    "run config 'seed'") otherwise. Floats must be finite numbers (NaN and inf rejected), integers
    whole numbers; a bool is not taken for a number (TOML ``seed = true`` is an error)."""
    kind = type(default)
    if kind in (int, float) and isinstance(value, bool):
        raise ValueError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if kind is bool:
        if isinstance(value, bool):
            return value
        if str(value).strip().lower() in ("true", "1", "yes"):
            return True
        if str(value).strip().lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"{key} must be true or false, got {value!r}")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{key} must be an integer, got {value!r}")
        if isinstance(value, str):
            try:
                return int(value.strip())  # exact, however many digits
            except ValueError:
                pass
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"{key} must be an integer, got {value!r}") from None
            if not number.is_integer():
                raise ValueError(f"{key} must be an integer, got {value!r}")
            return int(number)
    if kind is float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"{key} must be a finite number, got {value!r}")
        return number
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be {kind.__name__}, got {value!r}") from None


def parse_key_values(text: str, defaults: dict, what: str, noun: str = "setting") -> dict:
    """ "tv_weight=0.02,label_refine=0.25" -> {"tv_weight": 0.02, "label_refine": 0.25}, each value
    typed like ``defaults[key]``. ``what`` names the source and ``noun`` its keys in error messages.

    Raises ValueError for an item without '=', an unknown key or a value of the wrong type.
    """
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if "=" not in item:
            raise ValueError(f"{what}: expected key=value, got '{item}'")
        key, value = (s.strip() for s in item.split("=", 1))
        if key not in defaults:
            raise ValueError(f"{what}: unknown {noun} '{key}'; known: {sorted(defaults)}")
        out[key] = typed_value(f"{what} '{key}'", value, defaults[key])
    return out


def check_field_types(settings, key_of, names=None) -> None:
    """Every field of the dataclass ``settings`` (or those in ``names``) has its default's type: int
    fields a true int (not a bool), float fields a finite number, str and bool fields their type.
    ``key_of(name)`` gives the run-config key for a field name; ValueError "invalid run config: <key>
    ..." otherwise. Catches what from_run_config's typed_value would, for settings built directly."""
    for f in fields(settings):
        if names is not None and f.name not in names:
            continue
        kind, value = type(f.default), getattr(settings, f.name)
        if kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
            wanted = "an integer"
        elif kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            wanted = "a finite number"
        elif kind in (str, bool):
            ok, wanted = isinstance(value, kind), ("text" if kind is str else "true or false")
        else:
            continue
        if not ok:
            raise ValueError(f"invalid run config: {key_of(f.name)} must be {wanted}, got {value!r}")


# ------------------------------------------------------------------------- training protocol


def local_steps(num_samples: int, batch_size: int, local_epochs: int) -> int:
    """T = E * ceil(k / B), the number of local SGD steps of one client."""
    return int(local_epochs) * math.ceil(int(num_samples) / int(batch_size))


CLIENT_OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw")


@dataclass(frozen=True)
class ClientOptimizer:
    """The clients' local optimizer, public metadata the server prescribes (run config
    ``client-optimizer``, ``client-momentum``, ``client-weight-decay``, ``client-adam-betas``).

    name: "sgd" (plain SGD, the paper's; momentum must be 0), "momentum" (heavy ball) or "nesterov"
    (torch.optim.SGD with that momentum), "adam" (torch.optim.Adam, L2 weight decay added to the
    gradient) or "adamw" (torch.optim.AdamW, decoupled weight decay). momentum: beta in [0, 1)
    (> 0 for momentum and nesterov, 0 otherwise). weight_decay: lambda >= 0. adam_betas: (beta1,
    beta2), each in [0, 1) (used by adam and adamw only). Raises ValueError on construction.
    """

    name: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    adam_betas: tuple = (0.9, 0.999)

    def __post_init__(self):
        object.__setattr__(self, "adam_betas", tuple(float(b) for b in self.adam_betas))
        if self.name not in CLIENT_OPTIMIZERS:
            raise ValueError(f"client optimizer must be one of {', '.join(CLIENT_OPTIMIZERS)}, got {self.name!r}")
        heavy = self.name in ("momentum", "nesterov")
        if heavy and not 0 < self.momentum < 1:
            raise ValueError(f"the {self.name} optimizer needs a momentum in (0, 1), got {self.momentum}")
        if not heavy and self.momentum != 0:
            raise ValueError(f"momentum {self.momentum} given for the '{self.name}' optimizer, which has none")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise ValueError(f"weight decay must be a finite number >= 0, got {self.weight_decay}")
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise ValueError(f"adam betas must be two numbers in [0, 1), got {self.adam_betas}")

    @property
    def plain(self) -> bool:
        """True for the paper's plain SGD without weight decay (every optimizer-aware term is 1 or 0)."""
        return self.name == "sgd" and self.weight_decay == 0

    @property
    def adaptive(self) -> bool:
        """Adam or AdamW: a per-coordinate step size the server does not observe."""
        return self.name in ("adam", "adamw")

    def step_weights(self, local_steps: int):
        """(T,) numpy float64: c_s, the weight of step s's gradient g_s (s = 1..T, at w_{s-1}) in
        delta_w = w0 - wT = lr * sum_s c_s (g_s + lambda w_{s-1}) (docs/PISME.md, "Optimizers").

        * sgd: c_s = 1.
        * momentum (torch's heavy ball, no dampening): c_s = (1 - beta^(T-s+1)) / (1 - beta).
        * nesterov: c_s = 1 + beta (1 - beta^(T-s+1)) / (1 - beta).
        * adam / adamw: c_s = 1. Each Adam step moves a coordinate by about lr * m_hat/sqrt(v_hat), a
          ratio free of the gradient's scale, and the server never sees v_hat. The first moment's own
          weights (sum_{r>=s} beta1^(r-s) (1-beta1)/(1-beta1^r), exact were v_hat constant) were
          measured worse than uniform ones on the same updates (docs/real-federations.md), so the
          calibration vector d is what models Adam's per-coordinate scale.
        Raises ValueError for T < 1.
        """
        import numpy as np

        T = int(local_steps)
        if T < 1:
            raise ValueError(f"local_steps must be >= 1, got {local_steps}")
        s = np.arange(1, T + 1, dtype=np.float64)
        if self.name in ("momentum", "nesterov"):
            beta = self.momentum
            tail = (1 - beta ** (T - s + 1)) / (1 - beta)
            return tail if self.name == "momentum" else 1 + beta * tail
        return np.ones(T)  # sgd, adam, adamw

    def to_metrics(self) -> dict:
        """As a client's reply metrics, numbers only (a Flower MetricRecord holds no strings): the
        optimizer is its index in CLIENT_OPTIMIZERS."""
        return {
            "optimizer": CLIENT_OPTIMIZERS.index(self.name),
            "momentum": self.momentum,
            "weight-decay": self.weight_decay,
            "adam-beta1": self.adam_betas[0],
            "adam-beta2": self.adam_betas[1],
        }

    @classmethod
    def from_metrics(cls, metrics) -> ClientOptimizer:
        """Back from ``to_metrics``'s keys; a reply without them is plain SGD (older clients).
        ValueError for an optimizer index outside CLIENT_OPTIMIZERS or bad values."""
        m = metrics
        if "optimizer" not in m:
            return cls()
        code = m["optimizer"]
        if isinstance(code, str):
            name = code
        elif float(code).is_integer() and 0 <= int(code) < len(CLIENT_OPTIMIZERS):
            name = CLIENT_OPTIMIZERS[int(code)]
        else:
            raise ValueError(f"optimizer code {code!r} is not an index of {CLIENT_OPTIMIZERS}")
        return cls(
            name,
            float(m["momentum"]),
            float(m["weight-decay"]),
            (float(m["adam-beta1"]), float(m["adam-beta2"])),
        )

    def describe(self) -> str:
        """e.g. "momentum 0.9, weight decay 0.0005" or "sgd"."""
        parts = [self.name if self.name not in ("momentum", "nesterov") else f"{self.name} {self.momentum:g}"]
        if self.adaptive:
            parts.append(f"betas {self.adam_betas[0]:g}/{self.adam_betas[1]:g}")
        if self.weight_decay:
            parts.append(f"weight decay {self.weight_decay:g}")
        return ", ".join(parts)


def check_training(samples, batch_size, local_epochs, lr, *, samples_name: str = "samples") -> None:
    """ValueError unless B, E and k are >= 1, lr is a positive finite number and B <= k.
    ``samples_name`` names k in the message (TrainingMetadata calls it num_samples)."""
    for name, value in (("batch_size", batch_size), ("local_epochs", local_epochs), (samples_name, samples)):
        if int(value) < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite number, got {lr}")
    if batch_size > samples:
        raise ValueError(f"batch size B={batch_size} is larger than the client's k={samples} samples")


@dataclass(frozen=True)
class TrainingProtocol:
    """The victims' local training (docs/PISME.md, "Victim training"): E epochs of plain SGD on k samples.

    samples: k, private samples per client, integer >= 1. batch_size: B, 1 <= B <= k.
    local_epochs: E, integer >= 1. lr: eta, the SGD learning rate, a finite number > 0.
    Raises ValueError (TypeError for a non-integer k, B or E) on construction. The field names are
    ``fl_attack.evaluation.victims.train_victim``'s and AttackSettings', so ``asdict(protocol)`` passes on.
    """

    samples: int
    batch_size: int
    local_epochs: int
    lr: float

    def __post_init__(self):
        for name in ("samples", "batch_size", "local_epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an integer, got {value!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, numbers.Real):
            raise TypeError(f"lr must be a number, got {self.lr!r}")
        check_training(self.samples, self.batch_size, self.local_epochs, self.lr)

    @property
    def local_steps(self) -> int:
        """T = E * ceil(k / B), the local SGD steps (the last batch of an epoch may be smaller)."""
        return local_steps(self.samples, self.batch_size, self.local_epochs)

    def with_epochs(self, local_epochs: int) -> TrainingProtocol:
        """The same k, B and lr for E = ``local_epochs`` (e.g. the paper's T=250: PAPER.with_epochs(50))."""
        return replace(self, local_epochs=local_epochs)

    def run_config(self) -> dict:
        """The federation's run-config keys of this protocol (samples-per-client, batch-size, local-epochs, lr)."""
        return {
            "samples-per-client": self.samples,
            "batch-size": self.batch_size,
            "local-epochs": self.local_epochs,
            "lr": self.lr,
        }


# The paper's protocol (docs/PISME.md): k=50, B=10, E=20 (T=100), eta=0.004; E=50 gives its T=250.
PAPER = TrainingProtocol(samples=50, batch_size=10, local_epochs=20, lr=0.004)


@dataclass(frozen=True)
class Preset:
    """A named size of an attack experiment (``fl-attack attack --preset``, the experiments'
    ``--scale``): the victims' protocol and the attack's settings.

    protocol: the TrainingProtocol (its E is the one for the paper's T=100; ``long_epochs`` is the
    E for its T=250, so T = E * ceil(k/B) equals the paper's T at the paper and cpu presets).
    iterations: Adam steps K, >= 1. nodes: Gauss-Legendre nodes m, >= 1 (ValueError otherwise).
    clients, seeds: the experiments' victims per cell; cifar_clients: fewer CIFAR-100 clients per
    cell (cost), None for as many. trace_every: the trace's period in iterations. note: what it is for.
    rule: the attack's m, iterations and schedule are the audit's rule's per victim (iterations and nodes
    are then its short-trajectory choice, what an attack holds until its update is known).
    """

    name: str
    protocol: TrainingProtocol
    iterations: int
    nodes: int
    long_epochs: int
    clients: int
    seeds: int
    trace_every: int = 10
    cifar_clients: int | None = None
    note: str = ""
    rule: bool = False

    def __post_init__(self):
        for name in ("iterations", "nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"preset {self.name!r}: {name} must be an integer >= 1, got {value!r}")

    def attack_overrides(self) -> dict:
        """The preset's AttackConfig fields: {"iterations": K, "nodes": m}."""
        return {"iterations": self.iterations, "nodes": self.nodes}

    samples = property(lambda self: self.protocol.samples)
    batch_size = property(lambda self: self.protocol.batch_size)
    lr = property(lambda self: self.protocol.lr)

    @property
    def epochs(self) -> tuple:
        """((paper_T, E), ...): the local epochs E used for each of the paper's T = 100, 250."""
        return ((100, self.protocol.local_epochs), (250, self.long_epochs))

    def local_epochs(self, paper_T: int) -> int:
        return dict(self.epochs)[paper_T]

    def local_steps(self, paper_T: int) -> int:
        return self.protocol.with_epochs(self.local_epochs(paper_T)).local_steps

    def clients_for(self, dataset: str) -> int:
        # by name: cifar_clients is a setting of the paper presets' CIFAR-100 experiments alone
        if dataset == "cifar100" and self.cifar_clients is not None:
            return min(self.clients, self.cifar_clients)
        return self.clients

    def caption(self, datasets="", iterations=None, nodes=None, extra="", clients=None, epochs=None) -> str:
        """The preset as one sentence, for every table caption."""
        it = self.iterations if iterations is None else iterations
        Ts = ", ".join(f"E={e} -> T={self.protocol.with_epochs(e).local_steps}" for _, e in (epochs or self.epochs))
        parts = [
            f"Scale `{self.name}`",
            datasets,
            f"{clients or f'{self.clients} client(s)'} x {self.seeds} seed(s)",
            f"{it} attack iterations",
            f"k={self.samples}, B={self.batch_size}, lr={self.lr:g}, {Ts}",
            f"m={self.nodes if nodes is None else nodes}",
        ]
        return "; ".join(p for p in parts if p) + (f". {extra}" if extra else ".")


PRESETS = {
    "paper": Preset(
        "paper",
        PAPER,
        iterations=1000,
        nodes=7,
        long_epochs=50,
        clients=5,
        seeds=5,
        trace_every=50,
        note="the paper's protocol (docs/PISME.md); meant for a GPU. The paper does not state its clients per "
        "cell: 5 by default here (--clients sets it).",
    ),
    "cpu": Preset(
        "cpu",
        TrainingProtocol(samples=8, batch_size=4, local_epochs=50, lr=PAPER.lr),
        iterations=100,
        nodes=7,
        long_epochs=125,
        clients=2,
        seeds=1,
        cifar_clients=1,
        note="small enough for 2 shared CPU cores: k=8 images per client instead of 50, B=4 so that "
        "E=50/125 keeps the paper's T=100/250, 100 attack iterations instead of 1000, 2 FEMNIST "
        "clients but 1 CIFAR-100 client per cell (a CIFAR-100 attack costs about 3x a FEMNIST one).",
    ),
    "tiny": Preset(
        "tiny",
        TrainingProtocol(samples=4, batch_size=2, local_epochs=2, lr=PAPER.lr),
        iterations=3,
        nodes=3,
        long_epochs=5,
        clients=1,
        seeds=1,
        trace_every=1,
        note="a smoke test of the code paths (T=4/10 stand for the paper's T=100/250); its numbers mean nothing.",
    ),
    "audit": Preset(
        "audit",
        PAPER,
        iterations=400,
        nodes=1,
        long_epochs=50,
        clients=4,
        seeds=1,
        rule=True,
        note="the audit's attack: m, the iterations and X_hat's schedule chosen per victim from its T by the "
        "audit's rule (fl_attack.attacker.rule; docs/time-to-quality.md), as a federation's server attacks; "
        "explicit --nodes, --iterations and schedule --option values win. The victims' protocol is the paper's.",
    ),
}
