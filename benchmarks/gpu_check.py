"""``python -m benchmarks.gpu_check``: the GPU check, one command (``make gpu-check``; docs/gpu-check.md).

Seven stages (STAGES: environment, cuda-tests, bench, batched, compiled, precision, federation), each a
subprocess with its own time limit, run in order; a failing stage does not stop the next ones.
Everything goes under ``--out``; README.md and status.json are rewritten atomically after every
stage (and ``--archive`` refreshed), so a run killed at any point leaves what had finished.
``--budget-seconds`` bounds the whole check: each stage's limit is its own maximum, cut so that the
later stages keep their minimum. Missing flwr, ray, lpips or piq come from ``--deps`` (unpacked
first on the stages' PYTHONPATH and PATH). Only the standard library is imported at start, so a
machine without torch still gets env.txt and a README that says what was missing.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "gpu-check"
DEFAULT_DEPS = ROOT / ".gpu-deps" / "site.tar.xz"
FEDERATION = (
    "num-supernodes={nodes} client-resources-num-cpus={cpus} client-resources-num-gpus=0.0 init-args-num-gpus=1"
)
NEEDED = ("torch", "flwr", "ray", "lpips", "piq")  # what the stages import beyond the standard library
PINNED = {"flwr": "1.42.0", "ray": "2.55.1"}  # pyproject.toml's, and those of benchmarks/gpu_deps.sh


def _flags(**options) -> list[str]:
    """``--name value`` for each option, in order (``peak_size`` -> ``--peak-size``)."""
    return [arg for name, value in options.items() for arg in (f"--{name.replace('_', '-')}", str(value))]


def _precisions(device: str) -> str:
    return "fp32,bf16,tf32" if device == "cuda" else "fp32,bf16"


@dataclass
class Sizes:
    """The settings of the stages that compute: ``full`` for a GPU, ``quick`` for a CPU dry run."""

    bench: list[str]
    precision: list[str]
    batched_clients: tuple[int, ...]
    batched: list[str]
    compiled: list[str]  # benchmarks.attack_step --compiled N (fl_attack.attacker.attacks.compiled)
    run_config: dict
    federation: str
    expected_attacks: int

    @classmethod
    def full(cls, device: str) -> Sizes:
        return cls(
            bench=_flags(datasets="cifar100,femnist", nodes="1,3,7,12", samples=50, repeats=7),
            precision=_flags(precisions=_precisions(device), datasets="cifar100,femnist", nodes=7, samples=50)
            + _flags(repeats=5, iterations=20),
            batched_clients=(1, 4, 16),
            batched=_flags(datasets="cifar100", nodes=7, samples=50, iterations=10, repeats=3),
            # the paper's CIFAR-100 size; the maxpool user model is the generic path (4 compiles, CUDA graphs)
            compiled=_flags(compiled=16, datasets="cifar100", nodes=7, samples=50, iterations=10, repeats=3),
            run_config={  # strategies/run_configs/paper.toml's protocol, 2 rounds, 300 iterations
                "dataset": "cifar100",
                "num-server-rounds": 2,
                "samples-per-client": 50,
                "batch-size": 10,
                "local-epochs": 20,
                "lr": 0.004,
                "attack-method": "pisme",
                "attack-nodes": 7,
                "attack-iterations": 300,
                "attack-clients": "0,1",
                "attack-device": device,
                "attack-actors": 2,
                "attack-num-gpus": 0.5,
                "attack-batch": "auto",  # a round's two attacks as one batch on CUDA
                "attack-compile": "auto",  # compiled (CUDA graphs) on CUDA, eager on the CPU
                "server-test-samples": 500,
                "record-updates": False,
            },
            # clients train on the CPU; Ray's one GPU is left to the two attacker actors, on a CPU too
            federation=FEDERATION.format(nodes=4, cpus=2),
            expected_attacks=4,
        )

    @classmethod
    def quick(cls, device: str) -> Sizes:
        return cls(
            bench=_flags(datasets="femnist", nodes=1, samples=4, repeats=1),
            precision=_flags(precisions=_precisions(device), datasets="femnist", nodes=1, samples=4, repeats=1)
            + _flags(iterations=1, peak_size=256),
            batched_clients=(1, 2),
            batched=_flags(datasets="femnist", nodes=1, samples=4, iterations=1, repeats=1),
            compiled=_flags(compiled=2, datasets="femnist", nodes=1, samples=4, iterations=2, repeats=1),
            run_config={
                "dataset": "femnist",
                "num-server-rounds": 1,
                "samples-per-client": 4,
                "batch-size": 2,
                "local-epochs": 1,
                "attack-method": "pisme",
                "attack-nodes": 2,
                "attack-iterations": 3,
                "attack-clients": "0",
                "attack-device": device,
                "attack-threads": 1,
                "attack-num-gpus": 0.5,
                "server-test-samples": 0,
                "record-updates": False,
            },
            federation=FEDERATION.format(nodes=2, cpus=1),
            expected_attacks=1,
        )


@dataclass
class Stage:
    name: str
    title: str
    min_seconds: float  # skipped when less than this is left for it
    max_seconds: float  # its own limit
    status: str = "pending"  # pending, running, pass, fail, timeout, skipped
    seconds: float = 0.0
    note: str = ""
    commands: list[str] = field(default_factory=list)
    body: str = ""  # markdown for README.md: tables, figures
    files: list[str] = field(default_factory=list)


STAGES = (
    ("environment", "Environment", 5, 120),
    ("cuda-tests", "CUDA tests", 20, 240),
    ("bench", "Step benchmark", 30, 180),
    ("batched", "Batched-attack throughput", 30, 180),
    ("compiled", "Compiled step, unbatched and batched (eager/compiled x 1/N)", 60, 360),
    ("precision", "Mixed precision: fp32, bf16 and TF32 side by side", 20, 150),
    ("federation", "Paper-size federation with attacker actors on the device", 90, 300),
)


class Check:
    def __init__(self, out: Path, device: str, budget: float, quick: bool, deps: str, archive: str, python: str):
        self.out, self.device, self.quick = out, device, quick
        self.budget, self.started, self.wall_started = budget, time.monotonic(), time.time()
        self.sizes = Sizes.quick(device) if quick else Sizes.full(device)
        self.python, self.deps, self.archive = python, deps, Path(archive) if archive else None
        self.stages = [Stage(*s) for s in STAGES]
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), self.env.get("PYTHONPATH", "")) if p)
        self.env.update(PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
        self.deps_note = ""
        self.imports: dict = {}
        self.interrupted = ""
        self.no_cuda = False  # set by the environment stage: --device cuda, and torch sees none
        self.current: subprocess.Popen | None = None
        (out / "logs").mkdir(parents=True, exist_ok=True)

    # --- time -----------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return self.budget - self.elapsed()

    def limit_for(self, stage: Stage, selected: list[Stage]) -> float:
        """The stage's time limit: its maximum, cut so that the selected stages after it keep their
        minimum (except for the environment, which everything else needs)."""
        if stage.name == "environment":
            return min(stage.max_seconds, self.remaining())
        later = selected[selected.index(stage) + 1 :]
        return min(stage.max_seconds, self.remaining() - sum(s.min_seconds for s in later))

    # --- subprocesses ---------------------------------------------------------------------
    def run(
        self, stage: Stage, cmd: list[str], timeout: float, log: Path, env: dict | None = None, stdout=None
    ) -> tuple[int, bool]:
        """Run ``cmd`` from the repository root in its own process group, its output appended to
        ``log`` (only its stderr when ``stdout``, an open file, takes its stdout); past ``timeout``
        seconds the group gets SIGTERM, then SIGKILL 15 s later. Returns (exit status, timed out)."""
        stage.commands.append(" ".join(shlex.quote(c) for c in cmd))
        with open(log, "a") as f:
            f.write(f"$ {stage.commands[-1]}\n")
            f.flush()
            stderr = f if stdout else subprocess.STDOUT
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env or self.env, stdout=stdout or f, stderr=stderr, start_new_session=True
            )
            self.current = proc
            try:
                return proc.wait(timeout=max(timeout, 1)), False
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                f.write(f"\n[gpu-check: killed after {timeout:.0f} s]\n")
                return proc.returncode, True
            finally:
                self.current = None

    def probe(self, code: str, timeout: float = 120) -> tuple[int, str]:
        """Run ``python -c code`` with the stages' environment; (exit status, output)."""
        try:
            done = subprocess.run(
                [self.python, "-c", code], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return 124, f"timed out after {timeout:.0f} s"
        return done.returncode, (done.stdout + done.stderr).strip()

    def import_versions(self) -> dict:
        code = (
            "import importlib, json\nout = {}\n"
            f"for name in {NEEDED!r}:\n"
            "    try:\n        m = importlib.import_module(name)\n"
            "        out[name] = {'version': getattr(m, '__version__', '?'), 'path': getattr(m, '__file__', '')}\n"
            "    except Exception as exc:\n        out[name] = {'error': f'{type(exc).__name__}: {exc}'}\n"
            "print(json.dumps(out))"
        )
        rc, text = self.probe(code)
        try:
            return json.loads(text.splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            return {name: {"error": text[-300:] or f"exit status {rc}"} for name in NEEDED}

    def prepare_deps(self, always: bool = False) -> None:
        """Unpack the dependency archive when one of NEEDED is missing, or flwr or ray is not the
        project's version (or ``always``), and an archive exists."""
        self.imports = self.import_versions()
        missing = [n for n, v in self.imports.items() if "error" in v]
        missing += [
            f"{n}=={v} (found {self.imports[n]['version']})"
            for n, v in PINNED.items()
            if n in self.imports and "error" not in self.imports[n] and self.imports[n].get("version") != v
        ]
        if not missing and not always:
            self.deps_note = "all of " + ", ".join(NEEDED) + " import from the machine's own Python"
            return
        missing = missing or ["nothing (--deps-always)"]
        archive = Path(self.deps) if self.deps not in ("", "none") else None
        if archive is None or not archive.is_file():
            self.deps_note = (
                f"missing: {', '.join(missing)}; no dependency archive "
                f"({_shown(archive) if archive else '--deps none'}; build one with `make gpu-deps`)"
            )
            return
        target = Path(tempfile.mkdtemp(prefix="fl-attack-gpu-deps-"))
        atexit.register(shutil.rmtree, target, ignore_errors=True)
        try:
            with tarfile.open(archive) as tar:
                _extract(tar, target)
        except (OSError, tarfile.TarError) as exc:
            self.deps_note = f"missing: {', '.join(missing)}; unpacking {_shown(archive)} failed: {exc}"
            return
        self.env["PYTHONPATH"] = os.pathsep.join([str(target), self.env["PYTHONPATH"]])
        self.env["PATH"] = os.pathsep.join([str(target / "bin"), self.env.get("PATH", "")])
        self.imports = self.import_versions()
        still = [n for n, v in self.imports.items() if "error" in v]
        self.deps_note = (
            f"needed beyond the machine's Python: {', '.join(missing)}; unpacked {_shown(archive)} into {target}"
            + (f"; still missing: {', '.join(still)}" if still else "")
        )

    # --- the record -----------------------------------------------------------------------
    def write(self) -> None:
        """status.json and README.md, atomically; then the archive, if asked for."""
        status = {
            "device": self.device,
            "quick": self.quick,
            "budget_seconds": self.budget,
            "elapsed_seconds": round(self.elapsed(), 1),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.wall_started)),
            "interrupted": self.interrupted,
            "deps": self.deps_note,
            "stages": [{k: v for k, v in asdict(s).items() if k != "body"} for s in self.stages],
        }
        _write_atomic(self.out / "status.json", json.dumps(status, indent=2) + "\n")
        _write_atomic(self.out / "README.md", self.readme())
        if self.archive is not None:
            self.archive.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.archive.with_name(self.archive.name + ".tmp")
            with tarfile.open(tmp, "w:gz") as tar:
                tar.add(self.out, arcname=self.out.name)
            os.replace(tmp, self.archive)

    def readme(self) -> str:
        gpu = _env_value(self.out / "env.txt", "torch.cuda.device_name") or "no CUDA device"
        torch_version = _env_value(self.out / "env.txt", "torch") or "?"
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.wall_started))
        lines = [
            "# GPU check",
            "",
            f"Written by `python -m benchmarks.gpu_check` (docs/gpu-check.md). Device `{self.device}`"
            f"{' (quick sizes: a dry run of the machinery, not a measurement)' if self.quick else ''}; "
            f"GPU: {gpu}; torch {torch_version}; started {started}; "
            f"{self.elapsed():.0f} s of a {self.budget:.0f} s budget"
            + (f"; **interrupted: {self.interrupted}**" if self.interrupted else "")
            + ".",
            "",
        ]
        if self.device != "cuda" or "cuda" not in gpu.lower() and "nvidia" not in gpu.lower():
            lines += ["**This run did not use a GPU: it checks the script, not the GPU path.**", ""]
        lines += [
            f"Dependencies: {self.deps_note or 'not checked yet'}.",
            "",
            "| stage | status | seconds | note |",
            "|---|---|---|---|",
        ]
        for s in self.stages:
            note = s.note.replace("|", "/").replace("\n", " ")
            lines.append(f"| {s.name} | **{s.status}** | {s.seconds:.0f} | {note} |")
        lines.append("")
        for s in self.stages:
            if s.status == "pending":
                continue
            lines += [f"## {s.title} ({s.name}: {s.status})", ""]
            if s.commands:
                lines += ["```bash"] + s.commands + ["```", ""]
            if s.body:
                lines += [s.body.rstrip(), ""]
            if s.files:
                lines += ["Files: " + ", ".join(f"[{f}]({f})" for f in s.files), ""]
        return "\n".join(lines)


def _kill_group(proc: subprocess.Popen, grace: float = 15) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _extract(tar: tarfile.TarFile, target: Path) -> None:
    if hasattr(tarfile, "data_filter"):  # Python >= 3.12 (and recent 3.10/3.11 releases)
        tar.extractall(target, filter="data")
    else:  # pragma: no cover - older Pythons
        tar.extractall(target)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _shown(path: Path) -> Path:
    """``path`` relative to the repository when it is inside it: the record names no machine's folders."""
    path = path.resolve()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _env_value(path: Path, key: str) -> str:
    return next((line.split(":", 1)[1].strip() for line in _lines(path) if line.startswith(key + ":")), "")


def _tail(path: Path, n: int = 20) -> str:
    return "\n".join(_lines(path)[-n:])


def _code(text: str) -> str:
    """``text`` as a markdown code block."""
    return "```\n" + text + "\n```"


def _run_text(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# --- the stages -----------------------------------------------------------------------------


TORCH_PROBE = """
import json, torch
info = {"torch": torch.__version__, "torch.version.cuda": torch.version.cuda,
        "torch.cuda.is_available": torch.cuda.is_available(), "torch.get_num_threads": torch.get_num_threads()}
try:
    info["torch.backends.cudnn.version"] = torch.backends.cudnn.version()
except Exception as exc:
    info["torch.backends.cudnn.version"] = repr(exc)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update({"torch.cuda.device_count": torch.cuda.device_count(), "torch.cuda.device_name": p.name,
                 "torch.cuda.capability": f"{p.major}.{p.minor}",
                 "torch.cuda.memory_gib": round(p.total_memory / 2**30, 1),
                 "torch.cuda.multiprocessors": p.multi_processor_count})
    x = torch.ones(4, device="cuda")
    info["torch.cuda.sum_of_ones"] = float(x.sum())
print(json.dumps(info))
"""


def stage_environment(check: Check, stage: Stage, timeout: float) -> None:
    lines = [
        f"date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        f"python: {check.python}",
        f"uname: {' '.join(os.uname())}",
        f"cpus: {os.cpu_count()}",
        f"commit: {_git_commit()}",
        f"deps: {check.deps_note}",
    ]
    version = check.probe("import sys; print(sys.version.replace(chr(10), ' '))")[1]
    lines.append(f"python.version: {version}")
    for name, info in check.imports.items():
        lines.append(f"{name}: {info.get('version') or info.get('error')}")
        if info.get("path"):
            lines.append(f"{name}.path: {info['path']}")
    smi = shutil.which("nvidia-smi")
    smi_text = ""
    if smi:
        try:
            smi_text = _run_text([smi], 60).stdout
            query = [smi, "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"]
            lines.append(f"nvidia-smi.gpu: {_run_text(query, 60).stdout.strip()}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            lines.append(f"nvidia-smi: failed: {exc}")
    else:
        lines.append("nvidia-smi: not found (skipped)")
    torch_ok = "error" not in check.imports.get("torch", {"error": "not probed"})
    info = {}
    if torch_ok:
        rc, text = check.probe(TORCH_PROBE, timeout=max(timeout - 10, 10))
        try:
            info = json.loads(text.splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            lines.append(f"torch probe failed (exit {rc}): {text[-500:]}")
        lines += [f"{k}: {v}" for k, v in info.items()]
    env_txt = "\n".join(lines) + "\n" + (f"\n--- nvidia-smi ---\n{smi_text}" if smi_text else "")
    _write_atomic(check.out / "env.txt", env_txt)
    stage.files.append("env.txt")
    missing = [n for n, v in check.imports.items() if "error" in v]
    cuda = bool(info.get("torch.cuda.is_available"))
    problems = []
    if not torch_ok:
        problems.append("torch cannot be imported")
    elif not info:
        problems.append("the torch probe failed")
    if check.device == "cuda" and torch_ok and info and not cuda:
        problems.append("torch sees no CUDA device")
        check.no_cuda = True
    if missing:
        problems.append("cannot import " + ", ".join(missing))
    stage.status = "fail" if problems else "pass"
    found = f"{info.get('torch.cuda.device_name', 'no CUDA device')}, torch {info.get('torch', '?')}"
    if cuda:
        found += f", CUDA {info.get('torch.version.cuda')}, cuDNN {info.get('torch.backends.cudnn.version')}"
    stage.note = "; ".join(problems + [found])
    stage.body = _code("\n".join(lines))


def _git_commit() -> str:
    try:
        out = _run_text(["git", "rev-parse", "HEAD"], 10)
        dirty = _run_text(["git", "status", "--porcelain", "--untracked-files=no"], 10)
        if out.returncode == 0:
            return out.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "unknown (no git here)"


def cuda_test_files() -> list[str]:
    """The test files (tests/, benchmarks/) that mention CUDA; their tests are selected with ``-k cuda``."""
    paths = [*(ROOT / "tests").glob("test_*.py"), *(ROOT / "benchmarks").glob("test_*.py")]
    return sorted(str(p.relative_to(ROOT)) for p in paths if "cuda" in p.read_text().lower())


def stage_cuda_tests(check: Check, stage: Stage, timeout: float) -> None:
    log = check.out / "logs" / "cuda-tests.log"
    files = [f for f in cuda_test_files() if f != "benchmarks/test_gpu_check.py"]
    cmd = [check.python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", "cuda", *files]
    rc, timed_out = check.run(stage, cmd, timeout, log)
    stage.files.append("logs/cuda-tests.log")
    text = log.read_text(errors="replace")
    summary = next(
        (line.strip("= ") for line in reversed(text.splitlines()) if re.search(r"\d+ (passed|failed)", line)), ""
    )
    cuda_skips = sum(int(n or 1) for n in re.findall(r"SKIPPED(?: \[(\d+)\])?.*needs a CUDA device", text))
    if timed_out:
        stage.status = "timeout"
    elif rc != 0:
        stage.status = "fail"
    elif check.device == "cuda" and cuda_skips:
        stage.status = "fail"
        summary += f"; {cuda_skips} CUDA test(s) skipped on a CUDA run"
    else:
        stage.status = "pass"
        if cuda_skips:
            summary += f" (the {cuda_skips} CUDA test(s) skipped: no CUDA device)"
    stage.note = summary or f"exit status {rc}"
    stage.body = _code(_tail(log, 25))


def _attack_step_json(check: Check, stage: Stage, timeout: float, name: str, args: list[str]) -> dict | None:
    """Run ``benchmarks.attack_step ARGS --json`` and keep NAME.json and logs/NAME.log; None (with
    the stage marked failed or timed out) when it fails, times out or prints unreadable JSON."""
    log, tmp = check.out / "logs" / f"{name}.log", check.out / f".{name}.json.tmp"
    cmd = [check.python, "-m", "benchmarks.attack_step", "--device", check.device, *args, "--json"]
    with open(tmp, "w") as f:  # stdout is the JSON, stderr the log
        rc, timed_out = check.run(stage, cmd, timeout, log, stdout=f)
    stage.files.append(f"logs/{name}.log")
    if timed_out or rc != 0:
        tmp.unlink(missing_ok=True)
        stage.status = "timeout" if timed_out else "fail"
        stage.note = f"exit status {rc}" + (", timed out" if timed_out else "")
        stage.body = _code(_tail(log))
        return None
    try:
        result = json.loads(tmp.read_text())
    except json.JSONDecodeError as exc:
        stage.status, stage.note = "fail", f"unreadable JSON: {exc}"
        return None
    os.replace(tmp, check.out / f"{name}.json")
    stage.files.append(f"{name}.json")
    return result


def stage_bench(check: Check, stage: Stage, timeout: float) -> None:
    result = _attack_step_json(check, stage, timeout, "bench", check.sizes.bench)
    if result is None:
        return
    from benchmarks.attack_step import summarize

    rows = result["rows"]
    fast = {(r["dataset"], r["nodes"]): r["seconds_per_step"] for r in rows if r["impl"] == "fast"}
    best = [f"{d} m={m}: fast {t * 1e3:.1f} ms/step" for (d, m), t in sorted(fast.items())]
    stage.status = "pass" if all(r["max_grad_diff"] < 1e-9 for r in rows) else "fail"
    differ = "" if stage.status == "pass" else "; float64 gradients differ"
    stage.note = f"{result['device']}; " + ", ".join(best[:4]) + differ
    _table(check, stage, "bench", summarize(result), _plot_bench, rows, "step benchmark")


def _table(check: Check, stage: Stage, name: str, table: str, plot, rows: list, alt: str) -> None:
    """NAME.txt (``table``), NAME.png (``plot`` of ``rows``) and the stage's body showing both."""
    _write_atomic(check.out / f"{name}.txt", table + "\n")
    stage.files.append(f"{name}.txt")
    figure = _figure(check, f"{name}.png", plot, rows)
    stage.body = _code(table) + (f"\n\n![{alt}]({figure})" if figure else "")


def stage_batched(check: Check, stage: Stage, timeout: float) -> None:
    log = check.out / "logs" / "batched.log"
    stage.files.append("logs/batched.log")
    deadline = time.monotonic() + timeout
    rows, problems, device = [], [], check.device
    for n in check.sizes.batched_clients:
        left = deadline - time.monotonic()
        if left < 5:
            problems.append(f"N={n} skipped: stage time limit reached")
            continue
        tmp = check.out / f".batched-{n}.json.tmp"
        cmd = [check.python, "-m", "benchmarks.attack_step", "--batched", str(n), "--device", check.device]
        with open(tmp, "w") as f:
            rc, timed_out = check.run(stage, cmd + check.sizes.batched + ["--json"], left, log, stdout=f)
        if timed_out or rc != 0:
            tmp.unlink(missing_ok=True)
            problems.append(f"N={n}: " + ("timed out" if timed_out else f"exit status {rc}"))
            continue
        try:
            result = json.loads(tmp.read_text())
        except json.JSONDecodeError as exc:
            problems.append(f"N={n}: unreadable JSON ({exc})")
            continue
        tmp.unlink()
        rows += result["rows"]
        device = result["device"]
        merged = {"device": device, "threads": result["threads"], "torch": result["torch"], "rows": rows}
        _write_atomic(check.out / "batched.json", json.dumps(merged, indent=2) + "\n")
    if not rows:
        stage.status = "timeout" if any("timed out" in p for p in problems) else "fail"
        stage.note = "; ".join(problems)
        stage.body = _code(_tail(log))
        return
    from benchmarks.attack_step import summarize_batched

    stage.files.append("batched.json")
    stage.status = "fail" if problems else "pass"
    ratios = ", ".join(f"N={r['clients']}: x{r['throughput_ratio']:.2f}" for r in rows)
    stage.note = "; ".join([*problems, f"{device}; batched/sequential throughput {ratios}"])
    _table(check, stage, "batched", summarize_batched(merged), _plot_batched, rows, "batched throughput")


def stage_compiled(check: Check, stage: Stage, timeout: float) -> None:
    """eager/compiled x one client/N batched (``benchmarks.attack_step --compiled``): compile time, step
    time, the compiled step's GFLOP/s against the TF32 GEMM peak measured in the same process (the
    issue's goal: >= 30% at CIFAR-100, k=50, m=7, N=16), and compiled == eager (|dLsim|)."""
    result = _attack_step_json(check, stage, timeout, "compiled", check.sizes.compiled)
    if result is None:
        return
    from benchmarks.attack_step import summarize_compiled

    rows = result["rows"]
    fell_back = [r for r in rows if r["compile_note"] != "compiled"]
    stage.status = "fail" if fell_back or any(r["max_lsim_diff"] > 1e-4 for r in rows) else "pass"
    best = max(rows, key=lambda r: r["peak_fraction"])
    stage.note = (
        f"{result['device']}; "
        + ", ".join(f"{r['model']} N={r['clients']}: x{r['speedup']:.2f}" for r in rows)
        + f"; best {100 * best['peak_fraction']:.1f}% of the {result['gemm_peak_precision']} GEMM peak"
        + (f"; fell back to eager: {fell_back[0]['compile_note']}" if fell_back else "")
    )
    _write_atomic(check.out / "compiled.txt", summarize_compiled(result) + "\n")
    stage.files.append("compiled.txt")
    stage.body = _code(summarize_compiled(result))


def stage_precision(check: Check, stage: Stage, timeout: float) -> None:
    result = _attack_step_json(check, stage, timeout, "precision", check.sizes.precision)
    if result is None:
        return
    from benchmarks.attack_step import summarize_precisions

    rows = result["rows"]
    fp32 = {(r["dataset"], r["nodes"]): r["seconds_per_step"] for r in rows if r["precision"] == "fp32"}
    ratios = [
        f"{r['dataset']} m={r['nodes']} {r['precision']}: x{fp32[r['dataset'], r['nodes']] / r['seconds_per_step']:.2f}"
        for r in rows
        if r["precision"] != "fp32"
    ]
    # the lowered steps must still compute the same step: every gradient's cosine with fp32's above
    # tests/test_precision.py's loosest bound (dL/dP1's, 0.95)
    agree = all(r["grad_cosine"] > 0.95 for r in rows)
    stage.status = "pass" if agree else "fail"
    off = "" if agree else "; a lowered step's gradients are off fp32's (cosine <= 0.95)"
    stage.note = f"{result['device']}; step speed-up over fp32: " + ", ".join(ratios) + off
    _table(check, stage, "precision", summarize_precisions(result), _plot_precision, rows, "precision")


def stage_federation(check: Check, stage: Stage, timeout: float) -> None:
    from strategies.launch import toml_value  # the standard library only

    log = check.out / "logs" / "federation.log"
    stage.files.append("logs/federation.log")
    work = Path(tempfile.mkdtemp(prefix="fl-attack-gpu-fed-"))
    run_config = {**check.sizes.run_config, "results-dir": str(work / "results"), "run-name": "gpu-check"}
    overrides = " ".join(f"{k}={toml_value(v)}" for k, v in run_config.items())
    launch = max(int(timeout) - 30, 30)  # the launcher stops its SuperLink itself before the stage's limit
    cmd = [check.python, "-m", "strategies.launch", "--run-config", overrides]
    cmd += _flags(federation_config=check.sizes.federation, timeout=launch, silence_timeout=min(launch, 300))
    env = {**check.env, "FLWR_HOME": str(work / "flwr-home")}
    started = time.monotonic()
    rc, timed_out = check.run(stage, cmd, timeout, log, env=env)
    wall = time.monotonic() - started
    run = work / "results" / "gpu-check"
    copied = check.out / "federation"
    copied.mkdir(exist_ok=True)
    for name in ("attacks.csv", "rounds.csv", "summary.json", "events.log", "config.json"):
        if (run / name).is_file():
            shutil.copy(run / name, copied / name)
            stage.files.append(f"federation/{name}")
    rows = []
    if (run / "attacks.csv").is_file():
        with open(run / "attacks.csv") as f:
            rows = list(csv.DictReader(f))
    problems = []
    if timed_out:
        problems.append(f"killed after {timeout:.0f} s")
    elif rc != 0:
        problems.append(f"launcher exit status {rc}")
    ok = [r for r in rows if r.get("status") == "ok"]
    if len(ok) != check.sizes.expected_attacks:
        problems.append(f"{len(ok)} of {check.sizes.expected_attacks} attacks succeeded")
    devices = sorted({r.get("device", "") for r in rows})
    if rows and devices != [check.device]:
        problems.append(f"attacks.csv says device {devices}, expected ['{check.device}']")
    seconds = [float(r["attack_seconds"]) for r in ok if r.get("attack_seconds")]
    image = next((run / r["image"] for r in ok if r.get("image") and (run / r["image"]).is_file()), None)
    if image is not None:
        shutil.copy(image, check.out / "federation-reconstruction.png")
    stage.status = "timeout" if timed_out else ("fail" if problems else "pass")
    notes = [*problems, f"wall {wall:.0f} s (launch to exit)"]
    if seconds:
        notes.append(
            f"per attack {min(seconds):.1f}/{statistics.median(seconds):.1f}/{max(seconds):.1f} s (min/median/max)"
        )
    if rows:
        notes.append(f"device {', '.join(devices)}")
    stage.note = "; ".join(notes)
    body = [f"Run config: `{overrides}`", "", f"Federation config: `{check.sizes.federation}`", ""]
    if rows:
        body += [
            "| round | partition | method | m | iterations | device | worker | attack s | PSNR dB | status |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            psnr = r.get("psnr") or ""
            try:
                psnr = f"{float(psnr):.2f}"
            except ValueError:
                pass
            body.append(
                f"| {r['round']} | {r['partition_id']} | {r['method']} | {r['gradients_per_iteration']} | "
                f"{r['iterations']} | "
                f"{r.get('device', '')} | {r.get('worker_id', '')[:12]} | {r['attack_seconds']} | {psnr} | "
                f"{r['status']} |"
            )
        body.append("")
    timings = _timings_block(log)
    if timings:
        body += ["```", timings, "```", ""]
    figure = _figure(check, "federation.png", _plot_federation, ok) if ok else ""
    if figure:
        body.append(f"![attack seconds and PSNR]({figure})")
    if image is not None:
        body += ["", "![a reconstruction: originals over their matched reconstructions](federation-reconstruction.png)"]
    if stage.status != "pass":
        body += ["", "```", _tail(log, 30), "```"]
    stage.body = "\n".join(body)
    shutil.rmtree(work, ignore_errors=True)


def _timings_block(log: Path) -> str:
    """The launcher's 'where the time went' table from the stage's log."""
    lines = _lines(log)
    for i, line in enumerate(lines):
        if "where the time went" in line:
            return "\n".join([line, *itertools.takewhile(lambda nxt: nxt.startswith("  "), lines[i + 1 :])])
    return ""


# --- figures --------------------------------------------------------------------------------


def _figure(check: Check, name: str, plot, data) -> str:
    """Draw ``plot(data, axes)`` into ``name`` under the output folder; "" when matplotlib is missing
    or the plot fails (the tables are still written)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ""
    try:
        fig = plot(data, plt)
        title = f"{check.device}" + (" (quick dry run)" if check.quick else "")
        fig.suptitle(f"{fig.get_suptitle() if hasattr(fig, 'get_suptitle') else ''} [{title}]".strip(), fontsize=10)
        fig.tight_layout()
        tmp = check.out / f".{name}.tmp.png"
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        os.replace(tmp, check.out / name)
    except Exception as exc:  # a figure must not fail the stage
        print(f"gpu-check: figure {name} failed: {exc}", file=sys.stderr)
        return ""
    return name


def _plot_bench(rows, plt):
    datasets = sorted({r["dataset"] for r in rows})
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.6), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        for impl, style in (("fast", "o-"), ("reference", "s--")):
            mine = sorted(
                (r["nodes"], r["seconds_per_step"] * 1e3) for r in rows if r["dataset"] == dataset and r["impl"] == impl
            )
            ax.plot([m for m, _ in mine], [s for _, s in mine], style, label=impl)
        ax.set(title=f"{dataset}, k={rows[0]['samples']}", xlabel="nodes m", ylabel="ms per PI-SME step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("One PI-SME step: shipped path against the literal Algorithm-1 loop")
    return fig


def _plot_precision(rows, plt):
    configs = sorted({(r["dataset"], r["nodes"], r["samples"]) for r in rows})
    fig, axes = plt.subplots(1, len(configs), figsize=(4.5 * len(configs), 3.6), squeeze=False)
    for ax, (dataset, m, k) in zip(axes[0], configs):
        mine = [r for r in rows if (r["dataset"], r["nodes"], r["samples"]) == (dataset, m, k)]
        names = [r["precision"] for r in mine]
        ax.bar(names, [r["seconds_per_step"] * 1e3 for r in mine], color="tab:blue")
        for i, r in enumerate(mine):
            ax.annotate(
                f"{100 * r['peak_fraction']:.0f}% of peak", (i, r["seconds_per_step"] * 1e3), ha="center", va="bottom"
            )
        ax.set(title=f"{dataset}, k={k}, m={m}", ylabel="ms per PI-SME step")
    fig.suptitle("One PI-SME step per precision (each against its own GEMM peak)")
    return fig


def _plot_batched(rows, plt):
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    rows = sorted(rows, key=lambda r: r["clients"])
    n = [r["clients"] for r in rows]
    ax.plot(n, [r["sequential_attacks_per_second"] for r in rows], "o-", label="N sequential reconstruct")
    ax.plot(n, [r["batched_attacks_per_second"] for r in rows], "s-", label="one reconstruct_batch of N")
    ax.set(xscale="log", xlabel="clients N", ylabel="attacks per second", xticks=n, xticklabels=[str(v) for v in n])
    ax.set_ylim(bottom=0)
    r = rows[0]
    ax.set_title(f"{r['dataset']}, k={r['samples']}, m={r['nodes']}, {r['iterations']} iterations", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.suptitle("Batched-attack throughput")
    return fig


def _plot_federation(rows, plt):
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    labels = [f"r{r['round']} c{r['partition_id']}" for r in rows]
    ax.bar(labels, [float(r["attack_seconds"]) for r in rows], color="tab:blue")
    ax.set(ylabel="attack seconds", xlabel="round, client")
    psnr = [float(r["psnr"]) if r.get("psnr") not in ("", None) else float("nan") for r in rows]
    twin = ax.twinx()
    twin.plot(labels, psnr, "o", color="tab:red")
    twin.set_ylabel("PSNR dB", color="tab:red")
    fig.suptitle("Federation: each attack's wall time and PSNR")
    return fig


STAGE_FUNCTIONS = {
    "environment": stage_environment,
    "cuda-tests": stage_cuda_tests,
    "bench": stage_bench,
    "batched": stage_batched,
    "compiled": stage_compiled,
    "precision": stage_precision,
    "federation": stage_federation,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description="The GPU check: environment, CUDA tests, step benchmark, batched throughput and a short "
        "paper-size federation with attacker actors on the device; writes README.md, figures and logs "
        "under --out (docs/gpu-check.md).",
    )
    add = parser.add_argument
    add("--out", default=str(DEFAULT_OUT), help="output folder (default: docs/gpu-check)")
    add("--device", choices=("cuda", "cpu"), default="cuda", help="(default: cuda)")
    add(
        "--budget-seconds",
        type=float,
        default=480,
        help="the whole check's time; stages that no longer fit are skipped (default: 480)",
    )
    add("--stages", default=",".join(STAGE_FUNCTIONS), help="comma-separated subset (default: all, in order)")
    add("--quick", action="store_true", help="tiny sizes: a dry run of the machinery (the test)")
    add(
        "--deps",
        default=str(DEFAULT_DEPS),
        help="archive of the packages to unpack when flwr, ray, lpips or piq is missing ('none': never; "
        "default: .gpu-deps/site.tar.xz, from make gpu-deps)",
    )
    add("--deps-always", action="store_true", help="unpack --deps even when nothing is missing (to test the archive)")
    add("--archive", default="", help="also keep a .tar.gz of the output folder here, refreshed after every stage")
    add("--python", default=sys.executable, help="the Python that runs the stages (default: this one)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.stages.split(",") if n.strip()]
    unknown = [n for n in names if n not in STAGE_FUNCTIONS]
    if unknown or not names:
        parser.error(
            f"unknown stage {unknown[0] if unknown else '(none)'}; the stages are {', '.join(STAGE_FUNCTIONS)}"
        )
    if not args.budget_seconds > 0:
        parser.error("--budget-seconds must be > 0")
    out = Path(args.out).resolve()
    check = Check(out, args.device, args.budget_seconds, args.quick, args.deps, args.archive, args.python)
    selected = [s for s in check.stages if s.name in names]
    for s in check.stages:
        if s.name not in names:
            s.status, s.note = "skipped", "not selected (--stages)"

    def on_signal(signum, frame):
        check.interrupted = f"signal {signal.Signals(signum).name}"
        if check.current is not None:
            _kill_group(check.current, grace=5)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        return _run_stages(check, selected, args)
    except KeyboardInterrupt:
        check.interrupted = check.interrupted or "KeyboardInterrupt"
        for stage in check.stages:
            if stage.status in ("running", "pending"):
                stage.status = "fail" if stage.status == "running" else "skipped"
                stage.note = f"interrupted ({check.interrupted})"
        check.write()
        print(f"gpu-check: interrupted; what finished is in {out}", flush=True)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_stages(check: Check, selected: list[Stage], args) -> int:
    """prepare_deps, then each selected stage in order, writing the record after each; the exit status."""
    check.prepare_deps(always=args.deps_always)
    check.write()
    print(f"gpu-check: {check.deps_note}", flush=True)
    torch_missing = "error" in check.imports.get("torch", {})
    for stage in selected:
        limit = check.limit_for(stage, selected)
        if limit < stage.min_seconds:
            stage.status = "skipped"
            stage.note = (
                f"not enough budget left ({max(check.remaining(), 0):.0f} s; needs about {stage.min_seconds:.0f} s)"
            )
        elif torch_missing and stage.name != "environment":
            stage.status, stage.note = "skipped", "torch cannot be imported (env.txt)"
        elif stage.name != "environment" and check.no_cuda:
            stage.status, stage.note = "skipped", "--device cuda, but torch sees no CUDA device (environment)"
        else:
            stage.status = "running"
            check.write()
            print(f"gpu-check: {stage.name} (limit {limit:.0f} s)", flush=True)
            t = time.monotonic()
            try:
                STAGE_FUNCTIONS[stage.name](check, stage, limit)
            except Exception as exc:  # a broken stage must not stop the others (KeyboardInterrupt does)
                stage.status, stage.note = "fail", f"{type(exc).__name__}: {exc}"
            stage.seconds = time.monotonic() - t
        print(f"gpu-check: {stage.name}: {stage.status} ({stage.seconds:.0f} s) {stage.note}", flush=True)
        check.write()
    print(f"gpu-check: {check.out / 'README.md'}", flush=True)
    failed = [s.name for s in check.stages if s.status in ("fail", "timeout")]
    if failed:
        print(f"gpu-check: failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
