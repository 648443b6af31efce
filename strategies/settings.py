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
from pathlib import Path

from fl_attack.attacks import ATTACKS, AttackConfig
from fl_attack.config import TrainingProtocol, check_field_types, parse_key_values, typed_value
from fl_attack.data import get_spec

from .defense_settings import DefenseSettings


def _parse_overrides(text: str) -> dict:
    """ "tv_weight=0.02,lr_control_point=1e-5" -> AttackConfig overrides (typed like the defaults)."""
    out = parse_key_values(text, asdict(AttackConfig()), "attack-options", "attack setting")
    AttackConfig.from_overrides(**out)  # validates the combination
    return out


SEED_MAX = 2**32 - 1  # numpy's and torch's seeds take 32-bit values
PRESETS_DIR = Path(__file__).resolve().parent / "presets"  # run-config files: paper.toml, learning-*.toml


def preset_run_config(name: str) -> dict:
    """strategies/presets/<name>.toml as a flat run config, read by Flower's own parser (what
    ``--run-config strategies/presets/<name>.toml`` hands the apps, before pyproject's defaults fill
    the other keys). ValueError naming the known presets for an unknown name."""
    from flwr.common.config import parse_config_args

    path = PRESETS_DIR / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.toml")))
        raise ValueError(f"unknown run-config preset '{name}'; choose from: {known}")
    return parse_config_args([str(path)])


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


@dataclass(frozen=True)
class RunSettings:
    """Typed view of the run config. Field names are the keys with '-' replaced by '_'; the
    defaults are pyproject.toml's ``[tool.flwr.app.config]`` (tests/test_config.py keeps them equal).

    It composes the library's vocabulary: ``protocol`` is the clients' TrainingProtocol
    (fl_attack.config), ``attack_config()`` the AttackConfig of every attack. The defense keys
    ("defense", "defense-*", "secagg-*") are parsed into ``defense``, a DefenseSettings
    (strategies/defense_settings.py). Ready-made run configs: strategies/presets/*.toml
    (``preset_run_config``).
    """

    dataset: str = "femnist"
    data_dir: str = ""
    num_server_rounds: int = 3
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    local_epochs: int = 5
    batch_size: int = 8
    lr: float = 0.05
    samples_per_client: int = 32
    classes_per_client: int = 0
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
    attack_options: str = ""
    attack_rounds: str = "all"
    attack_budget: int = 0
    attack_max_backlog: int = 0
    record_updates: bool = True
    server_test_samples: int = 1000
    resume: str = ""
    results_dir: str = "results"
    run_name: str = ""
    seed: int = 0
    model: str = ""
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
    def threads(self) -> int:
        return max(1, self.client_threads)

    @property
    def methods(self) -> list[str]:
        return [m.strip() for m in self.attack_method.split(",") if m.strip()]

    def new_model(self, seed: int | None = None):
        """A fresh victim model of the run config's ``model`` spec ("" = the paper's CNN for the
        dataset; else "package.module:factory", fl_attack.models.resolve_model), in eval mode."""
        from fl_attack.models import resolve_model

        return resolve_model(self.model, self.dataset, seed=seed)

    @property
    def protocol(self) -> TrainingProtocol:
        """The clients' local training as the library's TrainingProtocol: samples-per-client (k),
        batch-size (B), local-epochs (E) and lr. ValueError for values ``validate`` rejects."""
        return TrainingProtocol(
            samples=self.samples_per_client, batch_size=self.batch_size, local_epochs=self.local_epochs, lr=self.lr
        )

    def attack_config(self) -> AttackConfig:
        """The AttackConfig for every attack of this run (attack-options override the defense's adaptation)."""
        overrides = {"observed_only": self.defense.observed_only, **_parse_overrides(self.attack_options)}
        return AttackConfig.from_overrides(
            iterations=self.attack_iterations, nodes=self.attack_nodes, seed=self.seed, **overrides
        )

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
        """Which of this round's partitions to attack: "all", "fraction:F" (seeded per round) or "0,3,5"."""
        spec = self.attack_clients.strip()
        if spec == "all":
            return sorted(partition_ids)
        if spec in ("none", ""):
            return []
        if spec.startswith("fraction:"):
            import numpy as np

            frac = float(spec.split(":", 1)[1])
            count = max(1, round(frac * len(partition_ids))) if partition_ids else 0
            rng = np.random.default_rng([self.seed, server_round])
            return sorted(int(p) for p in rng.choice(sorted(partition_ids), size=count, replace=False))
        wanted = {int(p) for p in spec.split(",")}
        return sorted(p for p in partition_ids if p in wanted)

    def attack_client_ids(self) -> list[int] | None:
        """The partition ids attack-clients lists ("0,3,5"), None for "all", "none" or "fraction:F".
        ValueError naming attack-clients for text that is not comma-separated ids >= 0."""
        clients = self.attack_clients.strip()
        if clients in ("all", "none", "") or clients.startswith("fraction:"):
            return None
        try:
            ids = [int(p) for p in clients.split(",")]
        except ValueError:
            raise ValueError(
                "invalid run config: attack-clients must be 'all', 'none', 'fraction:F' "
                f"or comma-separated partition ids, got '{clients}'"
            ) from None
        negative = [p for p in ids if p < 0]
        if negative:
            raise ValueError(f"invalid run config: attack-clients partition ids must be >= 0, got {negative[0]}")
        return ids

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

    # Parsing --------------------------------------------------------------------------------
    @classmethod
    def from_run_config(cls, run_config) -> RunSettings:
        """Parse Flower's run config; the defense keys go to DefenseSettings, unknown keys to ``extra``.

        Raises ValueError with the offending key for every invalid value.
        """
        known = {f.name: f for f in fields(cls) if f.name not in ("extra", "defense")}
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

    def validate(self) -> None:
        """Check every value against its range before round 1 (ValueError "invalid run config: <key>
        ..." naming the key). What needs the federation is checked by ``check_nodes``."""
        check_field_types(self, lambda name: name.replace("_", "-"))
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
            (self.samples_per_client >= 1, "samples-per-client must be >= 1"),
            (
                1 <= self.batch_size <= self.samples_per_client,
                f"batch-size must be in 1..samples-per-client ({self.samples_per_client}), got {self.batch_size}",
            ),
            (self.lr > 0, "lr must be > 0"),
            (
                0 <= self.classes_per_client <= spec.num_classes,
                f"classes-per-client must be in 0..{spec.num_classes} (0 = unrestricted)",
            ),
            (
                self.classes_per_client == 0 or self.dataset == "cifar100",
                "classes-per-client only applies to cifar100 (FEMNIST clients are writers)",
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
        if self.attack_device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ValueError(
                    "invalid run config: attack-device='cuda' but torch sees no CUDA device here; "
                    "use attack-device='auto' or 'cpu'"
                )
        if not self.methods:
            raise ValueError(
                "invalid run config: attack-method names no attack; give at least one of: " + ", ".join(sorted(ATTACKS))
            )
        twice = sorted({m for m in self.methods if self.methods.count(m) > 1})
        if twice:
            raise ValueError(f"invalid run config: attack-method names '{twice[0]}' twice in '{self.attack_method}'")
        for method in self.methods:
            if method not in ATTACKS:
                raise ValueError(
                    f"invalid run config: unknown attack-method '{method}'; choose from: {', '.join(sorted(ATTACKS))}"
                )
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
        clients = self.attack_clients.strip()
        if clients.startswith("fraction:"):
            try:
                frac = float(clients.split(":", 1)[1])
            except ValueError:
                frac = -1
            if not 0 < frac <= 1:
                raise ValueError("invalid run config: attack-clients 'fraction:F' needs F in (0, 1]")
        elif clients not in ("all", "none", ""):
            ids = self.attack_client_ids()
            if len(set(ids)) != len(ids):
                raise ValueError(f"invalid run config: attack-clients names a partition id twice: '{clients}'")
        self.attack_config()  # checks attack-options
        self.defense.validate()
        if self.model.strip() or self.defense.low_rank:  # a user model: resolved once here, before round 1
            from fl_attack.models import output_bias_key

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
