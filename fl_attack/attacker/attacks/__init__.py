"""Attack registry: importing this package registers ig, sme, nlsme, pisme, pisme-adaptive, ginas and dggi."""

from fl_attack.attacker.attacks import dggi, ginas, ig, nlsme, pisme, pisme_adaptive, sme  # noqa: F401  (registration side effect)
from fl_attack.attacker.attacks.base import (
    ATTACKS,
    Attack,
    AttackConfig,
    get_attack,
    lsim,
    parse_methods,
    register,
    total_variation,
)

__all__ = ["ATTACKS", "Attack", "AttackConfig", "get_attack", "lsim", "parse_methods", "register", "total_variation"]
