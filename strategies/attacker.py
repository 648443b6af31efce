"""The federation's attack workers (fl_attack.workers), chosen from the run config.

Where the ServerApp's attacks run, so that they never block a round:
- inside Flower's simulation: Ray actors on Flower's own Ray runtime (which is a Ray cluster when
  the SuperLink was started with ``RAY_ADDRESS``: ``python -m strategies.launch --ray-address``);
- under Flower's deployment engine (no Ray in the ServerApp's process): Ray actors on the cluster
  at ``attack-ray-address`` when it is set, else ``attack-actors`` local processes.

Facts this relies on (measured on Flower 1.42 with Ray 2.55): Flower's simulation process is the
Ray driver and its client pool holds every CPU, so an attacker asking num_cpus >= 1 would never
start: the actors there ask num_cpus=0 (plus ``attack-num-gpus``) and set their torch threads
themselves. Ray is up only once rounds run, so the choice is made at the first attack; the
ServerApp never calls ray.init() under the simulation.
"""

from __future__ import annotations

import logging

from fl_attack.run_config import RunSettings
from fl_attack.workers import AttackJob, AttackOutcome, ProcessWorkers, RayWorkers, Workers

log = logging.getLogger(__name__)

__all__ = ["AttackJob", "AttackOutcome", "FederationWorkers"]


class FederationWorkers:
    """The run's workers (``fl_attack.workers``), picked at the first submit: Flower's Ray runtime
    when it is up, else the Ray cluster at ``attack-ray-address``, else local processes.
    ``kind`` names the choice ("" before it)."""

    def __init__(self, settings: RunSettings, threads: int):
        self.settings, self.threads = settings, max(1, int(threads))
        self._workers: Workers | None = None
        self.kind = ""

    def _choose(self) -> Workers:
        s = self.settings
        import ray

        if ray.is_initialized():  # Flower's simulation (perhaps attached to a cluster)
            self.kind = "ray"
            workers = RayWorkers(s.attack_actors, s.attack_num_gpus, self.threads, s.attack_device)
        elif s.attack_ray_address:
            self.kind = f"ray cluster {s.attack_ray_address}"
            workers = RayWorkers(
                s.attack_actors,
                s.attack_num_gpus,
                self.threads,
                s.attack_device,
                address=s.attack_ray_address,
                num_cpus=self.threads,
            )
        else:  # Flower's deployment engine without a cluster
            self.kind = "local processes"
            workers = ProcessWorkers(s.attack_actors, self.threads, s.attack_device)
        log.info("attacks run on %s (%d worker(s))", self.kind, s.attack_actors)
        return workers

    @property
    def in_flight(self) -> int:
        return self._workers.in_flight if self._workers else 0

    def submit(self, job: AttackJob) -> None:
        if self._workers is None:
            self._workers = self._choose()
        self._workers.submit(job)

    def poll(self) -> list[AttackOutcome]:
        return self._workers.poll() if self._workers else []

    def drain(self, timeout: float) -> list[AttackOutcome]:
        return self._workers.drain(timeout) if self._workers else []

    def shutdown(self) -> None:
        if self._workers:
            self._workers.shutdown()
