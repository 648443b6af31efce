"""A study's independent federations as Ray jobs, with Ray's own job submission (``ray[default]``).

Each run is one job whose entrypoint is the checked launcher (``python -m strategies.launch``) for
that run alone, given the cluster's address as its ``--ray-address``, so the job's federation (its
clients) and its attacker actors join the same cluster. Ray decides where and when each job runs: all
are submitted at once, and nothing here schedules them. A cluster that should run K of them at a time
is started with a custom resource (``ray start --head --resources='{"fl-run": K}'``) and the study
given ``--job-resource fl-run``: each job then asks for one unit of it, and Ray queues the others.

Every node that may run a job needs this checkout at the same path and its .venv (as the launcher's
--ray-address does), and the run folders must be on a file system the submitting process reads at the
same path (one machine, or a shared mount): the entrypoint changes into the checkout and writes the
run folder named by its run config (an absolute results-dir).
"""

from __future__ import annotations

import secrets
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLL_SECONDS = 5.0  # how often the jobs' statuses are asked (waiting for them to end, not a time limit)
LOG_TAIL = 3000  # characters of a failed job's log printed
# A cluster just started takes a while to start its dashboard agent, the job server's hands: until then Ray
# answers a submission with HTTP 500 "No available agent to submit job, please try again later". It is asked
# again every POLL_SECONDS, this many times (5 minutes at the default) before the study gives up.
AGENT_WAITS = 60
NO_AGENT = "No available agent"


def entrypoint(values: dict, supernodes: int, ray_address: str, flwr_home: Path) -> str:
    """The shell command a job runs: the launcher for one run (``values``: its run-config keys) on
    ``supernodes`` clients, joined to the cluster at ``ray_address``, with its own FLWR_HOME (two
    launchers at once must not share Flower's packaged-app folder)."""
    from .studies import FEDERATION, run_config_text

    command = [
        sys.executable,
        "-m",
        "strategies.launch",
        "--run-config",
        run_config_text(values),
        "--federation-config",
        FEDERATION.format(supernodes),
        "--ray-address",
        ray_address,
    ]
    return f"cd {shlex.quote(str(ROOT))} && FLWR_HOME={shlex.quote(str(flwr_home))} " + " ".join(
        shlex.quote(part) for part in command
    )


def run_as_jobs(
    address: str,
    runs: list[tuple[str, dict, int]],
    finished: Callable[[str, bool], None],
    *,
    log=print,
    resource: str = "",
    flwr_home: Path | None = None,
    poll: float = POLL_SECONDS,
) -> None:
    """Submit each run of ``runs`` [(name, launcher run-config values, supernodes)] as a Ray job on the
    cluster at ``address`` (``ray start --head``'s HOST:PORT, or its dashboard's http://HOST:8265),
    then wait for them, calling ``finished(name, ok)`` as each ends (ok: the job SUCCEEDED, i.e. the
    launcher exited 0). ``resource``: a custom resource each job asks one unit of (module docstring).
    A failed job's log tail is printed. Ctrl-C stops the jobs still pending or running, then re-raises.
    Raises RuntimeError when the cluster's job server cannot be reached (no dashboard: install
    ``ray[default]``, start the head with ``ray start --head``)."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    try:
        client = JobSubmissionClient(address)
    except Exception as exc:  # ConnectionError, ValueError, Ray's own: all say the same to the user
        raise RuntimeError(
            f"cannot reach the Ray job server of {address} ({type(exc).__name__}: {exc}); start the cluster with "
            "`ray start --head` (ray[default] installed) and give its address"
        ) from None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    home = Path(flwr_home) if flwr_home is not None else ROOT / ".flwr" / "jobs"
    jobs: dict[str, str] = {}
    try:
        for name, values, supernodes in runs:
            jobs[name] = _submit(
                client,
                dict(
                    entrypoint=entrypoint(values, supernodes, address, home / name),
                    submission_id=f"fl-attack-{name}-{stamp}-{secrets.token_hex(3)}",
                    entrypoint_resources={resource: 1} if resource else None,
                    metadata={"run": name, "run-name": str(values.get("run-name", ""))},
                ),
                poll,
                log,
            )
            log(f"submitted {name} as Ray job {jobs[name]}")
        pending = dict(jobs)
        while pending:
            for name, job in list(pending.items()):
                status = client.get_job_status(job)
                if not status.is_terminal():
                    continue
                del pending[name]
                ok = status == JobStatus.SUCCEEDED
                log(f"Ray job {job} ({name}) {status.value}")
                if not ok:
                    log(f"the end of {job}'s log:\n{client.get_job_logs(job)[-LOG_TAIL:]}")
                finished(name, ok)
            if pending:
                time.sleep(poll)
    except KeyboardInterrupt:
        for name, job in jobs.items():
            if not client.get_job_status(job).is_terminal():
                client.stop_job(job)
                log(f"stopped Ray job {job} ({name}); --resume picks its run up again")
        raise


def _submit(client, job: dict, poll: float, log, waits: int = AGENT_WAITS) -> str:
    """``client.submit_job(**job)``, asked again while the cluster has no dashboard agent yet (``NO_AGENT``),
    at most ``waits`` times; any other error, or the last refusal, is raised as Ray raised it."""
    for attempt in range(waits + 1):
        try:
            return client.submit_job(**job)
        except RuntimeError as exc:
            if NO_AGENT not in str(exc) or attempt == waits:
                raise
            if attempt == 0:
                log("the cluster's job agent is not up yet; submitting again until it is")
            time.sleep(poll)
    raise AssertionError("unreachable")
