"""An honest-but-curious FedAvg: aggregates exactly like FedAvg and attacks every chosen update.

``configure_train`` sees each round's global arrays (w0). ``aggregate_train`` sees every client's
reply (wT, public metrics) before aggregation; it builds the attacker-facing ObservedUpdate from
public information only, dispatches the attacks without waiting for them, then aggregates with
the unchanged FedAvg code. Finished attacks go to the evaluator whenever the strategy next runs.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fl_attack import ObservedUpdate, TrainingMetadata
from fl_attack.records import append_csv_row
from .settings import RunSettings, usable_cpus

from .attacker import AttackDispatcher, AttackJob, AttackOutcome
from .evaluator import Evaluator
from .timings import Timings

log = logging.getLogger(__name__)

ROUND_COLUMNS = ["round", "clients", "train_loss", "eval_loss", "eval_accuracy", "attacks_in_flight", "seconds"]


def observed_update(w0: ArrayRecord, reply: Message, dataset: str, tags: dict) -> ObservedUpdate:
    """The attacker's view of one reply: (w0, wT, public metadata). Raises ValueError on bad input.

    Only the ArrayRecord and the public training metrics are read; the reply's "simulation"
    record (partition id, for the evaluator) is not part of it.
    """
    metrics = reply.content["metrics"]
    meta = TrainingMetadata(dataset=dataset, lr=float(metrics["lr"]), batch_size=int(metrics["batch-size"]),
                            local_epochs=int(metrics["local-epochs"]), num_samples=int(metrics["num-examples"]),
                            local_steps=int(metrics["local-steps"]))
    wT = reply.content["arrays"]
    return ObservedUpdate(w0.to_torch_state_dict(), wT.to_torch_state_dict(), meta, tags)


class LeakageTracking:
    """What both honest-but-curious strategies share: the attacker, the evaluator and the records.

    A strategy mixes this in, calls ``_init_tracking`` from its ``__init__`` and reports each
    round's start (w0), the attacks to run, the end of training and the evaluation; this class
    writes events.log, rounds.csv and, through the evaluator, attacks.csv.

    It also keeps the run's timings (strategies/timings.py): each round's instants (configured,
    first client fit started, trained, aggregated, evaluating), the clients' train-seconds, the
    attacks' seconds, its own hooks' time and the final wait for attacks.

    Attacks get torch threads by the run config's rule (RunSettings.attack_thread_count): the cores
    the training clients leave idle, or every core for the attacks of the last round, dispatched
    when the clients have finished training.
    """

    def _init_tracking(self, settings: RunSettings, run_dir, dispatcher: AttackDispatcher | None,
                       evaluator: Evaluator | None, clients_per_round: int | None = None) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.attack_config = settings.attack_config()
        self.attack_threads = settings.attack_thread_count(clients_per_round)
        self.drain_threads = settings.attack_drain_thread_count()
        self.dispatcher = dispatcher or AttackDispatcher(
            num_actors=settings.attack_actors, num_gpus=settings.attack_num_gpus,
            threads=self.attack_threads, device=settings.attack_device)
        self.evaluator = evaluator or Evaluator(settings, run_dir)
        self.timings = Timings()
        self.round_times: dict[int, dict] = {}
        self.global_arrays: dict[int, ArrayRecord] = {}
        self.submitted: list[AttackJob] = []
        self.rows: list[dict] = []
        self._train_loss: dict[int, float] = {}
        self._clients: dict[int, int] = {}
        self._round_start: dict[int, float] = {}
        self._jobs = 0
        self._event(f"attacker: {self.attack_threads} torch thread(s) per attack while clients train, "
                    f"{self.drain_threads} for the last round's attacks (attack-threads={settings.attack_threads}, "
                    f"{usable_cpus()} cores, client-num-cpus={settings.client_num_cpus}, "
                    f"clients per round={clients_per_round if clients_per_round is not None else 'unknown'})")

    def _round_started(self, server_round: int, arrays: ArrayRecord) -> None:
        self._round_start[server_round] = time.time()
        self.round_times[server_round] = {"configured": self._round_start[server_round]}
        self.global_arrays = {server_round: arrays}  # w0 of this round (older rounds are not needed)
        self._event(f"round {server_round}: training starts with {self.dispatcher.in_flight} attack(s) in flight")

    def _tags(self, server_round: int, **public) -> dict:
        return {"round": server_round, "defense": self.settings.defense.label, "nodes": self.attack_config.nodes,
                "iterations": self.attack_config.iterations, **public}

    def _submit(self, tags: dict, make_update: Callable[[], ObservedUpdate], oracle_labels: Callable[[], object]):
        """One attack job per method on the update ``make_update()`` builds; a failure to build it
        (e.g. a NaN update) is recorded as a failed attack and the round goes on."""
        try:  # built once, shared by every method's job
            update = make_update()
            tags["local_steps"] = update.metadata.local_steps
            labels = oracle_labels() if self.settings.attack_labels == "oracle" else "recovered"
        except Exception as exc:
            update, error = None, f"{type(exc).__name__}: {exc}"
        for method in self.settings.methods:
            self._jobs += 1
            if update is None:
                self.rows.append(self.evaluator.record(AttackOutcome(
                    self._jobs, method, dict(tags), "failed", error=error,
                    label_source=self.settings.attack_labels)))
                continue
            last_round = int(tags.get("round") or 0) >= self.settings.num_server_rounds  # clients idle now
            job = AttackJob(self._jobs, update, method, self.attack_config, labels,
                            time_limit=self.settings.attack_timeout, tags=dict(tags),
                            threads=self.drain_threads if last_round else self.attack_threads)
            self.submitted.append(job)
            self.dispatcher.submit(job)

    def _training_received(self, server_round: int, train_seconds: list, train_started: list) -> None:
        """The replies are in (called first thing when aggregating): the clients' reported times."""
        times = self.round_times.setdefault(server_round, {})
        times["trained"] = time.time()
        for seconds in train_seconds:
            if seconds is not None:
                self.timings.add("client_train", float(seconds))
        started = [float(t) for t in train_started if t is not None]
        if started:
            times["fit_started"] = min(started)

    def _round_trained(self, server_round: int, clients: int, train_loss: float | None) -> None:
        self._clients[server_round] = clients
        if train_loss is not None:
            self._train_loss[server_round] = float(train_loss)
        self.collect()
        self.round_times.setdefault(server_round, {})["aggregated"] = time.time()

    def _round_evaluated(self, server_round: int, eval_loss: float | None, eval_accuracy: float | None) -> None:
        row = {"round": server_round, "clients": self._clients.get(server_round, 0),
               "train_loss": self._train_loss.get(server_round), "attacks_in_flight": self.dispatcher.in_flight,
               "seconds": round(time.time() - self._round_start.get(server_round, time.time()), 2),
               "eval_loss": eval_loss, "eval_accuracy": eval_accuracy}
        with self.timings.measure("writing"):
            append_csv_row(self.run_dir / "rounds.csv", row, ROUND_COLUMNS)
        self.collect()

    def _evaluation_received(self, server_round: int) -> None:
        self.round_times.setdefault(server_round, {})["evaluating"] = time.time()

    def collect(self, timeout: float | None = None) -> list[dict]:
        """Evaluate and record every finished attack; with ``timeout``, wait for all of them."""
        if timeout is None:
            outcomes = self.dispatcher.poll()
        else:
            with self.timings.measure("drain_wait"):
                outcomes = self.dispatcher.drain(timeout)
        for outcome in outcomes:
            self.timings.add("attack", outcome.seconds)  # NaN (never ran to the end) is skipped
        rows = [self.evaluator.record(o) for o in outcomes]
        for row in rows:
            who = f"partition {row['partition_id']}" if row["partition_id"] not in (None, "") else row["client_id"]
            self._event(f"attack done: round {row['round']} {who} {row['method']} "
                        f"{row['status']} psnr={row['psnr']:.2f}" if row["status"] == "ok" else
                        f"attack failed: round {row['round']} {who} {row['method']}: {row['error']}")
        self.rows.extend(rows)
        return rows

    def timing_record(self) -> dict:
        """This strategy's and its evaluator's timings, for summary.json (strategies/timings.py)."""
        merged = self.timings.merged(getattr(self.evaluator, "timings", Timings()))
        rounds = {str(r): {k: round(v, 3) for k, v in t.items()} for r, t in sorted(self.round_times.items())}
        return {**merged.as_dict(), "rounds": rounds,
                "attacker_threads": {"while_training": self.attack_threads, "last_round": self.drain_threads}}

    def _event(self, text: str) -> None:
        log.info(text)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "events.log", "a") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")


class LeakageFedAvg(LeakageTracking, FedAvg):
    """FedAvg that hands each selected client update to the attacker, round after round.

    Under central DP it runs wrapped in one of Flower's DP strategy wrappers; it then sees each
    update after the clipping and before the noise, which only touches the aggregate.
    """

    def __init__(self, settings: RunSettings, run_dir, dispatcher: AttackDispatcher | None = None,
                 evaluator: Evaluator | None = None, clients_per_round: int | None = None, **fedavg_kwargs):
        super().__init__(**fedavg_kwargs)
        self._init_tracking(settings, run_dir, dispatcher, evaluator, clients_per_round)

    # -- rounds ---------------------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        start = time.perf_counter()
        self._round_started(server_round, arrays)
        messages = super().configure_train(server_round, arrays, config, grid)
        if server_round > 1:  # round 1's configure belongs to the start-up span
            self.timings.add("strategy", time.perf_counter() - start)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        ok = [r for r in replies if not r.has_error()]
        self._training_received(server_round, [(r.content.get("metrics") or {}).get("train-seconds") for r in ok],
                                [(r.content.get("simulation") or {}).get("train-started") for r in ok])
        with self.timings.measure("strategy"):
            self._dispatch(server_round, ok)
            arrays, metrics = super().aggregate_train(server_round, replies)
        train_loss = metrics["train-loss"] if metrics is not None and "train-loss" in metrics else None
        self._round_trained(server_round, len(ok), train_loss)
        return arrays, metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        self._evaluation_received(server_round)
        with self.timings.measure("strategy"):
            metrics = super().aggregate_evaluate(server_round, replies)
        found = metrics if metrics is not None else {}
        self._round_evaluated(server_round,
                              float(found["eval-loss"]) if "eval-loss" in found else None,
                              float(found["eval-accuracy"]) if "eval-accuracy" in found else None)
        return metrics

    # -- attacks --------------------------------------------------------------------------------
    def _dispatch(self, server_round: int, replies: list[Message]) -> None:
        w0 = self.global_arrays.get(server_round)
        by_partition = {}
        for reply in replies:
            sim = reply.content.get("simulation")
            if sim is not None and "partition-id" in sim:
                by_partition[int(sim["partition-id"])] = reply
        targets = self.settings.select_clients(list(by_partition), server_round)
        for partition_id in targets:
            reply = by_partition[partition_id]
            node_id = int(reply.metadata.src_node_id)
            tags = self._tags(server_round, node_id=node_id, partition_id=partition_id,
                              client_id=str(reply.content["simulation"].get("client-id", "")))
            self._submit(tags, lambda: observed_update(w0, reply, self.settings.dataset,
                                                       {"round": server_round, "node_id": node_id}),
                         lambda: self.evaluator.oracle_labels(partition_id))
        self._event(f"round {server_round}: dispatched attacks on partitions {targets} "
                    f"({self.dispatcher.in_flight} in flight)")
