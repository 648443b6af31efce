"""Attack registry: importing this package registers ig, sme, nlsme, pisme, pisme-adaptive, ginas, dggi
and dimitrov."""

from fl_attack.attacker.attacks import (  # noqa: F401  (registration side effect)
    dggi,
    dimitrov,
    ginas,
    ig,
    nlsme,
    pisme,
    pisme_adaptive,
    sme,
)
from fl_attack.attacker.attacks.base import (
    ATTACKS,
    AUTO_SETTINGS,
    LR_SCHEDULES,
    Attack,
    AttackConfig,
    check_compile,
    check_iterations,
    check_own_settings,
    get_attack,
    lsim,
    parse_methods,
    register,
    schedule_name,
    total_variation,
)

__all__ = [
    "ATTACKS",
    "AUTO_SETTINGS",
    "LR_SCHEDULES",
    "Attack",
    "AttackConfig",
    "check_compile",
    "check_iterations",
    "check_own_settings",
    "get_attack",
    "lsim",
    "parse_methods",
    "register",
    "schedule_name",
    "total_variation",
]
