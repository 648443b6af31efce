"""The checked entry point: run one federation, wait for it, and clean up.

    python -m strategies.launch [--run-config 'key=value ...'] [--federation-config '...']
    python -m strategies.launch --deployment N [--run-config 'key=value ...']
    python -m strategies.launch --superlink HOST:PORT [--run-config 'key=value ...']

Plain ``flwr run`` returns 0 even when the run failed and leaves a detached SuperLink behind
(measured on Flower 1.42). This launcher:
1. starts its own local SuperLink (through ``flwr run``) on free ports, with runtime dependency
   installation off, telemetry off, FLWR_HOME inside the project and FL_ATTACK_HOME set so the
   packaged app finds the bundled data;
2. streams the run, then asks ``flwr ls`` for its final status; a run that prints nothing for
   ``--silence-timeout`` seconds, or runs past ``--timeout``, is abandoned: the ``flwr run`` process
   group is killed, the reason printed, and the exit status is 1;
3. stops the SuperLink it started and prints where the run folder is (as the ServerApp named it);
4. adds its clock (launch, ``flwr run`` exit) to the run's summary.json timings and prints where the
   time went (fl_attack/audit/timings.py);
5. exits 0 only when the run completed and wrote its leakage record.

``--deployment N`` runs on Flower's deployment engine instead of the simulation: a SuperLink and N
SuperNodes on localhost (partition-id 0..N-1 from each SuperNode's --node-config,
strategies/deploy.py), stopped with their process groups at the end; their logs stay in
$FLWR_HOME/deployments/ when the run fails. ``--superlink HOST:PORT`` submits to a SuperLink that
is already running (started with --insecure, e.g. on another machine) and leaves it running.

``--run-config`` takes what ``flwr run`` takes (key=value strings, or one TOML file, dotted keys
included), parsed by Flower's own parser. The launcher adds the federation's
client-resources-num-cpus as the run config's client-num-cpus (the ServerApp cannot see the
federation config) unless the run config sets it. The report is analysis' job, run afterwards
(``make demo`` does both); nothing here imports analysis/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .deploy import (
    CONNECTION,
    DeploymentError,
    flwr_json,
    free_port,
    kill_group,
    signal_until_gone,
    start_local,
    write_connection,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FEDERATION = "num-supernodes=6 client-resources-num-cpus=1 client-resources-num-gpus=0.0"


def _environment() -> dict:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")  # flwr spawns flower-superlink by name
    env.setdefault("FLWR_HOME", str(ROOT / ".flwr"))
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"  # offline: no `uv sync` per run
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env["FL_ATTACK_HOME"] = str(ROOT)
    env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(free_port())
    env["FLWR_LOCAL_CONTROL_API_PORT"] = str(free_port())
    env.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    return env


def toml_value(value) -> str:
    """A run-config value as TOML: true/false, a number, a quoted string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


_PAIR = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")  # flwr's own key=value pattern


def _parse_overrides(overrides: list[str]) -> dict:
    """The --run-config values as Flower reads them, but refusing what Flower would silently drop
    (a key without a value, a stray word) and turning its parse errors into ValueError."""
    from flwr.common.config import parse_config_args

    pairs = [text for text in overrides if not text.endswith(".toml")]
    for text in pairs:
        stray = _PAIR.sub(" ", text).split()
        if stray:
            raise ValueError(f"expected key=value pairs, got '{stray[0]}' in '{text}'")
    keys = [key for text in pairs for key, _ in _PAIR.findall(text)]
    twice = next((key for key in keys if keys.count(key) > 1), None)
    if twice:  # Flower says only "invalid format" in one argument, and keeps the last across two
        raise ValueError(f"run-config key '{twice}' is given more than once; give it once")
    try:
        return parse_config_args(overrides or None)
    except (ValueError, OSError):
        raise
    except Exception as exc:  # click's and tomli's errors: a malformed value, a key given twice
        raise ValueError(str(getattr(exc, "message", None) or exc).strip()) from None


def _check_run_config(pairs: dict, federation: str | None) -> None:
    """Every check the ServerApp makes before round 1, here in a second: unknown keys (Flower would
    only say "Invalid run configuration"), each value's type and range (RunSettings), a resume
    folder's config and checkpoint, then attack-clients and the data's partitions against
    num-supernodes (not for ``federation`` None: a SuperLink elsewhere, whose nodes the ServerApp
    counts). ValueError naming the key."""
    import tomllib

    from fl_attack.audit.run_folder import check_resumable
    from fl_attack.run_config import preflight

    defaults = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    unknown = sorted(set(pairs) - set(defaults))
    if unknown:
        raise ValueError(
            f"unknown run-config key '{unknown[0]}'; the keys are pyproject.toml's "
            "[tool.flwr.app.config] (docs/run-config.md)"
        )
    run_config = {**defaults, **pairs}  # what the ServerApp's context.run_config will be
    num_nodes = None  # a SuperLink elsewhere: the ServerApp counts its nodes
    if federation is not None:
        nodes = re.search(r"num-supernodes=(\d+)", federation)
        num_nodes = int(nodes.group(1)) if nodes else 2  # Flower's default: 2 SuperNodes
    check_resumable(preflight(run_config, num_nodes), run_config)


def _check_federation(federation: str) -> None:
    """ValueError for client resources Flower 1.42 rejects only after the SuperLink has started
    (a fractional client-resources-num-cpus fails there with "'float' object cannot be interpreted
    as an integer")."""
    for key in ("client-resources-num-cpus", "num-supernodes"):
        found = re.search(rf"(?:^|\s){key}=(\S+)", federation or "")
        if found and not re.fullmatch(r"[1-9]\d*", found.group(1)):
            raise ValueError(f"{key} must be a whole number >= 1 (Flower takes no fractions), got {found.group(1)}")


def checked_run_config(pairs: dict, federation: str | None) -> dict:
    """``pairs`` (run-config values as Flower parses them) plus the federation's client CPUs as
    client-num-cpus when they do not set it, after every check the launcher makes before it starts
    anything (``_check_run_config``: keys, values, a resume folder, partitions). Returns the new dict;
    raises ValueError naming the key. A study calls it to ask whether a run can be resumed."""
    pairs = dict(pairs)
    cpus = re.search(r"client-resources-num-cpus=(\d+)(?![.\d])", federation or "")
    if cpus and "client-num-cpus" not in pairs:
        pairs["client-num-cpus"] = int(cpus.group(1))
    _check_run_config(pairs, federation)
    return pairs


def _run_config(overrides: list[str], federation: str | None, folder: Path) -> tuple[Path, str]:
    """The ``--run-config`` values (``_parse_overrides``), checked (``checked_run_config``, which adds
    the federation's client CPUs as client-num-cpus), written to a new TOML file in ``folder``: the
    one file handed to ``flwr run`` (the caller deletes it). Returns (that file, the run-name or "").
    Raises ValueError for a malformed or invalid run config, before anything starts."""
    pairs = checked_run_config(_parse_overrides(overrides), federation)
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="run-config-", suffix=".toml", dir=folder)  # one per launch
    os.close(fd)
    path = Path(name)
    path.write_text("".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in pairs.items()))
    return path, str(pairs.get("run-name", ""))


def _processes():
    """(pid, command line) of every live process that can be read in /proc (zombies left out: they
    have exited and only wait to be reaped)."""
    for pid, _, cmd in _process_table():
        yield pid, cmd


def _process_table():
    """(pid, parent pid, command line) of every live process that can be read in /proc (zombies left out)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] in ("Z", "X"):
                    continue
                yield int(proc.name), int(fields[1]), (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, IndexError, ValueError):
                continue


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _with_descendants(roots: list[int]) -> set[int]:
    """``roots`` and every live process under them (by parent pid, read now: a process whose parent has
    exited is reparented and no longer found)."""
    children: dict[int, list[int]] = {}
    for pid, parent, _ in _process_table():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def _stop_superlink(control_port: str, grace: float = 10.0) -> None:
    """Stop the SuperLink this launcher started (found by its control-API port) and every process
    of its session and of the sessions under it. ``flwr run`` starts the SuperLink in a session of its
    own, and the SuperLink starts the SuperExec in another (Flower 1.42: ``flower-superexec
    --parent-pid``), whose simulation process (``flwr-simulation``: the ServerApp, its attacker, Ray)
    outlives a SIGTERM of the SuperLink alone: an abandoned run's ServerApp went on attacking for 25
    minutes after its launcher had exited, and one outlived a stopped study by 25 s. The sessions are
    read before any signal (once the SuperLink is gone its children are reparented); SIGTERM to them
    all, SIGKILL to what is left after ``grace`` seconds; never this launcher's own session."""
    ours = [pid for pid, cmd in _processes() if "flower-superlink" in cmd and f":{control_port}" in cmd]
    sessions = {_session_of(pid) for pid in _with_descendants(ours)} - {None, os.getsid(0)}
    if not sessions:
        return

    def members() -> list[int]:
        return [pid for pid, _ in _processes() if pid != os.getpid() and _session_of(pid) in sessions]

    left = signal_until_gone(members, (grace, 5.0))
    if left:
        print(f"fl-attack: warning: processes of the SuperLink's session outlived SIGKILL: {left}", file=sys.stderr)


def _flwr_command(config_file: Path, federation: str | None, superlink: str | None = None) -> list[str]:
    """The command that runs the federation (a test may put another one in its place): on the
    local simulation SuperLink with the ``federation`` options, or on the SuperLink connection
    named ``superlink`` (deployment engine)."""
    if superlink:
        return ["flwr", "run", str(ROOT), superlink, "--stream", "--run-config", str(config_file)]
    return ["flwr", "run", str(ROOT), "--stream", "--run-config", str(config_file), "--federation-config", federation]


def stream(cmd: list[str], env: dict, timeout: float, silence_timeout: float, on_line) -> str:
    """Run ``cmd`` in its own process group, hand each output line (stdout and stderr) to
    ``on_line`` as it arrives, and wait for it to end.

    timeout: seconds in all; silence_timeout: seconds without a line. A reader thread feeds a queue,
    so silence is noticed even when no line ever comes. Past either limit the whole process group is
    killed (SIGTERM, SIGKILL 5 s later). Returns "" when the command ended by itself, else why it
    was abandoned (one sentence).
    """
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: queue.Queue = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # end of output

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = last = time.monotonic()
    reason, ended = "", False
    try:
        while True:
            now = time.monotonic()
            if now - last >= silence_timeout:
                reason = f"no output for {silence_timeout:g} s (--silence-timeout)"
            elif now - started >= timeout:
                reason = f"still running after {timeout:g} s (--timeout)"
            if reason:
                break
            try:
                line = lines.get(timeout=min(silence_timeout - (now - last), timeout - (now - started)))
            except queue.Empty:
                continue
            if line is None:
                ended = True
                break
            last = time.monotonic()
            on_line(line)
    finally:
        if not ended:  # abandoned, or interrupted (Ctrl-C)
            kill_group(proc)
        proc.wait()
        reader.join(timeout=5)
    return reason


def _final_status(run_id: str, env: dict, superlink: str | None = None) -> str:
    try:
        runs = flwr_json(["ls", *([superlink] if superlink else []), "--run-id", run_id], env, ROOT).get("runs", [])
        return str(runs[0].get("status", "unknown")) if runs else "unknown"
    except AttributeError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The launcher's command line (also what analysis.defenses builds its runs' arguments for)."""
    parser = argparse.ArgumentParser(
        prog="python -m strategies.launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--run-config",
        action="append",
        default=[],
        help="run config overrides as for flwr run: 'dataset=\"cifar100\" num-server-rounds=3' "
        "(repeatable) or one .toml file",
    )
    parser.add_argument(
        "--federation-config", default=None, help=f"simulation options (default: '{DEFAULT_FEDERATION}')"
    )
    engine = parser.add_mutually_exclusive_group()
    engine.add_argument(
        "--deployment",
        type=int,
        metavar="N",
        help="run on Flower's deployment engine: a SuperLink and N SuperNodes on localhost (partition-id 0..N-1)",
    )
    engine.add_argument(
        "--superlink",
        metavar="HOST:PORT",
        help="run on the SuperLink already running at HOST:PORT (started with --insecure); it keeps running",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds before the run is abandoned (default: no overall limit; a run whose attacker lags "
        "drains for as long as its attacks take, and --silence-timeout still catches a hung run)",
    )
    parser.add_argument(
        "--silence-timeout",
        type=float,
        default=900,
        help="seconds without any output before the run is abandoned (default: 900)",
    )
    parser.add_argument("--run-dir-file", default="", help="write the run folder's path to this file at the end")
    parser.add_argument(
        "--ray-address",
        default="",
        help="run the simulation (clients and attacker actors) on this existing Ray cluster, e.g. "
        "127.0.0.1:6379 from `ray start --head` (sets RAY_ADDRESS for the SuperLink it starts)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("timeout", "silence_timeout"):
        value = getattr(args, name)
        if value is not None and not (value > 0 and value != float("inf")):
            return _error(f"--{name.replace('_', '-')} must be a finite number of seconds > 0, got {value}")
    simulation = args.deployment is None and args.superlink is None
    if not simulation and args.federation_config is not None:
        return _error(
            "--federation-config sets simulation options; on the deployment engine each "
            "SuperNode's partition comes from its --node-config"
        )
    if args.deployment is not None and args.deployment < 1:
        return _error(f"--deployment needs at least 1 SuperNode, got {args.deployment}")
    if simulation:
        federation = args.federation_config or DEFAULT_FEDERATION
    else:  # the deployment engine has no simulation options; its node count is known only for --deployment
        federation = f"num-supernodes={args.deployment}" if args.deployment else None

    try:
        _check_federation(args.federation_config)
    except ValueError as exc:
        return _error(f"--federation-config: {exc}")
    env = _environment()
    if args.ray_address:
        env["RAY_ADDRESS"] = args.ray_address  # Flower's ray.init() joins this cluster
    try:
        config_file, _ = _run_config(args.run_config, federation, Path(env["FLWR_HOME"]) / "launch")
    except (ValueError, OSError) as exc:
        return _error(f"--run-config: {exc}")
    found = {"run_id": None, "run_dir": None}
    started = time.time()

    def on_line(line: str) -> None:
        sys.stdout.write(line)
        sys.stdout.flush()
        match = re.search(r"started run (\d+)", line)
        found["run_id"] = found["run_id"] or (match.group(1) if match else None)
        folder = re.search(r"fl-attack: leakage record in (.+)$", line.rstrip())
        found["run_dir"] = found["run_dir"] or (Path(folder.group(1)) if folder else None)

    connection, deployment, deploy_dir, cli_home = None, None, None, None
    try:
        if args.deployment:
            deploy_dir = Path(tempfile.mkdtemp(prefix="run-", dir=_mkdir(Path(env["FLWR_HOME"]) / "deployments")))
            print(f"fl-attack: starting a SuperLink and {args.deployment} SuperNode(s) on localhost", flush=True)
            deployment = start_local(args.deployment, env, deploy_dir)
            print(f"fl-attack: SuperLink on {deployment.address}; logs in {deploy_dir}", flush=True)
            connection, env = deployment.connection, deployment.cli_env
        elif args.superlink:
            cli_home = Path(tempfile.mkdtemp(prefix="cli-", dir=_mkdir(Path(env["FLWR_HOME"]) / "superlinks")))
            write_connection(cli_home, args.superlink)
            connection, env = CONNECTION, {**env, "FLWR_HOME": str(cli_home)}
        cmd = _flwr_command(config_file, federation, superlink=connection)
        print("fl-attack:", " ".join(shlex.quote(c) for c in cmd), flush=True)
        abandoned = stream(cmd, env, args.timeout or math.inf, args.silence_timeout, on_line)
        flwr_exited = time.time()
        run_id, run_dir = found["run_id"], found["run_dir"]
        if abandoned:
            _error(f"run abandoned: {abandoned}; the flwr process group was killed")
        status = _final_status(run_id, env, connection) if run_id else "not started"
    except DeploymentError as exc:
        _error(f"the local deployment did not start: {exc}")
        print(f"fl-attack: SuperLink and SuperNode logs in {deploy_dir}", file=sys.stderr)
        return 1
    finally:
        if deployment is not None:
            deployment.stop()
        elif simulation:
            _stop_superlink(env["FLWR_LOCAL_CONTROL_API_PORT"])
        config_file.unlink(missing_ok=True)
        if cli_home is not None:
            shutil.rmtree(cli_home, ignore_errors=True)
    if abandoned:
        print(
            f"fl-attack: run {run_id} abandoned after {time.time() - started:.0f} s (status: {status})", file=sys.stderr
        )
        if deploy_dir is not None:
            print(f"fl-attack: SuperLink and SuperNode logs in {deploy_dir}", file=sys.stderr)
        return 1
    seconds = time.time() - started
    ok = status.endswith("completed") and run_dir is not None and (run_dir / "rounds.csv").exists()
    print(f"fl-attack: run {run_id} {status} in {seconds:.0f} s", flush=True)
    if not ok:
        return _error(
            f"the federation did not complete (status: {status}); see the log above"
            + (f" and {run_dir}" if run_dir is not None and run_dir.exists() else "")
            + (f"; SuperLink and SuperNode logs in {deploy_dir}" if deploy_dir is not None else ""),
            code=1,
        )
    if deploy_dir is not None:  # the logs of a deployment that worked are not needed
        shutil.rmtree(deploy_dir, ignore_errors=True)
    print(f"fl-attack: leakage record: {run_dir}/attacks.csv", flush=True)
    summary = _report_timings(run_dir, started, flwr_exited)
    if summary is None:  # the ServerApp writes it last: without it the end of the record is unknown
        return _error(
            f"{run_dir}/summary.json is missing or unreadable (the disk may have refused it); "
            "the record may be incomplete: see events.log",
            code=1,
        )
    _print_verdict(summary)
    if summary.get("writes_refused") or summary.get("attacks_unwritten"):
        from fl_attack.audit.service import incomplete

        return _error(f"the disk refused part of the record: {incomplete(summary)}", code=1)
    if args.run_dir_file:  # for a caller that goes on with the run (make demo writes its report)
        Path(args.run_dir_file).write_text(f"{run_dir}\n")
    return 0


def _print_verdict(summary: dict) -> None:
    """The launcher's last lines: each attack's verdict (summary.json "verdict", fl_attack.evaluation.verdict)."""
    text = verdict_text(summary)
    if text:
        print(text, flush=True)


def verdict_text(summary: dict) -> str:
    """The verdict as the launcher prints it (README's demo block is written from it); "" without one."""
    lines = (summary.get("verdict") or {}).get("lines") or []
    if not lines:
        return ""
    header = (
        "fl-attack: the verdict (recovered = singled out among the client's k images and D distractors, "
        "and read as its original by an independent classifier; 95% intervals over the k images; chance = "
        "update-free outputs matched and ranked the same way; docs/verdict.md)"
    )
    return "\n".join([header, *(f"  {line}" for line in lines)])


def _error(message: str, code: int = 2) -> int:
    """Print ``message`` as the launcher's error on stderr; returns ``code``, the exit status."""
    print(f"fl-attack: error: {message}", file=sys.stderr)
    return code


def _mkdir(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _report_timings(run_dir: Path, launched: float, flwr_exited: float) -> dict | None:
    """Add the launcher's clock to summary.json's timings and print where the time went; returns
    summary.json, None when it cannot be read. A refused rewrite is reported, not raised."""
    from fl_attack.audit.timings import table
    from fl_attack.records import write_json_atomic

    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(summary, dict):
        return None
    if "timings" not in summary:
        return summary
    summary["timings"]["launcher"] = {"launched": launched, "flwr_exited": flwr_exited}
    try:
        write_json_atomic(path, summary)
    except OSError as exc:  # the ServerApp's summary stands; only the launcher's clock is lost
        print(f"fl-attack: warning: could not add the launcher's timings to {path}: {exc}", file=sys.stderr)
    print(table(summary["timings"]), flush=True)
    return summary


if __name__ == "__main__":
    # SIGTERM (timeout, kill) unwinds like Ctrl-C, so the finally blocks stop what was started.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sys.exit(main())
