"""Privacy accounting: the ε a client has spent under local or central DP (accountant), and what DP
promises about reconstruction beside what the verdict measures (rero).

Imports nothing from fl_attack; the federation's settings (DefenseSettings) and the audit import it.
The rero names are exported lazily (PEP 562): importing the package (as the ClientApp does, through
DefenseSettings) does not import scipy.stats and scipy.optimize.
"""

from __future__ import annotations

import importlib

_RERO = (
    "BOUNDS",
    "ReroBound",
    "check_bound",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_mu",
    "kappa_upper",
    "local_dp_rero_bound",
    "rero_bound_eps_delta",
    "rero_bound_gaussian",
)
__all__ = list(_RERO)


def __getattr__(name: str):
    if name in _RERO:
        return getattr(importlib.import_module("fl_attack.privacy.rero"), name)
    raise AttributeError(f"module 'fl_attack.privacy' has no attribute '{name}'")
