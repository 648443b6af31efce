"""Flower's deployment engine on this machine: one SuperLink and N SuperNodes on localhost.

``python -m strategies.launch --deployment N`` uses this to run the federation the way it runs on
real machines (docs/running.md, "Running on Flower's deployment engine"), with real processes instead of the
simulation's Ray actors:

- ``flower-superlink --insecure`` on a free port of 127.0.0.1. In Flower 1.42 its Fleet, Control and
  Runtime APIs share that one HTTP port; it spawns the ServerApp as a subprocess (isolation
  ``subprocess``, the default);
- N ``flower-supernode --insecure --superlink 127.0.0.1:PORT --node-config "partition-id=i
  num-partitions=N"``, each with its own Runtime API port; each spawns a ClientApp process per
  message;
- a Flower configuration file (``config.toml`` in the CLI's own FLWR_HOME) naming that SuperLink as
  the connection ``flwr run . NAME`` and ``flwr ls NAME`` use.

Every process gets its own FLWR_HOME under the deployment's folder, as on separate machines (each
installs its own packaged copy of the app there), runtime dependency installation off, and
FL_ATTACK_HOME, so the packaged apps find the bundled data and the results folder. Each process
leads its own process group, and ``LocalDeployment.stop`` ends those groups and then every
descendant that left them: the SuperLink starts its SuperExec in a session of its own, and that
SuperExec's ServerApp outlives a killed SuperLink while it waits for nodes (measured, Flower 1.42).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

CONNECTION = "fl-attack-deployment"  # the connection's name in the CLI's config.toml


class DeploymentError(RuntimeError):
    """The local SuperLink or a SuperNode did not come up."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group ``proc`` leads, then SIGKILL what is left after ``grace`` seconds."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the leader or children that ignored SIGTERM
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


def signal_until_gone(alive: Callable[[], list[int]], waits: tuple[float, float]) -> list[int]:
    """SIGTERM every pid ``alive()`` lists, then SIGKILL those left, each signal followed by up to
    its ``waits`` seconds for them to go; returns the pids still alive after both."""
    for sig, wait in zip((signal.SIGTERM, signal.SIGKILL), waits):
        for pid in alive():
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
    return alive()


def flwr_json(args: list[str], env: dict, cwd: Path) -> dict:
    """What ``flwr ARGS --format json`` prints, as a dict ({} when it prints no JSON object)."""
    out = subprocess.run(
        ["flwr", *args, "--format", "json"], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )
    try:
        found = json.loads(out.stdout[out.stdout.find("{") :])
    except json.JSONDecodeError:
        return {}
    return found if isinstance(found, dict) else {}


def write_connection(cli_home: Path, address: str, name: str = CONNECTION) -> None:
    """A Flower configuration file in ``cli_home`` whose default connection ``name`` is the insecure
    SuperLink at ``address`` (host:port): what ``flwr run . NAME`` submits to (Flower 1.42 reads
    SuperLink connections from $FLWR_HOME/config.toml; pyproject's federations are gone)."""
    cli_home.mkdir(parents=True, exist_ok=True)
    (cli_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = {json.dumps(address)}\ninsecure = true\n'
    )


@dataclass
class LocalDeployment:
    """A running SuperLink and its SuperNodes; ``cli_env`` is the environment for ``flwr`` commands."""

    folder: Path
    address: str
    cli_env: dict
    processes: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    connection: str = CONNECTION

    def _spawn(self, name: str, cmd: list[str], env: dict) -> subprocess.Popen:
        log = self.folder / f"{name}.log"
        home = self.folder / name
        home.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                cmd,
                env={**env, "FLWR_HOME": str(home)},
                cwd=self.folder,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stop() ends its children too
            )
        self.processes.append(proc)
        self.logs.append(log)
        return proc

    def _check_alive(self) -> None:
        for proc, log in zip(self.processes, self.logs):
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise DeploymentError(f"{log.stem} exited with status {proc.returncode}; its log ends:\n{tail}")

    def online_nodes(self) -> int:
        """How many SuperNodes the SuperLink lists as online (``flwr supernode list``)."""
        nodes = flwr_json(["supernode", "list", self.connection], self.cli_env, self.folder).get("nodes", [])
        return sum(n.get("status") == "online" for n in nodes)

    def stop(self, grace: float = 5.0) -> None:
        """End every process this deployment started, SuperNodes first, each with its process group,
        then their descendants outside those groups (SIGTERM, SIGKILL after ``grace`` seconds)."""
        strays = [d for proc in self.processes for d in _descendants(proc.pid)]
        for proc in reversed(self.processes):
            kill_group(proc, grace)
        signal_until_gone(lambda: [pid for pid, started in strays if _alive(pid, started)], (grace, grace))


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], fields[19]


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every live descendant of ``pid`` (the start time tells a reused pid)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append((int(entry.name), stat[2]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def _alive(pid: int, started: str) -> bool:
    """Whether the process ``pid`` that started at ``started`` (``_stat``'s start time) still runs."""
    stat = _stat(pid)
    return stat is not None and stat[2] == started and stat[1] not in ("Z", "X")


def start_local(num_nodes: int, env: dict, folder: Path, timeout: float = 120.0) -> LocalDeployment:
    """Start a SuperLink and ``num_nodes`` SuperNodes (partition-id 0..N-1 of num-partitions N) on
    127.0.0.1 and wait until every SuperNode is online. ``env``: the processes' environment (PATH
    with the flower executables, FL_ATTACK_HOME, ...). Logs go to ``folder``/NAME.log.

    Raises DeploymentError (after stopping what it started) when a process exits or the nodes are
    not online within ``timeout`` seconds."""
    if num_nodes < 1:
        raise ValueError(f"a deployment needs at least 1 SuperNode, got {num_nodes}")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    address = f"127.0.0.1:{port}"
    cli_home = folder / "cli"
    write_connection(cli_home, address)
    env = {**env, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    deployment = LocalDeployment(folder, address, {**env, "FLWR_HOME": str(cli_home)})
    try:
        # --disable-runtime-dependency-installation: offline, no `uv sync` per run
        superlink = ["flower-superlink", "--insecure", "--disable-runtime-dependency-installation"]
        deployment._spawn("superlink", [*superlink, "--host", "127.0.0.1", "--port", str(port)], env)
        deadline = time.monotonic() + timeout
        while not _healthy(port):
            deployment._check_alive()
            if time.monotonic() > deadline:
                raise DeploymentError(f"the SuperLink on {address} did not answer within {timeout:g} s")
            time.sleep(0.5)
        for i in range(num_nodes):
            # each SuperNode has a Runtime API port of its own (its ClientApps connect to it)
            node = ["flower-supernode", "--insecure", "--superlink", address, "--host", "127.0.0.1"]
            config = f"partition-id={i} num-partitions={num_nodes}"
            deployment._spawn(f"supernode-{i}", [*node, "--port", str(free_port()), "--node-config", config], env)
        while (online := deployment.online_nodes()) < num_nodes:
            deployment._check_alive()
            if time.monotonic() > deadline:
                raise DeploymentError(f"{online} of {num_nodes} SuperNodes online after {timeout:g} s")
            time.sleep(1.0)
    except BaseException:
        deployment.stop()
        raise
    return deployment


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return 200 <= response.status < 300
    except OSError:
        return False
