"""The run's settings: the federation's keys (fl_attack.federation.settings) and the audit's.

Flower hands the run config to both apps as a flat dict with kebab-case keys and TOML types.
``RunSettings.from_run_config`` turns it into typed settings and raises ValueError with a clear
message for any bad value, so the ServerApp can fail before the first round starts. RunSettings
extends the federation's FederationSettings, which parses and checks the keys a client needs (the
ClientApp reads only those, and loads no attack code), with the audit's: which rounds and clients
are attacked, how, and where it is recorded; each key is checked once, by the class that declares it.
The audit's policies live here too: the attacker's torch threads (the cores the clients leave idle)
and which clients to attack.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields

from fl_attack.attacker.attacks import AttackConfig
from fl_attack.attacker.precision import PRECISIONS
from fl_attack.federation.config import check_field_types, parse_key_values
from fl_attack.federation.defense_settings import (  # noqa: F401 -- DefenseSettings' old home
    CLIPPING_SIDES,
    DEFENSES,
    DefenseSettings,
    _field_to_key,
    _key_to_field,
)
from fl_attack.federation.settings import SEED_MAX, FederationSettings  # noqa: F401 -- SEED_MAX: its old home


def _parse_overrides(text: str) -> dict:
    """ "tv_weight=0.02,lr_control_point=1e-5" -> AttackConfig overrides (typed like the defaults)."""
    out = parse_key_values(text, asdict(AttackConfig()), "attack-options", "attack setting")
    AttackConfig.from_overrides(**out)  # validates the combination
    return out


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
class RunSettings(FederationSettings):
    """Typed view of the run config: the federation's keys (FederationSettings: data, partitions,
    model, local training, ``defense``) and the audit's below. Field names are the keys with '-'
    replaced by '_'; the defaults are pyproject.toml's ``[tool.flwr.app.config]`` (tests/test_config.py
    keeps them equal). ``protocol`` is the clients' TrainingProtocol (fl_attack.federation.config),
    ``attack_config()`` the AttackConfig of every attack, ``federation_settings()`` what a client reads.
    Ready-made run configs: strategies/run_configs/*.toml (``strategies.run_configs.load``).
    """

    num_server_rounds: int = 3
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
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
    resume: str = ""
    results_dir: str = "results"
    run_name: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def methods(self) -> list[str]:
        """attack-method's names; with attack-memory on, each memoryless method is followed by its
        remembering twin "METHOD+memory" (fl_attack.attacker.memory.memory_methods)."""
        from fl_attack.attacker.memory import memory_methods

        return list(memory_methods(self.attack_method, self.attack_memory))

    def attack_memory_state(self):
        """A new fl_attack.attacker.memory.AttackMemory of attack-memory and attack-memory-rounds."""
        from fl_attack.attacker.memory import AttackMemory

        return AttackMemory(self.attack_memory, self.attack_memory_rounds)

    def _check_training_options(self) -> None:
        """attack-options bn_stats_weight on a run that trains in eval mode would be silently ignored
        (the running statistics move only in train mode; the attacks would all fail)."""
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

    def _check_model_state(self, state: dict, num_classes: int) -> None:
        """attack-labels recovered reads the labels off the model's output bias: it must have one."""
        from fl_attack.federation.models import output_bias_key

        super()._check_model_state(state, num_classes)
        if self.attack_labels == "recovered":
            output_bias_key(state, num_classes)

    def validate(self) -> None:
        """Check every value against its range before round 1 (ValueError "invalid run config: <key>
        ..." naming the key): the federation's keys (FederationSettings.validate), then the audit's.
        What needs the federation is checked by ``check_nodes`` and ``check_partitions``."""
        super().validate()
        audit_fields = {f.name for f in fields(RunSettings)} - {f.name for f in fields(FederationSettings)}
        check_field_types(self, lambda name: name.replace("_", "-"), audit_fields)
        checks = [
            (self.num_server_rounds >= 1, "num-server-rounds must be >= 1"),
            (0 < self.fraction_train <= 1, "fraction-train must be in (0, 1]"),
            (0 <= self.fraction_evaluate <= 1, "fraction-evaluate must be in [0, 1]"),
            (self.attack_iterations >= 1, "attack-iterations must be >= 1"),
            (self.attack_nodes >= 1, f"attack-nodes (m) must be >= 1, got {self.attack_nodes}"),
            (self.attack_labels in ("recovered", "oracle"), "attack-labels must be 'recovered' or 'oracle'"),
            (self.attack_num_gpus >= 0, "attack-num-gpus must be >= 0"),
            (self.attack_actors >= 1, "attack-actors must be >= 1"),
            (self.attack_threads >= 0, "attack-threads must be >= 0 (0 = the cores the clients leave idle)"),
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
