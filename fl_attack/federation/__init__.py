"""The simulated federation's side: data, models, client training and the update a client returns.

Holds the datasets and their partitions (data, which re-exports pools, femnist, cifar, loading and
partition), the victims' architectures (models), FedAvg's local training (training), the client
optimizers (config), the update and its public metadata (update: ObservedUpdate, TrainingMetadata,
AttackTarget), the seeded draw of participants (participants), the defenses (defense_registry: one
class per defense; defenses: the compression arithmetic), and the settings a client reads of the run
config (settings: FederationSettings; defense_settings: DefenseSettings). Imports only
fl_attack.privacy, fl_attack.paths and fl_attack.records, never the attacker or the audit
(pyproject.toml's import-linter contracts); everything else may import it.
"""
