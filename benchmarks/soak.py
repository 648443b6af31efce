"""The long-study soak (docs/reliability.md, "A long study"): a federation of many clients over many
rounds, run twice with one seed, once straight through and once SIGKILLed half way and resumed.

Each run goes through the launcher (``flwr run``, Ray, the real apps). While it runs, every
``--every`` seconds a row goes to ``samples.csv``: the resident memory of the ServerApp process
(``flwr-simulation``, which also drives the attacker), of the attacker actors (``ray::AttackWorker``)
and of the client actors (``ray::ClientAppActor``), read from /proc; the size of the run folder; the
rounds and attack rows written so far; the attacks in flight and the lag in rounds. The killed run is
SIGKILLed (the launcher and everything it started) once ``--kill-after`` rounds are recorded and
resumed with ``resume=`` (which first runs the kept rounds' attacks that died in flight); then
``fl-attack replay RUN --missing`` must find nothing left to do. ``soak.json`` then says whether the
two runs' rounds.csv and attacks.csv are the same but for wall times and runtime ids, and the
figures.

Resumable: a run whose summary.json exists is not run again, a killed run found without one is
resumed, and samples.csv is appended to. Run it alone, niced:
    nice -n 10 python -m benchmarks.soak --out docs/reliability/soak
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = {"serverapp": ("flwr-simulation", "flwr-serverapp"), "attackers": ("ray::AttackWorker",)}
KINDS["clients"] = ("ray::ClientAppActor",)
SAMPLE_COLUMNS = [
    "run",
    "phase",
    "elapsed_s",
    "rounds",
    "attack_rows",
    "attacks_in_flight",
    "attack_lag_rounds",
    "serverapp_rss_mb",
    "attackers_rss_mb",
    "clients_rss_mb",
    "other_rss_mb",
    "folder_mb",
]
# Wall times, the attacker's progress and the runtime's ids: the columns a rerun may change.
VARYING = {"seconds", "attacks_in_flight", "attack_lag_rounds", "attack_seconds", "lag_rounds"}
VARYING |= {"node_id", "worker_node", "worker_id"}


def run_config(args, results: Path, name: str) -> str:
    return (
        f"num-server-rounds={args.rounds} fraction-train={args.fraction_train} fraction-evaluate={args.fraction_train} "
        "samples-per-client=10 batch-size=5 local-epochs=1 lr=0.05 seed=0 "
        f'attack-method="pisme" attack-iterations={args.iterations} attack-nodes=2 attack-threads=1 '
        f'attack-clients="{args.attack_clients}" attack-memory="keep" '
        f'results-dir="{results}" run-name="{name}"'
    )


def processes(flwr_home: Path) -> dict[str, float]:
    """Resident memory (MiB) of this soak's processes by kind: those whose environment holds its
    FLWR_HOME (Ray's workers inherit it from the simulation); "other" is the rest of them (the
    launcher, flwr, the SuperLink, Ray's daemons and idle workers)."""
    mark = f"FLWR_HOME={flwr_home}".encode()
    rss = dict.fromkeys([*KINDS, "other"], 0.0)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "status").read_text()
        except OSError:
            continue
        kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        kind = next((k for k, names in KINDS.items() if any(name in command for name in names)), "other")
        rss[kind] += kb / 1024
    return rss


def folder_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20 if path.exists() else 0.0


def csv_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f)]


class Sampler(threading.Thread):
    """Appends a samples.csv row every ``every`` seconds while ``phase`` is set."""

    def __init__(self, out: Path, flwr_home: Path, every: float):
        super().__init__(daemon=True)
        self.file, self.flwr_home, self.every = out / "samples.csv", flwr_home, every
        self.run_dir, self.phase, self.started = None, None, time.monotonic()
        self.stopped = threading.Event()

    def sample(self) -> None:
        if self.phase is None:
            return
        rounds = csv_rows(self.run_dir / "rounds.csv")
        last = rounds[-1] if rounds else {}
        rss = processes(self.flwr_home)
        row = {
            "run": self.run_dir.name,
            "phase": self.phase,
            "elapsed_s": round(time.monotonic() - self.started, 1),
            "rounds": len(rounds),
            "attack_rows": len(csv_rows(self.run_dir / "attacks.csv")),
            "attacks_in_flight": last.get("attacks_in_flight", ""),
            "attack_lag_rounds": last.get("attack_lag_rounds", ""),
            **{f"{k}_rss_mb": round(v, 1) for k, v in rss.items()},
            "folder_mb": round(folder_mb(self.run_dir), 2),
        }
        new = not self.file.exists()
        with open(self.file, "a", newline="") as f:
            writer = csv.DictWriter(f, SAMPLE_COLUMNS, lineterminator="\n")
            if new:
                writer.writeheader()
            writer.writerow(row)

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.sample()


def tree(pid: int) -> list[int]:
    """pid and its live descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(current := todo.pop())
        todo += children.get(current, [])
    return found


def launch(args, results: Path, name: str, env: dict, extra: str = "", kill_after: int | None = None) -> dict:
    """One launcher call; with ``kill_after``, SIGKILLs its process tree once that many rounds are
    recorded. Returns its exit code and wall time."""
    command = [sys.executable, "-m", "strategies.launch", "--run-config", run_config(args, results, name) + extra]
    command += ["--federation-config", f"num-supernodes={args.clients} client-resources-num-cpus=1"]
    started = time.monotonic()
    log = open(args.out / f"{name}.log", "a")
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    killed_at = None
    while proc.poll() is None:
        if kill_after is not None and len(csv_rows(results / name / "rounds.csv")) >= kill_after:
            killed_at = len(csv_rows(results / name / "rounds.csv"))
            for pid in reversed(tree(proc.pid)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
            break
        time.sleep(0.5)
    log.close()
    return {"returncode": proc.returncode, "seconds": round(time.monotonic() - started, 1), "killed_at": killed_at}


def comparable(path: Path, key: tuple[str, ...]) -> list[dict]:
    rows = [{k: v for k, v in row.items() if k not in VARYING} for row in csv_rows(path)]
    return sorted(rows, key=lambda r: tuple(r[k] for k in key))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("docs/reliability/soak"))
    p.add_argument("--results", type=Path, default=Path("results/soak"), help="the two run folders")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--kill-after", type=int, default=20, help="SIGKILL the second run after this many rounds")
    p.add_argument("--fraction-train", type=float, default=0.1)
    p.add_argument("--attack-clients", default="0,1,2+fraction:0.2", help="a tracked panel plus a sampled fraction")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.results.resolve()
    flwr_home = (results / "flwr-home").resolve()
    env = {**os.environ, "FLWR_HOME": str(flwr_home), "OMP_NUM_THREADS": "1"}
    state_file = args.out / "soak.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {"command": " ".join(sys.argv)}
    sampler = Sampler(args.out, flwr_home, args.every)
    sampler.start()

    def phase(name: str, label: str, **kw) -> None:
        sampler.run_dir, sampler.phase = results / name, label
        state.setdefault("phases", {})[label] = launch(args, results, name, env, **kw)
        sampler.sample()
        sampler.phase = None
        state_file.write_text(json.dumps(state, indent=1) + "\n")

    full, killed = results / "full", results / "killed"
    if not (full / "summary.json").exists():
        phase("full", "full")
    if not (killed / "summary.json").exists():
        if not (killed / "checkpoint.pt").exists():
            phase("killed", "until-killed", kill_after=args.kill_after)
        phase("killed", "resumed", extra=f' resume="{killed}"')
        started = time.monotonic()
        missing = subprocess.run(
            [sys.executable, "-m", "fl_attack.cli", "replay", str(killed), "--missing"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        state["phases"]["replay-missing"] = {
            "returncode": missing.returncode,
            "seconds": round(time.monotonic() - started, 1),
            "last_line": ((missing.stdout + missing.stderr).strip().splitlines() or [""])[-1],
        }
    sampler.stopped.set()

    same = {}
    for name, key in (("rounds.csv", ("round",)), ("attacks.csv", ("round", "partition_id", "method"))):
        a, b = comparable(full / name, key), comparable(killed / name, key)
        differing = sorted({k for x, y in zip(a, b, strict=False) for k in x if x[k] != y.get(k)})
        same[name] = {"rows": [len(a), len(b)], "identical": a == b, "differing_columns": differing}
    samples = csv_rows(args.out / "samples.csv")
    peaks = {
        kind: max((float(s[f"{kind}_rss_mb"]) for s in samples if s["phase"] == "full"), default=0.0)
        for kind in [*KINDS, "other"]
    }
    by_round = {}  # the uninterrupted run's first sample at each of these rounds
    for r in sorted({1, args.rounds // 4, args.rounds // 2, 3 * args.rounds // 4, args.rounds}):
        first = next((s for s in samples if s["phase"] == "full" and int(s["rounds"]) >= r), None)
        if first is not None:
            by_round[r] = {k: first[k] for k in SAMPLE_COLUMNS[2:]}
    state.update(
        {
            "clients": args.clients,
            "rounds": args.rounds,
            "fraction_train": args.fraction_train,
            "attack_clients": args.attack_clients,
            "same_rows": same,
            "peak_rss_mb_full_run": peaks,
            "full_run_by_round": by_round,
            "folder_mb": {"full": round(folder_mb(full), 2), "killed": round(folder_mb(killed), 2)},
        }
    )
    state_file.write_text(json.dumps(state, indent=1) + "\n")
    print(json.dumps(state, indent=1))
    return 0 if all(v["identical"] for v in same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
