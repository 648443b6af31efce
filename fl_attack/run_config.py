"""The federation's run config (``[tool.flwr.app.config]``), parsed and checked in one place.

Flower hands the run config to both apps as a flat dict with kebab-case keys and TOML types.
``RunSettings.from_run_config`` turns it into typed settings and raises ValueError with a clear
message for any bad value, so the ServerApp can fail before the first round starts. Both apps
(clients/ and strategies/) read the run config through this module. The federation's policies live
here too: the attacker's torch threads (the cores the clients leave idle) and which clients to attack.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields

from fl_attack.attacker.attacks import AttackConfig
from fl_attack.attacker.precision import PRECISIONS
from fl_attack.federation.config import TrainingProtocol, check_field_types, parse_key_values, typed_value
from fl_attack.federation.data import PARTITIONERS, get_spec
from fl_attack.federation.defenses import weight_matrices
from fl_attack.privacy.accountant import ACCOUNTANTS, gaussian_noise_multiplier


def _parse_overrides(text: str) -> dict:
    """ "tv_weight=0.02,lr_control_point=1e-5" -> AttackConfig overrides (typed like the defaults)."""
    out = parse_key_values(text, asdict(AttackConfig()), "attack-options", "attack setting")
    AttackConfig.from_overrides(**out)  # validates the combination
    return out


SEED_MAX = 2**32 - 1  # numpy's and torch's seeds take 32-bit values


# The audit's keys: what the honest-but-curious server attacks and how, and where it records it.
# The other keys describe the simulated federation (data, model, client training, defenses); an
# audited Flower app has its own for those, which the audit does not read (strategies/audit.py).
AUDIT_KEYS = ("num-server-rounds", "record-updates", "server-test-samples", "results-dir", "run-name", "seed")


def audit_run_config(run_config) -> dict:
    """The audit's keys of a Flower run config (every "attack-..." key and ``AUDIT_KEYS``); the
    app's own keys are left out, so that a name the app uses for something else (its ``lr``, its
    ``fraction-train``) is never read as the simulated federation's."""
    return {k: v for k, v in dict(run_config).items() if k.startswith("attack-") or k in AUDIT_KEYS}


def preflight(run_config, num_nodes: int | None = None) -> RunSettings:
    """A run's settings, parsed and checked once before its first round: every value's type and
    range, the device, and with ``num_nodes`` (the federation's node count) the data's partitions,
    the attack-clients ids and the defense's clients per round. The launcher runs it before the
    SuperLink starts, the ServerApp before round 1; the ClientApp and the strategies take the
    settings it returns and check nothing again. ``preflight.runs`` counts the calls (tests).
    Raises ValueError naming the key."""
    preflight.runs += 1
    settings = RunSettings.from_run_config(run_config)
    settings.check_device()
    if num_nodes is not None:
        settings = settings.with_partitions(num_nodes)  # what the Flower partitioners cut the data by
        settings.check_partitions(num_nodes)
        settings.check_nodes(num_nodes)  # attack-clients ids must be < the federation's node count
        settings.clients_per_round(num_nodes)
    return settings


preflight.runs = 0


def usable_cpus() -> int:
    """The cores this process may use: its CPU affinity (taskset, cpusets), capped by a cgroup v2 CPU
    quota (``docker --cpus``), else os.cpu_count(); at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, _cgroup_cpu_quota() or cpus))


def _cgroup_cpu_quota() -> int | None:
    """ceil(quota / period) of the cgroup's CPU limit (v2 cpu.max, else v1 cfs), None without one."""

    def read(path):
        try:
            with open(path) as f:
                return f.read().split()
        except OSError:
            return []

    fields = read("/sys/fs/cgroup/cpu.max") or (
        read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")[:1] + read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")[:1]
    )
    try:
        quota, period = fields[0], int(fields[1])
        return None if quota in ("max", "-1") else max(1, math.ceil(int(quota) / period))
    except (ValueError, IndexError):
        return None


# --- The run's defense: "defense", "defense-*" and "secagg-*". The DP and secure aggregation
# defenses themselves are Flower's (LocalDpMod, the DP strategy wrappers, SecAgg+), wired in by
# clients/defenses.py, strategies/server_app.py and strategies/secagg.py; the compression transforms
# are the library's (fl_attack/federation/defenses.py).
DEFENSES = ("none", "local-dp", "central-dp", "secagg", "topk", "low-rank", "quantize")
CLIPPING_SIDES = ("server", "client")
# The run-config keys a DefenseSettings owns: "defense" itself, "defense-*" and "secagg-*".
_PREFIXES = ("defense-", "secagg-")


def _key_to_field(key: str) -> str:
    if key == "defense":
        return "defense"
    if key.startswith("defense-"):
        key = key[len("defense-") :]
    return key.replace("-", "_")


def _field_to_key(name: str) -> str:
    if name == "defense" or name.startswith("secagg_"):
        return name.replace("_", "-")
    return "defense-" + name.replace("_", "-")


@dataclass(frozen=True)
class DefenseSettings:
    """The defense of a run and its parameters (run-config keys in brackets).

    defense ["defense"]: "none", one of DEFENSES, or a combination joined by "+", e.g. "topk+local-dp".
    clip_norm ["defense-clip-norm"]: L2 clipping norm C of each update (local-dp, central-dp).
    epsilon, delta ["defense-epsilon", "defense-delta"]: local-dp's Gaussian mechanism, Flower's
        LocalDpMod with sensitivity C: noise std = C * sqrt(2 ln(1.25/delta)) / epsilon per coordinate.
    noise_multiplier ["defense-noise-multiplier"]: central-dp's z; Flower adds noise of std z*C/n to
        the aggregate of n clients.
    accountant ["defense-accountant"]: the DP accountant of the ε recorded for local-dp and central-dp
        (fl_attack.privacy.accountant): "rdp" (dp_accounting's RdpAccountant) or "pld" (PLDAccountant, tighter).
    target_delta ["defense-target-delta"]: the δ at which the spent ε is given.
    clipping ["defense-clipping"]: central-dp's clipping side, "server" (DifferentialPrivacyServer-
        SideFixedClipping) or "client" (DifferentialPrivacyClientSideFixedClipping + fixedclipping_mod).
    topk_fraction ["defense-topk-fraction"]: fraction in (0, 1] of update coordinates sent (topk).
    rank ["defense-rank"]: rank r of each weight matrix's update (low-rank).
    bits ["defense-bits"]: bits b of the stochastic quantisation (quantize).
    adaptive_attack ["defense-adaptive-attack"]: under topk, the attacker matches only the observed
        (non-zero) coordinates; false keeps the naive attacker, for comparison.
    secagg_num_shares, secagg_reconstruction_threshold, secagg_max_weight ["secagg-*"]: SecAgg+
        (Flower's SecAggPlusWorkflow); max weight 0 means samples-per-client, the finest quantisation
        that cannot overflow.
    """

    defense: str = "none"
    clip_norm: float = 0.05
    epsilon: float = 10.0
    delta: float = 1e-5
    noise_multiplier: float = 1.0
    clipping: str = "server"
    accountant: str = "rdp"
    target_delta: float = 1e-5
    topk_fraction: float = 0.1
    rank: int = 2
    bits: int = 4
    adaptive_attack: bool = True
    secagg_num_shares: int = 3
    secagg_reconstruction_threshold: int = 2
    secagg_max_weight: float = 0.0

    # Parsing ------------------------------------------------------------------------------
    @staticmethod
    def owns(key: str) -> bool:
        """True for the run-config keys this class parses."""
        return key == "defense" or key.startswith(_PREFIXES)

    @classmethod
    def from_run_config(cls, run_config) -> DefenseSettings:
        """The defense keys of Flower's run config (other keys are ignored), typed and checked.

        Raises ValueError naming the key for an unknown defense key or a bad value.
        """
        known = {f.name: f for f in fields(cls)}
        values = {}
        for key, value in dict(run_config).items():
            if not cls.owns(key):
                continue
            name = _key_to_field(key)
            if name not in known or _field_to_key(name) != key:
                raise ValueError(
                    f"invalid run config: unknown defense key '{key}'; known: "
                    f"{', '.join(_field_to_key(n) for n in known)}"
                )
            values[name] = typed_value(f"run config '{key}'", value, getattr(cls, name))
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Check every value that needs no model or federation; ValueError with the key otherwise."""
        check_field_types(self, _field_to_key)
        names = self.names
        unknown = [n for n in names if n not in DEFENSES]
        if unknown or not names:
            raise ValueError(
                f"invalid run config: unknown defense '{unknown[0] if unknown else self.defense}' "
                f"in defense='{self.defense}'; choose from {', '.join(DEFENSES)} or a '+' combination"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"invalid run config: defense='{self.defense}' names a defense twice")
        if "none" in names and len(names) > 1:
            raise ValueError("invalid run config: defense 'none' cannot be combined with another defense")
        if self.secagg and self.central_dp:
            raise ValueError(
                "invalid run config: central-dp cannot be combined with secagg: Flower's DP strategy "
                "wrappers run on the Message API strategy, SecAgg+ on the legacy workflow; "
                "use local-dp+secagg for DP under secure aggregation"
            )
        checks = [
            (self.clip_norm > 0, f"defense-clip-norm must be > 0, got {self.clip_norm}"),
            (self.epsilon > 0, f"defense-epsilon must be > 0 (smaller is more noise), got {self.epsilon}"),
            (0 < self.delta < 1, f"defense-delta must be in (0, 1), got {self.delta}"),
            (
                self.noise_multiplier >= 0,
                f"defense-noise-multiplier must be >= 0 (a noise scale cannot be "
                f"negative), got {self.noise_multiplier}",
            ),
            (
                self.accountant in ACCOUNTANTS,
                f"defense-accountant must be one of {', '.join(ACCOUNTANTS)}, got '{self.accountant}'",
            ),
            (0 < self.target_delta < 1, f"defense-target-delta must be in (0, 1), got {self.target_delta}"),
            (self.clipping in CLIPPING_SIDES, f"defense-clipping must be 'server' or 'client', got '{self.clipping}'"),
            (0 < self.topk_fraction <= 1, f"defense-topk-fraction must be in (0, 1], got {self.topk_fraction}"),
            (self.rank >= 1, f"defense-rank must be >= 1, got {self.rank}"),
            (1 <= self.bits <= 16, f"defense-bits must be in 1..16, got {self.bits}"),
            (self.secagg_num_shares >= 3, f"secagg-num-shares must be >= 3, got {self.secagg_num_shares}"),
            (
                2 <= self.secagg_reconstruction_threshold < self.secagg_num_shares,
                f"secagg-reconstruction-threshold must be in 2..secagg-num-shares-1 "
                f"({self.secagg_num_shares - 1}), got {self.secagg_reconstruction_threshold}",
            ),
            (
                self.secagg_max_weight >= 0,
                f"secagg-max-weight must be >= 0 (0 = samples-per-client), got {self.secagg_max_weight}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid run config: {message}")

    def check_model(self, state) -> None:
        """With low-rank: every weight matrix must allow rank r. ``state``: the model's state dict."""
        if not self.low_rank:
            return
        for name, (rows, cols) in weight_matrices(state):
            if self.rank > min(rows, cols):
                raise ValueError(
                    f"invalid run config: defense-rank={self.rank} is larger than the model's "
                    f"'{name}' update allows: a {rows}x{cols} matrix has rank at most "
                    f"{min(rows, cols)}"
                )

    def check_clients(self, num_clients: int) -> None:
        """With secagg: the clients sampled per round must reach SecAgg+'s minimum."""
        if self.secagg and num_clients < self.secagg_min_clients:
            raise ValueError(
                f"invalid federation: secagg needs at least {self.secagg_min_clients} clients per "
                f"round (SecAgg+ needs 2, and secagg-reconstruction-threshold="
                f"{self.secagg_reconstruction_threshold} shares), but only {num_clients} take part; "
                "raise num-supernodes or fraction-train, or lower the threshold"
            )

    # Views --------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [n.strip().lower() for n in self.defense.split("+") if n.strip()]

    @property
    def local_dp(self) -> bool:
        return "local-dp" in self.names

    @property
    def central_dp(self) -> bool:
        return "central-dp" in self.names

    @property
    def secagg(self) -> bool:
        return "secagg" in self.names

    @property
    def topk(self) -> bool:
        return "topk" in self.names

    @property
    def low_rank(self) -> bool:
        return "low-rank" in self.names

    @property
    def quantize(self) -> bool:
        return "quantize" in self.names

    @property
    def transforms_update(self) -> bool:
        """True when the client transforms its update itself (topk, low-rank or quantize)."""
        return self.topk or self.low_rank or self.quantize

    @property
    def observed_only(self) -> bool:
        """The attack matches only the observed (non-zero) coordinates: topk with the adaptive attacker."""
        return self.topk and self.adaptive_attack

    @property
    def secagg_min_clients(self) -> int:
        return max(2, self.secagg_reconstruction_threshold)

    @property
    def local_dp_std(self) -> float:
        """LocalDpMod's per-coordinate noise std, sensitivity C * sqrt(2 ln(1.25/delta)) / epsilon."""
        return self.clip_norm * gaussian_noise_multiplier(self.epsilon, self.delta)

    def _part(self, name: str) -> str:
        if name == "local-dp":
            return f"local-dp(C={self.clip_norm:g},eps={self.epsilon:g})"
        if name == "central-dp":
            return f"central-dp({self.clipping},z={self.noise_multiplier:g},C={self.clip_norm:g})"
        if name == "secagg":
            return f"secagg(shares={self.secagg_num_shares},t={self.secagg_reconstruction_threshold})"
        if name == "topk":
            return f"topk({self.topk_fraction:g}{'' if self.adaptive_attack else ',naive'})"
        if name == "low-rank":
            return f"low-rank({self.rank})"
        if name == "quantize":
            return f"quantize({self.bits})"
        return name

    @property
    def label(self) -> str:
        """Short text for the attacks.csv ``defense`` column, e.g. "topk(0.1)+local-dp(C=0.05,eps=10)"."""
        return "+".join(self._part(n) for n in self.names)

    def parameters(self) -> dict:
        """The run-config keys and values that configure the active defenses."""
        used = {
            "local-dp": ("clip_norm", "epsilon", "delta", "accountant", "target_delta"),
            "central-dp": ("clip_norm", "noise_multiplier", "clipping", "accountant", "target_delta"),
            "secagg": ("secagg_num_shares", "secagg_reconstruction_threshold", "secagg_max_weight"),
            "topk": ("topk_fraction", "adaptive_attack"),
            "low-rank": ("rank",),
            "quantize": ("bits",),
        }
        out = {}
        for name in self.names:
            for f in used.get(name, ()):
                out[_field_to_key(f)] = getattr(self, f)
        if self.local_dp:
            out["local-dp-noise-std"] = self.local_dp_std
        return out

    def observed(self) -> str:
        """What the attacker observes of a client under this defense, for config.json."""
        if self.names == ["none"]:
            return "each attacked client's full update (w0, wT) and its public training metadata"
        notes = []
        if self.secagg:
            notes.append(
                "SecAgg+: only the aggregate (the num-examples weighted mean of all participants' "
                "updates), attacked as one update of k = the participants' total samples and scored "
                "against all their images; num-examples and metrics still arrive in plaintext"
            )
        if self.local_dp:
            notes.append(
                f"local DP: each update clipped to L2 norm {self.clip_norm:g}, then Gaussian noise of "
                f"std {self.local_dp_std:.3g} on every coordinate (Flower's LocalDpMod)"
            )
        if self.central_dp:
            notes.append(
                f"central DP ({self.clipping}-side clipping): each client's update clipped to L2 norm "
                f"{self.clip_norm:g} and free of noise; Flower adds the noise (std z*C/n, z="
                f"{self.noise_multiplier:g}) to the aggregate only"
            )
        if self.low_rank:
            notes.append(
                f"low-rank: each weight matrix's update is a rank-{self.rank} SVD approximation (biases unchanged)"
            )
        if self.quantize:
            notes.append(f"quantize: each tensor's update stochastically quantised to {self.bits} bits")
        if self.topk:
            notes.append(
                f"top-k: only the {self.topk_fraction:g} fraction of update coordinates largest in "
                "magnitude; the rest equal w0. The attacker "
                + (
                    "matches only these observed coordinates (adaptive)"
                    if self.adaptive_attack
                    else "matches all coordinates, zeros included (naive)"
                )
            )
        return "; ".join(notes)

    def describe(self) -> dict:
        """The defense block of config.json."""
        return {
            "defense": "+".join(self.names),
            "label": self.label,
            "parameters": self.parameters(),
            "observed": self.observed(),
        }

    def update_transforms(self) -> dict:
        """The keyword arguments of ``fl_attack.federation.defenses.transform_update`` for this defense."""
        return {
            "rank": self.rank if self.low_rank else None,
            "bits": self.bits if self.quantize else None,
            "topk_fraction": self.topk_fraction if self.topk else None,
        }


# Run-config keys a resumed run may change: where and how fast attacks run, and how many rounds.
RESUMABLE_KEYS = {
    "resume",
    "num-server-rounds",
    "run-name",
    "results-dir",
    "attack-timeout",
    "attack-threads",
    "attack-actors",
    "attack-num-gpus",
    "attack-device",
    "attack-ray-address",
    "attack-compile",  # the same attacks up to rounding, compiled or not, batched or not
    "attack-batch",
    "client-num-cpus",
}
# Run-config keys added after runs were recorded, with the value such a run ran with: a run
# recorded without one resumes as if it had been set so.
ADDED_KEYS = {"attack-precision": "fp32"}


@dataclass(frozen=True)
class RunSettings:
    """Typed view of the run config. Field names are the keys with '-' replaced by '_'; the
    defaults are pyproject.toml's ``[tool.flwr.app.config]`` (tests/test_config.py keeps them equal).

    It composes the library's vocabulary: ``protocol`` is the clients' TrainingProtocol
    (fl_attack.federation.config), ``attack_config()`` the AttackConfig of every attack. The defense keys
    ("defense", "defense-*", "secagg-*") are parsed into ``defense``, a DefenseSettings
    (below). Ready-made run configs: strategies/run_configs/*.toml (``strategies.run_configs.load``).
    """

    dataset: str = "femnist"
    data_dir: str = ""
    num_server_rounds: int = 3
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    local_epochs: int = 5
    batch_size: int = 8
    lr: float = 0.05
    client_optimizer: str = "sgd"
    client_momentum: float = 0.9
    client_weight_decay: float = 0.0
    client_adam_betas: str = "0.9,0.999"
    client_train_mode: bool = False
    samples_per_client: int = 32
    classes_per_client: int = 0
    partitioner: str = "paper"
    dirichlet_alpha: float = 0.5
    client_threads: int = 1
    client_num_cpus: int = 2
    attack_method: str = "pisme"
    attack_clients: str = "0"
    attack_iterations: int = 200
    attack_nodes: int = 3
    attack_labels: str = "recovered"
    attack_num_gpus: float = 0.0
    attack_actors: int = 1
    attack_ray_address: str = ""
    attack_threads: int = 0
    attack_timeout: float = 600.0
    attack_device: str = "auto"
    attack_precision: str = "fp32"
    attack_compile: str = "auto"
    attack_batch: str = "auto"
    attack_options: str = ""
    attack_rounds: str = "all"
    attack_budget: int = 0
    attack_max_backlog: int = 0
    attack_memory: str = "none"
    attack_memory_rounds: str = "best:2,latest:1"
    record_updates: bool = True
    server_test_samples: int = 1000
    resume: str = ""
    results_dir: str = "results"
    run_name: str = ""
    seed: int = 0
    model: str = ""
    # Not a run-config key: the federation's node count, which the Flower partitioners cut the data
    # by (with_partitions: the ServerApp's grid, the node config's num-partitions, config.json's num_nodes).
    num_partitions: int | None = None
    defense: DefenseSettings = field(default_factory=DefenseSettings)
    extra: dict = field(default_factory=dict)

    # Convenience views -------------------------------------------------------------------
    @property
    def samples(self) -> int:
        return self.samples_per_client

    @property
    def classes(self) -> int | None:
        return self.classes_per_client or None

    @property
    def held_out(self) -> int:
        """Samples the server holds out for its own test set (0 without centralised evaluation)."""
        return self.server_test_samples

    @property
    def data(self):
        """The run's data settings (fl_attack.federation.data.DataSettings): how its clients' private samples
        are drawn (partitioner, dirichlet-alpha and the federation's num_partitions included);
        the evaluator's, never the attacker's."""
        from fl_attack.federation.data import DataSettings

        return DataSettings(
            self.dataset,
            self.samples,
            self.data_dir or None,
            self.classes,
            self.seed,
            self.held_out,
            self.partitioner,
            self.dirichlet_alpha,
            self.num_partitions,
        )

    def with_partitions(self, num_partitions: int | None) -> RunSettings:
        """These settings for a federation of ``num_partitions`` nodes (partition ids 0..N-1): what
        the Flower partitioners (partitioner iid, dirichlet, pathological) cut the data by. The
        ServerApp passes its grid's node count, the ClientApp its node config's num-partitions, a
        replay config.json's num_nodes, so all three cut the same partitions. ValueError for N < 1."""
        import dataclasses

        if num_partitions is not None and (
            isinstance(num_partitions, bool) or not isinstance(num_partitions, int) or num_partitions < 1
        ):
            raise ValueError(f"the federation's number of partitions must be an integer >= 1, got {num_partitions!r}")
        return dataclasses.replace(self, num_partitions=num_partitions)

    def max_client_samples(self) -> int:
        """The most samples one client trains on: samples-per-client, or with 0 (a Flower
        partitioner's whole partitions) the largest of the federation's num_partitions partitions.
        ValueError as fl_attack.federation.data.partition_sizes (e.g. num_partitions unknown)."""
        if self.samples_per_client > 0:
            return self.samples_per_client
        from fl_attack.federation.data import partition_sizes

        sizes = partition_sizes(self.data)
        return int(sizes[: self.num_partitions].max(initial=0))

    @property
    def threads(self) -> int:
        return max(1, self.client_threads)

    @property
    def methods(self) -> list[str]:
        """attack-method's names; with attack-memory on, each memoryless method is followed by its
        remembering twin "METHOD+memory" (fl_attack.attacker.memory.memory_methods)."""
        from fl_attack.attacker.memory import memory_methods

        return list(memory_methods(self.attack_method, self.attack_memory))

    def server_test_set(self):
        """The server's held-out test pool (fl_attack.federation.data.ClientData: images in [0,1], labels),
        disjoint from every client's data, or None with server-test-samples = 0. Also the public
        data of label_estimator=aux."""
        if not self.server_test_samples:
            return None
        from fl_attack.federation.data import load_pool, server_test_set

        pool = load_pool(self.dataset, self.data_dir or None)
        return server_test_set(pool, self.server_test_samples, seed=self.seed)

    def attack_memory_state(self):
        """A new fl_attack.attacker.memory.AttackMemory of attack-memory and attack-memory-rounds."""
        from fl_attack.attacker.memory import AttackMemory

        return AttackMemory(self.attack_memory, self.attack_memory_rounds)

    def new_model(self, seed: int | None = None):
        """A fresh victim model of the run config's ``model`` spec ("" = the paper's CNN for the
        dataset; else "package.module:factory", fl_attack.federation.models.resolve_model), in eval mode."""
        from fl_attack.federation.models import resolve_model

        return resolve_model(self.model, self.dataset, seed=seed)

    @property
    def protocol(self) -> TrainingProtocol:
        """The clients' local training as the library's TrainingProtocol: samples-per-client (k),
        batch-size (B), local-epochs (E) and lr. ValueError for values ``validate`` rejects."""
        return TrainingProtocol(
            samples=self.samples_per_client, batch_size=self.batch_size, local_epochs=self.local_epochs, lr=self.lr
        )

    @property
    def optimizer(self):
        """The clients' local optimizer (fl_attack.federation.config.ClientOptimizer): client-optimizer, with
        client-momentum for momentum and nesterov only, client-weight-decay and client-adam-betas
        ("beta1,beta2", adam and adamw only). ValueError "invalid run config: ..." for bad values."""
        from fl_attack.federation.config import CLIENT_OPTIMIZERS, ClientOptimizer

        name = self.client_optimizer
        if name not in CLIENT_OPTIMIZERS:
            raise ValueError(
                f"invalid run config: client-optimizer must be one of {', '.join(CLIENT_OPTIMIZERS)}, got {name!r}"
            )
        try:
            betas = tuple(float(b) for b in self.client_adam_betas.split(","))
        except ValueError:
            raise ValueError(
                f"invalid run config: client-adam-betas must be 'beta1,beta2', got {self.client_adam_betas!r}"
            ) from None
        momentum = self.client_momentum if name in ("momentum", "nesterov") else 0.0
        try:
            return ClientOptimizer(name, momentum, self.client_weight_decay, betas)
        except ValueError as exc:
            raise ValueError(f"invalid run config: client-optimizer {name}: {exc}") from None

    def check_prescribed(self, metadata) -> None:
        """ValueError unless a client's reply metadata (fl_attack.federation.update.TrainingMetadata) is the
        training this run config prescribes: lr, batch-size, local-epochs, samples-per-client (when
        > 0), the client optimizer and train mode. The attack models the update by them, so a client
        that trained otherwise (another app version, a deployment's own config) is not attacked as
        if it had not; the strategy records it as a failed attack naming the difference."""
        m = metadata
        prescribed = [
            ("lr", m.lr, self.lr, math.isclose(m.lr, self.lr, rel_tol=1e-9)),
            ("batch-size", m.batch_size, self.batch_size, m.batch_size == self.batch_size),
            ("local-epochs", m.local_epochs, self.local_epochs, m.local_epochs == self.local_epochs),
            ("client-optimizer", m.optimizer.describe(), self.optimizer.describe(), m.optimizer == self.optimizer),
            ("client-train-mode", m.train_mode, self.client_train_mode, m.train_mode == self.client_train_mode),
        ]
        if self.samples_per_client > 0:
            k = self.samples_per_client
            prescribed.append(("samples-per-client", m.num_samples, k, m.num_samples == k))
        for key, replied, expected, same in prescribed:
            if not same:
                raise ValueError(f"the client's reply says {key} {replied}, the run config prescribes {expected}")

    def _check_training_options(self) -> None:
        """Settings that would be silently ignored: client-momentum given for an optimizer without
        momentum, and attack-options bn_stats_weight on a run that trains in eval mode (the running
        statistics move only in train mode; the attacks would all fail)."""
        default = type(self).__dataclass_fields__["client_momentum"].default
        if self.client_momentum != default and self.client_optimizer not in ("momentum", "nesterov"):
            raise ValueError(
                f"invalid run config: client-momentum {self.client_momentum} applies to client-optimizer "
                f"momentum and nesterov only, not '{self.client_optimizer}' (torch's SGD with momentum is "
                'client-optimizer="momentum")'
            )
        try:
            weight = self.attack_config().bn_stats_weight
        except ValueError:
            return  # a bad attack-options value is reported where the options are checked
        if weight > 0 and not self.client_train_mode:
            raise ValueError(
                "invalid run config: attack-options bn_stats_weight > 0 needs client-train-mode = true "
                "(batch norm's running statistics change only in train mode)"
            )

    def _check_memory(self) -> None:
        """attack-method, attack-memory and attack-memory-rounds (ValueError, one line each)."""
        from fl_attack.attacker.memory import memory_methods, parse_joint_rounds

        try:
            memory_methods(self.attack_method, self.attack_memory)
        except ValueError as exc:
            key = "attack-memory" if "attack-memory must" in str(exc) else "attack-method"
            raise ValueError(f"invalid run config: {key}: {exc}") from None
        if self.attack_memory != "none" and self.attack_labels == "oracle":
            raise ValueError(
                "invalid run config: attack-memory keeps only what the attacker produced; "
                "it cannot be used with attack-labels = 'oracle' (the ground truth)"
            )
        if self.attack_memory != "none" and self.defense.secagg:
            raise ValueError(
                "invalid run config: attack-memory remembers one client across rounds; under secagg the "
                "server sees only aggregates"
            )
        try:
            parse_joint_rounds(self.attack_memory_rounds)
        except ValueError as exc:
            raise ValueError(f"invalid run config: {exc}") from None

    def attack_config(self) -> AttackConfig:
        """The AttackConfig for every attack of this run (attack-options override the defense's
        adaptation). ValueError naming the key when attack-options sets a setting that has a
        run-config key of its own (attack-iterations, attack-nodes, seed, attack-precision)."""
        options = _parse_overrides(self.attack_options)
        own = {
            "iterations": "attack-iterations",
            "nodes": "attack-nodes",
            "seed": "seed",
            "precision": "attack-precision",
            "compile": "attack-compile",
        }
        clash = sorted(options.keys() & own.keys())
        if clash:
            raise ValueError(
                f"invalid run config: attack-options sets {clash[0]}; set the run-config key {own[clash[0]]}"
            )
        overrides = {"observed_only": self.defense.observed_only, **options}
        return AttackConfig.from_overrides(
            iterations=self.attack_iterations,
            nodes=self.attack_nodes,
            seed=self.seed,
            precision=self.attack_precision,
            compile=self.attack_compile,
            **overrides,
        )

    def attack_batch_size(self) -> int:
        """The attacks of one round a worker runs as one ``reconstruct_batch`` (attack-batch: N, or
        "auto": ``fl_attack.attacker.workers.BATCH_ON_CUDA`` when the attacks run on CUDA, else 1)."""
        from fl_attack.attacker.workers import resolve_batch

        return resolve_batch(self.attack_batch, self.attack_device)

    def attack_thread_count(self, clients_per_round: int | None = None, cpus: int | None = None) -> int:
        """Torch threads for an attack that runs while clients train: attack-threads when it is set,
        else (0) the cores the concurrently training clients leave idle, at least 1.

        Ray runs ``cpus // client-num-cpus`` clients at once (its client pool), and never more than
        the clients sampled per round; each reserves client-num-cpus cores.
        """
        if self.attack_threads > 0:
            return self.attack_threads
        cpus = cpus or usable_cpus()
        per_client = max(1, self.client_num_cpus)
        concurrent = cpus // per_client
        if clients_per_round is not None:
            concurrent = min(concurrent, max(0, clients_per_round))
        return max(1, cpus - concurrent * per_client)

    def attack_drain_thread_count(self, cpus: int | None = None) -> int:
        """Torch threads for an attack dispatched after the last round's training, when the clients
        are idle: attack-threads when it is set, else every core."""
        return self.attack_thread_count(clients_per_round=0, cpus=cpus)

    def attacks_round(self, server_round: int) -> bool:
        """Whether round ``server_round`` is attacked: attack-rounds "all", "none", "every:N" (rounds
        N, 2N, ...), "first:N" (rounds 1..N) or comma-separated round numbers "1,5,10"."""
        spec = self.attack_rounds.strip()
        if spec == "all":
            return True
        if spec in ("none", ""):
            return False
        kind, _, number = spec.partition(":")
        if kind == "every":
            return server_round % int(number) == 0
        if kind == "first":
            return server_round <= int(number)
        return server_round in {int(r) for r in spec.split(",")}

    def select_clients(self, partition_ids: list[int], server_round: int) -> list[int]:
        """Which of this round's partitions to attack: "all", "fraction:F" (seeded per round), a
        panel "0,3,5", or a panel and a fraction of the others "0,3+fraction:F"."""
        spec = self.attack_clients.strip()
        if spec == "all":
            return sorted(partition_ids)
        if spec in ("none", ""):
            return []
        panel, fraction = self._client_spec()
        chosen = set(panel) & set(partition_ids)
        if fraction is not None:
            import numpy as np

            count = max(1, round(fraction * len(partition_ids))) if partition_ids else 0
            rng = np.random.default_rng([self.seed, server_round])
            chosen |= {int(p) for p in rng.choice(sorted(partition_ids), size=count, replace=False)}
        return sorted(chosen)

    def _client_spec(self) -> tuple[list[int], float | None]:
        """attack-clients as (the panel's partition ids, the sampled fraction or None); for text other
        than "all" and "none". ValueError naming attack-clients for anything else."""
        clients = self.attack_clients.strip()
        parts = [part.strip() for part in clients.split("+")]
        try:
            if len(parts) > 2 or (len(parts) == 2 and parts[0].startswith("fraction:")):
                raise ValueError  # "fraction:F", "IDS" or "IDS+fraction:F"
            fraction_text = parts.pop().removeprefix("fraction:") if parts[-1].startswith("fraction:") else None
            if len(parts) > 1 or (fraction_text is None and not parts):
                raise ValueError
            ids = [int(p) for p in parts[0].split(",")] if parts else []
            fraction = float(fraction_text) if fraction_text is not None else None
        except ValueError:
            raise ValueError(
                "invalid run config: attack-clients must be 'all', 'none', 'fraction:F', comma-separated "
                f"partition ids or both as 'IDS+fraction:F' (e.g. '0,3+fraction:0.2'), got '{clients}'"
            ) from None
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError("invalid run config: attack-clients 'fraction:F' needs F in (0, 1]")
        negative = [p for p in ids if p < 0]
        if negative:
            raise ValueError(f"invalid run config: attack-clients partition ids must be >= 0, got {negative[0]}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"invalid run config: attack-clients names a partition id twice: '{clients}'")
        return ids, fraction

    def attack_client_ids(self) -> list[int] | None:
        """The tracked panel attack-clients lists ("0,3,5", or the ids of "0,3+fraction:F"), None
        for "all", "none" or "fraction:F". ValueError naming attack-clients for bad text."""
        if self.attack_clients.strip() in ("all", "none", ""):
            return None
        return self._client_spec()[0] or None

    def clients_per_round(self, num_nodes: int) -> int:
        """The clients sampled per round in a federation of ``num_nodes`` (at most that many):
        Flower's count, at least SecAgg+'s minimum under secagg. ValueError when the defense
        cannot run with that many (DefenseSettings.check_clients)."""
        from fl_attack.federation.participants import sample_size

        minimum = self.defense.secagg_min_clients if self.defense.secagg else 1
        sampled = sample_size(num_nodes, self.fraction_train, minimum)
        self.defense.check_clients(sampled)
        return sampled

    def check_nodes(self, num_nodes: int) -> None:
        """Check the settings against the federation: its ``num_nodes`` partitions are 0..num_nodes-1.
        ValueError naming attack-clients for a listed id >= num_nodes (it would never be attacked)."""
        ids = self.attack_client_ids() or []
        outside = sorted(p for p in ids if p >= num_nodes)
        if outside:
            raise ValueError(
                f"invalid run config: attack-clients lists partition id {outside[0]}, but the "
                f"federation has {num_nodes} node(s) (partition ids 0..{num_nodes - 1})"
            )

    def check_partitions(self, num_nodes: int) -> None:
        """ValueError before round 1 when the data cannot give each of ``num_nodes`` nodes its own
        partition of samples-per-client samples beside the server's held-out test set, or when
        data-dir does not exist (or does not hold ``dataset``'s images).

        With a Flower partitioner (partitioner natural, iid, dirichlet, pathological) the data is
        cut into ``num_nodes`` partitions (natural: one per writer, of which ``num_nodes`` are used)
        and every node's partition is checked: "invalid run config: samples-per-client: partition P
        has only N samples, asked for k", and with samples-per-client = 0 (the whole partition) its
        size against batch-size; a partitioning the library refuses names the partitioner."""
        from fl_attack.federation.data import load_pool, num_partitions, partition_sizes

        try:
            pool = load_pool(self.dataset, self.data_dir or None)
        except FileNotFoundError as exc:
            raise ValueError(f"invalid run config: data-dir: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"invalid run config: data-dir: {exc}") from None
        if self.partitioner != "paper":
            try:
                sizes = partition_sizes(self.with_partitions(num_nodes).data, pool)
            except ValueError as exc:
                raise ValueError(f"invalid run config: partitioner: {exc}") from None
            if num_nodes > len(sizes):
                raise ValueError(
                    f"invalid run config: {num_nodes} clients asked for, but the natural partitioner finds only "
                    f"{len(sizes)} writers with training samples in the {self.dataset} data; lower num-supernodes"
                )
            k, where = self.samples_per_client, f"{self.partitioner} partitioner, {num_nodes} partitions"
            for p, n in enumerate(sizes[:num_nodes].tolist()):
                if k > n:
                    raise ValueError(
                        f"invalid run config: samples-per-client: partition {p} has only {n} samples, asked for "
                        f"{k} ({where}); lower samples-per-client (0 = each client's whole partition) or num-supernodes"
                    )
                if k == 0 and n < self.batch_size:
                    raise ValueError(
                        f"invalid run config: batch-size: partition {p} has only {n} samples (samples-per-client=0: "
                        f"the whole partition; {where}), fewer than batch-size={self.batch_size}"
                    )
            return
        available = num_partitions(pool, self.samples, self.classes, held_out=self.held_out)
        if num_nodes > available:
            raise ValueError(
                f"{num_nodes} clients asked for, but the {self.dataset} data has only {available} "
                f"partitions of {self.samples} samples; lower num-supernodes or samples-per-client"
            )

    # Parsing --------------------------------------------------------------------------------
    @classmethod
    def from_run_config(cls, run_config) -> RunSettings:
        """Parse Flower's run config; the defense keys go to DefenseSettings, unknown keys to ``extra``.

        Raises ValueError with the offending key for every invalid value.
        """
        known = {f.name: f for f in fields(cls) if f.name not in ("extra", "defense", "num_partitions")}
        values, extra = {}, {}
        for key, value in dict(run_config).items():
            if DefenseSettings.owns(key):
                continue
            name = key.replace("-", "_")
            if name in known:
                values[name] = typed_value(f"run config '{key}'", value, getattr(cls, name))
            else:
                extra[key] = value
        settings = cls(**values, defense=DefenseSettings.from_run_config(run_config), extra=extra)
        settings.validate()
        return settings

    def check_device(self) -> None:
        """ValueError when attack-device='cuda', or attack-precision='tf32' (CUDA only), and torch
        sees no CUDA device on this machine (kept apart from ``validate``: a run recorded on a GPU
        machine is still read back elsewhere)."""
        import torch

        if self.attack_device == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "invalid run config: attack-device='cuda' but torch sees no CUDA device here; "
                "use attack-device='auto' or 'cpu'"
            )
        if self.attack_precision == "tf32" and not torch.cuda.is_available():
            raise ValueError(
                "invalid run config: attack-precision='tf32' needs a CUDA device and torch sees none here; "
                "use attack-precision='fp32', 'bf16' or 'auto'"
            )

    def validate(self) -> None:
        """Check every value against its range before round 1 (ValueError "invalid run config: <key>
        ..." naming the key). What needs the federation is checked by ``check_nodes``."""
        check_field_types(self, lambda name: name.replace("_", "-"))
        self.optimizer  # noqa: B018 -- raises for a bad client-optimizer, momentum, weight decay or betas
        try:
            spec = get_spec(self.dataset)
        except ValueError as exc:
            raise ValueError(f"invalid run config: dataset: {exc}") from None
        checks = [
            (0 <= self.seed <= SEED_MAX, f"seed must be an integer in [0, 2**32-1], got {self.seed}"),
            (self.num_server_rounds >= 1, "num-server-rounds must be >= 1"),
            (0 < self.fraction_train <= 1, "fraction-train must be in (0, 1]"),
            (0 <= self.fraction_evaluate <= 1, "fraction-evaluate must be in [0, 1]"),
            (self.local_epochs >= 1, "local-epochs must be >= 1"),
            (
                self.partitioner in PARTITIONERS,
                f"partitioner must be one of {', '.join(PARTITIONERS)}, got '{self.partitioner}'",
            ),
            (
                self.samples_per_client >= 1 or (self.samples_per_client == 0 and self.partitioner != "paper"),
                "samples-per-client must be >= 1 (0 = each client's whole partition, with a Flower partitioner: "
                "partitioner natural, iid, dirichlet or pathological)",
            ),
            (
                1 <= self.batch_size <= (self.samples_per_client or self.batch_size),
                f"batch-size must be in 1..samples-per-client ({self.samples_per_client}), got {self.batch_size}",
            ),
            (self.lr > 0, "lr must be > 0"),
            (
                0 <= self.classes_per_client <= spec.num_classes,
                f"classes-per-client must be in 0..{spec.num_classes} (0 = unrestricted)",
            ),
            (
                self.classes_per_client == 0 or self.dataset == "cifar100" or self.partitioner != "paper",
                "classes-per-client only applies to cifar100 (FEMNIST clients are writers)",
            ),
            (
                self.classes_per_client == 0 or self.partitioner in ("paper", "pathological"),
                f"classes-per-client applies to partitioner 'paper' (cifar100) and 'pathological' only, "
                f"not '{self.partitioner}' (set it to 0)",
            ),
            (
                self.partitioner != "pathological" or self.classes_per_client >= 1,
                "partitioner 'pathological' needs classes-per-client >= 1 (the classes of each partition)",
            ),
            (
                self.partitioner != "natural" or self.dataset == "femnist",
                f"partitioner 'natural' partitions by writer id: femnist only, not {self.dataset} "
                "(use iid, dirichlet or pathological)",
            ),
            (
                self.dirichlet_alpha > 0,
                f"dirichlet-alpha must be > 0 (the Dirichlet concentration; smaller = more skewed), "
                f"got {self.dirichlet_alpha}",
            ),
            (self.attack_iterations >= 1, "attack-iterations must be >= 1"),
            (self.attack_nodes >= 1, f"attack-nodes (m) must be >= 1, got {self.attack_nodes}"),
            (self.attack_labels in ("recovered", "oracle"), "attack-labels must be 'recovered' or 'oracle'"),
            (self.attack_num_gpus >= 0, "attack-num-gpus must be >= 0"),
            (self.attack_actors >= 1, "attack-actors must be >= 1"),
            (self.attack_threads >= 0, "attack-threads must be >= 0 (0 = the cores the clients leave idle)"),
            (self.client_num_cpus >= 1, "client-num-cpus must be >= 1 (the federation's client-resources-num-cpus)"),
            (self.client_threads >= 0, f"client-threads must be >= 0 (0 = 1 thread), got {self.client_threads}"),
            (self.attack_timeout > 0, f"attack-timeout must be a finite number > 0 seconds, got {self.attack_timeout}"),
            (self.attack_device in ("auto", "cpu", "cuda"), "attack-device must be auto, cpu or cuda"),
            (
                self.attack_precision in PRECISIONS,
                f"attack-precision must be one of {', '.join(PRECISIONS)}, got {self.attack_precision!r}",
            ),
            (
                self.attack_compile in ("off", "on", "auto"),
                f"attack-compile must be one of off, on, auto, got {self.attack_compile!r}",
            ),
            (
                self.attack_batch.strip() == "auto"
                or (self.attack_batch.strip().isdigit() and int(self.attack_batch) >= 1),
                f"attack-batch must be an integer >= 1 or 'auto', got {self.attack_batch!r}",
            ),
            (
                not (self.attack_precision == "tf32" and self.attack_device == "cpu"),
                "attack-precision 'tf32' needs attack-device 'cuda' or 'auto' (TF32 is a CUDA tensor-core mode)",
            ),
            (self.results_dir.strip() != "", "results-dir must not be empty"),
            (
                self.run_name == ""
                or (os.sep not in self.run_name and "/" not in self.run_name and self.run_name not in (".", "..")),
                f"run-name must be a plain folder name (no '/', not '.' or '..'), got '{self.run_name}'",
            ),
            (self.attack_budget >= 0, "attack-budget must be >= 0 attacks per round (0 = no limit)"),
            (self.attack_max_backlog >= 0, "attack-max-backlog must be >= 0 attacks in flight (0 = no limit)"),
            (self.server_test_samples >= 0, "server-test-samples must be >= 0 (0 = no centralised evaluation)"),
            (
                not (self.resume and self.defense.secagg),
                "resume is not supported with defense secagg "
                "(Flower's legacy SecAgg+ workflow always starts at round 1)",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid run config: {message}")
        self._check_memory()
        self._check_training_options()
        rounds = self.attack_rounds.strip()
        try:
            kind, _, number = rounds.partition(":")
            if kind in ("every", "first"):
                if int(number) < 1:
                    raise ValueError
            elif rounds not in ("all", "none", ""):
                picked = [int(r) for r in rounds.split(",")]
                if min(picked) < 1 or len(set(picked)) != len(picked):
                    raise ValueError
        except ValueError:
            raise ValueError(
                "invalid run config: attack-rounds must be 'all', 'none', 'every:N', 'first:N' (N >= 1) "
                f"or distinct round numbers >= 1 such as '1,5,10', got '{rounds}'"
            ) from None
        self.attack_client_ids()  # checks attack-clients
        if self.attack_config().label_estimator == "aux" and not self.server_test_samples:  # checks attack-options
            raise ValueError(
                "invalid run config: label_estimator=aux estimates labels from the server's held-out "
                "test pool: set server-test-samples > 0"
            )
        self.defense.validate()
        if self.model.strip() or self.defense.low_rank:  # a user model: resolved once here, before round 1
            from fl_attack.federation.models import output_bias_key

            try:
                state = self.new_model(seed=0).state_dict()
                if self.attack_labels == "recovered":
                    output_bias_key(state, spec.num_classes)
            except ValueError as exc:
                raise ValueError(f"invalid run config: model: {exc}") from None
            except KeyError as exc:
                raise ValueError(f"invalid run config: model: {exc.args[0]}") from None
            if self.defense.low_rank:
                self.defense.check_model(state)
