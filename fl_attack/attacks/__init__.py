"""Attack registry: importing this package registers ig, sme, nlsme and pisme."""
from . import ig, nlsme, pisme, sme  # noqa: F401  (registration side effect)
from .base import ATTACKS, Attack, AttackConfig, get_attack, lsim, register, total_variation

__all__ = ["ATTACKS", "Attack", "AttackConfig", "get_attack", "lsim", "register", "total_variation"]
