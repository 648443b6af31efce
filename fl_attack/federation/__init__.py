"""The simulated federation's side: data, models, client training and the update a client returns.

Holds the datasets and their partitions (data, which re-exports pools, femnist, cifar, loading and
partition), the victims' architectures (models), FedAvg's local training (training), the client
optimizers (config), the update and its public metadata (update: ObservedUpdate, TrainingMetadata,
AttackTarget), the seeded draw of participants (participants), the defenses (defense_registry: one
class per defense; defenses: the compression arithmetic), and the settings a client reads of the run
config (settings: FederationSettings; defense_settings: DefenseSettings). Imports only
fl_attack.privacy, fl_attack.paths and fl_attack.records, never the attacker or the audit
(pyproject.toml's import-linter contracts); everything else may import it.

The dataset registry: each dataset is one module that registers its ``DatasetSpec``
(pools.register_dataset); the import below is the registration, so that importing any module of this
package registers every dataset (a new dataset: its module, its assets and one name here;
docs/data.md, "Adding a dataset").
"""

from fl_attack.federation import (  # noqa: F401  (registration side effect: the dataset registry)
    cifar,
    femnist,
    femnist_digits,
)
