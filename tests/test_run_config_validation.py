"""Every run-config value is checked against its real range before round 1 (fl_attack.run_config.preflight),
by the settings that own its key (FederationSettings, DefenseSettings, AuditSettings), and a bad value
gets its key's one message, naming the key."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from fl_attack.audit.settings import RunSettings
from fl_attack.federation.config import typed_value
from fl_attack.federation.defense_settings import DefenseSettings, _field_to_key
from fl_attack.run_config import preflight

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "invalid run config: "
CLIENTS_WORDING = (
    "attack-clients must be 'all', 'none', 'fraction:F', comma-separated partition ids or both as "
    "'IDS+fraction:F' (e.g. '0,3+fraction:0.2')"
)

INT_KEYS = [f.name.replace("_", "-") for f in dataclasses.fields(RunSettings) if type(f.default) is int]
FLOAT_KEYS = [f.name.replace("_", "-") for f in dataclasses.fields(RunSettings) if type(f.default) is float]
DEFENSE_INT_KEYS = [_field_to_key(f.name) for f in dataclasses.fields(DefenseSettings) if type(f.default) is int]
DEFENSE_FLOAT_KEYS = [_field_to_key(f.name) for f in dataclasses.fields(DefenseSettings) if type(f.default) is float]


def test_the_key_lists_cover_the_settings():
    assert {"seed", "num-server-rounds", "batch-size", "attack-iterations", "attack-actors"} <= set(INT_KEYS)
    assert {"attack-timeout", "lr", "fraction-train", "attack-num-gpus"} <= set(FLOAT_KEYS)
    assert {"defense-rank", "defense-bits", "secagg-num-shares"} <= set(DEFENSE_INT_KEYS)
    assert {"defense-clip-norm", "defense-epsilon", "defense-delta", "secagg-max-weight"} <= set(DEFENSE_FLOAT_KEYS)


@pytest.mark.parametrize("key", INT_KEYS + DEFENSE_INT_KEYS)
@pytest.mark.parametrize("value", [2.7, "2.7", "two", True, float("nan"), float("inf")])
def test_every_integer_key_rejects_what_is_not_an_integer(key, value):
    with pytest.raises(ValueError, match=f"run config '{key}' must be an integer, got "):
        RunSettings.from_run_config({key: value})


@pytest.mark.parametrize("key", FLOAT_KEYS + DEFENSE_FLOAT_KEYS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), "nan", "inf", "x", False])
def test_every_float_key_rejects_nan_inf_and_non_numbers(key, value):
    with pytest.raises(ValueError, match=f"run config '{key}' must be a (finite )?number, got "):
        RunSettings.from_run_config({key: value})


def test_integers_in_text_stay_exact_and_whole_floats_are_integers():
    assert typed_value("k", "18446744073709551617", 0) == 2**64 + 1  # no float rounding
    assert typed_value("k", 3.0, 0) == 3 and typed_value("k", " 4 ", 0) == 4
    assert RunSettings.from_run_config({"seed": 2**32 - 1}).seed == 2**32 - 1


# (run config, the key the message names, the message after "invalid run config: "; "..." at the end: its start).
# Every key with a check has a row (test_every_checked_key_has_a_row), and each message is the key's one wording.
BAD = [
    # the federation's keys (fl_attack.federation.settings.FederationSettings)
    ({"seed": -1}, "seed", "seed must be an integer in [0, 2**32-1], got -1"),
    ({"seed": 2**32}, "seed", "seed must be an integer in [0, 2**32-1], got 4294967296"),
    (
        {"dataset": "mnist"},
        "dataset",
        "dataset: unknown dataset 'mnist'; choose one of: cifar100, femnist, femnist-digits",
    ),
    ({"model": "nope"}, "model", "model: model spec 'nope' is neither 'paper' nor 'package.module:factory'"),
    (
        {"dataset": "femnist-digits", "attack-method": "dggi"},
        "attack-method",
        "attack-method: femnist-digits has no diffusion prior ...",
    ),
    (
        {"dataset": "femnist-digits", "attack-method": "dimitrov"},
        "attack-method",
        "attack-method dimitrov cannot run on femnist-digits: dimitrov has hyperparameters for femnist, "
        "cifar100, not 'femnist-digits'",
    ),
    ({"fraction-train": 0.0}, "fraction-train", "fraction-train must be in (0, 1]"),
    ({"fraction-train": 1.5}, "fraction-train", "fraction-train must be in (0, 1]"),
    ({"fraction-evaluate": -0.1}, "fraction-evaluate", "fraction-evaluate must be in [0, 1]"),
    ({"local-epochs": 0}, "local-epochs", "local-epochs must be >= 1"),
    ({"batch-size": 0}, "batch-size", "batch-size must be in 1..samples-per-client (32), got 0"),
    ({"batch-size": 40}, "batch-size", "batch-size must be in 1..samples-per-client (32), got 40"),
    ({"lr": 0.0}, "lr", "lr must be > 0"),
    (
        {"client-optimizer": "rmsprop"},
        "client-optimizer",
        "client-optimizer must be one of sgd, momentum, nesterov, adam, adamw, got 'rmsprop'",
    ),
    (
        {"client-optimizer": "momentum", "client-momentum": 1.5},
        "client-optimizer",
        "client-optimizer momentum: the momentum optimizer needs a momentum in (0, 1), got 1.5",
    ),
    (
        {"client-momentum": 0.5},
        "client-momentum",
        "client-momentum 0.5 applies to client-optimizer momentum and nesterov only, not 'sgd' "
        '(torch\'s SGD with momentum is client-optimizer="momentum")',
    ),
    ({"client-adam-betas": "x"}, "client-adam-betas", "client-adam-betas must be 'beta1,beta2', got 'x'"),
    (
        {"samples-per-client": 0},
        "samples-per-client",
        "samples-per-client must be >= 1 (0 = each client's whole partition, with a Flower partitioner: "
        "partitioner natural, iid, dirichlet or pathological)",
    ),
    ({"classes-per-client": 200}, "classes-per-client", "classes-per-client must be in 0..62 (0 = unrestricted)"),
    (
        {"classes-per-client": 2},
        "classes-per-client",
        "classes-per-client only applies to cifar100 (FEMNIST clients are writers)",
    ),
    (
        {"partitioner": "bogus"},
        "partitioner",
        "partitioner must be one of paper, natural, iid, dirichlet, pathological, got 'bogus'",
    ),
    (
        {"partitioner": "pathological"},
        "partitioner",
        "partitioner 'pathological' needs classes-per-client >= 1 (the classes of each partition)",
    ),
    (
        {"dirichlet-alpha": 0.0},
        "dirichlet-alpha",
        "dirichlet-alpha must be > 0 (the Dirichlet concentration; smaller = more skewed), got 0.0",
    ),
    ({"client-threads": -1}, "client-threads", "client-threads must be >= 0 (0 = 1 thread), got -1"),
    (
        {"client-num-cpus": 0},
        "client-num-cpus",
        "client-num-cpus must be >= 1 (the federation's client-resources-num-cpus)",
    ),
    (
        {"server-test-samples": -1},
        "server-test-samples",
        "server-test-samples must be >= 0 (0 = no centralised evaluation)",
    ),
    # the defense's keys (fl_attack.federation.defense_settings.DefenseSettings)
    ({"defense": "topk+topk"}, "defense", "defense='topk+topk' names a defense twice"),
    ({"defense": "none+topk"}, "defense", "defense 'none' cannot be combined with another defense"),
    ({"defense-clip-norm": 0.0}, "defense-clip-norm", "defense-clip-norm must be > 0, got 0.0"),
    ({"defense-epsilon": 0.0}, "defense-epsilon", "defense-epsilon must be > 0 (smaller is more noise), got 0.0"),
    ({"defense-delta": 1.0}, "defense-delta", "defense-delta must be in (0, 1), got 1.0"),
    (
        {"defense-noise-multiplier": -1.0},
        "defense-noise-multiplier",
        "defense-noise-multiplier must be >= 0 (a noise scale cannot be negative), got -1.0",
    ),
    ({"defense-clipping": "both"}, "defense-clipping", "defense-clipping must be 'server' or 'client', got 'both'"),
    ({"defense-accountant": "x"}, "defense-accountant", "defense-accountant must be one of rdp, pld, got 'x'"),
    ({"defense-target-delta": 1.0}, "defense-target-delta", "defense-target-delta must be in (0, 1), got 1.0"),
    ({"defense-topk-fraction": 0.0}, "defense-topk-fraction", "defense-topk-fraction must be in (0, 1], got 0.0"),
    ({"defense-rank": 0}, "defense-rank", "defense-rank must be >= 1, got 0"),
    ({"defense-bits": 17}, "defense-bits", "defense-bits must be in 1..16, got 17"),
    ({"secagg-num-shares": 2}, "secagg-num-shares", "secagg-num-shares must be >= 3, got 2"),
    (
        {"secagg-reconstruction-threshold": 1},
        "secagg-reconstruction-threshold",
        "secagg-reconstruction-threshold must be in 2..secagg-num-shares-1 (2), got 1",
    ),
    (
        {"secagg-max-weight": -1.0},
        "secagg-max-weight",
        "secagg-max-weight must be >= 0 (0 = samples-per-client), got -1.0",
    ),
    # the audit's keys (fl_attack.audit.settings.AuditSettings, and RunSettings.check_together across the two)
    ({"num-server-rounds": 0}, "num-server-rounds", "num-server-rounds must be >= 1"),
    ({"attack-timeout": 0}, "attack-timeout", "attack-timeout must be a finite number > 0 seconds, got 0.0"),
    ({"attack-timeout": -5.0}, "attack-timeout", "attack-timeout must be a finite number > 0 seconds, got -5.0"),
    ({"attack-method": ""}, "attack-method", "attack-method: no attack method given; choose from: ..."),
    ({"attack-method": " , "}, "attack-method", "attack-method: no attack method given; choose from: ..."),
    (
        {"attack-method": "pisme,ig,pisme"},
        "attack-method",
        "attack-method: method 'pisme' is listed more than once in 'pisme,ig,pisme'",
    ),
    (
        {"attack-method": "pisme+memory"},
        "attack-method",
        "attack-method: 'pisme+memory' needs attack-memory = labels, keep or joint (it is 'none')",
    ),
    (
        {"attack-method": "pisme+memorx", "attack-memory": "keep"},
        "attack-method",
        "attack-method: unknown attack method 'pisme+memorx'; choose from: ...",
    ),
    (
        {"attack-memory": "forever"},
        "attack-memory",
        "attack-memory: attack-memory must be one of none, labels, keep, joint, got 'forever'",
    ),
    (
        {"attack-memory": "keep", "attack-labels": "oracle"},
        "attack-memory",
        "attack-memory: an attack memory keeps only what the attacker produced; it cannot be used with oracle "
        "labels (the ground truth)",
    ),
    (
        {"attack-memory": "keep", "defense": "secagg"},
        "attack-memory",
        "attack-memory remembers one client across rounds; under secagg the server sees only aggregates",
    ),
    (
        {"attack-memory": "joint", "attack-memory-rounds": "best:0"},
        "attack-memory-rounds",
        "attack-memory-rounds must be 'all' or 'best:N,latest:M' with N, M >= 0 and N + M >= 1, got 'best:0'",
    ),
    (
        {"attack-memory": "joint", "attack-memory-rounds": "first:2"},
        "attack-memory-rounds",
        "attack-memory-rounds must be 'all' or 'best:N,latest:M' with N, M >= 0 and N + M >= 1, got 'first:2'",
    ),
    (
        {"attack-options": "label_estimator=aux", "server-test-samples": 0},
        "server-test-samples",
        "attack-options label_estimator=aux reads the server's held-out test pool: set server-test-samples > 0",
    ),
    (
        {"attack-options": "label_estimator=rlu", "server-test-samples": 0},
        "server-test-samples",
        "attack-options label_estimator=rlu reads the server's held-out test pool: set server-test-samples > 0",
    ),
    (
        {"attack-options": "start=public", "server-test-samples": 0},
        "server-test-samples",
        "attack-options start=public reads the server's held-out test pool: set server-test-samples > 0",
    ),
    (
        {"attack-options": "bn_stats_weight=1"},
        "attack-options",
        "attack-options bn_stats_weight > 0 needs client-train-mode = true "
        "(batch norm's running statistics change only in train mode)",
    ),
    (
        {"attack-options": "bn_stats_weight=-1"},
        "attack-options",
        "attack-options: bn_stats_weight must be >= 0 (0: off), got -1.0",
    ),
    ({"attack-options": "tv_weight=x"}, "attack-options", "attack-options 'tv_weight' must be a number, got 'x'"),
    ({"attack-options": "nosuch=1"}, "attack-options", "attack-options: unknown attack setting 'nosuch'; known: ..."),
    (
        {"attack-options": "precision=bf16"},
        "attack-precision",
        "attack-options: precision is set here and by the run-config key attack-precision; give one",
    ),
    (
        {"attack-options": "nodes=5"},
        "attack-nodes",
        "attack-options: nodes is set here and by the run-config key attack-nodes; give one",
    ),
    (
        {"attack-options": "compile=on"},
        "attack-compile",
        "attack-options: compile is set here and by the run-config key attack-compile; give one",
    ),
    (
        {"attack-nodes": -1},  # 0: the audit's rule
        "attack-nodes",
        "attack-nodes: the number of quadrature nodes m must be an integer >= 0 (0: chosen per update), got -1",
    ),
    (
        {"attack-lr-schedule": "fast"},
        "attack-lr-schedule",
        "attack-lr-schedule must be one of steps, constant, plateau or auto, got 'fast'",
    ),
    (
        {"attack-iterations": -1},
        "attack-iterations",
        "attack-iterations: iterations must be an integer >= 0 (0: chosen per update), got -1",
    ),
    ({"attack-labels": "x"}, "attack-labels", "attack-labels: labels must be 'recovered' or 'oracle', got 'x'"),
    ({"attack-num-gpus": -1.0}, "attack-num-gpus", "attack-num-gpus must be >= 0"),
    ({"attack-actors": 0}, "attack-actors", "attack-actors must be >= 1"),
    (
        {"attack-threads": -1},
        "attack-threads",
        "attack-threads must be >= 0 (0 = the cores the clients leave idle)",
    ),
    ({"attack-device": "tpu"}, "attack-device", "attack-device: unknown device 'tpu'; use auto, cpu or cuda"),
    (
        {"attack-precision": "fp16"},
        "attack-precision",
        "attack-precision: precision must be one of fp32, bf16, tf32, auto, got 'fp16'",
    ),
    (
        {"attack-precision": "tf32", "attack-device": "cpu"},
        "attack-precision",
        "attack-precision: precision 'tf32' needs a CUDA device (TF32 is a mode of NVIDIA tensor cores), the attack "
        "runs on 'cpu'; use fp32 or bf16 there",
    ),
    ({"attack-compile": "yes"}, "attack-compile", "attack-compile: compile must be one of off, on, auto, got 'yes'"),
    (
        {"attack-batch": "0"},
        "attack-batch",
        "attack-batch: attack batch must be an integer >= 1 or 'auto', got '0'",
    ),
    (
        {"attack-batch": "many"},
        "attack-batch",
        "attack-batch: attack batch must be an integer >= 1 or 'auto', got 'many'",
    ),
    (
        {"attack-rounds": "every:0"},
        "attack-rounds",
        "attack-rounds must be 'all', 'none', 'every:N', 'first:N' (N >= 1) or distinct round numbers >= 1 such "
        "as '1,5,10', got 'every:0'",
    ),
    ({"attack-budget": -1}, "attack-budget", "attack-budget must be >= 0 attacks per round (0 = no limit)"),
    (
        {"attack-max-backlog": -1},
        "attack-max-backlog",
        "attack-max-backlog must be >= 0 attacks in flight (0 = no limit)",
    ),
    ({"attack-clients": "0,-1"}, "attack-clients", "attack-clients partition ids must be >= 0, got -1"),
    ({"attack-clients": "1,2,1"}, "attack-clients", "attack-clients names a partition id twice: '1,2,1'"),
    ({"attack-clients": "1,x"}, "attack-clients", f"{CLIENTS_WORDING}, got '1,x'"),
    ({"attack-clients": "0+"}, "attack-clients", f"{CLIENTS_WORDING}, got '0+'"),
    ({"attack-clients": "fraction:0.2+0"}, "attack-clients", f"{CLIENTS_WORDING}, got 'fraction:0.2+0'"),
    (
        {"attack-clients": "0,0+fraction:0.2"},
        "attack-clients",
        "attack-clients names a partition id twice: '0,0+fraction:0.2'",
    ),
    ({"attack-clients": "0+fraction:2"}, "attack-clients", "attack-clients 'fraction:F' needs F in (0, 1]"),
    ({"attack-clients": "fraction:0"}, "attack-clients", "attack-clients 'fraction:F' needs F in (0, 1]"),
    ({"attack-clients": "fraction:nan"}, "attack-clients", "attack-clients 'fraction:F' needs F in (0, 1]"),
    (
        {"run-name": "../elsewhere"},
        "run-name",
        "run-name must be a plain folder name (no '/', not '.' or '..'), got '../elsewhere'",
    ),
    ({"run-name": ".."}, "run-name", "run-name must be a plain folder name (no '/', not '.' or '..'), got '..'"),
    ({"results-dir": " "}, "results-dir", "results-dir must not be empty"),
    (
        {"resume": "x", "defense": "secagg"},
        "resume",
        "resume is not supported with defense secagg (Flower's legacy SecAgg+ workflow always starts at round 1)",
    ),
]
# Checks that need the federation's nodes (preflight with 3 nodes, the bundled data).
BAD_FOR_3_NODES = [
    (
        {"attack-clients": "0,7"},
        "attack-clients",
        "attack-clients lists partition id 7, but the federation has 3 node(s) (partition ids 0..2)",
    ),
    (
        {"data-dir": "/nonexistent/leaf"},
        "data-dir",
        "data-dir: FEMNIST LEAF directory not found: /nonexistent/leaf ...",
    ),
    (
        {"samples-per-client": 5000, "partitioner": "iid"},
        "samples-per-client",
        "samples-per-client: partition 0 has only 4903 samples, asked for 5000 (iid partitioner, 3 partitions); "
        "lower samples-per-client (0 = each client's whole partition) or num-supernodes",
    ),
]
# Checks of this machine: they refuse only where torch sees no CUDA device.
BAD_WITHOUT_CUDA = [
    (
        {"attack-device": "cuda"},
        "attack-device",
        "attack-device: device 'cuda' was asked for but torch sees no CUDA device",
    ),
    (
        {"attack-precision": "tf32"},
        "attack-precision",
        "attack-precision: precision 'tf32' needs a CUDA device (TF32 is a mode of NVIDIA tensor cores), the attack "
        "runs on 'cpu'; use fp32 or bf16 there",
    ),
]


def _raises_its_message(config: dict, message: str, num_nodes: int | None = None) -> None:
    with pytest.raises(ValueError) as info:
        preflight(config, num_nodes)
    text = str(info.value)
    if message.endswith(" ..."):
        assert text.startswith(PREFIX + message.removesuffix(" ...")), text
    else:
        assert text == PREFIX + message


def _ids(rows):
    return [f"{k}={list(c.values())[0]!r}" for c, k, _ in rows]


@pytest.mark.parametrize("config, key, message", BAD, ids=_ids(BAD))
def test_a_bad_value_is_rejected_with_its_keys_one_message(config, key, message):
    assert message.startswith(key) or key in message
    _raises_its_message(config, message)


@pytest.mark.parametrize("config, key, message", BAD_FOR_3_NODES, ids=_ids(BAD_FOR_3_NODES))
def test_a_value_that_does_not_fit_the_federation_is_rejected_before_it_starts(config, key, message):
    RunSettings.from_run_config(config)  # fine alone: the check needs the federation's nodes
    _raises_its_message(config, message, num_nodes=3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="these refuse only where torch sees no CUDA device")
@pytest.mark.parametrize("config, key, message", BAD_WITHOUT_CUDA, ids=_ids(BAD_WITHOUT_CUDA))
def test_a_cuda_setting_is_rejected_on_a_machine_without_cuda(config, key, message):
    RunSettings.from_run_config(config)  # parsing alone does not need the GPU: a run is read back anywhere
    _raises_its_message(config, message)


def test_every_checked_key_has_a_row():
    # every key docs/run-config.md names a check for (analysis.docs reads them from the source) has a bad value above
    from analysis import docs

    rows = {key for _, key, _ in BAD + BAD_FOR_3_NODES + BAD_WITHOUT_CUDA}
    checked = {key for _, cls, keys in docs.owners() for key in keys if docs.checks_of(key, docs._source_strings(cls))}
    checked |= {key for _, cls, _ in docs.owners() for key in docs.owner_checks(cls)}  # the attacker's checkers
    assert checked - rows == set()


@pytest.mark.parametrize(
    "wording", ["attack-threads must be", "must be an integer >= 1 or 'auto'", "attack-batch must be"]
)
def test_attack_batch_and_threads_are_each_checked_in_one_place(wording):
    # attack-batch: the attacker's resolve_batch, which AuditSettings.validate calls; attack-threads: AuditSettings
    hits = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("fl_attack", "strategies", "clients")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if wording in line
    ]
    assert len(hits) == (0 if wording == "attack-batch must be" else 1), hits


def test_attack_device_cuda_needs_cuda():
    if torch.cuda.is_available():
        RunSettings.from_run_config({"attack-device": "cuda"}).check_device()
        return
    settings = RunSettings.from_run_config({"attack-device": "cuda"})  # parsing alone does not need the GPU
    with pytest.raises(ValueError, match="attack-device: device 'cuda' was asked for but torch sees no CUDA device"):
        settings.check_device()


@pytest.mark.parametrize(
    "field, value, key",
    [
        ("attack_timeout", math.inf, "attack-timeout"),
        ("lr", math.nan, "lr"),
        ("seed", 1.5, "seed"),
        ("num_server_rounds", True, "num-server-rounds"),
        ("attack_method", None, "attack-method"),
    ],
)
def test_settings_built_directly_are_checked_too(field, value, key):
    with pytest.raises(ValueError, match=f"invalid run config: {key} must be "):
        RunSettings(**{field: value}).validate()


def test_defense_settings_built_directly_are_checked_too():
    with pytest.raises(ValueError, match="invalid run config: defense-epsilon must be a finite number, got inf"):
        DefenseSettings(epsilon=math.inf).validate()
    with pytest.raises(ValueError, match="invalid run config: defense-adaptive-attack must be true or false"):
        DefenseSettings(adaptive_attack=1).validate()


def test_attack_clients_are_checked_against_the_federations_nodes():
    settings = RunSettings.from_run_config({"attack-clients": "0,3"})
    settings.check_nodes(4)
    with pytest.raises(
        ValueError,
        match=r"attack-clients lists partition id 3, but the federation has 3 node\(s\) "
        r"\(partition ids 0..2\)",
    ):
        settings.check_nodes(3)
    for spec in ("all", "none", "fraction:0.5"):
        RunSettings.from_run_config({"attack-clients": spec}).check_nodes(1)


def test_attack_compile_and_batch_reach_the_attacks_and_the_pipeline():
    settings = RunSettings.from_run_config({"attack-compile": "on", "attack-batch": 4})  # TOML may give an int
    assert settings.attack_config().compile == "on" and settings.attack_batch_size() == 4
    default = RunSettings.from_run_config({"attack-device": "cpu"})
    assert default.attack_config().compile == "auto" and default.attack_batch_size() == 1  # auto on a CPU: 1
