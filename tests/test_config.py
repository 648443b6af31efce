"""One configuration vocabulary (fl_attack.federation.config): the training protocol, the presets, and the
places that read them — the standalone CLI, the paper experiments' scales, the federation's
RunSettings and its run-config preset files — checked so that no copy can drift."""

from __future__ import annotations

import dataclasses
import inspect
import json
import tomllib
from pathlib import Path

import pytest

from fl_attack.attacker.attacks import AttackConfig
from fl_attack.audit.settings import RunSettings
from fl_attack.federation.config import PAPER, PRESETS, Preset, TrainingProtocol
from fl_attack.federation.defense_settings import DefenseSettings, _key_to_field
from fl_attack.federation.settings import FederationSettings
from fl_attack.federation.training import train_local
from fl_attack.federation.update import TrainingMetadata
from fl_attack.standalone import AttackSettings
from strategies import run_configs

ROOT = Path(__file__).resolve().parents[1]
with open(ROOT / "pyproject.toml", "rb") as _f:
    PYPROJECT = tomllib.load(_f)["tool"]["flwr"]["app"]["config"]


# --- TrainingProtocol and the presets -----------------------------------------------------------


def test_the_paper_protocol_is_pismes():
    assert (PAPER.samples, PAPER.batch_size, PAPER.local_epochs, PAPER.lr) == (50, 10, 20, 0.004)
    assert PAPER.local_steps == 100 and PAPER.with_epochs(50).local_steps == 250
    assert PRESETS["paper"].protocol is PAPER
    assert PAPER.run_config() == {"samples-per-client": 50, "batch-size": 10, "local-epochs": 20, "lr": 0.004}
    with pytest.raises(dataclasses.FrozenInstanceError):
        PAPER.lr = 0.1


def test_presets_keep_the_sizes_the_code_used():
    sizes = {name: (*dataclasses.astuple(p.protocol), p.iterations, p.nodes) for name, p in PRESETS.items()}
    assert sizes == {
        "paper": (50, 10, 20, 0.004, 1000, 7),
        "cpu": (8, 4, 50, 0.004, 100, 7),
        "tiny": (4, 2, 2, 0.004, 3, 3),
        "audit": (50, 10, 20, 0.004, 400, 1),  # the rule's short-T choice until each victim's T is known
    }
    assert PRESETS["audit"].rule and not any(p.rule for name, p in PRESETS.items() if name != "audit")
    assert PRESETS["cpu"].protocol.local_steps == PAPER.local_steps  # the paper's T=100 at k=8
    assert AttackConfig.from_overrides(**PRESETS["tiny"].attack_overrides()).nodes == 3


BAD_PROTOCOLS = [
    (dict(samples=0), ValueError, "samples must be >= 1, got 0"),
    (dict(batch_size=0), ValueError, "batch_size must be >= 1, got 0"),
    (dict(local_epochs=0), ValueError, "local_epochs must be >= 1, got 0"),
    (dict(batch_size=60), ValueError, "batch size B=60 is larger than the client's k=50 samples"),
    (dict(lr=0.0), ValueError, "lr must be a positive finite number, got 0.0"),
    (dict(lr=float("nan")), ValueError, "lr must be a positive finite number, got nan"),
    (dict(samples=2.5), TypeError, "samples must be an integer, got 2.5"),
    (dict(local_epochs=True), TypeError, "local_epochs must be an integer, got True"),
    (dict(lr="0.1"), TypeError, "lr must be a number, got '0.1'"),
]


@pytest.mark.parametrize("change, error, message", BAD_PROTOCOLS, ids=[str(c) for c, _, _ in BAD_PROTOCOLS])
def test_a_bad_protocol_is_refused_with_its_field(change, error, message):
    with pytest.raises(error) as info:
        dataclasses.replace(PAPER, **change)
    assert str(info.value) == message


def test_the_update_metadata_shares_the_protocols_checks():
    with pytest.raises(ValueError, match="^batch size B=60 is larger than the client's k=50 samples$"):
        TrainingMetadata("femnist", 0.004, 60, 20, 50)
    with pytest.raises(ValueError, match="^num_samples must be >= 1, got 0$"):
        TrainingMetadata("femnist", 0.004, 1, 20, 0)
    assert (
        TrainingMetadata("femnist", lr=0.004, batch_size=10, local_epochs=20, num_samples=50).local_steps
        == PAPER.local_steps
    )


def test_a_preset_needs_iterations_and_nodes():
    with pytest.raises(ValueError, match="preset 'x': nodes must be an integer >= 1, got 0"):
        Preset("x", PAPER, iterations=1, nodes=0, long_epochs=50, clients=1, seeds=1)


def test_the_former_copies_read_the_presets():
    from analysis.defenses import SCALE
    from analysis.experiments.path_consistency import PROTOCOL

    d = AttackSettings()
    assert (d.protocol, d.iterations, d.nodes) == (PAPER, 1000, 7)
    defaults = {k: p.default for k, p in inspect.signature(train_local).parameters.items()}
    assert (defaults["lr"], defaults["batch_size"], defaults["local_epochs"]) == (0.004, 10, 20)
    assert {n: s.epochs for n, s in PRESETS.items()} == {
        "paper": ((100, 20), (250, 50)),
        "cpu": ((100, 50), (250, 125)),
        "tiny": ((100, 2), (250, 5)),
        "audit": ((100, 20), (250, 50)),
    }
    assert {n: (p["samples"], p["batch_size"], p["epochs"]) for n, p in PROTOCOL.items()} == {
        "paper": (50, 10, ((100, 20), (250, 50))),
        "cpu": (50, 10, ((100, 20), (250, 50))),
        "tiny": (4, 2, ((100, 2), (250, 5))),
    }
    assert SCALE == {
        "samples-per-client": 8,
        "batch-size": 4,
        "local-epochs": 5,
        "lr": 0.004,
        "attack-method": "pisme",
        "attack-clients": "0",
        "attack-iterations": 100,
        "attack-nodes": 3,
        "attack-lr-schedule": "steps",
        "seed": 0,
    }


# --- RunSettings and pyproject.toml ------------------------------------------------------------


def test_run_settings_defaults_are_pyprojects():
    not_keys = ("defense", "extra", "num_partitions")  # num_partitions: the federation's node count
    run_fields = {f.name: f.default for f in dataclasses.fields(RunSettings) if f.name not in not_keys}
    defense_fields = {f.name: f.default for f in dataclasses.fields(DefenseSettings) if f.name != "plugin_parameters"}
    for key, value in PYPROJECT.items():
        if DefenseSettings.owns(key):
            fields, name = defense_fields, _key_to_field(key)
        else:
            fields, name = run_fields, key.replace("-", "_")
        assert name in fields, f"pyproject key '{key}' has no settings field"
        assert type(fields[name]) is type(value) and fields[name] == value, (key, value, fields[name])
    keys = {k.replace("-", "_") for k in PYPROJECT}
    assert set(run_fields) <= keys, f"RunSettings fields without a pyproject key: {sorted(set(run_fields) - keys)}"
    defense_keys = {_key_to_field(k) for k in PYPROJECT if DefenseSettings.owns(k)}
    assert set(defense_fields) <= defense_keys, sorted(set(defense_fields) - defense_keys)


def test_run_settings_compose_the_protocol_and_the_attack_config():
    settings = RunSettings.from_run_config({**PYPROJECT, **PAPER.run_config(), "attack-nodes": 7})
    assert settings.protocol == PAPER and settings.attack_config().nodes == 7
    assert RunSettings().protocol == TrainingProtocol(
        samples=PYPROJECT["samples-per-client"],
        batch_size=PYPROJECT["batch-size"],
        local_epochs=PYPROJECT["local-epochs"],
        lr=PYPROJECT["lr"],
    )


def test_the_clients_read_the_federation_keys_as_the_server_does():
    # the ClientApp parses only FederationSettings: the same values as the server's RunSettings
    run_config = {**PYPROJECT, **PAPER.run_config(), "defense": "topk", "seed": 7, "attack-nodes": 7}
    settings = RunSettings.from_run_config(run_config)
    federation = FederationSettings.from_run_config(run_config)
    assert settings.federation_settings() == federation and type(federation) is FederationSettings
    assert federation.protocol == PAPER and federation.defense.topk and federation.seed == 7
    fed_keys = {f.name for f in dataclasses.fields(FederationSettings)}
    assert not any(name.startswith("attack_") for name in fed_keys)


def test_each_key_is_checked_by_the_settings_that_own_it():
    # an audit key is the audit's to check: a client parses past it; the server's pre-flight does not
    bad_audit = {**PYPROJECT, "attack-iterations": -1}
    assert FederationSettings.from_run_config(bad_audit).lr == PYPROJECT["lr"]
    with pytest.raises(ValueError, match="invalid run config: attack-iterations: iterations must be an integer >= 0"):
        RunSettings.from_run_config(bad_audit)
    # a federation key fails both, with the one wording
    for cls in (FederationSettings, RunSettings):
        with pytest.raises(ValueError, match=r"^invalid run config: lr must be > 0$"):
            cls.from_run_config({**PYPROJECT, "lr": -1.0})


def test_run_settings_compose_the_federations_and_the_audits_settings():
    # each role parses only its own keys; RunSettings is the two side by side, plus the keys neither owns
    from fl_attack.audit.settings import AuditSettings

    run_config = {**PYPROJECT, "attack-iterations": 7, "seed": 5, "lr": 0.1, "some-app-key": 1}
    settings = RunSettings.from_run_config(run_config)
    audit = AuditSettings.from_run_config(run_config)
    assert settings.audit_settings() == audit and type(audit) is AuditSettings
    assert settings.federation_settings() == FederationSettings.from_run_config(run_config)
    assert settings.extra == {"some-app-key": 1}
    audit_keys = {f.name for f in dataclasses.fields(AuditSettings)}
    fed_keys = {f.name for f in dataclasses.fields(FederationSettings)}
    assert not audit_keys & fed_keys
    assert {f.name for f in dataclasses.fields(RunSettings)} == audit_keys | fed_keys | {"extra"}
    # a bad federation value is the federation's to refuse: the audit parses past it
    assert AuditSettings.from_run_config({**run_config, "lr": -1.0}).attack_iterations == 7
    # what needs both is the composition's: the federation's seed and defense reach the AttackConfig
    assert settings.attack_config().seed == 5 and audit.attack_config().seed == AttackConfig().seed
    assert settings.attack_config(FederationSettings(seed=9)).seed == 9


# --- the ready-made run-config files -------------------------------------------------------------

PRESET_FILES = run_configs.names()


def test_the_preset_files_are_there():
    assert {"paper", "learning-femnist", "learning-cifar100"} <= set(PRESET_FILES)


@pytest.mark.parametrize("name", PRESET_FILES)
def test_every_preset_file_is_a_valid_run_config(name):
    config = run_configs.load(name)
    assert config and set(config) <= set(PYPROJECT), sorted(set(config) - set(PYPROJECT))  # no typo lands in extra
    settings = RunSettings.from_run_config({**PYPROJECT, **config})
    assert settings.extra == {}


def test_the_paper_file_is_the_paper_preset():
    settings = RunSettings.from_run_config({**PYPROJECT, **run_configs.load("paper")})
    assert settings.protocol == PAPER
    assert (settings.attack_iterations, settings.attack_nodes) == (PRESETS["paper"].iterations, PRESETS["paper"].nodes)
    assert settings.methods == ["pisme"] and settings.attack_labels == "recovered"


def test_unknown_preset_file():
    with pytest.raises(
        ValueError,
        match="unknown run config 'papr'; choose from: flower-app, learning-cifar100, learning-femnist, "
        "memory-cifar100, memory-femnist, paper",
    ):
        run_configs.load("papr")


def test_the_leakage_study_reads_its_runs_from_the_files_unchanged():
    """The study's runs are the presets' keys as written (the regime of docs/leakage-over-rounds.md), with
    the attack left to the audit's rule: no attack-iterations, -nodes or -lr-schedule pinned."""
    from analysis.leakage_study import RUNS

    learning = {
        "num-server-rounds": 15,
        "samples-per-client": 16,
        "batch-size": 8,
        "local-epochs": 5,
        "lr": 0.05,
        "attack-method": "pisme",
        "attack-memory": "keep",
        "attack-options": "label_estimator=aux",
        "server-test-samples": 1000,
        "seed": 0,
    }
    expected = [
        ("femnist", {**learning, "dataset": "femnist", "attack-clients": "0,1,2"}, 20),
        ("cifar100", {**learning, "dataset": "cifar100", "attack-clients": "0,1"}, 20),
    ]
    assert [(n, list(c.items()), s) for n, c, s in RUNS] == [(n, list(c.items()), s) for n, c, s in expected]


# --- the standalone CLI: --preset and --option ----------------------------------------------------


def _settings(*argv):
    from fl_attack import cli

    return cli._settings(cli.build_parser().parse_args(["attack", *argv]))


def test_the_cli_defaults_are_the_paper_preset():
    assert _settings() == AttackSettings()


def test_a_preset_sets_protocol_iterations_and_nodes_under_the_flags():
    s = _settings("--preset", "cpu", "--nodes", "3")
    assert (s.protocol, s.iterations, s.nodes) == (PRESETS["cpu"].protocol, 100, 3)
    s = _settings("--preset", "tiny", "--local-epochs", "1", "--option", "iterations=5")
    assert (s.samples, s.batch_size, s.local_epochs, s.iterations, s.nodes) == (4, 2, 1, 5, 3)


def test_option_sets_any_attack_setting():
    s = _settings(
        "--option",
        "tv_weight=0.02,lr_control_point=1e-4",
        "--option",
        "tv_reduction=sum",
        "--option",
        "nodes=2",
        "--label-refine",
        "0.25",
    )
    assert s.overrides == {"tv_weight": 0.02, "lr_control_point": 1e-4, "tv_reduction": "sum", "label_refine": 0.25}
    config = s.attack_config()
    assert (config.tv_weight, config.tv_reduction, config.label_refine, config.nodes) == (0.02, "sum", 0.25, 2)


BAD_OPTIONS = [
    (["--option", "tv_weight"], "--option: expected key=value, got 'tv_weight'"),
    (
        ["--option", "tv_wieght=0.02"],
        "--option: unknown attack setting 'tv_wieght'; known: ['auto', 'bn_stats_weight', ",
    ),
    (["--option", "tv_weight=much"], "--option 'tv_weight' must be a number, got 'much'"),
    (["--option", "nodes=2.5"], "--option 'nodes' must be an integer, got '2.5'"),
    (["--option", "tv_reduction=max"], "tv_reduction must be 'mean' or 'sum', got 'max'"),
    (
        ["--option", "iterations=5", "--iterations", "6"],
        "--option: iterations is set here and by --iterations; give one",
    ),
    (
        ["--option", "label_refine=0.5", "--label-refine", "0.25"],
        "--option: label_refine is set here and by --label-refine; give one",
    ),
    (["--preset", "huge"], "argument --preset: invalid choice: 'huge' (choose from 'paper', 'cpu', 'tiny', 'audit')"),
]


@pytest.mark.parametrize("args, message", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_a_bad_option_or_preset_exits_2_in_one_line_before_training(tmp_path, capsys, monkeypatch, args, message):
    from fl_attack import standalone
    from fl_attack.cli import main

    monkeypatch.setattr(standalone, "_train_victim", lambda *a, **k: pytest.fail("trained"))
    out = tmp_path / "out"
    assert main(["attack", *args, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fl-attack: error: {message}"), captured.err
    assert captured.out == "" and not out.exists()


def test_a_tiny_preset_run_records_its_options(tmp_path):
    from fl_attack.cli import main

    out = tmp_path / "run"
    assert (
        main(
            [
                "attack",
                "--preset",
                "tiny",
                "--methods",
                "ig",
                "--option",
                "tv_weight=0.02",
                "--device",
                "cpu",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    recorded = json.loads((out / "settings.json").read_text())
    protocol = (recorded["samples"], recorded["batch_size"], recorded["local_epochs"], recorded["lr"])
    assert protocol == (4, 2, 2, 0.004) and recorded["iterations"] == 3 and recorded["nodes"] == 3
    assert recorded["overrides"] == {"tv_weight": 0.02} and recorded["preset"] == "tiny"
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 2 and ",4," in rows[1]  # local_steps T = 2 * ceil(4/2)


def test_every_federations_study_run_is_a_valid_run_config_for_its_supernodes():
    """A typo or a partition too small would stop the study in its n-th federation, an hour in:
    every run's keys are known, it validates and its data gives each supernode its partition."""
    from analysis.federations_study import REPLAYS, RUNS

    for name, config, supernodes in RUNS:
        assert set(config) <= set(PYPROJECT), (name, sorted(set(config) - set(PYPROJECT)))
        settings = RunSettings.from_run_config({**PYPROJECT, **config}).with_partitions(supernodes)
        settings.validate()
        settings.check_partitions(supernodes)
    naive = {name for name, args in REPLAYS if "optimizer_aware=false" in args}
    assert naive == {n for n, c, _ in RUNS if c.get("client-optimizer", "sgd") != "sgd"}
    assert all(name in dict((n, c) for n, c, _ in RUNS) for name, _ in REPLAYS)


@pytest.mark.parametrize("study", ["leakage_study", "federations_study"])
def test_a_study_refuses_an_unknown_run_before_launching_anything(study, tmp_path, capsys):
    import importlib

    main = importlib.import_module(f"analysis.{study}").main
    assert main(["--out", str(tmp_path), "--only", "nope"]) == 2
    assert "unknown run(s) ['nope']" in capsys.readouterr().err and not (tmp_path / "runs").exists()
