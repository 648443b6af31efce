"""The launcher abandons a run that goes silent (strategies/launch.py), without a real federation:
the flwr command is replaced by a small Python script."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

import strategies.launch as launch

SILENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("child", child.pid, flush=True)
time.sleep(120)
"""


# Ignores SIGTERM, it and its child: only the SIGKILL that follows the grace period ends them.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
child.stdout.readline()  # the child ignores SIGTERM from here on
print("child", child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has exited, only not been reaped


@pytest.fixture
def fake_flwr(monkeypatch, tmp_path):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))

    def use(script: str):
        monkeypatch.setattr(
            launch, "_flwr_command", lambda config_file, federation, superlink=None: [sys.executable, "-c", script]
        )

    return use


def test_a_silent_run_is_abandoned_and_its_process_group_killed(fake_flwr, capsys):
    fake_flwr(SILENT)
    rc = launch.main(["--silence-timeout", "2", "--timeout", "60"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert (
        "fl-attack: error: run abandoned: no output for 2 s (--silence-timeout); the flwr process group was killed"
        in err
    )
    child = int(re.search(r"child (\d+)", out).group(1))
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the flwr command's child outlived it"


def test_the_overall_timeout_is_checked_even_while_lines_keep_coming(fake_flwr, capsys):
    fake_flwr("import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.2)\n")
    assert launch.main(["--silence-timeout", "5", "--timeout", "2"]) == 1
    assert "run abandoned: still running after 2 s (--timeout)" in capsys.readouterr().err


def test_a_run_that_ends_by_itself_is_not_abandoned(fake_flwr, capsys):
    fake_flwr("print('no federation here')")
    assert launch.main(["--silence-timeout", "5"]) == 1  # it never started a run, so it did not complete
    out, err = capsys.readouterr()
    assert "no federation here" in out and "abandoned" not in err and "did not complete (status: not started)" in err


@pytest.mark.parametrize(
    "flag, value", [("--silence-timeout", "0"), ("--silence-timeout", "inf"), ("--timeout", "-1"), ("--timeout", "nan")]
)
def test_timeouts_must_be_finite_and_positive(flag, value, capsys):
    assert launch.main([flag, value]) == 2
    assert f"fl-attack: error: {flag} must be a finite number of seconds > 0, got " in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--deployment", "2", "--federation-config", "num-supernodes=2"], "--federation-config sets simulation"),
        (["--deployment", "0"], "--deployment needs at least 1 SuperNode, got 0"),
        (["--deployment", "2", "--run-config", 'attack-clients="2"'], "the federation has 2 node(s)"),
    ],
)
def test_deployment_options_are_checked_before_anything_starts(argv, message, fake_flwr, capsys):
    fake_flwr("raise SystemExit('flwr must not run')")
    assert launch.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("federation", ["num-supernodes=2 client-resources-num-cpus=0.5", "num-supernodes=1.5"])
def test_fractional_federation_resources_are_refused_before_anything_starts(federation, fake_flwr, capsys):
    fake_flwr("raise SystemExit('flwr must not run')")
    assert launch.main(["--federation-config", federation]) == 2
    assert "must be a whole number >= 1 (Flower takes no fractions)" in capsys.readouterr().err


def test_deployment_and_superlink_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        launch.main(["--deployment", "2", "--superlink", "127.0.0.1:9093"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_superlink_submits_to_that_address_through_a_connection_of_its_own(fake_flwr, monkeypatch, capsys):
    """--superlink HOST:PORT: flwr run gets a connection name, whose address and insecure flag are
    in the config.toml of the FLWR_HOME the command runs with; nothing is started or stopped."""
    seen = {}
    script = "import os, pathlib; print((pathlib.Path(os.environ['FLWR_HOME']) / 'config.toml').read_text())"

    def command(config_file, federation, superlink=None):
        seen.update(federation=federation, superlink=superlink)
        return [sys.executable, "-c", script]

    monkeypatch.setattr(launch, "_flwr_command", command)
    monkeypatch.setattr(launch, "_stop_superlink", lambda port: seen.setdefault("stopped", port))
    assert launch.main(["--superlink", "10.0.0.5:9093", "--silence-timeout", "30"]) == 1  # no run started
    out = capsys.readouterr().out
    assert seen == {"federation": None, "superlink": launch.CONNECTION}
    assert f'default = "{launch.CONNECTION}"' in out and 'address = "10.0.0.5:9093"' in out and "insecure = true" in out


@pytest.mark.heavy
def test_a_flwr_that_ignores_sigterm_is_killed_with_sigkill(fake_flwr, capsys):
    fake_flwr(STUBBORN)
    assert launch.main(["--silence-timeout", "2", "--timeout", "60"]) == 1
    out, err = capsys.readouterr()
    assert "run abandoned: no output for 2 s (--silence-timeout); the flwr process group was killed" in err
    child = int(re.search(r"child (\d+)", out).group(1))
    deadline = time.monotonic() + 10  # a wait for the event, not a bound: SIGKILL'd processes exit at once
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "a SIGTERM-ignoring child survived the SIGKILL escalation"


# A stand-in for the SuperLink flwr run starts: named like it (found by the launcher's control port),
# in a session of its own. As in Flower 1.42, it starts the SuperExec in another session of its own
# (ps: flower-superexec --parent-pid SUPERLINK has its own sid), and the SuperExec starts the simulation
# (flwr-simulation: the ServerApp, its attacker and Ray) in that session; the simulation ignores SIGTERM.
SIMULATION = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(600)"
SUPEREXEC = (
    "import subprocess, sys, time\n"
    f"child = subprocess.Popen([sys.executable, '-c', {SIMULATION!r}], stdout=subprocess.PIPE, text=True)\n"
    "child.stdout.readline()\n"
    "print('simulation', child.pid, flush=True)\n"
    "time.sleep(600)\n"
)
SUPERLINK = (
    "import subprocess, sys, time\n"
    f"superexec = subprocess.Popen([sys.executable, '-c', {SUPEREXEC!r}], start_new_session=True, "
    "stdout=subprocess.PIPE, text=True)\n"
    "print(superexec.stdout.readline().strip(), 'superexec', superexec.pid, flush=True)\n"
    "time.sleep(600)\n"
)
DETACHED_SUPERLINK = f"""
import os, subprocess, sys, time
port = os.environ["FLWR_LOCAL_CONTROL_API_PORT"]
superlink = subprocess.Popen([sys.executable, "-c", {SUPERLINK!r}, "flower-superlink", "--control-api-address",
                              "127.0.0.1:" + port], start_new_session=True, stdout=subprocess.PIPE, text=True)
print(superlink.stdout.readline().strip(), "superlink", superlink.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.heavy
def test_an_abandoned_run_stops_the_superlinks_whole_session(fake_flwr, capsys):
    """flwr run starts the SuperLink in a session of its own, and the SuperLink's simulation process
    (the ServerApp and its attacker) outlived a SIGTERM of the SuperLink alone: a real run abandoned by
    --timeout went on attacking for 25 minutes after its launcher had exited. The launcher now ends the
    SuperLink's whole session and the sessions of the processes under it (the SuperExec's, which holds the
    simulation and Ray: one outlived a stopped study by 25 s), with SIGKILL after the grace period."""
    fake_flwr(DETACHED_SUPERLINK)
    assert launch.main(["--silence-timeout", "2"]) == 1
    out = capsys.readouterr().out
    found = re.search(r"simulation (\d+) superexec (\d+) superlink (\d+)", out)
    assert found, out
    simulation, superexec, superlink = (int(found.group(i)) for i in (1, 2, 3))
    deadline = time.monotonic() + 30  # a wait for the event (the launcher waits for them itself)
    while any(map(_alive, (simulation, superexec, superlink))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(superlink), "the SuperLink survived the launcher"
    assert not _alive(superexec), "the SuperExec (a session of its own under the SuperLink) survived the launcher"
    assert not _alive(simulation), "the SuperExec's simulation process survived the launcher"


@pytest.mark.parametrize(
    "run_config, message",
    [
        ("samples-per-client=5000", "partitions of 5000 samples; lower num-supernodes or samples-per-client"),
        ('data-dir="/no/such/folder"', "invalid run config: data-dir: "),
    ],
)
def test_data_that_cannot_serve_the_federation_is_refused_before_anything_starts(
    fake_flwr, capsys, run_config, message
):
    fake_flwr("raise SystemExit('flwr started')")  # reached only if the checks let it through
    assert launch.main(["--run-config", run_config, "--federation-config", "num-supernodes=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fl-attack: error: ") and message in err, err


def test_a_resume_without_a_readable_checkpoint_is_refused_in_one_line_before_anything_starts(
    fake_flwr, capsys, tmp_path
):
    from fl_attack.audit.run_folder import RunFolder

    run = RunFolder(tmp_path / "run")
    run.write_config({"run_config": {}})
    run.checkpoint_file.write_bytes(b"not a checkpoint")  # cut off, or another file
    fake_flwr("raise SystemExit('flwr started')")
    assert launch.main(["--run-config", f'resume="{run}"']) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"resume='{run}' cannot be resumed: {run.checkpoint_file}" in err, err
    assert "weights_only" not in err


@pytest.mark.runtime
def test_a_resume_that_does_not_fit_its_run_is_refused_in_one_line_before_anything_starts(fake_flwr, capsys, tmp_path):
    """The resume checks the ServerApp makes (the run config equals the interrupted run's, its
    memory.pt is readable) run in the launcher too: they used to fail after the SuperLink had
    started, with a traceback and exit 1."""
    import tomllib

    from fl_attack.audit.run_folder import RunFolder
    from fl_attack.audit.settings import RunSettings
    from strategies.server_app import write_run_config

    defaults = tomllib.loads((launch.ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    recorded = {**defaults, "attack-memory": "keep", "num-server-rounds": 4}
    settings = RunSettings.from_run_config(recorded)
    run = RunFolder(tmp_path / "run")
    write_run_config(run, settings, recorded, num_nodes=2)
    run.save_checkpoint(2, settings.new_model(seed=0).state_dict())
    settings.attack_memory_state().save(run.memory_file)
    fake_flwr("raise SystemExit('flwr started')")  # reached only if the checks let it through
    same = ["--run-config", f'resume="{run}" attack-memory="keep" num-server-rounds=4']
    cases = [
        (
            ["--run-config", f'resume="{run}" attack-memory="joint" num-server-rounds=4'],
            "differs from the interrupted run's in attack-memory",
        ),
        (["--run-config", f'resume="{run}" attack-memory="keep" num-server-rounds=2'], "has finished all 2 rounds"),
    ]
    for argv, message in cases:
        assert launch.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("fl-attack: error: ") and message in err, err
    run.memory_file.write_bytes(b"garbage")
    assert launch.main(same) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"cannot be resumed: {run.memory_file} is not an attack memory" in err, err
    settings.attack_memory_state().save(run.memory_file)  # restored: the checks let it through to flwr
    assert launch.main(same) != 2
    out, err = capsys.readouterr()
    assert "flwr started" in out + err and "invalid run config" not in err, (out, err)


# A flwr that "completes" a run: it names the run and its folder as flwr and the ServerApp do, and
# leaves rounds.csv; summary.json is what the test varies.
COMPLETES = """
import sys
from pathlib import Path
run = Path(sys.argv[-1])
run.mkdir(parents=True, exist_ok=True)
(run / "rounds.csv").write_text("round\\n1\\n")
print("started run 7", flush=True)
print(f"fl-attack: leakage record in {run}", flush=True)
"""


def _complete_with_summary(monkeypatch, tmp_path, summary: str | None) -> Path:
    """A fake flwr that completes a run in tmp_path/results/run, whose summary.json is ``summary``
    (None: none), and a faked final status "completed"; returns the run folder."""
    run = tmp_path / "results" / "run"
    if summary is not None:
        run.mkdir(parents=True)
        (run / "summary.json").write_text(summary)
    monkeypatch.setattr(
        launch,
        "_flwr_command",
        lambda config_file, federation, superlink=None: [sys.executable, "-c", COMPLETES, str(run)],
    )
    monkeypatch.setattr(launch, "_final_status", lambda run_id, env, superlink=None: "completed")
    return run


@pytest.mark.parametrize("summary", [None, "{not json", '{"attacks": 1, "attacks_ok": 1, "writes_refused": {}}'])
def test_a_completed_run_without_a_readable_summary_exits_1(fake_flwr, monkeypatch, capsys, tmp_path, summary):
    """Unit test (a fake flwr, a faked final status): the ServerApp writes summary.json last, so a
    run whose summary.json the disk refused (missing or torn) ends with one error line and exit 1;
    a readable one ends with 0."""
    run = _complete_with_summary(monkeypatch, tmp_path, summary)
    rc = launch.main(["--silence-timeout", "30"])
    err = capsys.readouterr().err
    if summary and summary.startswith('{"'):
        assert rc == 0, err
    else:
        assert rc == 1 and f"{run}/summary.json is missing or unreadable" in err, err


@pytest.mark.parametrize(
    "summary, named",
    [
        ({"writes_refused": {"checkpoints": [1]}}, "checkpoints of round(s) 1"),
        ({"attacks_unwritten": 1}, "1 attacks.csv row(s) (kept in unwritten-*.pt)"),
    ],
    ids=["checkpoint", "attacks-row"],
)
def test_a_completed_run_whose_record_the_disk_refused_exits_1(
    fake_flwr, monkeypatch, capsys, tmp_path, summary, named
):
    """Unit test (a fake flwr, a faked final status): a run that completed, but whose summary.json
    says the disk refused a checkpoint or an attacks.csv row, ends with exit 1 and one error line
    naming what is missing (it used to end with 0)."""
    _complete_with_summary(monkeypatch, tmp_path, json.dumps(summary))
    rc = launch.main(["--silence-timeout", "30"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("fl-attack: error:")]
    assert rc == 1 and errors == [
        f"fl-attack: error: the disk refused part of the record: {named} (see events.log): "
        "the run may not resume or replay in full"
    ], err
