"""benchmarks/gpu_check.py, on the CPU path: every stage's record is written, a stage that fails or
runs out of time does not stop the others, the budget skips what no longer fits, a missing package
comes from the dependency archive, and an interrupted run leaves what had finished."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parent.parent


def _status(out: Path) -> dict:
    return {s["name"]: s for s in json.loads((out / "status.json").read_text())["stages"]}


@pytest.mark.runtime
@pytest.mark.slow  # about 90 s on 2 cores: run it (make test-slow) before spending device time
def test_a_quick_cpu_run_writes_every_stage_and_its_figures(tmp_path):
    """The whole check with tiny sizes on the CPU: the same commands a GPU run makes, with --device cpu.
    Slow (outside CI): the stages' own logic is tested on fakes below; this is the dry run of the real commands."""
    out, archive = tmp_path / "gpu-check", tmp_path / "back" / "gpu-check.tgz"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--quick", "--out", str(out)]
        + ["--budget-seconds", "600", "--deps", "none", "--archive", str(archive)],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    stages = _status(out)
    assert {name: s["status"] for name, s in stages.items()} == dict.fromkeys(gpu_check.STAGE_FUNCTIONS, "pass")
    for name in (
        "README.md",
        "env.txt",
        "logs/cuda-tests.log",
        "bench.json",
        "bench.txt",
        "bench.png",
        "batched.json",
        "batched.png",
        "compiled.json",
        "compiled.txt",
        "precision.json",
        "precision.txt",
        "precision.png",
        "federation.png",
        "federation-reconstruction.png",
        "federation/rounds.csv",
        "logs/federation.log",
    ):
        assert (out / name).is_file(), name
    readme = (out / "README.md").read_text()
    assert "did not use a GPU" in readme and "![batched throughput](batched.png)" in readme
    assert f"torch.cuda.is_available: {torch.cuda.is_available()}" in (out / "env.txt").read_text()
    if not torch.cuda.is_available():
        assert "CUDA test(s) skipped: no CUDA device" in stages["cuda-tests"]["note"]
    assert [r["clients"] for r in json.loads((out / "batched.json").read_text())["rows"]] == [1, 2]
    assert [r["precision"] for r in json.loads((out / "precision.json").read_text())["rows"]] == ["fp32", "bf16"]
    with open(out / "federation" / "attacks.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["status"], r["device"]) for r in rows] == [("ok", "cpu")]
    assert "strategies.launch" in " ".join(stages["federation"]["commands"])
    with tarfile.open(archive) as tar:
        assert {"gpu-check/README.md", "gpu-check/federation/attacks.csv"} <= set(tar.getnames())


@pytest.fixture
def fake_stages(monkeypatch):
    """Stages that take no time, and no import probe: each test puts its own stage functions in."""
    monkeypatch.setattr(gpu_check.Check, "prepare_deps", lambda self, always=False: None)

    def passing(check, stage, timeout):
        stage.status, stage.note = "pass", f"limit {timeout:.0f}"

    for name in gpu_check.STAGE_FUNCTIONS:
        monkeypatch.setitem(gpu_check.STAGE_FUNCTIONS, name, passing)
    return monkeypatch


def test_a_failing_or_timed_out_stage_does_not_stop_the_others(tmp_path, fake_stages):
    pids = []

    def broken(check, stage, timeout):
        raise RuntimeError("broken on purpose")

    def slow(check, stage, timeout):
        log = check.out / "logs" / "slow.log"
        cmd = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"]
        rc, timed_out = check.run(stage, cmd, 2, log)
        pids.append(int(log.read_text().splitlines()[1]))
        stage.status = "timeout" if timed_out else "pass"

    fake_stages.setitem(gpu_check.STAGE_FUNCTIONS, "bench", broken)
    fake_stages.setitem(gpu_check.STAGE_FUNCTIONS, "batched", slow)
    out = tmp_path / "out"
    assert gpu_check.main(["--device", "cpu", "--out", str(out), "--budget-seconds", "1000"]) == 1
    stages = _status(out)
    assert {n: s["status"] for n, s in stages.items()} == {
        "environment": "pass",
        "cuda-tests": "pass",
        "bench": "fail",
        "batched": "timeout",
        "compiled": "pass",
        "precision": "pass",
        "federation": "pass",
    }
    assert stages["bench"]["note"] == "RuntimeError: broken on purpose"
    with pytest.raises(ProcessLookupError):  # the timed-out command's process group was killed
        os.kill(pids[0], 0)
    assert "killed after 2 s" in (out / "logs" / "slow.log").read_text()
    assert "| batched | **timeout** |" in (out / "README.md").read_text()


def test_the_budget_cuts_each_stage_and_skips_what_no_longer_fits(tmp_path, fake_stages):
    """Each stage's limit keeps the later stages' minimum; a stage whose minimum does not fit is skipped."""
    out = tmp_path / "out"
    minimum = {name: low for name, _, low, _ in gpu_check.STAGES}
    budget = minimum["environment"] + minimum["federation"] + 10  # room for these two only
    assert gpu_check.main(["--device", "cpu", "--out", str(out), "--budget-seconds", str(budget)]) == 0
    stages = _status(out)
    assert stages["environment"]["status"] == "pass"
    for name in ("cuda-tests", "bench", "batched", "compiled", "precision"):
        assert stages[name]["status"] == "skipped" and "not enough budget left" in stages[name]["note"]
    assert stages["federation"]["status"] == "pass"
    assert gpu_check.main(["--device", "cpu", "--out", str(out), "--budget-seconds", "1"]) == 0
    assert {s["status"] for s in _status(out).values()} == {"skipped"}
    assert "not enough budget left" in (out / "README.md").read_text()


def test_stages_can_be_chosen(tmp_path, fake_stages):
    out = tmp_path / "out"
    assert gpu_check.main(["--device", "cpu", "--out", str(out), "--stages", "bench,federation"]) == 0
    assert {n: s["status"] for n, s in _status(out).items()} == {
        "environment": "skipped",
        "cuda-tests": "skipped",
        "bench": "pass",
        "batched": "skipped",
        "compiled": "skipped",
        "precision": "skipped",
        "federation": "pass",
    }
    with pytest.raises(SystemExit):
        gpu_check.main(["--out", str(out), "--stages", "bench,nothing"])


@pytest.mark.heavy
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the run on a machine without CUDA")
def test_cuda_asked_for_without_a_cuda_device_fails_and_skips_the_device_stages(tmp_path):
    out = tmp_path / "out"
    code = gpu_check.main(["--device", "cuda", "--out", str(out), "--stages", "environment,bench", "--deps", "none"])
    assert code == 1
    stages = _status(out)
    assert stages["environment"]["status"] == "fail" and "torch sees no CUDA device" in stages["environment"]["note"]
    assert stages["bench"]["status"] == "skipped" and "no CUDA device" in stages["bench"]["note"]
    assert (out / "env.txt").is_file()


def test_a_missing_package_is_unpacked_from_the_dependency_archive(tmp_path, monkeypatch):
    """As on the GPU machine, where flwr and ray are missing: the archive goes first on the stages'
    PYTHONPATH (and its bin/ on PATH), and env.txt says where each package came from."""
    monkeypatch.setattr(gpu_check, "NEEDED", ("fl_attack_gpu_check_fake",))
    archive = tmp_path / "site.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for name, text in (
            ("fl_attack_gpu_check_fake/__init__.py", "__version__ = '9.9'\n"),
            ("bin/fake-tool", "#!/bin/sh\necho fake\n"),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    check = gpu_check.Check(tmp_path / "out", "cpu", 100, True, str(archive), "", sys.executable)
    check.prepare_deps()
    assert check.imports["fl_attack_gpu_check_fake"]["version"] == "9.9"
    assert "needed beyond the machine's Python: fl_attack_gpu_check_fake" in check.deps_note
    site = Path(check.env["PYTHONPATH"].split(os.pathsep)[0])
    assert check.env["PATH"].split(os.pathsep)[0] == str(site / "bin")
    assert os.access(site / "bin" / "fake-tool", os.X_OK)
    bare = gpu_check.Check(tmp_path / "bare", "cpu", 100, True, "none", "", sys.executable)
    bare.prepare_deps()
    assert "error" in bare.imports["fl_attack_gpu_check_fake"] and "no dependency archive" in bare.deps_note


@pytest.mark.runtime
def test_an_interrupted_run_keeps_what_finished(tmp_path):
    """SIGTERM (a device's time limit) while a stage runs: the stages done are kept, the running one
    is marked, its command is killed, and README.md says the run was interrupted."""
    out, pid_file = tmp_path / "out", tmp_path / "hang.pid"
    # The hanging command writes its pid (atomically: a rename), so the test knows it runs, and which.
    hang = (
        f"import os, time; open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid())); "
        f"os.replace({str(pid_file)!r} + '.tmp', {str(pid_file)!r}); time.sleep(120)"
    )
    script = f"""
import sys
from benchmarks import gpu_check
gpu_check.Check.prepare_deps = lambda self, always=False: None
def passing(check, stage, timeout):
    stage.status = "pass"
def hang(check, stage, timeout):
    check.run(stage, [sys.executable, "-c", {hang!r}], 600, check.out / "logs" / "hang.log")
for name in gpu_check.STAGE_FUNCTIONS:
    gpu_check.STAGE_FUNCTIONS[name] = passing
gpu_check.STAGE_FUNCTIONS["bench"] = hang
sys.exit(gpu_check.main(["--device", "cpu", "--out", {str(out)!r}]))
"""
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    command = None
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists():  # wait for the event: the bench stage's command runs
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, "the bench stage's command did not start within 120 s"
            time.sleep(0.1)
        command = int(pid_file.read_text())
        assert _status(out)["bench"]["status"] == "running"
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0].decode()
        assert proc.returncode == 130, output
        stages = _status(out)
        assert [stages[n]["status"] for n in ("environment", "cuda-tests", "bench", "batched", "federation")] == [
            "pass",
            "pass",
            "fail",
            "skipped",
            "skipped",
        ]
        assert "interrupted" in stages["bench"]["note"]
        assert "**interrupted: signal SIGTERM**" in (out / "README.md").read_text()
        assert not _alive(command), "the interrupted stage's command outlived the check"
    finally:  # nothing outlives the test, whatever failed
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if command is not None and _alive(command):
            os.kill(command, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_the_cuda_tests_are_the_ones_that_mention_cuda():
    files = gpu_check.cuda_test_files()
    assert "tests/test_gradients.py" in files and "tests/test_cli.py" in files
    assert "benchmarks/test_attack_step.py" in files and "tests/test_layers.py" not in files
