"""The federation's settings: what a client needs of the run config, parsed and checked in one place.

``FederationSettings`` holds the keys of the simulated federation: its data and partitions (dataset,
data-dir, samples-per-client, classes-per-client, partitioner, dirichlet-alpha, the server's held-out
server-test-samples, seed), its model, the clients drawn per round (fraction-train, fraction-evaluate),
the clients' local training (local-epochs, batch-size, lr, client-*) and ``defense``, the
``DefenseSettings`` of the defenses the clients apply ("defense", "defense-*", "secagg-*";
fl_attack.federation.defense_settings). ``from_run_config`` types each key, ``validate`` checks each
once and raises ValueError "invalid run config: <key> ...". The ClientApp and its mods (clients/)
read the run config through this module alone, so a client loads no attack code; the server's
``fl_attack.audit.settings.RunSettings`` composes it with the audit's keys (``AuditSettings``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields

from fl_attack.federation.config import TrainingProtocol, check_field_types, typed_value
from fl_attack.federation.data import PARTITIONERS, get_spec
from fl_attack.federation.defense_settings import DefenseSettings

SEED_MAX = 2**32 - 1  # numpy's and torch's seeds take 32-bit values
NOT_KEYS = frozenset({"defense", "num_partitions", "extra"})  # settings fields that are not run-config keys


def typed_fields(cls, run_config) -> dict:
    """{field name: value} for each key of ``run_config`` that names a field of the settings dataclass
    ``cls`` ('-' for '_'; the defense's keys and ``NOT_KEYS`` excepted), typed like the field's default
    (fl_attack.federation.config.typed_value). ValueError "run config '<key>' must be ..." for a value
    of the wrong type; ranges are ``validate``'s."""
    names = {f.name for f in fields(cls)} - NOT_KEYS
    values = {}
    for key, value in dict(run_config).items():
        name = key.replace("-", "_")
        if name in names and not DefenseSettings.owns(key):
            values[name] = typed_value(f"run config '{key}'", value, getattr(cls, name))
    return values


@dataclass(frozen=True)
class FederationSettings:
    """Typed view of the federation's run-config keys. Field names are the keys with '-' replaced by
    '_'; the defaults are pyproject.toml's ``[tool.flwr.app.config]`` (tests/test_config.py keeps
    them equal). The defense keys are parsed into ``defense``, a DefenseSettings.
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
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
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

    def clients_per_round(self, num_nodes: int) -> int:
        """The clients sampled per round in a federation of ``num_nodes`` (at most that many):
        Flower's count of fraction-train, at least SecAgg+'s minimum under secagg. ValueError when the
        defense cannot run with that many (DefenseSettings.check_clients)."""
        from fl_attack.federation.participants import sample_size

        sampled = sample_size(num_nodes, self.fraction_train, self.defense.min_clients)
        self.defense.check_clients(sampled)
        return sampled

    # Parsing --------------------------------------------------------------------------------
    @classmethod
    def from_run_config(cls, run_config) -> FederationSettings:
        """Parse Flower's run config into FederationSettings: each key that names one of its fields is
        typed like its default (``typed_fields``), the defense keys go to DefenseSettings; other keys
        (the audit's) are left to their owner. Raises ValueError naming the key for every invalid
        value (``validate``)."""
        defense = DefenseSettings.from_run_config(run_config)
        settings = cls(**typed_fields(FederationSettings, run_config), defense=defense)
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
                self.classes_per_client == 0 or not spec.writers or self.partitioner != "paper",
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
                self.partitioner != "natural" or spec.writers,
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
            (0 < self.fraction_train <= 1, "fraction-train must be in (0, 1]"),
            (0 <= self.fraction_evaluate <= 1, "fraction-evaluate must be in [0, 1]"),
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
        if self.model.strip() or self.defense.needs_model:  # a user model: resolved once here, before round 1
            self.check_model()

    def check_model(self, *checks) -> None:
        """Resolve the run's model spec (``new_model``) and check its state dict: the defense's checks
        (DefenseSettings.check_model: low-rank's ranks) and each of ``checks``, called as check(state, the
        dataset's number of classes) (RunSettings: the audit's AuditSettings.check_output_bias).
        ValueError "invalid run config: model: ..." for a spec that does not resolve or a check that
        raises ValueError or KeyError."""
        num_classes = get_spec(self.dataset).num_classes
        try:
            state = self.new_model(seed=0).state_dict()
            for check in checks:
                check(state, num_classes)
        except ValueError as exc:
            raise ValueError(f"invalid run config: model: {exc}") from None
        except KeyError as exc:
            raise ValueError(f"invalid run config: model: {exc.args[0]}") from None
        self.defense.check_model(state)
