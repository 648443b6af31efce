"""The attacker's worker runtime: where and how attack jobs run, apart from the attacks themselves.

``workers`` is the entry (``make_workers``, ``Pipeline``, ``AttackJob``, ``AttackOutcome``, ``run_job``);
``schedule`` decides which workers a driver gets and how jobs reach them, ``actor`` runs them on Ray,
``pool`` in this process or spawned processes, ``run`` runs one job (``run_job``: the body of every
worker), and ``outcome`` holds a job and what comes back. The attack mathematics (fl_attack.attacker's
``api``, ``attacks``, ``memory``, ``labels``, ...) never imports this package (pyproject.toml's
import-linter contracts).
"""
