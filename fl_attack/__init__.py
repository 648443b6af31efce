"""fl-attack: gradient inversion of multi-step FedAvg updates (PI-SME and baselines).

The library is usable without Flower:

    from fl_attack import ObservedUpdate, reconstruct, reconstruct_batch
    rec = reconstruct(update, method="pisme", iterations=300)
    recs = reconstruct_batch([update_1, update_2], method="pisme", iterations=300)  # one batched run

Its packages, by role (each one's header says what it holds and who may import it):
``federation`` (data, models, client training, the update a client returns), ``attacker`` (the
attacks and what runs on an attack worker), ``audit`` (the server's audit service, its settings and
run folder), ``evaluation`` (the ground truth and the evaluator), ``privacy`` (the DP accountant). Data
flows one way: client training -> ObservedUpdate -> attack -> evaluation against the ground truth.
``run_config`` parses a run's settings; ``cli`` and ``standalone`` are the entry points; ``records``,
``paths`` and ``schema`` (a run folder's files and its CSVs' columns) are shared helpers.
"""

import importlib as _importlib

__version__ = "0.1.0"

# The public names load on first use (PEP 562), so torch-free helpers such as fl_attack.records can
# be imported by the analysis scripts without starting torch.
_EXPORTS = {
    "Reconstruction": "attacker.api",
    "reconstruct": "attacker.api",
    "reconstruct_batch": "attacker.api",
    "resolve_device": "attacker.api",
    "ATTACKS": "attacker.attacks",
    "AttackConfig": "attacker.attacks",
    "ObservedUpdate": "federation.update",
    "TrainingMetadata": "federation.update",
    "local_steps": "federation.update",
    "PAPER": "federation.config",
    "PRESETS": "federation.config",
    "Preset": "federation.config",
    "TrainingProtocol": "federation.config",
}

__all__ = [
    "ATTACKS",
    "AttackConfig",
    "ObservedUpdate",
    "PAPER",
    "PRESETS",
    "Preset",
    "Reconstruction",
    "TrainingMetadata",
    "TrainingProtocol",
    "local_steps",
    "reconstruct",
    "reconstruct_batch",
    "resolve_device",
    "__version__",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(_importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif not name.startswith("_"):  # a submodule, e.g. fl_attack.attacker.api after a bare "import fl_attack"
        try:
            value = _importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
