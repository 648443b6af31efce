"""The run config, checked once before a run starts: ``preflight``.

Flower hands the run config to both apps as a flat dict with kebab-case keys and TOML types. Each
key belongs to one role, which parses and checks it: the federation's (data, partitions, model,
local training; fl_attack.federation.settings.FederationSettings), the defense's
(fl_attack.federation.defense_settings.DefenseSettings) and the audit's (which rounds and clients are
attacked, how, on what, and the record; fl_attack.audit.settings.AuditSettings).
``fl_attack.audit.settings.RunSettings`` composes them; ``preflight`` adds what needs the
federation's nodes or this machine, and is the one place a run fails before its first round (the
launcher runs it before the SuperLink starts, the ServerApp before round 1).

Each setting is imported from its home (the modules named above); this module holds only ``preflight``
and sits above fl_attack.audit in the layers (pyproject.toml's import-linter contracts).
"""

from __future__ import annotations

from fl_attack.audit.settings import RunSettings


def preflight(run_config, num_nodes: int | None = None) -> RunSettings:
    """A run's settings, parsed and checked once before its first round: every value's type and
    range (RunSettings.from_run_config: the federation's, the defense's, the audit's and those across
    them), the device, and with ``num_nodes`` (the federation's node count) the data's partitions,
    the attack-clients ids and the defense's clients per round. The launcher runs it before the
    SuperLink starts, the ServerApp before round 1; the ClientApp and the strategies take the
    settings it returns and check nothing again. ``preflight.runs`` counts the calls (tests).
    Raises ValueError naming the key."""
    preflight.runs += 1
    settings = RunSettings.from_run_config(run_config)
    settings.check_device()
    if num_nodes is not None:
        settings = settings.with_partitions(num_nodes)  # what the Flower partitioners cut the data by
        settings.check_partitions(num_nodes)
        settings.check_nodes(num_nodes)  # attack-clients ids must be < the federation's node count
        settings.clients_per_round(num_nodes)
    return settings


preflight.runs = 0
