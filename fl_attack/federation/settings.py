"""The federation's settings: what a client needs of the run config, parsed and checked in one place.

``FederationSettings`` holds the keys of the simulated federation: its data and partitions (dataset,
data-dir, samples-per-client, classes-per-client, partitioner, dirichlet-alpha, the server's held-out
server-test-samples, seed), its model, the clients' local training (local-epochs, batch-size, lr,
client-*) and ``defense``, the ``DefenseSettings`` of the defenses the clients apply ("defense",
"defense-*", "secagg-*"). ``from_run_config`` types each key, ``validate`` checks each once and
raises ValueError "invalid run config: <key> ...". The ClientApp and its mods (clients/) read the run
config through this module alone, so a client loads no attack code; the server's
``fl_attack.run_config.RunSettings`` extends it with the audit's keys.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields

from fl_attack.federation.config import TrainingProtocol, check_field_types, typed_value
from fl_attack.federation.data import PARTITIONERS, get_spec
from fl_attack.federation.defenses import weight_matrices
from fl_attack.privacy.accountant import ACCOUNTANTS, gaussian_noise_multiplier

SEED_MAX = 2**32 - 1  # numpy's and torch's seeds take 32-bit values

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


@dataclass(frozen=True)
class FederationSettings:
    """Typed view of the federation's run-config keys. Field names are the keys with '-' replaced by
    '_'; the defaults are pyproject.toml's ``[tool.flwr.app.config]`` (tests/test_config.py keeps
    them equal). The defense keys are parsed into ``defense``, a DefenseSettings (above).
    """

    dataset: str = "femnist"
    data_dir: str = ""
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
    server_test_samples: int = 1000
    seed: int = 0
    model: str = ""
    # Not a run-config key: the federation's node count, which the Flower partitioners cut the data
    # by (with_partitions: the ServerApp's grid, the node config's num-partitions, config.json's num_nodes).
    num_partitions: int | None = None
    defense: DefenseSettings = field(default_factory=DefenseSettings)

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

    def with_partitions(self, num_partitions: int | None) -> FederationSettings:
        """These settings for a federation of ``num_partitions`` nodes (partition ids 0..N-1): what
        the Flower partitioners (partitioner iid, dirichlet, pathological) cut the data by. The
        ServerApp passes its grid's node count, the ClientApp its node config's num-partitions, a
        replay config.json's num_nodes, so all three cut the same partitions. ValueError for N < 1."""
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

    def server_test_set(self):
        """The server's held-out test pool (fl_attack.federation.data.ClientData: images in [0,1], labels),
        disjoint from every client's data, or None with server-test-samples = 0. Also the public
        data of label_estimator=aux."""
        if not self.server_test_samples:
            return None
        from fl_attack.federation.data import load_pool, server_test_set

        pool = load_pool(self.dataset, self.data_dir or None)
        return server_test_set(pool, self.server_test_samples, seed=self.seed)

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
    def from_run_config(cls, run_config):
        """Parse Flower's run config into ``cls``: each key that names a field is typed like its
        default, the defense keys go to DefenseSettings; other keys go to ``extra`` when ``cls`` has
        one (RunSettings), else are left to their owner. Raises ValueError naming the key for every
        invalid value (``validate``)."""
        known = {f.name for f in fields(cls) if f.name not in ("extra", "defense", "num_partitions")}
        values, extra = {}, {}
        for key, value in dict(run_config).items():
            if DefenseSettings.owns(key):
                continue
            name = key.replace("-", "_")
            if name in known:
                values[name] = typed_value(f"run config '{key}'", value, getattr(cls, name))
            else:
                extra[key] = value
        if "extra" in {f.name for f in fields(cls)}:
            values["extra"] = extra
        settings = cls(**values, defense=DefenseSettings.from_run_config(run_config))
        settings.validate()
        return settings

    def federation_settings(self) -> FederationSettings:
        """These settings as a plain FederationSettings (what a client reads of a RunSettings)."""
        return FederationSettings(**{f.name: getattr(self, f.name) for f in fields(FederationSettings)})

    def validate(self) -> None:
        """Check every federation value against its range (ValueError "invalid run config: <key>
        ...", naming the key); a user model (or low-rank's ranks) is resolved once here."""
        own = {f.name for f in fields(FederationSettings)}
        check_field_types(self, lambda name: name.replace("_", "-"), own)
        self.optimizer  # noqa: B018 -- raises for a bad client-optimizer, momentum, weight decay or betas
        try:
            spec = get_spec(self.dataset)
        except ValueError as exc:
            raise ValueError(f"invalid run config: dataset: {exc}") from None
        checks = [
            (0 <= self.seed <= SEED_MAX, f"seed must be an integer in [0, 2**32-1], got {self.seed}"),
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
            (self.client_num_cpus >= 1, "client-num-cpus must be >= 1 (the federation's client-resources-num-cpus)"),
            (self.client_threads >= 0, f"client-threads must be >= 0 (0 = 1 thread), got {self.client_threads}"),
            (self.server_test_samples >= 0, "server-test-samples must be >= 0 (0 = no centralised evaluation)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid run config: {message}")
        default = FederationSettings.__dataclass_fields__["client_momentum"].default
        if self.client_momentum != default and self.client_optimizer not in ("momentum", "nesterov"):
            raise ValueError(
                f"invalid run config: client-momentum {self.client_momentum} applies to client-optimizer "
                f"momentum and nesterov only, not '{self.client_optimizer}' (torch's SGD with momentum is "
                'client-optimizer="momentum")'
            )
        self.defense.validate()
        if self.model.strip() or self.defense.low_rank:  # a user model: resolved once here, before round 1
            try:
                state = self.new_model(seed=0).state_dict()
                self._check_model_state(state, spec.num_classes)
            except ValueError as exc:
                raise ValueError(f"invalid run config: model: {exc}") from None
            except KeyError as exc:
                raise ValueError(f"invalid run config: model: {exc.args[0]}") from None
            if self.defense.low_rank:
                self.defense.check_model(state)

    def _check_model_state(self, state: dict, num_classes: int) -> None:
        """What else the run needs of the model's ``state`` (none here; RunSettings: the attack's
        output bias). ValueError or KeyError, reported as "invalid run config: model: ..."."""
