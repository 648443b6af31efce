"""fl-attack: gradient inversion of multi-step FedAvg updates (PI-SME and baselines).

The library is usable without Flower:

    from fl_attack import ObservedUpdate, reconstruct
    rec = reconstruct(update, method="pisme", iterations=300)

Data flows one way: victim training (``training``) -> ObservedUpdate (``update``) -> attack
(``attacks``, ``api``) -> evaluation against the ground truth (``metrics``).
"""
from .api import Reconstruction, reconstruct, resolve_device
from .attacks import ATTACKS, AttackConfig
from .update import ObservedUpdate, TrainingMetadata, local_steps

__version__ = "0.1.0"

__all__ = ["ATTACKS", "AttackConfig", "ObservedUpdate", "Reconstruction", "TrainingMetadata", "local_steps",
           "reconstruct", "resolve_device", "__version__"]
