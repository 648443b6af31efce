"""The leakage_metadata ClientApp mod (clients/mods.py) on real Flower Messages: in the quickstart
app of tests/quickstart_app (someone else's app, laid out as Flower's quickstart-pytorch), the
metadata it adds to a train reply is what the app trained with, TrainingMetadata.from_metrics reads
it back, the reply's arrays are untouched and a key the app set itself is never overwritten."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.app.error import Error
from flwr.supercore.task_identity import TaskIdentity

from clients.mods import leakage_metadata
from fl_attack.federation.config import ClientOptimizer
from fl_attack.federation.update import TrainingMetadata

APP = Path(__file__).resolve().parent / "quickstart_app"
RUN_CONFIG = tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
NODE = {"partition-id": 1, "num-partitions": 3}


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield


@pytest.fixture
def quickstart(monkeypatch):
    """The app's modules, imported as flwr does: its folder on sys.path, ``quickstart.client_app``."""
    monkeypatch.syspath_prepend(str(APP))
    return importlib.import_module("quickstart.client_app"), importlib.import_module("quickstart.task")


def context(node=NODE, **run_config) -> Context:
    return Context(1, 1, dict(node), RecordDict(), {**RUN_CONFIG, **run_config})


def train_message(arrays: ArrayRecord, config: dict | None = None) -> Message:
    """What the app's ServerApp (Flower's FedAvg) sends: the global arrays and the train config."""
    config = {"lr": RUN_CONFIG["learning-rate"], "server-round": 1} if config is None else config
    return Message(
        content=RecordDict({"arrays": arrays, "config": ConfigRecord(config)}), dst_node_id=1, message_type="train"
    )


def snapshot(record: ArrayRecord) -> dict:
    return {k: (a.dtype, tuple(a.shape), bytes(a.data)) for k, a in record.items()}


class Spy:
    """What the app's training really did: the arguments of its train function, the optimizer's
    settings and steps (torch.optim.SGD, counted), the model's mode at each forward pass."""

    def __init__(self, monkeypatch, client_app):
        self.steps, self.modes, self.optimizers, self.calls = 0, [], [], []
        spy = self
        original_train = client_app.train_fn

        class CountingSGD(torch.optim.SGD):
            def __init__(self, params, **kwargs):
                super().__init__(params, **kwargs)
                spy.optimizers.append(kwargs)

            def step(self, closure=None):
                spy.steps += 1
                return super().step(closure)

        def train_fn(net, trainloader, epochs, lr, device, **kwargs):
            spy.calls.append(dict(k=len(trainloader.dataset), B=trainloader.batch_size, E=epochs, lr=lr))
            net.register_forward_pre_hook(lambda module, _: spy.modes.append(module.training))
            return original_train(net, trainloader, epochs, lr, device, **kwargs)

        monkeypatch.setattr(torch.optim, "SGD", CountingSGD)
        monkeypatch.setattr(client_app, "train_fn", train_fn)


def test_the_metadata_is_what_the_app_trained_with(quickstart, monkeypatch):
    client_app, task = quickstart
    spy = Spy(monkeypatch, client_app)
    torch.manual_seed(0)
    w0 = ArrayRecord(task.Net().state_dict())
    reply = client_app.app(train_message(w0), context())  # the whole ClientApp: its mods, then train
    assert not reply.has_error(), reply.error
    metrics = reply.content["metrics"]
    [trained] = spy.calls
    [optimizer] = spy.optimizers
    # what the app trained with, as the mod reports it
    assert metrics["num-examples"] == trained["k"] == 32  # 40 images per partition, 80% for training
    assert (metrics["batch-size"], metrics["local-epochs"]) == (trained["B"], trained["E"])
    assert metrics["lr"] == trained["lr"]
    assert metrics["local-steps"] == spy.steps == 2 * 4  # E * ceil(32/8): the optimizer's real steps
    assert ClientOptimizer.from_metrics(metrics) == ClientOptimizer(
        "momentum", optimizer["momentum"], optimizer.get("weight_decay", 0.0)
    )
    assert metrics["train-mode"] == 1 and spy.modes and all(spy.modes)
    assert metrics["train_loss"] > 0  # the app's own metric, kept
    # the attacker's reader takes it back
    meta = TrainingMetadata.from_metrics("cifar100", metrics)
    assert meta == TrainingMetadata(
        "cifar100", lr=0.05, batch_size=8, local_epochs=2, num_samples=32, local_steps=8,
        optimizer=ClientOptimizer("momentum", 0.9), train_mode=True,
    )  # fmt: skip
    # exactly the keys TrainingMetadata writes, besides the app's own
    assert set(metrics) == set(meta.to_metrics()) | {"train_loss"}
    # the evaluator's bookkeeping in simulation: the node's partition
    assert dict(reply.content["simulation"]) == {"partition-id": 1}


def test_the_reply_arrays_are_untouched(quickstart):
    client_app, task = quickstart
    inner = {}

    def train_then_look(msg, ctx):
        reply = client_app.train(msg, ctx)  # the app's own handler, without mods
        inner["reply"], inner["arrays"] = reply, snapshot(reply.content["arrays"])
        return reply

    reply = client_app.audit_mod(train_message(ArrayRecord(task.Net().state_dict())), context(), train_then_look)
    assert reply is inner["reply"]
    assert list(reply.content.array_records) == ["arrays"]
    assert snapshot(reply.content["arrays"]) == inner["arrays"]


def _reply(metrics: dict, **records) -> Message:
    """A train reply as an app would build it, to a real train message."""
    msg = train_message(ArrayRecord({"w": torch.ones(3)}))
    content = RecordDict({"arrays": ArrayRecord({"w": torch.zeros(3)}), "metrics": MetricRecord(metrics), **records})
    return Message(content=content, reply_to=msg)


def _run(mod, reply: Message, ctx=None, config: dict | None = None) -> Message:
    msg = train_message(ArrayRecord({"w": torch.ones(3)}), config)
    return mod(msg, ctx or context(), lambda m, c: reply)


def test_a_key_the_app_set_itself_is_never_overwritten():
    mod = leakage_metadata(optimizer={"name": "momentum", "momentum": 0.9})
    simulation = ConfigRecord({"partition-id": 7, "client-id": "mine"})
    reply = _run(mod, _reply({"num-examples": 32, "lr": 0.5, "local-steps": 3}, simulation=simulation))
    metrics = reply.content["metrics"]
    assert (metrics["lr"], metrics["local-steps"]) == (0.5, 3)  # the app's values win
    assert (metrics["batch-size"], metrics["local-epochs"], metrics["optimizer"]) == (8, 2, 1)  # the rest added
    assert dict(reply.content["simulation"]) == {"partition-id": 7, "client-id": "mine"}


def test_settings_come_from_the_message_config_then_the_run_config_or_are_fixed():
    reply = _run(leakage_metadata(), _reply({"num-examples": 30}), config={"lr": 0.2, "batch-size": 4})
    metrics = reply.content["metrics"]  # the message's config first, then the run config
    assert (metrics["lr"], metrics["batch-size"], metrics["local-epochs"]) == (0.2, 4, 2)
    assert metrics["local-steps"] == 2 * 8  # ceil(30/4)
    assert ClientOptimizer.from_metrics(metrics) == ClientOptimizer()  # plain SGD by default
    mod = leakage_metadata(lr="learning-rate", batch_size=5, local_epochs=3, drop_last=True, train_mode=False)
    metrics = _run(mod, _reply({"num-examples": 32}), config={}).content["metrics"]
    assert (metrics["lr"], metrics["batch-size"], metrics["local-epochs"]) == (0.05, 5, 3)
    assert metrics["local-steps"] == 3 * 6 and metrics["train-mode"] == 0  # floor(32/5): the last batch dropped
    assert TrainingMetadata.from_metrics("cifar100", metrics).local_steps == 18


def test_only_train_replies_are_touched():
    mod = leakage_metadata()
    msg = Message(content=RecordDict({"config": ConfigRecord()}), dst_node_id=1, message_type="evaluate")
    reply = Message(content=RecordDict({"metrics": MetricRecord({"num-examples": 8})}), reply_to=msg)
    assert dict(mod(msg, context(), lambda m, c: reply).content["metrics"]) == {"num-examples": 8}
    assert "simulation" not in reply.content
    failed = Message(Error(code=0, reason="boom"), reply_to=train_message(ArrayRecord({"w": torch.ones(3)})))
    assert _run(mod, failed).has_error()
    # outside simulation, a node without a partition-id: no simulation record
    reply = _run(mod, _reply({"num-examples": 8}), ctx=context(node={}))
    assert "simulation" not in reply.content and reply.content["metrics"]["local-steps"] == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"lr": 0}, ValueError, r"leakage_metadata\(lr=0\): must be a finite number > 0"),
        ({"batch_size": 2.5}, ValueError, r"batch_size=2.5\): must be a whole number"),
        ({"local_epochs": True}, TypeError, r"must be a key name \(str\) or a number, got bool"),
        ({"lr": " "}, ValueError, r"give the key your app reads it from, or its value"),
        ({"optimizer": "momentum"}, ValueError, r"optimizer='momentum'\): the momentum optimizer needs a momentum"),
        ({"optimizer": {"name": "lbfgs"}}, ValueError, r"client optimizer must be one of"),
        ({"optimizer": 0.9}, TypeError, r"give a ClientOptimizer, a name"),
        ({"train_mode": 1}, TypeError, r"train_mode=...\): must be True or False"),
    ],
)
def test_a_bad_declaration_is_refused_when_the_app_is_imported(kwargs, error, message):
    with pytest.raises(error, match=message):
        leakage_metadata(**kwargs)


def test_a_missing_or_bad_setting_at_run_time_says_which_and_where():
    with pytest.raises(ValueError, match=r"batch_size is declared as key 'bs', which neither the train message"):
        _run(leakage_metadata(batch_size="bs"), _reply({"num-examples": 8}))
    with pytest.raises(ValueError, match=r"lr from the train message's config's 'lr' = -1.0: must be a finite"):
        _run(leakage_metadata(), _reply({"num-examples": 8}), config={"lr": -1.0})
    with pytest.raises(TypeError, match=r"local_epochs from the run config's 'local-epochs' = 'two': must be a num"):
        _run(leakage_metadata(), _reply({"num-examples": 8}), ctx=context(**{"local-epochs": "two"}))
    with pytest.raises(ValueError, match=r"MetricRecord has no 'num-examples'"):
        _run(leakage_metadata(), _reply({"loss": 1.0}))
    with pytest.raises(ValueError, match=r"the train reply has 2 MetricRecords"):
        _run(leakage_metadata(), _reply({"num-examples": 8}, more=MetricRecord({"x": 1.0})))


def test_a_bad_key_declaration_fails_before_the_client_trains():
    """A key neither the train message nor the run config has is refused before ``call_next``: the
    client does not train for nothing, round after round (red when the mod reads the keys after)."""
    trained = []

    def train(msg, ctx):
        trained.append(1)
        return _reply({"num-examples": 8})

    msg = train_message(ArrayRecord({"w": torch.ones(3)}))
    with pytest.raises(ValueError, match=r"batch_size is declared as key 'bs'"):
        leakage_metadata(batch_size="bs")(msg, context(), train)
    assert not trained
