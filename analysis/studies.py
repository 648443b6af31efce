"""What the studies (analysis.leakage_study, analysis.defenses) share: a run config as the
launcher's --run-config text, and federations launched into their run folders, skipping the
finished ones, resuming the interrupted ones and restarting those that cannot be resumed (a run
killed before its first checkpoint), so a stopped study picks up where it stopped.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from fl_attack.audit.run_folder import RunFolder

FEDERATION = "num-supernodes={} client-resources-num-cpus=1 client-resources-num-gpus=0.0"


def run_config_text(values: dict) -> str:
    """The launcher's --run-config text of ``values`` (kebab-case run-config keys)."""
    from strategies.launch import toml_value

    return " ".join(f"{k}={toml_value(v)}" for k, v in values.items())


def finished(folder: str | Path) -> bool:
    """The run folder holds a finished run (its summary.json is written last)."""
    return RunFolder(folder).summary_file.is_file()


def plan_run(folder: Path, config: dict, supernodes: int, log=print, reuse: bool = True) -> dict | None:
    """The launcher's run-config values that run ``config`` into ``folder`` (results-dir and run-name
    set here) on ``supernodes`` clients, or None for a finished run kept as it is (``reuse``).

    With ``reuse``, a folder that holds an unfinished run is resumed (``resume`` set) when the
    launcher's own checks accept it (``strategies.launch.checked_run_config``: a readable checkpoint,
    the same run config, rounds left, a readable memory.pt, no secagg); otherwise (a run killed
    before its first checkpoint, one under secagg, one whose run config changed since) its folder is
    moved aside to ``NAME.set-aside-YYYYmmdd-HHMMSS`` beside it, with a message saying why, and the
    run starts again. Without ``reuse`` nothing is checked: the launcher refuses a folder that holds
    a run."""
    from strategies.launch import checked_run_config

    run = RunFolder(folder)
    values = {**config, "results-dir": str(run.path.parent), "run-name": run.path.name}
    if not reuse:
        return values
    if finished(run):
        return None
    if not run.holds_run:
        return values
    resumed = {**values, "resume": str(run.path)}
    try:
        checked_run_config(resumed, FEDERATION.format(supernodes))
        return resumed
    except ValueError as exc:
        why = str(exc).removeprefix("invalid run config: ")
    aside = run.path.with_name(f"{run.path.name}.set-aside-{time.strftime('%Y%m%d-%H%M%S')}")
    run.path.rename(aside)
    log(f"restarting {run.path.name}: its unfinished run cannot be resumed ({why}); its record is kept in {aside}")
    return values


def launch_run(folder: Path, config: dict, supernodes: int, log=print, reuse: bool = True) -> bool:
    """Run the federation of ``config`` into ``folder`` on ``supernodes`` clients (``plan_run``: with
    ``reuse``, a finished run is kept, an interrupted one resumed, one that cannot be resumed
    restarted). True when the run finished; a launcher that fails or refuses its arguments is
    logged, not raised, so the study goes on with its other runs."""
    from strategies.launch import main as launch

    values = plan_run(folder, config, supernodes, log, reuse)
    if values is None:
        return True
    name = values["run-name"]
    log(f"{'resuming' if 'resume' in values else 'running'} {name}")
    started = time.time()
    try:
        code = launch(["--run-config", run_config_text(values), "--federation-config", FEDERATION.format(supernodes)])
    except SystemExit as exc:  # the launcher refused its arguments
        code = exc.code if isinstance(exc.code, int) else 2
    log(f"{name} exited {code} after {time.time() - started:.0f} s")
    return code == 0


def run_study(
    out: Path,
    runs,
    replays,
    only: set[str] | None,
    with_replays: bool,
    log=print,
    timings: dict | None = None,
    on_run=None,
) -> list[Path]:
    """Launch every missing run of ``runs`` [(name, run config, supernodes)] into out/runs/<name>
    (an interrupted one resumed), then every missing replay of ``replays`` [(run name, fl-attack
    replay arguments with --name)]; ``only``: the run names to do (None: all). ``timings`` gets each
    run's and replay's wall time in this call (seconds, under its name, a replay's as RUN/REPLAY; one
    kept as finished takes about 0) and ``on_run()`` is called after each (the study records its call
    there). Returns the folders of the runs and replays that finished, in order."""
    from fl_attack.cli import main as fl_attack_main

    results, folders = out / "runs", []

    def timed(name: str, started: float) -> None:
        if timings is not None:
            timings[name] = round(time.time() - started, 1)
        if on_run is not None:
            on_run()

    for name, config, supernodes in runs:
        if only and name not in only:
            continue
        started = time.time()
        if launch_run(results / name, config, supernodes, log):
            folders.append(results / name)
        timed(name, started)
    for name, args in replays if with_replays else []:
        folder = results / name
        if (only and name not in only) or not finished(folder):
            continue
        replay = folder / "replays" / args[args.index("--name") + 1]
        started = time.time()
        if not finished(replay):
            log(f"replay {name} {' '.join(args)}")
            code = fl_attack_main(["replay", str(folder), *args, "--threads", "2"])
            log(f"replay exited {code} after {time.time() - started:.0f} s")
        timed(f"{name}/{replay.name}", started)
        if finished(replay):
            folders.append(replay)
    return folders


def study_main(argv, *, label: str, prog: str, doc: str, runs, replays, outputs) -> int:
    """The command line of a study: --out DIR, --only NAME,..., --skip-replays. Runs ``run_study``,
    recording the call (its command, commit, wall time and each run's) in DIR/study.json (``record_call``),
    then ``outputs(out, folders)`` (which writes the tables and returns the study table); 2 for an
    unknown run name. ``label`` prefixes every line it prints ("leakage study: ...")."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="study folder (runs/, study.csv, study.md, study.json, report/)")
    names = [name for name, _, _ in runs]
    parser.add_argument(
        "--only", default="", help="comma-separated run names (default: all of " + ", ".join(names) + ")"
    )
    parser.add_argument("--skip-replays", action="store_true", help="run the federations only")
    args = parser.parse_args(argv)
    only = {n.strip() for n in args.only.split(",") if n.strip()} or None
    unknown = (only or set()) - set(names)
    if unknown:
        print(f"{label}: error: unknown run(s) {sorted(unknown)}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    def log(message: str) -> None:
        print(f"{label}: {message}", flush=True)

    call = start_call(out, prog.split()[-1], argv, started)
    folders = run_study(
        out,
        runs,
        replays,
        only,
        not args.skip_replays,
        log=log,
        timings=call["settings"],
        on_run=lambda: record_call(out, call),
    )
    end_call(out, call, started)
    table = outputs(out, folders)
    log(f"{len(folders)} run(s) and replay(s), {len(table)} table rows, {time.time() - started:.0f} s; {out}")
    return 0


def command_line(main, label: str, again: str) -> None:
    """Run a study's ``main()`` as a command and exit with its code. SIGTERM unwinds like Ctrl-C: the running
    launcher stops what it started (its finally blocks: the SuperLink and the sessions under it) and the study
    stops, where a SystemExit would read as that run's failure and go on with the next. A study started in
    the background by a non-interactive shell ignores SIGINT (POSIX): stop it with SIGTERM. ``again`` says
    how to pick up where it stopped ("rerun with --resume")."""
    import signal
    import sys

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        code = main()
    except KeyboardInterrupt:
        print(f"{label}: interrupted; what finished is kept: {again}", file=sys.stderr)
        code = 130
    sys.exit(code)


# --- a study's own record: its commands, commit and wall times ------------------------------------------------

STUDY_FILE = "study.json"


def record_call(out: Path, call: dict) -> Path:
    """out/study.json with ``call`` (one invocation of the study: its command, the commit it ran at, when it
    started and ended, its wall time and each setting's or run's) in place of the entry of the same ``started``, or
    appended; written atomically, at the start of a call and again at its end, so a killed call is seen as
    one that never ended. The study's wall time is the sum of its calls' ``seconds``."""
    from fl_attack.records import write_text_atomic

    path = out / STUDY_FILE
    try:
        calls = json.loads(path.read_text(encoding="utf-8"))["calls"]
    except (OSError, ValueError, KeyError, TypeError):
        calls = []
    calls = [c for c in calls if c.get("started") != call["started"]] + [call]
    return write_text_atomic(path, json.dumps({"calls": calls}, indent=2) + "\n")


def commit_of(folder: Path) -> str:
    """The git commit ``folder``'s checkout is at (with "+changes" when its tracked files differ from it),
    or "" outside a git checkout."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=folder,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def start_call(out: Path, module: str, argv: list[str] | None, started: float) -> dict:
    """This call of study ``module`` ("analysis.defenses"), started at ``started`` (time.time()), recorded in
    out/study.json (``record_call``): its command (``argv``, default sys.argv's), commit and start; its
    "settings" dict is for each setting's or run's time, recorded again with ``record_call``."""
    import shlex
    import sys

    call = {
        "command": shlex.join(["python", "-m", module, *(argv if argv is not None else sys.argv[1:])]),
        "commit": commit_of(Path(__file__).resolve().parents[1]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "ended": None,
        "seconds": None,
        "settings": {},
    }
    record_call(out, call)
    return call


def end_call(out: Path, call: dict, started: float) -> None:
    """``call`` (``start_call``) ended now: its end and wall time recorded in out/study.json."""
    call.update(ended=time.strftime("%Y-%m-%dT%H:%M:%S"), seconds=round(time.time() - started, 1))
    record_call(out, call)
