"""An in-process federation for tests: the real ClientApp and server side, no Flower runtime.

The grid delivers each message to the ClientApp of its node in this process; the dispatcher runs
attacks in process and keeps every job it was given.
"""

from __future__ import annotations

import copy
import random
import tomllib
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from clients.client_app import app as client_app
from fl_attack.attacker.runtime.workers import InlineWorkers, Pipeline
from fl_attack.audit.settings import RunSettings
from fl_attack.federation.data import client_partition, load_pool
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local
from fl_attack.federation.update import ObservedUpdate, TrainingMetadata
from strategies.secagg import run_secagg
from strategies.server_app import build_strategy

BASE = {
    "dataset": "femnist",
    "num-server-rounds": 1,
    "samples-per-client": 10,
    "batch-size": 5,
    "local-epochs": 1,
    "attack-iterations": 2,
    "attack-nodes": 2,
    "attack-clients": "all",
    "attack-method": "pisme",
    "seed": 0,
}


def flower_run_config(num_rounds=1, **overrides) -> dict:
    """The whole run config Flower would hand the ServerApp for ``federate(..., **overrides)``: the
    defaults of pyproject.toml's [tool.flwr.app.config], then BASE, then the overrides (what a run's
    config.json records)."""
    with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
        defaults = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
    return {
        **defaults,
        **BASE,
        "num-server-rounds": num_rounds,
        **{k.replace("_", "-"): v for k, v in overrides.items()},
    }


class InProcessGrid:
    """A Grid that delivers each message to the ClientApp of its node, in this process.

    Each node keeps its own Context (SecAgg+ keeps protocol state there across stages), and each
    message's content is deep-copied, as the wire would: Flower reuses one RecordDict for all nodes.
    """

    def __init__(self, run_config: dict, partitions, random_node_ids: bool = False):
        """random_node_ids: node ids drawn afresh (unseeded) and listed in a random order, as Flower's
        simulation does per run; else node 100 + p holds partition p."""
        self.run = SimpleNamespace(run_id=1)
        nodes = {"num-partitions": len(partitions)}  # as the simulation sets it: the node count
        ids = [random.getrandbits(63) for _ in partitions] if random_node_ids else [100 + p for p in partitions]
        self.contexts = {
            node: Context(1, node, {"partition-id": p, **nodes}, RecordDict(), dict(run_config))
            for node, p in zip(ids, partitions, strict=True)
        }
        self.random_node_ids = random_node_ids

    def get_node_ids(self):
        ids = list(self.contexts)
        return random.sample(ids, len(ids)) if self.random_node_ids else ids

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            delivered = Message(
                content=copy.deepcopy(msg.content),
                dst_node_id=node,
                message_type=msg.metadata.message_type,
                group_id=msg.metadata.group_id,
            )
            replies.append(client_app(delivered, self.contexts[node]))
        return replies


class RecordingWorkers(InlineWorkers):
    """In-process workers (fl_attack.attacker.runtime.workers), keeping every job they were given."""

    def __init__(self):
        super().__init__(device="cpu")
        self.jobs = []

    def submit(self, job):
        self.jobs.append(job)
        super().submit(job)


def federate(tmp_path, partitions=(0, 1), num_rounds=1, *, torch_threads=None, random_node_ids=False, **overrides):
    """``num_rounds`` rounds of the real federation in process (the ClientApp with its mods, the
    server side of server_app.build_strategy, the in-process workers); returns (settings, the run's
    AuditService, Flower's result, the attack jobs). torch_threads: run it with that many torch threads
    (restored after), as the Ray workers would. random_node_ids: as ``serve``'s."""
    if torch_threads is not None:
        before = torch.get_num_threads()
        torch.set_num_threads(torch_threads)
        try:
            return federate(tmp_path, partitions, num_rounds, random_node_ids=random_node_ids, **overrides)
        finally:
            torch.set_num_threads(before)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # what Flower's runtime sets
    run_config = {**BASE, "num-server-rounds": num_rounds, **{k.replace("_", "-"): v for k, v in overrides.items()}}
    settings = RunSettings.from_run_config(run_config)
    settings.clients_per_round(len(partitions))
    model = settings.new_model(seed=0)  # the run config's model ("" = the paper's CNN)
    runner, service, evaluate = build_strategy(settings, tmp_path, len(partitions), model.state_dict())
    service.pipeline = Pipeline(dispatcher := RecordingWorkers(), batch=settings.attack_batch_size())
    grid = InProcessGrid(run_config, partitions, random_node_ids)
    result = None
    if settings.defense.secagg:
        server = Context(1, 0, {}, RecordDict(), run_config)
        run_secagg(grid, server, runner, settings)
    else:
        result = runner.start(
            grid=grid,
            initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=num_rounds,
            train_config=ConfigRecord({}),
            timeout=600,
            evaluate_fn=evaluate,
        )
    service.drain(120)
    return settings, service, result, dispatcher.jobs


def serve(tmp_path, partitions=(0, 1), num_rounds=1, random_node_ids=False, **overrides) -> Path:
    """The real ServerApp (strategies/server_app.py ``main``: the run folder, every round, the drain,
    summary.json and its last console lines) on an InProcessGrid, with the attacks run in this process
    (``InlineWorkers``: no Ray, no spawned process). The run is ``tmp_path``/run, which it returns.
    random_node_ids: node ids new and random per call, as Flower's simulation gives them."""
    import fl_attack.audit.service as service_module
    from strategies import server_app

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # what Flower's runtime sets
    run_config = flower_run_config(num_rounds, results_dir=str(tmp_path), run_name="run", **overrides)
    grid = InProcessGrid(run_config, partitions, random_node_ids)
    chosen = service_module.federation_workers
    service_module.federation_workers = lambda settings, threads: InlineWorkers("cpu", threads)
    try:
        server_app.main(grid, Context(1, 0, {}, RecordDict(), run_config))
    finally:
        service_module.federation_workers = chosen
    return tmp_path / "run"


def small_update() -> ObservedUpdate:
    """A FEMNIST update without training: w0 = the paper's CNN (seed 0), wT = w0 minus 1e-3 x N(0, 1)
    noise (seed 1), k=2; for attack-plumbing tests (workers, actor faults), not attack quality."""
    w0 = OrderedDict(build_model("femnist", seed=0).state_dict())
    gen = torch.Generator().manual_seed(1)
    wT = OrderedDict((k, v - 1e-3 * torch.randn(v.shape, generator=gen)) for k, v in w0.items())
    meta = TrainingMetadata(dataset="femnist", lr=0.004, batch_size=2, local_epochs=1, num_samples=2)
    return ObservedUpdate(w0, wT, meta, {"round": 1})


def femnist_update(partition: int, k: int, batch_size: int, local_epochs: int, lr: float = 0.004, optimizer=None):
    """(update, the client's train split) of a real FEMNIST writer: ``partition``'s first k
    samples, trained from the paper CNN (seed 0) at the paper's lr 0.004 (or ``lr``) by fl_attack's
    own client training (T = local_epochs x ceil(k / batch_size) steps of plain SGD, or of
    ``optimizer``, a fl_attack.federation.config.ClientOptimizer)."""
    split = client_partition(load_pool("femnist"), partition, k)
    result = train_local(
        build_model("femnist", seed=0),
        split.train.images,
        split.train.labels,
        dataset="femnist",
        lr=lr,
        batch_size=batch_size,
        local_epochs=local_epochs,
        **({} if optimizer is None else {"optimizer": optimizer}),
    )
    return result.update, split.train
