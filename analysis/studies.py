"""What the studies (analysis.leakage_study, analysis.defenses) share: a run config as the
launcher's --run-config text, and federations launched into their run folders, skipping the
finished ones, resuming the interrupted ones and restarting those that cannot be resumed (a run
killed before its first checkpoint), so a stopped study picks up where it stopped.
"""

from __future__ import annotations

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


def run_study(out: Path, runs, replays, only: set[str] | None, with_replays: bool, log=print) -> list[Path]:
    """Launch every missing run of ``runs`` [(name, run config, supernodes)] into out/runs/<name>
    (an interrupted one resumed), then every missing replay of ``replays`` [(run name, fl-attack
    replay arguments with --name)]; ``only``: the run names to do (None: all). Returns the folders
    of the runs and replays that finished, in order."""
    from fl_attack.cli import main as fl_attack_main

    results, folders = out / "runs", []
    for name, config, supernodes in runs:
        if not (only and name not in only) and launch_run(results / name, config, supernodes, log):
            folders.append(results / name)
    for name, args in replays if with_replays else []:
        folder = results / name
        if (only and name not in only) or not finished(folder):
            continue
        replay = folder / "replays" / args[args.index("--name") + 1]
        if not finished(replay):
            log(f"replay {name} {' '.join(args)}")
            started = time.time()
            code = fl_attack_main(["replay", str(folder), *args, "--threads", "2"])
            log(f"replay exited {code} after {time.time() - started:.0f} s")
        if finished(replay):
            folders.append(replay)
    return folders


def study_main(argv, *, label: str, prog: str, doc: str, runs, replays, outputs) -> int:
    """The command line of a study: --out DIR, --only NAME,..., --skip-replays. Runs ``run_study``,
    then ``outputs(out, folders)`` (which writes the tables and returns the study table); 2 for an
    unknown run name. ``label`` prefixes every line it prints ("leakage study: ...")."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="study folder (runs/, study.csv, study.md, report/)")
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
    started = time.time()

    def log(message: str) -> None:
        print(f"{label}: {message}", flush=True)

    folders = run_study(out, runs, replays, only, not args.skip_replays, log=log)
    table = outputs(out, folders)
    log(f"{len(folders)} run(s) and replay(s), {len(table)} table rows, {time.time() - started:.0f} s; {out}")
    return 0
