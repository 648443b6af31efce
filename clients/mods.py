"""A ClientApp mod for any Flower app: it adds to each train reply the public training metadata
the honest-but-curious server's attack needs.

The user adds one line to their own ClientApp::

    from clients.mods import leakage_metadata
    app = ClientApp(mods=[leakage_metadata(optimizer={"name": "momentum", "momentum": 0.9})])
    # or, for training only: @app.train(mods=[leakage_metadata(...)])

and declares once where their app's training settings come from. Each of ``lr``, ``batch_size``
and ``local_epochs`` is either the name of the key the server prescribes it under (looked up in the
train message's ConfigRecord(s) first, where Flower's quickstart-pytorch sends ``lr``, then in the
run config, where it keeps ``batch-size`` and ``local-epochs``), or the number the app's code
fixes. The optimizer, its settings and the train/eval mode are what the app's code fixes. k is the
``num-examples`` the app already reports in its reply.

The mod writes, into the reply's one MetricRecord, exactly the keys
``fl_attack.federation.update.TrainingMetadata.from_metrics`` reads (num-examples, local-steps, lr,
batch-size, local-epochs, the optimizer keys of ``ClientOptimizer.to_metrics`` and train-mode),
with local-steps T = E * ceil(k/B), or E * floor(k/B) for a loader that drops the last batch
(``drop_last=True``). It never overwrites a key the app already set: the app's own value wins.
When the node config has a ``partition-id`` (always in simulation) it also adds it to the reply's
"simulation" ConfigRecord, which only the server's evaluator reads (scoring against the ground
truth); FedAvg and its kin pass ConfigRecords through unaggregated. The reply's arrays are never
touched. Evaluate and query messages, and error replies, pass through unchanged (Flower runs a
ClientApp-level mod around every handler, and runs no mod for a message type without a handler).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord
from flwr.clientapp.typing import ClientAppCallable, Mod

from fl_attack.federation.config import ClientOptimizer

SIMULATION_RECORD = "simulation"  # the reply's ConfigRecord only the evaluator reads


def _check_number(where: str, value, kind: type):
    """``value`` as a ``kind`` (float or int) > 0. TypeError/ValueError naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: must be a number, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{where}: must be a finite number > 0")
    if kind is int and not float(value).is_integer():
        raise ValueError(f"{where}: must be a whole number")
    return kind(value)


def _check_setting(name: str, value, kind: type):
    """A declared setting: a key name (a non-empty str) or a number of ``kind`` > 0."""
    where = f"leakage_metadata({name}={value!r})"
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{where}: give the key your app reads it from, or its value")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: must be a key name (str) or a number, got {type(value).__name__}")
    return _check_number(where, value, kind)


def _check_optimizer(optimizer) -> ClientOptimizer:
    if isinstance(optimizer, ClientOptimizer):
        return optimizer
    try:
        if isinstance(optimizer, str):
            return ClientOptimizer(optimizer)
        if isinstance(optimizer, Mapping):
            return ClientOptimizer(**optimizer)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"leakage_metadata(optimizer={optimizer!r}): {exc}") from None
    raise TypeError(
        f"leakage_metadata(optimizer={optimizer!r}): give a ClientOptimizer, a name (sgd, adam, adamw) or a "
        'dict such as {"name": "momentum", "momentum": 0.9}'
    )


@dataclass(frozen=True)
class LeakageMetadata:
    """The declarations behind one ``leakage_metadata`` mod (see the module docstring)."""

    lr: str | float = "lr"
    batch_size: str | int = "batch-size"
    local_epochs: str | int = "local-epochs"
    optimizer: ClientOptimizer = ClientOptimizer()
    train_mode: bool = True
    drop_last: bool = False

    def __post_init__(self):
        object.__setattr__(self, "lr", _check_setting("lr", self.lr, float))
        object.__setattr__(self, "batch_size", _check_setting("batch_size", self.batch_size, int))
        object.__setattr__(self, "local_epochs", _check_setting("local_epochs", self.local_epochs, int))
        object.__setattr__(self, "optimizer", _check_optimizer(self.optimizer))
        for name in ("train_mode", "drop_last"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"leakage_metadata({name}=...): must be True or False")

    def _value(self, name: str, msg: Message, context: Context, kind: type):
        declared = getattr(self, name)
        if not isinstance(declared, str):
            return declared
        for record in msg.content.config_records.values():  # what the server sent this round
            if declared in record:
                return self._number(name, declared, record[declared], "the train message's config", kind)
        if declared in context.run_config:
            return self._number(name, declared, context.run_config[declared], "the run config", kind)
        raise ValueError(
            f"leakage_metadata: {name} is declared as key '{declared}', which neither the train message's "
            f"config nor the run config has; declare the key your app reads, e.g. leakage_metadata({name}="
            f"'my-key'), or the value it uses, e.g. leakage_metadata({name}=...)"
        )

    @staticmethod
    def _number(name: str, key: str, value, where: str, kind: type):
        return _check_number(f"leakage_metadata: {name} from {where}'s '{key}' = {value!r}", value, kind)

    def prescribed(self, msg: Message, context: Context) -> tuple:
        """(lr, B, E) as the server prescribes them for ``msg``. ValueError for a declared key that
        neither the train message's config nor the run config has."""
        lr = self._value("lr", msg, context, float)
        batch_size = self._value("batch_size", msg, context, int)
        local_epochs = self._value("local_epochs", msg, context, int)
        return lr, batch_size, local_epochs

    def metrics(self, msg: Message, context: Context, num_examples, prescribed: tuple | None = None) -> dict:
        """The metadata keys for a reply with ``num_examples`` (k), with B, E and lr as prescribed."""
        lr, batch_size, local_epochs = prescribed or self.prescribed(msg, context)
        k = int(num_examples)
        per_epoch = k // batch_size if self.drop_last else math.ceil(k / batch_size)
        return {
            "num-examples": k,
            "local-steps": local_epochs * per_epoch,
            "lr": lr,
            "batch-size": batch_size,
            "local-epochs": local_epochs,
            **self.optimizer.to_metrics(),
            "train-mode": int(self.train_mode),
        }

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        is_train = msg.metadata.message_type.split(".")[0] == MessageType.TRAIN
        prescribed = self.prescribed(msg, context) if is_train else None  # a bad declaration fails before training
        reply = call_next(msg, context)
        if not is_train or reply.has_error():
            return reply
        records = reply.content.metric_records
        if len(records) != 1:
            raise ValueError(
                f"leakage_metadata: the train reply has {len(records)} MetricRecords ({sorted(records)}); it "
                "needs exactly one, holding num-examples (as Flower's FedAvg requires)"
            )
        metrics: MetricRecord = next(iter(records.values()))
        if "num-examples" not in metrics:
            raise ValueError(
                "leakage_metadata: the train reply's MetricRecord has no 'num-examples' (the client's training "
                "examples, k); report it as Flower's FedAvg requires"
            )
        for key, value in self.metrics(msg, context, metrics["num-examples"], prescribed).items():
            if key not in metrics:  # the app's own value wins
                metrics[key] = value
        if "partition-id" in context.node_config:
            simulation = reply.content.config_records.get(SIMULATION_RECORD)
            if simulation is None:
                reply.content[SIMULATION_RECORD] = simulation = ConfigRecord()
            if "partition-id" not in simulation:
                simulation["partition-id"] = int(context.node_config["partition-id"])
        return reply


def leakage_metadata(
    *,
    lr: str | float = "lr",
    batch_size: str | int = "batch-size",
    local_epochs: str | int = "local-epochs",
    optimizer: ClientOptimizer | Mapping | str = "sgd",
    train_mode: bool = True,
    drop_last: bool = False,
) -> Mod:
    """The mod that adds the attack's public training metadata to each train reply.

    lr, batch_size, local_epochs: the key the server prescribes each under (the train message's
    config, then the run config; defaults as in Flower's quickstart-pytorch: "lr", "batch-size",
    "local-epochs"), or the number the app fixes. optimizer: the app's local optimizer, a
    ``fl_attack.federation.config.ClientOptimizer``, a dict of its fields (``{"name": "momentum", "momentum":
    0.9}`` for quickstart-pytorch's ``torch.optim.SGD(..., momentum=0.9)``) or a name without
    settings ("sgd", "adam", "adamw"). train_mode: the app trains after ``model.train()`` (as Flower's
    examples do). drop_last: the app's train loader drops the last incomplete batch. Raises
    TypeError or ValueError for a bad declaration, here, when the app module is imported.
    """
    return LeakageMetadata(lr, batch_size, local_epochs, optimizer, train_mode, drop_last)
