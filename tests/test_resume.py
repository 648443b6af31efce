"""Resume on the real path: a federation launched with flwr run, killed in round 3 after its
rounds.csv row but before its checkpoint, resumed from round 2's checkpoint, gives the same
rounds.csv as an uninterrupted run with the same seed (round 3's first row cut back, not doubled).
Resume's refusals and cut-back on real run folders, without a federation, are below it."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fl_attack.audit.run_folder import RunFolder
from fl_attack.audit.settings import RunSettings
from fl_attack.schema import ATTACK_COLUMNS
from strategies.server_app import prepare_resume, write_run_config

ROOT = Path(__file__).resolve().parent.parent
CONFIG = (
    'num-server-rounds=3 samples-per-client=10 batch-size=5 local-epochs=1 lr=0.05 attack-clients="0" '
    'attack-method="ig" attack-iterations=5 server-test-samples=300'
)
# Timings and the attacker's progress differ from run to run; everything else must not.
TIMING = {"seconds", "attacks_in_flight", "attack_lag_rounds"}


def launch(tmp_path, run_config: str, env_extra=None, config: str = CONFIG):
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home"), **(env_extra or {})}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "strategies.launch",
            "--run-config",
            f'{config} results-dir="{tmp_path / "results"}" {run_config}',
            "--federation-config",
            "num-supernodes=3 client-resources-num-cpus=1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def write_rows(path: Path, records: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)


@pytest.mark.runtime
# 144 s (three federations): slow for the suite's 15-minute budget; CI keeps the cut-back and SIGKILL tests below
@pytest.mark.slow
def test_an_interrupted_run_resumes_from_its_last_round(tmp_path):
    """Also with a remembering server (attack-memory="keep"): the resumed run starts from the
    memory.pt the crash left, cut back to the checkpoint, and its history goes on from it."""
    from fl_attack.attacker.memory import AttackMemory

    whole = launch(tmp_path, 'run-name="whole" attack-memory="keep"')
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    # ":settled": the crash first waits for rounds 1-2's attacks, so their rows and memory are on disk.
    crash = {"FL_ATTACK_CRASH_AFTER_ROUND": "3:before-checkpoint:settled"}
    crashed = launch(tmp_path, 'run-name="cut" attack-memory="keep"', crash)
    run = tmp_path / "results" / "cut"
    assert crashed.returncode != 0 and not (run / "summary.json").exists()
    assert [r["round"] for r in rows(run / "rounds.csv")] == ["1", "2", "3"]  # a row past the checkpoint
    assert RunFolder(run).load_checkpoint()[0] == 2
    # What the memory held of rounds 1-2 at the crash (a round-3 candidate there is past the checkpoint).
    remembered = AttackMemory.load(run / "memory.pt").clients[(0, "ig+memory")].history
    before = [c.fit for c in remembered if max(c.rounds) <= 2]
    assert before, "rounds 1-2's memory is not in the memory.pt the crash left"
    # (Starting the folder again, or resuming a record with columns this version does not know, is
    # refused: tested on real folders below, without a federation.)
    attacks_csv = run / "attacks.csv"
    recorded = rows(attacks_csv)
    early = sorted((r["round"], r["method"]) for r in recorded if int(r["round"]) <= 2)
    assert early == [(r, m) for r in ("1", "2") for m in ("ig", "ig+memory")], early
    # One recorded before a column was added (as by an older version) gets the column, empty.
    write_rows(attacks_csv, recorded, [c for c in ATTACK_COLUMNS if c != "device"])
    resumed = launch(tmp_path, f'resume="{run}" attack-memory="keep"')
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    after = AttackMemory.load(run / "memory.pt").clients[(0, "ig+memory")].history
    assert [c.fit for c in after if max(c.rounds) <= 2] == before  # the memory went on from the crash's
    held = [r for r in rows(attacks_csv) if r["round"] == "3" and r["method"] == "ig+memory"]
    assert len(held) == 1 and held[0]["memory"] == "keep"
    assert float(held[0]["lsim_honest"]) <= min(before)  # never worse than what it remembered
    with open(attacks_csv) as f:
        assert next(csv.reader(f)) == ATTACK_COLUMNS
    migrated = {(r["round"], r["partition_id"], r["method"]): r for r in rows(attacks_csv)}
    for old in recorded:
        if int(old["round"]) <= 2:
            assert migrated[(old["round"], old["partition_id"], old["method"])] == {**old, "device": ""}
    assert migrated[("3", "0", "ig")]["device"] == "cpu"
    expected, got = rows(tmp_path / "results" / "whole" / "rounds.csv"), rows(run / "rounds.csv")
    assert [r["round"] for r in got] == ["1", "2", "3"]
    for want, have in zip(expected, got):
        assert {k: v for k, v in want.items() if k not in TIMING} == {k: v for k, v in have.items() if k not in TIMING}
    # Every attack row once, round 3's from the resumed run; the config says it was resumed.
    attacks = sorted((r["round"], r["partition_id"], r["method"]) for r in rows(run / "attacks.csv"))
    assert attacks == [(r, "0", m) for r in ("1", "2", "3") for m in ("ig", "ig+memory")], attacks
    assert {r["round"] for r in rows(run / "updates" / "index.csv")} == {"1", "2", "3"}
    config = json.loads((run / "config.json").read_text())
    assert config["resumed"][0]["after_round"] == 2 and len(config["resumed"]) == 1
    assert "resumed after round 2" in (run / "events.log").read_text()


# --- resume's checks and cut-back on real run folders (no federation) ---------------------------


def _interrupted_run(tmp_path, done=2, recorded=3, **keys):
    """A run folder as a federation leaves it when killed after round ``done``'s checkpoint, with
    rows of rounds 1..``recorded`` in every CSV (rows past the checkpoint: a crash mid-round)."""
    values = {"num-server-rounds": 4, "resume": "", **keys}
    settings = RunSettings.from_run_config(values)
    folder = RunFolder(tmp_path / "run")
    write_run_config(folder, settings, values, num_nodes=2)
    folder.save_checkpoint(done, settings.new_model(seed=0).state_dict())
    for r in range(1, recorded + 1):
        folder.append_round({"round": r, "clients": 2})
        folder.append_attack({"round": r, "partition_id": 0, "method": "ig", "status": "ok", "image": "x.png"})
    (folder.updates).mkdir()
    index = "round,partition_ids,node_id,client_id,aggregate,file,sha256\n"
    (folder.updates / "index.csv").write_text(index + "".join(f"{r},0,,w,False,f{r}.pt,0\n" for r in range(1, 4)))
    return folder, values


def test_resume_cuts_every_record_back_to_the_checkpoint(tmp_path):
    folder, values = _interrupted_run(tmp_path)
    settings = RunSettings.from_run_config({**values, "resume": str(folder)})
    run, done, arrays = prepare_resume(settings, {**values, "resume": str(folder)})
    assert done == 2 and run.path == folder.path and arrays
    assert [r["round"] for r in rows(folder.rounds_file)] == ["1", "2"]
    assert [r["round"] for r in rows(folder.attacks_file)] == ["1", "2"]
    assert [r["round"] for r in rows(folder.updates / "index.csv")] == ["1", "2"]


@pytest.mark.runtime
def test_resume_removes_the_half_written_file_a_killed_writer_left(tmp_path):
    """A process SIGKILLed inside an atomic write (fl_attack.records: the soak's memory.pt, 16 MB)
    leaves its temporary file; the resume removes it, says so in events.log, and keeps the rest."""
    import signal

    folder, values = _interrupted_run(tmp_path)
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from fl_attack.records import _temp_beside\n"
        "fd, name = _temp_beside(Path(sys.argv[1]))\n"
        "os.write(fd, b'half of a memory')\n"
        "print(name, flush=True)\n"
        "time.sleep(600)\n"
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", script, str(folder.memory_file)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    left = Path(writer.stdout.readline().strip())  # the event: it is writing
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    assert left.is_file() and left.parent == folder.path and left.name.startswith(".memory.pt.")
    settings = RunSettings.from_run_config({**values, "resume": str(folder)})
    prepare_resume(settings, {**values, "resume": str(folder)})
    assert not left.exists() and folder.checkpoint_file.is_file()
    assert f"resume: removed {left.name}, left half-written" in (folder.path / "events.log").read_text()


def test_resume_refuses_another_run_config_and_a_finished_run(tmp_path):
    folder, values = _interrupted_run(tmp_path)
    resume = {"resume": str(folder)}
    changed = {**values, **resume, "lr": 0.1}
    with pytest.raises(ValueError, match="differs from the interrupted run's in lr; only "):
        prepare_resume(RunSettings.from_run_config(changed), changed)
    assert [r["round"] for r in rows(folder.rounds_file)] == ["1", "2", "3"]  # refused: nothing cut
    allowed = {**values, **resume, "attack-timeout": 60.0}  # where and how fast attacks run may change
    assert prepare_resume(RunSettings.from_run_config(allowed), allowed)[1] == 2
    finished = {**values, **resume, "num-server-rounds": 2}
    with pytest.raises(ValueError, match="has finished all 2 rounds; raise num-server-rounds"):
        prepare_resume(RunSettings.from_run_config(finished), finished)


def test_a_run_recorded_before_attack_precision_existed_resumes_at_fp32(tmp_path):
    """A config.json without attack-precision (recorded by an older version) ran in fp32: resuming
    it at fp32 is the same run, at bf16 it is another one."""
    folder, values = _interrupted_run(tmp_path)
    assert "attack-precision" not in folder.read_config()["run_config"]
    fp32 = {**values, "resume": str(folder), "attack-precision": "fp32"}
    assert prepare_resume(RunSettings.from_run_config(fp32), fp32)[1] == 2
    bf16 = {**fp32, "attack-precision": "bf16"}
    with pytest.raises(ValueError, match="differs from the interrupted run's in attack-precision; only "):
        prepare_resume(RunSettings.from_run_config(bf16), bf16)


def test_resume_refuses_a_record_with_columns_this_version_does_not_write(tmp_path):
    """A record from a newer version is refused before anything is cut or written: every file stays
    byte for byte as it was."""
    folder, values = _interrupted_run(tmp_path)
    recorded = rows(folder.attacks_file)
    write_rows(folder.attacks_file, [{**r, "future": "x"} for r in recorded], [*ATTACK_COLUMNS, "future"])
    files = [folder.attacks_file, folder.rounds_file, folder.updates / "index.csv"]
    before = [f.read_bytes() for f in files]
    resume = {**values, "resume": str(folder)}
    with pytest.raises(ValueError, match=r"columns this version does not write \(\['future'\]\)"):
        prepare_resume(RunSettings.from_run_config(resume), resume)
    assert [f.read_bytes() for f in files] == before


def test_resume_refuses_a_folder_without_a_readable_checkpoint(tmp_path):
    folder, values = _interrupted_run(tmp_path)
    folder.checkpoint_file.write_bytes(b"cut off")
    resume = {**values, "resume": str(folder)}
    with pytest.raises(ValueError, match="cannot be resumed: .*checkpoint.pt is not a checkpoint") as info:
        prepare_resume(RunSettings.from_run_config(resume), resume)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("damage", ["missing", "cut off", "another file"])
def test_a_remembering_run_without_a_readable_memory_is_refused_before_anything_is_cut(tmp_path, damage):
    """With attack-memory on, the server's memory cannot be rebuilt from the record: a resume whose
    memory.pt is gone or unreadable is refused in one line (it used to go on from an empty memory
    when the file was gone, and die with a traceback after the SuperLink started when it was
    corrupt), and no record is cut."""
    folder, values = _interrupted_run(tmp_path, **{"attack-memory": "keep"})
    resume = {**values, "resume": str(folder)}
    settings = RunSettings.from_run_config(resume)
    settings.attack_memory_state().save(folder.memory_file)
    intact = folder.memory_file.read_bytes()
    if damage == "missing":
        folder.memory_file.unlink()
    else:
        folder.memory_file.write_bytes(intact[: len(intact) // 2] if damage == "cut off" else b"garbage")
    with pytest.raises(
        ValueError, match=r"cannot be resumed: .*memory.pt (is missing|is not an attack memory)"
    ) as info:
        prepare_resume(settings, resume)
    assert "\n" not in str(info.value) and "attack-memory='keep'" in str(info.value)
    assert [r["round"] for r in rows(folder.rounds_file)] == ["1", "2", "3"]  # refused: nothing cut
    folder.memory_file.write_bytes(intact)  # restored: the same resume goes on
    assert prepare_resume(settings, resume)[1] == 2


def _tree(pid: int) -> list[int]:
    """pid and its live descendants, read from /proc (independent of the launcher's own helpers)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(current := todo.pop())
        todo += parents.get(current, [])
    return found


@pytest.mark.runtime
@pytest.mark.slow
def test_a_launcher_killed_from_outside_keeps_its_record_and_resumes(tmp_path):
    """SIGKILL of the launcher and every process it started (SuperLink, flwr, the apps), from
    outside, once round 1's checkpoint is on disk and with round 1's attack in flight (every attack
    waits for a gate file that does not exist yet): the rounds it recorded are kept whole, the
    resumed run first runs the kept round's attack that died in flight, and goes on to the end
    with no round twice and no attack missing."""
    import signal
    import time

    from fl_attack.attacker.runtime.workers import GATE_ENV

    gate = tmp_path / "attacks-may-end"
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home"), GATE_ENV: str(gate)}
    run = tmp_path / "results" / "killed"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "strategies.launch",
            "--run-config",
            f'{CONFIG} results-dir="{tmp_path / "results"}" run-name="killed"',
            "--federation-config",
            "num-supernodes=3 client-resources-num-cpus=1",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 600
        while not (run / "checkpoint.pt").exists():  # wait for the event
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint.pt within 600 s of the launch"
            time.sleep(0.2)
    finally:
        for pid in reversed(_tree(proc.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    done, _ = RunFolder(run).load_checkpoint()
    kept = [r["round"] for r in rows(run / "rounds.csv")]
    assert done >= 1 and kept[:done] == [str(r) for r in range(1, done + 1)]
    assert not (run / "attacks.csv").exists() or not rows(run / "attacks.csv")  # died in flight
    gate.touch()
    resumed = launch(tmp_path, f'resume="{run}"', env_extra={GATE_ENV: str(gate)})
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert [r["round"] for r in rows(run / "rounds.csv")] == ["1", "2", "3"]
    assert (run / "summary.json").is_file()
    assert sorted((a["round"], a["partition_id"]) for a in rows(run / "attacks.csv")) == [
        ("1", "0"),
        ("2", "0"),
        ("3", "0"),
    ]
    assert (
        f"resume: running the {done} attack(s) of the kept rounds left in flight first"
        in (run / "events.log").read_text()
    )


def test_an_unnamed_run_gets_a_fresh_folder_and_a_named_one_never_reuses_one(tmp_path, monkeypatch):
    """Three unnamed runs started within one second (the run name's clock held still) get the
    timestamped name, then -2 and -3; a named run never goes into a folder that holds a run."""
    from types import SimpleNamespace

    from fl_attack.audit import service
    from fl_attack.audit.service import new_run_folder

    monkeypatch.setattr(service, "time", SimpleNamespace(strftime=lambda fmt: "20250102-030405"))
    settings = RunSettings.from_run_config({"results-dir": str(tmp_path), "attack-method": "pisme"})
    first = new_run_folder(settings)
    first.write_config({})
    second = new_run_folder(settings)
    second.write_config({})
    third = new_run_folder(settings)
    assert first.path == tmp_path / "20250102-030405-femnist-pisme"
    assert (second.path.name, third.path.name) == (f"{first.path.name}-2", f"{first.path.name}-3")
    named = RunSettings.from_run_config({"results-dir": str(tmp_path), "run-name": first.path.name})
    with pytest.raises(ValueError, match="already holds a run; choose another run-name, or resume it"):
        new_run_folder(named)
