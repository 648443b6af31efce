"""Every run-config value is checked against its real range before round 1, and the error names the
key (fl_attack/run_config.py, fl_attack/federation/config.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fl_attack.federation.config import typed_value
from fl_attack.run_config import DefenseSettings, RunSettings, _field_to_key

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


BAD = [  # (run config, the key the message must name, more of the message)
    ({"seed": -1}, "seed", "must be an integer in [0, 2**32-1], got -1"),
    ({"seed": 2**32}, "seed", "got 4294967296"),
    ({"attack-timeout": 0}, "attack-timeout", "must be a finite number > 0 seconds, got 0"),
    ({"attack-timeout": -5.0}, "attack-timeout", "got -5.0"),
    ({"attack-method": ""}, "attack-method", "no attack method given"),
    ({"attack-method": " , "}, "attack-method", "no attack method given"),
    ({"attack-method": "pisme,ig,pisme"}, "attack-method", "method 'pisme' is listed more than once"),
    ({"attack-memory": "forever"}, "attack-memory", "must be one of none, labels, keep, joint"),
    ({"attack-method": "pisme+memory"}, "attack-method", "'pisme+memory' needs attack-memory"),
    ({"attack-method": "pisme+memorx", "attack-memory": "keep"}, "attack-method", "unknown attack method"),
    ({"attack-memory": "keep", "attack-labels": "oracle"}, "attack-memory", "cannot be used with attack-labels"),
    ({"attack-memory": "joint", "attack-memory-rounds": "best:0"}, "attack-memory-rounds", "got 'best:0'"),
    ({"attack-memory": "joint", "attack-memory-rounds": "first:2"}, "attack-memory-rounds", "got 'first:2'"),
    ({"attack-memory": "keep", "defense": "secagg"}, "attack-memory", "the server sees only aggregates"),
    (
        {"attack-options": "label_estimator=aux", "server-test-samples": 0},
        "server-test-samples",
        "label_estimator=aux",
    ),
    ({"attack-clients": "0,-1"}, "attack-clients", "partition ids must be >= 0, got -1"),
    ({"attack-clients": "1,2,1"}, "attack-clients", "names a partition id twice"),
    ({"attack-clients": "1,x"}, "attack-clients", "got '1,x'"),
    ({"attack-clients": "0+"}, "attack-clients", "'IDS+fraction:F'"),
    ({"attack-clients": "fraction:0.2+0"}, "attack-clients", "'IDS+fraction:F'"),
    ({"attack-clients": "0,0+fraction:0.2"}, "attack-clients", "names a partition id twice"),
    ({"attack-clients": "0+fraction:2"}, "attack-clients", "needs F in (0, 1]"),
    ({"attack-clients": "fraction:0"}, "attack-clients", "needs F in (0, 1]"),
    ({"attack-clients": "fraction:nan"}, "attack-clients", "needs F in (0, 1]"),
    ({"fraction-train": 0.0}, "fraction-train", "must be in (0, 1]"),
    ({"fraction-train": 1.5}, "fraction-train", "must be in (0, 1]"),
    ({"fraction-evaluate": -0.1}, "fraction-evaluate", "must be in [0, 1]"),
    ({"lr": 0.0}, "lr", "must be > 0"),
    ({"num-server-rounds": 0}, "num-server-rounds", "must be >= 1"),
    ({"client-threads": -1}, "client-threads", "must be >= 0"),
    ({"attack-device": "tpu"}, "attack-device", "must be auto, cpu or cuda"),
    ({"attack-precision": "fp16"}, "attack-precision", "must be one of fp32, bf16, tf32, auto, got 'fp16'"),
    ({"attack-precision": "tf32", "attack-device": "cpu"}, "attack-precision", "'tf32' needs attack-device 'cuda'"),
    ({"attack-options": "precision=bf16"}, "attack-precision", "attack-options sets precision"),
    ({"attack-options": "nodes=5"}, "attack-nodes", "attack-options sets nodes"),
    ({"attack-compile": "yes"}, "attack-compile", "must be one of off, on, auto, got 'yes'"),
    ({"attack-options": "compile=on"}, "attack-compile", "attack-options sets compile"),
    ({"attack-batch": "0"}, "attack-batch", "must be an integer >= 1 or 'auto', got '0'"),
    ({"attack-batch": "many"}, "attack-batch", "must be an integer >= 1 or 'auto'"),
    ({"dataset": "mnist"}, "dataset", "unknown dataset 'mnist'"),
    ({"run-name": "../elsewhere"}, "run-name", "must be a plain folder name"),
    ({"run-name": ".."}, "run-name", "must be a plain folder name"),
    ({"results-dir": " "}, "results-dir", "must not be empty"),
    ({"defense-delta": 1.0}, "defense-delta", "must be in (0, 1)"),
    ({"defense-topk-fraction": 0.0}, "defense-topk-fraction", "must be in (0, 1]"),
    ({"defense-noise-multiplier": -1.0}, "defense-noise-multiplier", "must be >= 0"),
    ({"defense-bits": 17}, "defense-bits", "must be in 1..16"),
]


@pytest.mark.parametrize("config, key, message", BAD, ids=[f"{k}={list(c.values())[0]!r}" for c, k, _ in BAD])
def test_a_bad_value_is_rejected_with_its_key(config, key, message):
    with pytest.raises(ValueError) as info:
        RunSettings.from_run_config(config)
    text = str(info.value)
    assert text.startswith("invalid run config: ") and key in text and message in text, text


def test_attack_device_cuda_needs_cuda():
    if torch.cuda.is_available():
        RunSettings.from_run_config({"attack-device": "cuda"}).check_device()
        return
    settings = RunSettings.from_run_config({"attack-device": "cuda"})  # parsing alone does not need the GPU
    with pytest.raises(ValueError, match="attack-device='cuda' but torch sees no CUDA device here"):
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
