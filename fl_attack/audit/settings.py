"""The audit's settings: what the honest-but-curious server attacks, how, and where it records it.
(Over 600 lines: every audit key is parsed and checked here, once, by its one checker.)

``AuditSettings`` holds the audit's run-config keys, each parsed and checked here once: which rounds
and clients are attacked (num-server-rounds, attack-rounds, attack-clients, attack-budget,
attack-max-backlog), with what (attack-method, -iterations, -nodes, -lr-schedule, -labels, -options,
-precision, -compile, -memory, -memory-rounds), on what (attack-actors, -threads, -batch, -device, -num-gpus,
-ray-address, -timeout) and the record (record-updates, resume, results-dir, run-name).
``from_run_config`` types them, ``validate`` raises ValueError "invalid run config: <key> ..."; the
values the attacker owns (attack-iterations, -nodes, -labels, -device, -precision, -compile, -batch,
and the memory's rule on oracle labels) are checked by its one checker of each (``OWNER_CHECKS``), the
message prefixed with the key. attack-options is parsed once into the run's AttackConfig, kept on the
settings (``attack_config``).

``RunSettings`` is what the server reads: the federation's keys (``FederationSettings``) and the
audit's, flat (one field per key), and what needs both: the attacks' AttackConfig (the federation's
seed and defense), the attack threads (the cores the clients leave idle) and the checks across the two
(``check_together``). ``fl_attack.run_config.preflight`` adds the checks that need the federation's
nodes or this machine, and is where a run fails before it starts.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path

from fl_attack.attacker.api import check_device, resolve_device
from fl_attack.attacker.attacks import (
    ATTACKS,
    LR_SCHEDULES,
    AttackConfig,
    check_compile,
    check_iterations,
    check_own_settings,
)
from fl_attack.attacker.labels import check_label_mode
from fl_attack.attacker.memory import check_memory_labels
from fl_attack.attacker.precision import check_on_device, check_precision
from fl_attack.attacker.quadrature import check_nodes
from fl_attack.attacker.rule import AUTO, placeholder
from fl_attack.attacker.runtime.schedule import check_batch
from fl_attack.federation.config import check_field_types, parse_key_values
from fl_attack.federation.defense_settings import DefenseSettings
from fl_attack.federation.settings import NOT_KEYS, FederationSettings, typed_fields
from fl_attack.paths import resolve_in_project

log = logging.getLogger(__name__)

# The keys an audited Flower app's run config gives the audit besides every "attack-..." key
# (strategies/audit.py); the app's own keys (its lr, its fraction-train) are never read as the federation's.
AUDIT_KEYS = ("num-server-rounds", "record-updates", "server-test-samples", "results-dir", "run-name", "seed")

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
ADDED_KEYS = {"attack-precision": "fp32", "attack-lr-schedule": "steps"}
# AttackConfig settings that have a run-config key of their own (attack-options may not set them:
# ``check_own_settings``; fl-attack replay writes them as these keys).
OWN_KEYS = {
    "iterations": "attack-iterations",
    "nodes": "attack-nodes",
    "seed": "seed",
    "precision": "attack-precision",
    "compile": "attack-compile",
    "auto": "attack-nodes, attack-iterations or attack-lr-schedule (0 / auto: the audit's rule)",
}
# The audit's keys whose values the attacker checks: each key's one checker, in the module that owns the
# value (its message prefixed "invalid run config: KEY: "; analysis/docs.py shows it beside the key).
OWNER_CHECKS = {
    "attack-iterations": partial(check_iterations, allow_auto=True),  # 0: the audit's rule (fl_attack.attacker.rule)
    "attack-nodes": partial(check_nodes, allow_auto=True),
    "attack-labels": check_label_mode,
    "attack-device": check_device,
    "attack-precision": check_precision,
    "attack-compile": check_compile,
    "attack-batch": check_batch,
}


def audit_run_config(run_config) -> dict:
    """The audit's keys of a Flower run config (every "attack-..." key and ``AUDIT_KEYS``); the
    app's own keys are left out, so that a name the app uses for something else (its ``lr``, its
    ``fraction-train``) is never read as the simulated federation's."""
    return {k: v for k, v in dict(run_config).items() if k.startswith("attack-") or k in AUDIT_KEYS}


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
class AuditSettings:
    """Typed view of the audit's run-config keys (module docstring). Field names are the keys with '-'
    replaced by '_'; the defaults are pyproject.toml's ``[tool.flwr.app.config]`` (tests/test_config.py
    keeps them equal)."""

    num_server_rounds: int = 3
    attack_method: str = "pisme"
    attack_clients: str = "0"
    attack_iterations: int = AUTO
    attack_nodes: int = AUTO
    attack_lr_schedule: str = "auto"
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
    resume: str = ""
    results_dir: str = "results"
    run_name: str = ""

    @classmethod
    def from_run_config(cls, run_config) -> AuditSettings:
        """The audit's keys of Flower's run config, each typed like its default; the federation's keys
        are left to FederationSettings. Raises ValueError naming the key for every invalid value."""
        settings = cls(**typed_fields(AuditSettings, run_config))
        settings.validate()
        return settings

    def audit_settings(self) -> AuditSettings:
        """These settings as a plain AuditSettings (the audit's keys of a RunSettings)."""
        return AuditSettings(**{f.name: getattr(self, f.name) for f in fields(AuditSettings)})

    # -- the attacks -------------------------------------------------------------------------------
    @property
    def methods(self) -> list[str]:
        """attack-method's names; with attack-memory on, each memoryless method is followed by its
        remembering twin "METHOD+memory" (fl_attack.attacker.memory.memory_methods)."""
        from fl_attack.attacker.memory import memory_methods

        return list(memory_methods(self.attack_method, self.attack_memory))

    def attack_memory_state(self, saved: Path | None = None, round_offset: int = 0):
        """The server's memory (fl_attack.attacker.memory.AttackMemory): a new one of attack-memory and
        attack-memory-rounds, or with attack-memory on and ``saved`` (a resumed run's memory.pt) on
        disk, that one cut back to the ``round_offset`` rounds kept. ValueError for a bad file."""
        from fl_attack.attacker.memory import AttackMemory

        if self.attack_memory != "none" and saved is not None and Path(saved).exists():
            memory = AttackMemory.load(saved)
            memory.cut_back(round_offset)
            return memory
        return AttackMemory(self.attack_memory, self.attack_memory_rounds)

    def run_path(self, dataset: str, stamp: str) -> Path:
        """The run's folder: results-dir/run-name (results-dir under the project when relative), or for
        an unnamed run results-dir/<stamp>-<dataset>-<methods>, with -2, -3 ... where that exists."""
        root = resolve_in_project(self.results_dir)
        if self.run_name:
            return root / self.run_name
        base = f"{stamp}-{dataset}-{'-'.join(self.methods)}"
        path, n = root / base, 1
        while path.exists():
            n += 1
            path = root / f"{base}-{n}"
        return path

    def attack_config(self, federation: FederationSettings | None = None) -> AttackConfig:
        """The AttackConfig of every attack: attack-iterations, -nodes, -precision, -compile, the
        learning rates of attack-lr-schedule (``LR_SCHEDULES``) and attack-options (which override them),
        with the federation's seed and its defense's adaptation (observed_only, which attack-options
        overrides); without ``federation`` AttackConfig's own seed and none. Parsed once per settings
        object and kept on it (the one AttackConfig of a run; RunSettings': with its own federation).
        ValueError for a bad attack-options value, or naming the key when attack-options sets a setting
        that has a run-config key of its own (``OWN_KEYS``)."""
        if federation is not None and federation is not self:
            return self._parse_attack_config(federation)
        config = self.__dict__.get("_attack_config")
        if config is None:
            config = self._parse_attack_config(federation)
            object.__setattr__(self, "_attack_config", config)  # frozen: kept beside the fields, not one of them
        return config

    def _parse_attack_config(self, federation: FederationSettings | None) -> AttackConfig:
        try:
            options = parse_key_values(self.attack_options, asdict(AttackConfig()), "attack-options", "attack setting")
        except ValueError as exc:  # "attack-options ..." (fl_attack.federation.config.parse_key_values)
            raise ValueError(f"invalid run config: {exc}") from None
        own = {name: f"the run-config key {key}" for name, key in OWN_KEYS.items()}
        self._owner_check("attack-options", check_own_settings, options, own)
        # 0 / "auto": the audit's rule chooses per update (fl_attack.attacker.rule); until then the short-T choice
        rule = placeholder()
        auto = [
            name for name, value in (("iterations", self.attack_iterations), ("nodes", self.attack_nodes)) if not value
        ]
        own = dict(iterations=self.attack_iterations or rule["iterations"], nodes=self.attack_nodes or rule["nodes"])
        own |= dict(precision=self.attack_precision, compile=self.attack_compile)
        if self.attack_lr_schedule == "auto":
            schedule = {key: rule[key] for key in ("lr_images", "lr_decay", "lr_schedule")}
            if not schedule.keys() & options.keys():  # attack-options that set a rate or shape make it theirs
                auto.append("schedule")
        else:
            schedule = LR_SCHEDULES[self.attack_lr_schedule]
        options = {**schedule, **options, "auto": tuple(auto)}
        if federation is not None:
            own["seed"] = federation.seed
            options = {"observed_only": federation.defense.observed_only, **options}
        try:
            return AttackConfig.from_overrides(**own, **options)
        except ValueError as exc:  # an attack-options value out of its range (AttackConfig's checks)
            raise ValueError(f"invalid run config: attack-options: {exc}") from None

    def make_workers(self, threads: int):
        """The attack workers of attack-actors, -ray-address, -device and -num-gpus
        (fl_attack.attacker.runtime.workers.make_workers), each attack with ``threads`` torch threads: actors
        on the Ray runtime when one is up (Flower's simulation), else on the Ray cluster at
        attack-ray-address, else local processes (the deployment engine)."""
        import ray

        from fl_attack.attacker.runtime.workers import make_workers

        address = self.attack_ray_address
        kind = "ray" if ray.is_initialized() else f"ray cluster {address}" if address else ""
        log.info("attacks run on %s (%d worker(s))", kind or "local processes", self.attack_actors)
        return make_workers(
            self.attack_actors,
            address=address or None,
            threads=max(1, int(threads)),
            device=self.attack_device,
            num_gpus=self.attack_num_gpus,
            ray_runtime=ray.is_initialized(),
        )

    def attack_batch_size(self) -> int:
        """The attacks of one round a worker runs as one ``reconstruct_batch`` (attack-batch: N, or
        "auto": ``fl_attack.attacker.runtime.workers.BATCH_ON_CUDA`` when the attacks run on CUDA, else 1):
        attack-batch resolved, once, by the AuditService that runs the attacks."""
        from fl_attack.attacker.runtime.workers import resolve_batch

        return resolve_batch(self.attack_batch, self.attack_device)

    # -- which rounds and clients are attacked -----------------------------------------------------
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

    def select_clients(self, partition_ids: list[int], server_round: int, seed: int | None = None) -> list[int]:
        """Which of this round's partitions to attack: "all", "fraction:F" (drawn per round with
        ``seed``, the run's: RunSettings passes its own, a bare AuditSettings 0), a panel "0,3,5", or a
        panel and a fraction of the others "0,3+fraction:F"."""
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
            rng = np.random.default_rng([seed or 0, server_round])
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

    def schedule(self, server_round: int, candidates: list[int], in_flight: int) -> tuple[list[int], int, str]:
        """The partitions of ``candidates`` to attack in round ``server_round``, each with every method:
        attack-rounds, attack-clients (``select_clients``), attack-max-backlog (none while that many
        attacks are ``in_flight``) and attack-budget (at most that many attacks a round). Returns (the
        partitions, the attacks skipped, a line for events.log or "")."""
        if not self.attacks_round(server_round):
            return [], 0, f"not attacked (attack-rounds={self.attack_rounds})"
        targets = self.select_clients(candidates, server_round)
        methods = len(self.methods)
        backlog = self.attack_max_backlog
        if backlog and in_flight >= backlog:
            skipped = len(targets) * methods
            return (
                [],
                skipped,
                f"{skipped} attack(s) skipped: {in_flight} still in flight (attack-max-backlog={backlog})",
            )
        budget = self.attack_budget
        if budget and len(targets) * methods > budget:
            kept = targets[: max(0, budget // methods)]
            return (
                kept,
                (len(targets) - len(kept)) * methods,
                f"attack-budget={budget} keeps partitions {kept} of {targets}",
            )
        return targets, 0, ""

    # -- the checks --------------------------------------------------------------------------------
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

    def check_device(self) -> None:
        """ValueError when attack-device='cuda', or attack-precision='tf32' (CUDA only), and torch
        sees no CUDA device on this machine (kept apart from ``validate``: a run recorded on a GPU
        machine is still read back elsewhere). The attacker's checks (``resolve_device``,
        ``check_on_device``), their messages prefixed with the key."""
        device = self._owner_check("attack-device", resolve_device, self.attack_device)
        self._owner_check("attack-precision", check_on_device, self.attack_precision, device)

    @staticmethod
    def _owner_check(key: str, check, *values):
        """``check(*values)`` (a checker of the module that owns the value), its ValueError as
        "invalid run config: KEY: <its message>"."""
        try:
            return check(*values)
        except ValueError as exc:
            raise ValueError(f"invalid run config: {key}: {exc}") from None

    def check_output_bias(self, state: dict, num_classes: int) -> None:
        """attack-labels recovered reads the labels off the model's output bias: ``state`` (a user
        model's state dict) must have one. ValueError or KeyError (fl_attack.federation.models.output_bias_key)."""
        from fl_attack.federation.models import output_bias_key

        if self.attack_labels == "recovered":
            output_bias_key(state, num_classes)

    def validate(self) -> None:
        """Check every audit value against its range (ValueError "invalid run config: <key> ...",
        naming the key). What needs the federation is RunSettings.check_together's, what needs its
        nodes ``check_nodes``'s, what needs this machine ``check_device``'s."""
        from fl_attack.attacker.memory import memory_methods, parse_joint_rounds

        check_field_types(self, lambda name: name.replace("_", "-"), {f.name for f in fields(AuditSettings)})
        checks = [
            (self.num_server_rounds >= 1, "num-server-rounds must be >= 1"),
            (
                self.attack_lr_schedule in (*LR_SCHEDULES, "auto"),
                f"attack-lr-schedule must be one of {', '.join(LR_SCHEDULES)} or auto, got {self.attack_lr_schedule!r}",
            ),
            (self.attack_num_gpus >= 0, "attack-num-gpus must be >= 0"),
            (self.attack_actors >= 1, "attack-actors must be >= 1"),
            (self.attack_threads >= 0, "attack-threads must be >= 0 (0 = the cores the clients leave idle)"),
            (self.attack_timeout > 0, f"attack-timeout must be a finite number > 0 seconds, got {self.attack_timeout}"),
            (self.results_dir.strip() != "", "results-dir must not be empty"),
            (
                self.run_name == ""
                or (os.sep not in self.run_name and "/" not in self.run_name and self.run_name not in (".", "..")),
                f"run-name must be a plain folder name (no '/', not '.' or '..'), got '{self.run_name}'",
            ),
            (self.attack_budget >= 0, "attack-budget must be >= 0 attacks per round (0 = no limit)"),
            (self.attack_max_backlog >= 0, "attack-max-backlog must be >= 0 attacks in flight (0 = no limit)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid run config: {message}")
        for key, check in OWNER_CHECKS.items():  # the attacker's checks, each in the module that owns the value
            self._owner_check(key, check, getattr(self, key.replace("-", "_")))
        if self.attack_device == "cpu":  # tf32 on a CPU; what "auto" resolves to is check_device's
            self._owner_check("attack-precision", check_on_device, self.attack_precision, "cpu")
        try:
            memory_methods(self.attack_method, self.attack_memory)
        except ValueError as exc:
            key = "attack-memory" if "attack-memory must" in str(exc) else "attack-method"
            raise ValueError(f"invalid run config: {key}: {exc}") from None
        self._owner_check("attack-memory", check_memory_labels, self.methods, self.attack_labels)
        try:
            parse_joint_rounds(self.attack_memory_rounds)
        except ValueError as exc:
            raise ValueError(f"invalid run config: {exc}") from None
        self._check_rounds()
        self.attack_client_ids()  # checks attack-clients
        self.attack_config()  # checks attack-options, parsed once and kept

    def _check_rounds(self) -> None:
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


@dataclass(frozen=True)
class RunSettings(AuditSettings, FederationSettings):
    """The run's settings: the federation's keys (FederationSettings: data, partitions, model, local
    training, ``defense``) and the audit's (AuditSettings), one field per key, composed; ``extra``
    holds the keys neither owns. ``protocol`` is the clients' TrainingProtocol, ``attack_config()`` the
    AttackConfig of every attack, ``federation_settings()`` and ``audit_settings()`` each role's part.
    Ready-made run configs: strategies/run_configs/*.toml (``strategies.run_configs.load``).
    """

    extra: dict = field(default_factory=dict)

    @classmethod
    def from_run_config(cls, run_config) -> RunSettings:
        """Flower's run config, each key parsed and checked by its owner (FederationSettings with its
        DefenseSettings, AuditSettings), composed and checked across the two (``check_together``);
        the keys neither owns go to ``extra``. Raises ValueError naming the key for every invalid value."""
        federation = FederationSettings.from_run_config(run_config)
        audit = AuditSettings(**typed_fields(AuditSettings, run_config))
        names = {f.name for f in fields(cls)} - NOT_KEYS
        owned = lambda key: key.replace("-", "_") in names or DefenseSettings.owns(key)  # noqa: E731
        extra = {k: v for k, v in dict(run_config).items() if not owned(k)}
        parts = {f.name: getattr(part, f.name) for part in (federation, audit) for f in fields(part)}
        settings = cls(**parts, extra=extra)
        AuditSettings.validate(settings)  # the audit's checks; attack-options parsed here, once, with the federation
        settings.check_together()
        return settings

    def with_partitions(self, num_partitions: int | None) -> RunSettings:
        """FederationSettings.with_partitions, with the AttackConfig parsed once kept (it does not
        depend on the partitions)."""
        settings = super().with_partitions(num_partitions)
        if "_attack_config" in self.__dict__:
            object.__setattr__(settings, "_attack_config", self.__dict__["_attack_config"])
        return settings

    def attack_config(self, federation: FederationSettings | None = None) -> AttackConfig:
        """AuditSettings.attack_config with this run's federation (its seed and defense)."""
        return super().attack_config(self if federation is None else federation)

    def select_clients(self, partition_ids: list[int], server_round: int, seed: int | None = None) -> list[int]:
        """AuditSettings.select_clients, drawn with the run's seed."""
        return super().select_clients(partition_ids, server_round, self.seed if seed is None else seed)

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

    def describe_threads(self, clients_per_round: int) -> str:
        """The attack threads' rule in words, for events.log: while clients train, after the last round."""
        return (
            f"{self.attack_thread_count(clients_per_round)} torch thread(s) per attack while clients train, "
            f"{self.attack_drain_thread_count()} for the last round's attacks (attack-threads={self.attack_threads}, "
            f"{usable_cpus()} cores, client-num-cpus={self.client_num_cpus}, clients per round={clients_per_round})"
        )

    def validate(self) -> None:
        """The federation's checks (FederationSettings.validate), the audit's (AuditSettings.validate),
        then those across the two (``check_together``); ValueError "invalid run config: <key> ...".
        For settings built directly: ``from_run_config`` has each part check itself."""
        FederationSettings.validate(self)
        AuditSettings.validate(self)
        self.check_together()

    def check_together(self) -> None:
        """The audit's keys against the federation's: what the defense, the clients' training mode or
        the server's held-out pool rule out, attack-labels recovered's need of an output bias in a
        user model (resolved again here: FederationSettings.check_model), and an attack's need of the
        dataset's diffusion prior (dggi, image_prior diffusion). ValueError naming the key."""
        if self.resume and self.defense.secagg:
            raise ValueError(
                "invalid run config: resume is not supported with defense secagg "
                "(Flower's legacy SecAgg+ workflow always starts at round 1)"
            )
        if self.attack_memory != "none" and self.defense.secagg:
            raise ValueError(
                "invalid run config: attack-memory remembers one client across rounds; under secagg the "
                "server sees only aggregates"
            )
        config = self.attack_config()
        if config.bn_stats_weight > 0 and not self.client_train_mode:  # it would be silently ignored
            raise ValueError(
                "invalid run config: attack-options bn_stats_weight > 0 needs client-train-mode = true "
                "(batch norm's running statistics change only in train mode)"
            )
        if config.needs_public and not self.server_test_samples:
            raise ValueError(
                f"invalid run config: attack-options {config.needs_public} reads the server's held-out "
                "test pool: set server-test-samples > 0"
            )
        if self.attack_labels == "recovered" and (self.model.strip() or self.defense.low_rank):
            self.check_model(self.check_output_bias)
        for method in self.methods:  # an attack that cannot run on this dataset (dimitrov's hyperparameters)
            attack = ATTACKS.get(method.split("+")[0])
            try:
                attack.check_dataset(self.dataset) if attack is not None else None
            except ValueError as exc:
                raise ValueError(
                    f"invalid run config: attack-method {method} cannot run on {self.dataset}: {exc}"
                ) from None
        prior = [m for m in self.methods if getattr(ATTACKS.get(m.split("+")[0]), "uses_prior", False)]
        if prior or config.image_prior == "diffusion":
            from fl_attack.attacker.diffusion import check_prior

            try:
                check_prior(self.dataset)
            except ValueError as exc:
                key = "attack-method" if prior else "attack-options image_prior"
                raise ValueError(f"invalid run config: {key}: {exc}") from None
