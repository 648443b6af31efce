"""One checker per attack-run value, reached from every entry point with one message (issue #58, item 1).

Each value an attack runs with (the label mode, m, the iterations, the device, the precision and tf32's
device, compile, attack-batch, the memory's rule on oracle labels, the settings options may not set)
is checked by one function in the module that owns it (fl_attack.attacker). Here the same bad value
goes through every entry point that takes it: the run config (AuditSettings.from_run_config), a
replay of a real recorded run (prepare_replay, and ``fl-attack replay``), the standalone experiment
(validate_settings of AttackSettings), the ``fl-attack attack`` command line and the paper
experiments (make_context, --grid), and each says the same message. Then the source tree holds each
message's words once, and a real ServerApp start parses attack-options once, runs its pre-flight once
and resolves attack-batch once.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from analysis.experiments.common import make_context
from fl_attack.audit.replay import ReplayError, prepare_replay
from fl_attack.audit.settings import AuditSettings
from fl_attack.cli import main
from fl_attack.standalone import AttackSettings, validate_settings

ROOT = Path(__file__).resolve().parents[1]
RUN = dict(attack_method="ig", attack_iterations=1, attack_clients="0", attack_threads=1)
TINY = ["--samples", "4", "--batch-size", "2", "--local-epochs", "1", "--iterations", "1", "--methods", "ig"]

LABELS = "labels must be 'recovered' or 'oracle', got 'x'"
NODES = "the number of quadrature nodes m must be an integer >= 1, got 0"
ITERATIONS = "iterations must be an integer >= 1, got 0"
DEVICE = "unknown device 'tpu'; use auto, cpu or cuda"
PRECISION = "precision must be one of fp32, bf16, tf32, auto, got 'fp16'"
TF32 = (
    "precision 'tf32' needs a CUDA device (TF32 is a mode of NVIDIA tensor cores), the attack runs on 'cpu'; "
    "use fp32 or bf16 there"
)
COMPILE = "compile must be one of off, on, auto, got 'yes'"
BATCH = "attack batch must be an integer >= 1 or 'auto', got '0'"
MEMORY = (
    "an attack memory keeps only what the attacker produced; it cannot be used with oracle labels (the ground truth)"
)
OWN = "nodes is set here and by"  # then the setting of its own the entry point has for it; "; give one"

# value: (its message, run config, replay's keywords, AttackSettings' fields, `fl-attack attack` flags,
# make_context's keywords); None where the entry point does not take the value.
CASES = {
    "labels": (
        LABELS,
        {"attack-labels": "x"},
        {"labels": "x"},
        {"labels": "x"},
        ["--labels", "x"],
        {"grid": {"labels": "x"}, "axes": ("labels",)},
    ),
    "m": (
        NODES,
        None,  # the run config takes 0: the audit's rule (its own message: tests/test_rule.py)
        {"nodes": 0},
        {"nodes": 0},
        ["--nodes", "0"],
        {"grid": {"nodes": "0"}, "axes": ("nodes",)},
    ),
    "iterations": (
        ITERATIONS,
        None,  # the run config takes 0: the audit's rule
        {"iterations": 0},
        {"iterations": 0},
        ["--iterations", "0"],
        {"iterations": 0},
    ),
    "device": (
        DEVICE,
        {"attack-device": "tpu"},
        {"device": "tpu"},
        {"device": "tpu"},
        ["--device", "tpu"],
        {"device": "tpu"},
    ),
    "precision": (
        PRECISION,
        {"attack-precision": "fp16"},
        {"precision": "fp16"},
        {"precision": "fp16"},
        ["--precision", "fp16"],
        {"precision": "fp16"},
    ),
    "tf32 on a CPU": (
        TF32,
        {"attack-precision": "tf32", "attack-device": "cpu"},
        {"precision": "tf32", "device": "cpu"},
        {"precision": "tf32", "device": "cpu"},
        ["--precision", "tf32", "--device", "cpu"],
        {"precision": "tf32", "device": "cpu"},
    ),
    "compile": (
        COMPILE,
        {"attack-compile": "yes"},
        {"compile": "yes"},
        {"overrides": {"compile": "yes"}},
        ["--compile", "yes"],
        {"compile": "yes"},
    ),
    "batch": (BATCH, {"attack-batch": "0"}, {"batch": "0"}, None, None, {"batch": "0"}),
    "memory with oracle labels": (
        MEMORY,
        {"attack-memory": "keep", "attack-labels": "oracle"},
        {"memory": "keep", "labels": "oracle"},
        None,
        None,
        None,
    ),
    "a setting options may not set": (
        OWN,
        {"attack-options": "nodes=5"},
        {"options": "nodes=5", "nodes": 3},
        {"overrides": {"nodes": 5}},
        ["--option", "nodes=5", "--nodes", "3"],
        None,
    ),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A real ServerApp run (strategies/server_app.py main: pre-flight, run folder, one round of two
    FEMNIST clients, partition 0 attacked with IG for 1 iteration, its update recorded), with what its
    start did counted: pre-flight runs, attack-options parses, attack-batch resolutions."""
    import fl_attack.attacker.runtime.workers as workers
    import fl_attack.audit.settings as settings_module
    from fl_attack import run_config
    from tests.inprocess import serve

    parses, resolved = [], []
    parse, resolve = settings_module.parse_key_values, workers.resolve_batch

    def counted_parse(text, *args, **kwargs):
        if args and args[1] == "attack-options":
            parses.append(text)
        return parse(text, *args, **kwargs)

    def counted_resolve(*args, **kwargs):
        resolved.append(args)
        return resolve(*args, **kwargs)

    before = run_config.preflight.runs
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings_module, "parse_key_values", counted_parse)
        patch.setattr(workers, "resolve_batch", counted_resolve)
        run = serve(tmp_path_factory.mktemp("served"), attack_options="tv_weight=0.02", **RUN)
    assert (run / "updates" / "index.csv").is_file() and (run / "summary.json").is_file()
    return run, run_config.preflight.runs - before, parses, resolved


def _message(entry, call) -> str:
    with pytest.raises((ValueError, ReplayError)) as info:
        call()
    return f"{entry}: {info.value}"


@pytest.mark.parametrize("value", list(CASES))
def test_a_bad_value_says_the_same_at_every_entry_point(served, tmp_path, capsys, value):
    message, run_config, replay, standalone, argv, context = CASES[value]
    run_dir = served[0]
    said = []
    if run_config is not None:
        said.append(_message("run config", lambda: AuditSettings.from_run_config(run_config)))
        assert said[0].startswith(f"run config: invalid run config: {next(iter(run_config))}: ")  # the checker's
    said.append(_message("replay", lambda: prepare_replay(run_dir, threads=1, **replay)))
    flags = [text for key, value in replay.items() for text in (f"--{key}", str(value))]
    assert main(["replay", str(run_dir), "--threads", "1", *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fl-attack: error: ") and not (run_dir / "replays").exists()
    said.append(f"fl-attack replay: {lines[0]}")
    if standalone is not None:
        said.append(_message("standalone", lambda: validate_settings(AttackSettings(**standalone))))
    if argv is not None:
        out = tmp_path / "out"
        assert main(["attack", *TINY, *argv, "--out", str(out)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fl-attack: error: ") and not out.exists()
        said.append(f"fl-attack attack: {lines[0]}")
    if context is not None:
        kwargs = {"device": "cpu", **context}
        said.append(_message("experiments", lambda: make_context("table1", "tiny", tmp_path / "x", **kwargs)))
    for text in said:
        assert message in text, text
    if value == "a setting options may not set":  # each entry point names its own setting of nodes
        owns = ("the run-config key attack-nodes", "--nodes", "--nodes", "AttackSettings.nodes", "--nodes")
        for text, own in zip(said, owns, strict=True):
            assert text.endswith(f"{OWN} {own}; give one"), text
    assert len(said) >= 3


# each message's distinctive words, which one raise in the source holds
WORDS = [
    "must be 'recovered' or 'oracle'",
    "quadrature nodes m must be",
    "iterations must be an integer",
    "unknown device",
    "asked for but torch sees no CUDA device",
    "precision must be one of",
    "needs a CUDA device",
    "compile must be one of",
    "attack batch must be",
    "keeps only what the attacker produced",
    "is set here and by",
    "attack-memory must be one of",
]


@pytest.mark.parametrize("words", WORDS)
def test_each_message_is_written_once_in_the_source(words):
    # the messages a raise is built from and those of (condition, message) check lists (analysis.docs reads both)
    from analysis.docs import _messages

    hits = [
        f"{path.relative_to(ROOT)}: {text}"
        for folder in ("fl_attack", "strategies", "clients", "analysis", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for text in _messages(ast.parse(path.read_text(encoding="utf-8")))
        if words in text
    ]
    assert len(hits) == 1, hits


def test_a_server_start_checks_once_parses_attack_options_once_and_resolves_attack_batch_once(served):
    run, preflights, parses, resolved = served
    assert preflights == 1
    assert parses == ["tv_weight=0.02"]  # the pre-flight's; the record, the strategy and the service reuse it
    assert len(resolved) == 1  # by the AuditService that runs the attacks; validate only checks it
    assert json.loads((run / "config.json").read_text())["attack_config"]["tv_weight"] == 0.02


def test_the_run_settings_keep_one_attack_config():
    from fl_attack.run_config import preflight

    settings = preflight({"attack-options": "tv_weight=0.02", "attack-nodes": 2}, num_nodes=3)
    assert settings.attack_config() is settings.attack_config()
    assert settings.with_partitions(3).attack_config() is settings.attack_config()  # the strategy's copy
    assert settings.attack_config().nodes == 2 and settings.attack_config().tv_weight == 0.02


def test_m_and_the_iterations_take_0_only_where_auto_is_allowed():
    """Unit test of the two checkers' flag for the run config's "chosen per update" (0)."""
    from fl_attack.attacker.attacks.base import check_iterations
    from fl_attack.attacker.quadrature import check_nodes

    for check in (check_nodes, check_iterations):
        assert check(0, allow_auto=True) == 0 and check(3) == 3
        with pytest.raises(ValueError, match=r">= 1, got 0$"):
            check(0)
        with pytest.raises(ValueError, match=r">= 0 \(0: chosen per update\), got -1$"):
            check(-1, allow_auto=True)
        for bad in (True, 2.5, "3"):
            with pytest.raises(ValueError, match="must be an integer"):
                check(bad)
