"""The audit's attack for one update, chosen from the update's public metadata before it attacks.

The server knows each update's local steps T = E * ceil(k/B) (``TrainingMetadata.local_steps``). The rule:

* T < ``LONG_TRAJECTORY``: PI-SME with one Gauss-Legendre node for 400 iterations, X_hat's rate starting at
  1.0 and cut x0.3 when the attack's own loss stalls ("plateau"): on short local training it matches the
  paper's schedule at the wall time of 200 iterations at m = 3.
* T >= ``LONG_TRAJECTORY``: m = 7 for 400 iterations at the paper's steps (1.0, x0.1 at 3/8, 5/8, 7/8): a
  client that trained longer is worth a longer attack, as the path integral needs more nodes to follow a
  longer trajectory (PI-SME's own claim; Ghosh & Bhattacharya 2026, Table 2, eqs. 6-8).

The measurements that chose it, over attack seeds and trajectory lengths: docs/time-to-quality.md, "At every
trajectory length". Only T is read: k, B, the optimizer and the model's size were not found to change the
choice on the sets measured there. An explicit attack-nodes, attack-iterations or schedule always wins
(``AttackConfig.from_overrides`` takes it out of ``AttackConfig.auto``).
"""

from __future__ import annotations

from fl_attack.attacker.attacks import LR_SCHEDULES, AttackConfig

AUTO = 0  # attack-nodes / attack-iterations (and fl-attack's --preset audit): chosen per update by this rule
# T at and above which the rule spends the long-trajectory attack (docs/time-to-quality.md).
LONG_TRAJECTORY = 50
SHORT = {"nodes": 1, "iterations": 400, "schedule": "plateau"}
LONG = {"nodes": 7, "iterations": 400, "schedule": "steps"}


def audit_choice(local_steps: int) -> dict:
    """The rule's attack for an update of T = ``local_steps`` local steps: {"nodes": m, "iterations": K,
    "schedule": an ``LR_SCHEDULES`` name}. ValueError for T < 1."""
    if isinstance(local_steps, bool) or int(local_steps) < 1:
        raise ValueError(f"local_steps must be an integer >= 1, got {local_steps!r}")
    return dict(LONG if int(local_steps) >= LONG_TRAJECTORY else SHORT)


def placeholder() -> dict:
    """The AttackConfig values an "auto" setting holds until the update is known (the short-trajectory
    choice): nodes, iterations and the schedule's fields."""
    return {"nodes": SHORT["nodes"], "iterations": SHORT["iterations"], **LR_SCHEDULES[SHORT["schedule"]]}


def for_update(config: AttackConfig, metadata) -> AttackConfig:
    """``config`` with the settings named in ``config.auto`` chosen by ``audit_choice`` for ``metadata``
    (an update's ``TrainingMetadata``) and ``auto`` emptied; ``config`` itself when nothing is auto."""
    if not config.auto:
        return config
    choice = audit_choice(metadata.local_steps)
    chosen = {}
    if "nodes" in config.auto:
        chosen["nodes"] = choice["nodes"]
    if "iterations" in config.auto:
        chosen["iterations"] = choice["iterations"]
    if "schedule" in config.auto:
        chosen.update({"lr_images": 1.0, "lr_decay": True, **LR_SCHEDULES[choice["schedule"]]})
    return AttackConfig.from_overrides(config, auto=(), **chosen)
