"""The audit's rule (fl_attack.attacker.rule): the attack chosen from an update's public metadata, in each regime,
and every way a user's explicit setting wins over it (the run config, fl-attack attack --preset audit, replay).

Unit tests of the rule's table, then the rule on real victims' updates (FEMNIST writers trained as
Dimitrov et al.'s protocol and as short local training), where T comes from the update itself."""

from __future__ import annotations

import pytest

from fl_attack.attacker.attacks import LR_SCHEDULES, AttackConfig, schedule_name
from fl_attack.attacker.rule import LONG_TRAJECTORY, audit_choice, for_update
from fl_attack.attacker.runtime.outcome import AttackJob
from fl_attack.audit.settings import AuditSettings
from fl_attack.evaluation.victims import train_victim
from fl_attack.federation.update import AttackTarget

ALL = ("nodes", "iterations", "schedule")


@pytest.mark.parametrize(
    "T, nodes, schedule",
    [(1, 1, "plateau"), (10, 1, "plateau"), (20, 1, "plateau"), (LONG_TRAJECTORY - 1, 1, "plateau")]
    + [(LONG_TRAJECTORY, 7, "steps"), (100, 7, "steps"), (250, 7, "steps")],
)
def test_each_regime_gets_its_attack_unit(T, nodes, schedule):
    """Short local training: m = 1, 400 iterations, plateau; from T = LONG_TRAJECTORY: m = 7, 400, steps."""
    assert audit_choice(T) == {"nodes": nodes, "iterations": 400, "schedule": schedule}


def test_a_trajectory_without_steps_is_refused_unit():
    for bad in (0, -3, True):
        with pytest.raises(ValueError, match="local_steps must be an integer >= 1"):
            audit_choice(bad)


def test_the_run_config_defaults_leave_all_three_to_the_rule_and_a_given_value_wins_unit():
    """attack-nodes = 0, attack-iterations = 0, attack-lr-schedule = "auto" (pyproject's defaults): all three are
    the rule's; a value given in the run config, or a rate or shape set in attack-options, is not."""
    assert AuditSettings().attack_config().auto == ALL
    assert AuditSettings(attack_nodes=3).attack_config().auto == ("iterations", "schedule")
    assert AuditSettings(attack_iterations=1000).attack_config().auto == ("nodes", "schedule")
    steps = AuditSettings(attack_lr_schedule="steps").attack_config()
    assert steps.auto == ("nodes", "iterations") and schedule_name(steps) == "steps"
    assert AuditSettings(attack_options="lr_images=0.3").attack_config().auto == ("nodes", "iterations")
    fixed = AuditSettings(attack_nodes=3, attack_iterations=200, attack_lr_schedule="constant").attack_config()
    assert fixed.auto == () and (fixed.nodes, fixed.iterations, schedule_name(fixed)) == (3, 200, "constant")
    with pytest.raises(ValueError, match="attack-options: auto is set here and by the run-config key attack-nodes"):
        AuditSettings(attack_options="auto=nodes").attack_config()
    with pytest.raises(ValueError, match="attack-nodes: the number of quadrature nodes m must be an integer >= 0"):
        AuditSettings.from_run_config({"attack-nodes": -1})


def test_an_explicit_override_takes_its_setting_out_of_the_rule_unit():
    """AttackConfig.from_overrides, the one place a setting is overridden (replay's --nodes, --iterations,
    --options; the CLI's flags): the overridden setting leaves ``auto``; the rule then picks only the rest."""
    base = AttackConfig.from_overrides(None, auto=ALL)
    assert AttackConfig.from_overrides(base, nodes=3).auto == ("iterations", "schedule")
    assert AttackConfig.from_overrides(base, lr_schedule="cosine").auto == ("nodes", "iterations")
    assert AttackConfig.from_overrides(base, tv_weight=0.02).auto == ALL


@pytest.fixture(scope="module")
def victims():
    """Two real FEMNIST writers' updates: Dimitrov et al.'s protocol (k = 50, B = 5, E = 10: T = 100) and short
    local training (k = 16, B = 8, E = 5: T = 10), plain SGD at 0.004 from the paper's CNN."""
    long = train_victim("femnist", 0, samples=50, batch_size=5, local_epochs=10, lr=0.004, seed=0)
    short = train_victim("femnist", 1, samples=16, batch_size=8, local_epochs=5, lr=0.004, seed=0)
    return long, short


def test_the_rule_reads_t_from_each_real_update(victims):
    """An AttackJob chooses its attack from its update's own metadata: T = 100 gets m = 7 and the steps, T = 10
    m = 1 and the plateau, each at 400 iterations; what the config gives explicitly stays; the row's
    described attack is the one chosen."""
    long, short = victims
    assert (long.update.metadata.local_steps, short.update.metadata.local_steps) == (100, 10)
    config = AuditSettings().attack_config()
    jobs = [AttackJob(i, v.update, "pisme", config, AttackTarget(1, (i,))) for i, v in enumerate(victims)]
    chosen = [(j.config.nodes, j.config.iterations, schedule_name(j.config), j.config.auto) for j in jobs]
    assert chosen == [(7, 400, "steps", ()), (1, 400, "plateau", ())]
    assert jobs[0].described()["lr_schedule"] == "steps" and jobs[0].described()["iterations"] == 400
    assert {k: getattr(jobs[0].config, k) for k in LR_SCHEDULES["steps"]} == LR_SCHEDULES["steps"]
    mine = AuditSettings(attack_nodes=3).attack_config()
    assert for_update(mine, long.update.metadata).nodes == 3  # the user's m, the rule's iterations and schedule
    assert schedule_name(for_update(mine, long.update.metadata)) == "steps"


def test_fl_attack_attack_preset_audit_is_the_rule_with_explicit_flags_winning(victims):
    """`fl-attack attack --preset audit` leaves m, the iterations and the schedule to the rule, per victim;
    --nodes / --iterations / a schedule --option take theirs out of it (as the other presets' flags win)."""
    from fl_attack.cli import _settings, build_parser

    def auto_of(*flags):
        args = build_parser().parse_args(["attack", "--preset", "audit", *flags])
        return _settings(args).attack_config().auto

    assert auto_of() == ALL
    assert auto_of("--nodes", "3") == ("iterations", "schedule")
    assert auto_of("--iterations", "1000", "--option", "lr_schedule=cosine") == ("nodes",)
    paper = build_parser().parse_args(["attack", "--preset", "paper"])
    assert _settings(paper).attack_config().auto == ()
