"""An honest-but-curious FedAvg: aggregates exactly like FedAvg and attacks every chosen update.

``configure_train`` sees each round's global arrays (w0). ``aggregate_train`` sees every client's
reply (wT, public metrics) before aggregation; it drops non-finite updates, builds the
attacker-facing ObservedUpdate of each chosen client from public information only, records it,
dispatches the attacks without waiting for them, then aggregates the rest with the unchanged FedAvg
code, in partition order so that one seed gives one global model; integer arrays (batch norm's
num_batches_tracked) are counters, not weights, and take the clients' maximum in their dtype instead
(``integer_arrays_as_max``). The server's centralised evaluation ends each round: it writes the
round's row and checkpoints the global model. Finished attacks go to the evaluator whenever the
strategy next runs.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log as flwr_log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from tqdm import tqdm

from fl_attack import ObservedUpdate, TrainingMetadata
from fl_attack.evaluator import Evaluator
from fl_attack.labels import NEEDS_AUX, AuxiliaryData
from fl_attack.memory import MEMORY_SUFFIX, AttackMemory
from fl_attack.models import resolve_model
from fl_attack.privacy import PrivacyLedger, format_epsilons
from fl_attack.records import read_csv
from fl_attack.run_config import RunSettings, usable_cpus
from fl_attack.runs import RunFolder
from fl_attack.timings import Timings
from fl_attack.training import evaluate_model
from fl_attack.update import AttackTarget, save_torch_atomic, save_update
from fl_attack.verdict import Verdict, verdict_line, verdict_summary
from fl_attack.victims import ground_truth, private_samples
from fl_attack.workers import AttackJob, AttackOutcome, Pipeline, Workers, make_workers, memory_key, remember
from fl_attack.workers import outcomes as outcomes_of

from .sampling import NodePartitions

log = logging.getLogger(__name__)

# Set to a round number R, the ServerApp process exits abruptly (os._exit: no clean-up, no
# summary.json) right after round R's checkpoint, or with "R:before-checkpoint" after its rounds.csv
# row but before its checkpoint (the resume must then cut that row back): how the tests interrupt a
# real federation. With ":settled" after either ("3:before-checkpoint:settled") it first waits (at
# most 600 s) until every attack of the rounds before R is collected (its row written, its memory
# saved), so that a test knows what the crash leaves on disk.
CRASH_ENV = "FL_ATTACK_CRASH_AFTER_ROUND"
SETTLED = ":settled"


def _crash_here(server_round: int, point: str, tracking: LeakageTracking) -> None:
    value = os.environ.get(CRASH_ENV, "")
    if value.removesuffix(SETTLED) != (f"{server_round}:{point}" if point else str(server_round)):
        return
    if value.endswith(SETTLED):
        tracking.settle(server_round, timeout=600)
    tracking.folder.event(f"round {server_round}: {CRASH_ENV}={value}: the ServerApp dies here, as if killed")
    os._exit(70)


def observed_update(w0: ArrayRecord, reply: Message, dataset: str, client: dict) -> ObservedUpdate:
    """The attacker's view of one reply: (w0, wT, public metadata). Raises ValueError on bad input.

    Only the ArrayRecord and the public training metrics are read; the reply's "simulation"
    record (partition id, for the evaluator) is not part of it.
    """
    meta = TrainingMetadata.from_metrics(dataset, reply.content["metrics"])
    return ObservedUpdate(w0.to_torch_state_dict(), reply.content["arrays"].to_torch_state_dict(), meta, client)


def partition_of(reply: Message) -> int | None:
    """The simulated client's partition id (the reply's "simulation" record), None without one."""
    sim = reply.content.get("simulation") if not reply.has_error() else None
    return int(sim["partition-id"]) if sim is not None and "partition-id" in sim else None


def in_partition_order(replies: Iterable[Message]) -> list[Message]:
    """Replies sorted by partition id, then node id: the order they arrive in varies from run to
    run, and floating-point sums depend on the order."""
    return sorted(replies, key=lambda r: (partition_of(r) is None, partition_of(r) or 0, int(r.metadata.src_node_id)))


def integer_arrays_as_max(aggregate: ArrayRecord, records: list[ArrayRecord]) -> ArrayRecord:
    """``aggregate`` (FedAvg's weighted mean of ``records``) with each integer array replaced by the
    element-wise maximum of the records' arrays, in their dtype; floating arrays unchanged, key order kept.

    Flower's aggregate_arrayrecords multiplies every array by a float weight, which turns an int64
    counter such as batch norm's num_batches_tracked into a float64 mean; a counter of steps taken
    is not a weight to average, and the clients' next w0 must hold it as the model's int64 buffer.
    Raises ValueError when the records disagree on an integer array's dtype.
    """
    out = {}
    for key, array in aggregate.items():
        arrays = [record[key].numpy() for record in records]
        if not np.issubdtype(arrays[0].dtype, np.integer):
            out[key] = array
            continue
        if len({a.dtype for a in arrays}) != 1:
            raise ValueError(f"the clients' '{key}' arrays differ in dtype: {sorted({str(a.dtype) for a in arrays})}")
        out[key] = Array(np.asarray(np.maximum.reduce(arrays), dtype=arrays[0].dtype))
    return ArrayRecord(out)


def is_finite(arrays: ArrayRecord) -> bool:
    """True when every array of the record is free of NaN and inf."""
    return all(np.isfinite(array.numpy()).all() for array in arrays.values())


def federation_workers(settings: RunSettings, threads: int) -> Workers:
    """The run's attack workers: actors on Flower's Ray runtime when it is up (the simulation),
    else on the Ray cluster at ``attack-ray-address``, else local processes (the deployment engine)."""
    import ray

    s = settings
    kind = "ray" if ray.is_initialized() else f"ray cluster {s.attack_ray_address}" if s.attack_ray_address else ""
    log.info("attacks run on %s (%d worker(s))", kind or "local processes", s.attack_actors)
    return make_workers(
        s.attack_actors,
        address=s.attack_ray_address or None,
        threads=max(1, int(threads)),
        device=s.attack_device,
        num_gpus=s.attack_num_gpus,
        ray_runtime=ray.is_initialized(),
    )


class LeakageTracking:
    """What both honest-but-curious strategies share: the attacker, the evaluator and the records.

    A strategy mixes this in before its Flower strategy class (``__init__`` takes the arguments
    below and hands the others to that class) and reports each round's start (w0), the attacks to
    run, the end of training, the clients' evaluation and the server's; this class writes
    events.log, rounds.csv, checkpoint.pt, updates/ and, through the evaluator, attacks.csv.

    Which attacks run is the run config's: attack-rounds (which rounds), attack-clients (which
    clients), attack-budget (at most so many per round) and attack-max-backlog (skip a round while
    the attacker is that far behind). Every round's row says how many attacks were dispatched,
    skipped and still in flight, and how many rounds behind the oldest of them is.

    ``round_offset``: rounds already done before this strategy started (a resumed run): Flower's
    round r is the run's round r + round_offset everywhere, also in what the clients are told.

    ``privacy``: the run's PrivacyLedger (fl_attack.privacy) under local-dp or central-dp: each
    round's participants go into it, and rounds.csv and every attack row get the ε spent.

    It also keeps the run's timings (fl_attack/timings.py). Attacks get torch threads by the run
    config's rule (RunSettings.attack_thread_count).
    """

    def __init__(
        self,
        settings: RunSettings,
        run_dir,
        workers: Workers | None = None,
        clients_per_round: int | None = None,
        round_offset: int = 0,
        test_set=None,
        privacy: PrivacyLedger | None = None,
        **strategy_kwargs,
    ) -> None:
        super().__init__(**strategy_kwargs)
        self.settings = settings
        self.folder = RunFolder(run_dir)  # every file of the run's record
        self.round_offset = round_offset
        self.test_set = test_set  # the server's held-out ClientData, or None (no centralised evaluation)
        self.attack_config = settings.attack_config()
        self.attack_threads = settings.attack_thread_count(clients_per_round)
        self.drain_threads = settings.attack_drain_thread_count()
        # the attack workers, chosen at the first submit (Flower's Ray runtime is up by then)
        self.pipeline = Pipeline(
            workers or (lambda: federation_workers(settings, self.attack_threads)), batch=settings.attack_batch_size()
        )
        self.timings = Timings()  # the evaluator's scoring, images and writing phases too
        self.evaluator = Evaluator(
            settings.dataset,
            defense=settings.defense.label,
            folder=self.folder.path,
            table=self.folder.append_attack,
            timings=self.timings,
            verdict=Verdict.from_data(
                settings.dataset,
                data_dir=settings.data_dir or None,
                seed=settings.seed,
                public=(test_set.images, test_set.labels) if test_set is not None else None,
            ),
        )
        self.memory = settings.attack_memory_state()  # the server's memory of its tracked clients
        if settings.attack_memory != "none" and self.folder.memory_file.exists():  # a resumed run
            self.memory = AttackMemory.load(self.folder.memory_file)
            self.memory.cut_back(round_offset)
        self.privacy = privacy  # the DP budget spent (fl_attack.privacy), None without local-dp or central-dp
        if privacy is not None and round_offset:  # a resumed run: who took part in the rounds kept
            privacy.restore(read_csv(self.folder.rounds_file)[1])
            privacy.cut_back(round_offset)
        self._memory_queue: dict = {}  # (partition, method) -> its "+memory" jobs waiting, oldest first
        self._memory_busy: set = set()  # the keys with a "+memory" job in flight
        self.label_aux = (
            AuxiliaryData(test_set.images, test_set.labels)
            if self.attack_config.label_estimator in NEEDS_AUX and test_set is not None
            else None
        )
        self.round_times: dict[int, dict] = {}
        self.global_arrays: dict[int, ArrayRecord] = {}
        self.rows: list[dict] = []
        self.current_round = round_offset
        self.nodes = NodePartitions(settings.seed, self.folder.event)  # the seeded draw of participants
        # per round: clients, losses, accuracies, attack counts, excluded partitions
        self._round: defaultdict[int, dict] = defaultdict(lambda: {"dispatched": 0, "skipped": 0, "excluded": []})
        self.unwritten: list[AttackOutcome] = []  # finished attacks whose rows the disk refused
        self.refused: dict[str, list[int]] = {"rounds": [], "checkpoints": [], "updates": [], "memory": []}
        self._jobs = 0
        self.folder.event(
            f"attacker: {self.attack_threads} torch thread(s) per attack while clients train, "
            f"{self.drain_threads} for the last round's attacks (attack-threads={settings.attack_threads}, "
            f"{usable_cpus()} cores, client-num-cpus={settings.client_num_cpus}, "
            f"clients per round={clients_per_round if clients_per_round is not None else 'unknown'})"
        )

    def _run_round(self, flower_round: int) -> int:
        return flower_round + self.round_offset

    def _round_started(self, server_round: int, arrays: ArrayRecord) -> None:
        self.current_round = server_round
        self.round_times[server_round] = {"configured": time.time()}
        self.global_arrays = {server_round: arrays}  # w0 of this round (older rounds are not needed)
        in_flight = self.pipeline.in_flight
        oldest = f", the oldest from round {self.pipeline.rounds_in_flight()[0]}" if in_flight else ""
        behind = f" ({self.lag_rounds()} round(s) behind)" if in_flight else ""
        self.folder.event(f"round {server_round}: training starts with {in_flight} attack(s) in flight{oldest}{behind}")

    def truth(self, target: AttackTarget) -> tuple[torch.Tensor, torch.Tensor]:
        """The private images and labels an attack is scored against (the evaluator's, never the
        attacker's): one client's, or for an aggregate the participants' in partition order."""
        return ground_truth(self.settings.data, target.partition_ids)

    def lag_rounds(self) -> int:
        """How many rounds the oldest attack still in flight is behind the current round (0: none)."""
        return self.current_round - self.pipeline.rounds_in_flight()[0] if self.pipeline.in_flight else 0

    def _plan(self, server_round: int, candidates: list[int]) -> list[int]:
        """The partitions to attack this round (each with every method), by the run config's schedule."""
        if not self.settings.attacks_round(server_round):
            self.folder.event(f"round {server_round}: not attacked (attack-rounds={self.settings.attack_rounds})")
            return []
        targets = self.settings.select_clients(candidates, server_round)
        methods = len(self.settings.methods)
        backlog = self.settings.attack_max_backlog
        if backlog and self.pipeline.in_flight >= backlog:
            self._round[server_round]["skipped"] += len(targets) * methods
            self.folder.event(
                f"round {server_round}: {len(targets) * methods} attack(s) skipped: "
                f"{self.pipeline.in_flight} still in flight (attack-max-backlog={backlog})"
            )
            return []
        budget = self.settings.attack_budget
        if budget and len(targets) * methods > budget:
            kept = targets[: max(0, budget // methods)]
            self._round[server_round]["skipped"] += (len(targets) - len(kept)) * methods
            self.folder.event(f"round {server_round}: attack-budget={budget} keeps partitions {kept} of {targets}")
            targets = kept
        return targets

    def _observe(self, w0: ArrayRecord, reply: Message, client: dict) -> ObservedUpdate:
        """The attacker's view of one reply, checked against the training the run config prescribes."""
        update = observed_update(w0, reply, self.settings.dataset, client)
        self.settings.check_prescribed(update.metadata)
        return update

    def _submit(
        self, target: AttackTarget, make_update: Callable[[], ObservedUpdate], oracle_labels: Callable[[], object]
    ) -> None:
        """One attack job per method on the update ``make_update()`` builds, recorded in updates/ first;
        a failure to build it is recorded as a failed attack and the round goes on."""
        try:  # built once, shared by every method's job
            update = make_update()
            labels = oracle_labels() if self.settings.attack_labels == "oracle" else "recovered"
        except Exception as exc:
            update, error = None, f"{type(exc).__name__}: {exc}"
        if update is not None and self.settings.record_updates:
            try:
                with self.timings.measure("writing"):
                    save_update(update, target, self.folder.updates)
            except Exception as exc:  # the attack can still run; only the replay copy is missing
                self.refused["updates"].append(target.round)
                self.folder.event(f"could not record the update of {target.describe()}: {type(exc).__name__}: {exc}")
        methods = self.settings.methods
        for method in methods:
            self._jobs += 1
            if update is None:
                unbuilt = AttackJob(self._jobs, None, method, self.attack_config, target, self.settings.attack_labels)
                failed = AttackOutcome.failed(unbuilt, error)
                epsilon = self.epsilon(target.round, target.partition_ids)
                self.rows.append(self.evaluator.record(failed, None, epsilon=epsilon))
                continue
            if method + MEMORY_SUFFIX in methods:  # its "+memory" twin runs it and yields its row
                self._round[target.round]["dispatched"] += 1
                continue
            last_round = target.round >= self.settings.num_server_rounds  # clients idle now
            job = AttackJob(
                self._jobs,
                update,
                method,
                self.attack_config,
                target,
                labels,
                time_limit=self.settings.attack_timeout,
                threads=self.drain_threads if last_round else self.attack_threads,
                model=self.settings.model,
                label_aux=self.label_aux,
                with_memoryless=method.endswith(MEMORY_SUFFIX) and method.removesuffix(MEMORY_SUFFIX) in methods,
            )
            self._round[target.round]["dispatched"] += 1
            if method.endswith(MEMORY_SUFFIX):
                key = memory_key(target, method)
                self.memory.observe(key, target.round, update)
                self._memory_queue.setdefault(key, []).append(job)
                self._next_memory_job(key)
            else:
                self.pipeline.submit(job)

    @property
    def attacks_pending(self) -> int:
        """Attacks in flight and "+memory" jobs waiting for their client's previous one."""
        return self.pipeline.in_flight + sum(len(queue) for queue in self._memory_queue.values())

    def _next_memory_job(self, key) -> None:
        """Submit ``key``'s oldest waiting "+memory" job unless one of its jobs is in flight: each
        starts from the memory its previous round left, so a run's memory does not depend on timing
        (and a replay reproduces it)."""
        queue = self._memory_queue.get(key)
        if key in self._memory_busy or not queue:
            return
        job = queue.pop(0)
        job.memory = self.memory.inputs(key, job.target.round)
        self._memory_busy.add(key)
        self.pipeline.submit(job)

    def _training_received(
        self, server_round: int, partitions: Iterable[int], train_seconds: list, train_started: list
    ) -> None:
        """The replies are in (called first thing when aggregating): the partitions whose updates the
        round received (each spent its DP budget), recorded before any attack of the round is, so that
        its rows carry the ε spent by then; then the clients' reported times."""
        partitions = sorted(int(p) for p in partitions)
        self._round[server_round]["participants"] = partitions
        if self.privacy is not None:
            self.privacy.round_done(server_round, partitions)
        times = self.round_times.setdefault(server_round, {})
        times["trained"] = time.time()
        for seconds in train_seconds:
            if seconds is not None:
                self.timings.add("client_train", float(seconds))
        started = [float(t) for t in train_started if t is not None]
        if started:
            times["fit_started"] = min(started)

    def epsilon(self, server_round: int, partitions: Iterable[int] | None = None) -> float | None:
        """The DP budget spent by ``server_round`` (fl_attack.privacy.PrivacyLedger.epsilon); None without DP."""
        return None if self.privacy is None else self.privacy.epsilon(server_round, partitions)

    def _tracked_epsilons(self, server_round: int) -> str:
        """rounds.csv's epsilon_tracked: each attack-clients id's ε under local-dp, else ""."""
        tracked = self.settings.attack_client_ids()
        if self.privacy is None or self.privacy.mechanism != "local-dp" or not tracked:
            return ""
        return format_epsilons({p: self.privacy.epsilon(server_round, [p]) for p in tracked})

    def _round_trained(self, server_round: int, clients: int, train_loss: float | None) -> None:
        record = self._round[server_round]
        record["clients"] = clients
        if train_loss is not None:
            record["train_loss"] = float(train_loss)
        self.collect()
        self.round_times.setdefault(server_round, {})["aggregated"] = time.time()

    def _clients_evaluated(self, server_round: int, eval_loss, eval_accuracy) -> None:
        """The clients' federated evaluation of the round's global model (None: not reported)."""
        values = {"eval_loss": eval_loss, "eval_accuracy": eval_accuracy}
        self._round[server_round].update({key: None if v is None else float(v) for key, v in values.items()})
        self.collect()

    def global_evaluation(self, server_round: int, state: dict) -> dict | None:
        """Loss and accuracy of the global model ``state`` on the server's held-out test set; None
        without one. Round 0 is the initial model, logged only."""
        if self.test_set is None:
            return None
        with self.timings.measure("global_evaluation"):
            net = resolve_model(self.settings.model, self.settings.dataset)
            net.load_state_dict(state)
            loss, accuracy = evaluate_model(net, self.test_set.images, self.test_set.labels, self.settings.dataset)
        if server_round == 0:
            self.folder.event(
                f"initial global model: test accuracy {accuracy:.4f}, loss {loss:.4f} "
                f"on the server's {len(self.test_set)} held-out samples"
            )
        else:
            self._round[server_round].update(global_loss=loss, global_accuracy=accuracy)
        return {"global-loss": loss, "global-accuracy": accuracy}

    def _finish_round(self, server_round: int, state: dict | None) -> None:
        """The round's row in rounds.csv, then the checkpoint of its global model ``state`` (None:
        no checkpoint), written atomically in that order."""
        self.collect()
        record = self._round[server_round]
        row = {
            "round": server_round,
            "clients": record.get("clients", 0),
            "train_loss": record.get("train_loss"),
            "attacks_in_flight": self.pipeline.in_flight,
            "seconds": round(time.time() - self.round_times.get(server_round, {}).get("configured", time.time()), 2),
            "eval_loss": record.get("eval_loss"),
            "eval_accuracy": record.get("eval_accuracy"),
            "global_loss": record.get("global_loss"),
            "global_accuracy": record.get("global_accuracy"),
            "attack_lag_rounds": self.lag_rounds(),
            "attacks_dispatched": record.get("dispatched", 0),
            "attacks_skipped": record.get("skipped", 0),
            "excluded": ",".join(map(str, record.get("excluded", []))),
            "participants": ",".join(map(str, record.get("participants", []))),
            "epsilon": self.epsilon(server_round),
            "epsilon_tracked": self._tracked_epsilons(server_round),
        }
        with self.timings.measure("writing"):
            try:
                self.folder.append_round(row)
            except OSError as exc:  # the federation goes on; the round's row is in events.log at least
                self.refused["rounds"].append(server_round)
                self.folder.event(f"round {server_round}: could not write rounds.csv ({exc}); row: {row}")
            _crash_here(server_round, "before-checkpoint", self)  # fault injection (tests)
            try:
                if state is not None:
                    self.folder.save_checkpoint(server_round, state)
            except OSError as exc:  # a resume goes back to the last checkpoint that was written
                self.refused["checkpoints"].append(server_round)
                self.folder.event(f"round {server_round}: could not write the checkpoint ({exc})")
            self.save_memory()  # after the checkpoint: a resume cuts the memory back to it
        _crash_here(server_round, "", self)  # fault injection (tests)
        accuracy = record.get("global_accuracy")
        self.folder.event(
            f"round {server_round}: done; global accuracy "
            f"{'n/a' if accuracy is None else f'{accuracy:.4f}'}; {self.pipeline.in_flight} attack(s) "
            f"in flight, {self.lag_rounds()} round(s) behind"
        )

    def settle(self, server_round: int, timeout: float) -> None:
        """Collect until no attack of a round before ``server_round`` is in flight or queued, or
        ``timeout`` seconds have passed (fault injection: CRASH_ENV's ":settled")."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.collect()
            queued = [job.target.round for queue in self._memory_queue.values() for job in queue]
            if all(r >= server_round for r in self.pipeline.rounds_in_flight() + queued):
                return
            time.sleep(0.05)

    def _evaluation_received(self, server_round: int) -> None:
        self.round_times.setdefault(server_round, {})["evaluating"] = time.time()

    def collect(self, done: list | None = None) -> list[dict]:
        """Evaluate and record every finished attack (does not wait); ``done``: (job, outcome) pairs
        already collected from the pipeline."""
        outcomes = [
            o for job, outcome in (self.pipeline.poll() if done is None else done) for o in outcomes_of(job, outcome)
        ]
        for outcome in outcomes:
            self.timings.add("attack", outcome.seconds)  # NaN (never ran to the end) is skipped
        self._remember(outcomes)
        return self._record(outcomes)

    def _remember(self, outcomes: list[AttackOutcome]) -> None:
        """The memory takes each "+memory" outcome's candidates; the outcome then carries the
        estimate the server holds after it (what its row scores). memory.pt is saved after."""
        remembered = [o for o in outcomes if o.method.endswith(MEMORY_SUFFIX)]
        for outcome in remembered:
            remember(self.memory, outcome)
            self._memory_busy.discard(memory_key(outcome.target, outcome.method))
        if remembered:
            self.save_memory()
        for outcome in remembered:
            self._next_memory_job(memory_key(outcome.target, outcome.method))

    def save_memory(self) -> None:
        """memory.pt, atomically; a refused write is logged (the memory stays in this process)."""
        if self.settings.attack_memory == "none":
            return
        try:
            self.memory.save(self.folder.memory_file)
        except OSError as exc:
            self.refused["memory"].append(self.current_round)
            self.folder.event(f"could not write the attack memory ({exc}); kept in memory, tried again later")

    def _record(self, outcomes: list[AttackOutcome]) -> list[dict]:
        """Score and write each outcome's row. An outcome whose row cannot be written (the disk
        refuses even after the writer's retries) stays in ``unwritten``, reconstruction and all, and
        is tried again at the next call: it is never dropped."""
        rows, pending, self.unwritten = [], self.unwritten + outcomes, []
        for outcome in pending:
            try:
                row = self.evaluator.record(
                    outcome,
                    self.truth(outcome.target),
                    lag_rounds=self.current_round - outcome.target.round,
                    epsilon=self.epsilon(outcome.target.round, outcome.target.partition_ids),
                )
            except OSError as exc:
                self.unwritten.append(outcome)
                self.folder.event(
                    f"could not write the result of {outcome.target.describe()} {outcome.method} "
                    f"({exc}); kept in memory, tried again later"
                )
                continue
            rows.append(row)
            self.folder.event(
                f"attack done: {outcome.target.describe()} {row['method']}: {verdict_line(row)}"
                if row["status"] == "ok"
                else f"attack failed: {outcome.target.describe()} {row['method']}: {row['error']}"
            )
        self.rows.extend(rows)
        return rows

    def keep_unwritten(self) -> None:
        """At shutdown: outcomes whose rows could still not be written go to unwritten-<n>.pt in the
        run folder (images, labels, target), for a later look; a failure here is logged, not raised."""
        if not self.unwritten:
            return
        try:
            path = self.folder / f"unwritten-{len(self.unwritten)}.pt"
            save_torch_atomic(path, [vars(o) for o in self.unwritten])
            self.folder.event(f"{len(self.unwritten)} result(s) not written to attacks.csv; saved in {path.name}")
        except Exception as exc:
            log.error("%d attack result(s) could not be written at all: %s", len(self.unwritten), exc)

    def drain(self, timeout: float) -> list[dict]:
        """Wait up to ``timeout`` seconds for the attacks still in flight, with a progress bar and a
        line in events.log every minute; the ones still running then are recorded as failed."""
        rows, left = [], self.attacks_pending  # in flight, and "+memory" jobs queued behind them
        if left:
            self.folder.event(
                f"rounds done; waiting for {left} attack(s) still in flight or queued "
                f"(the oldest from round {self.pipeline.rounds_in_flight()[0]}), at most {timeout:.0f} s"
            )
        bar = tqdm(
            total=left, desc="fl-attack: attacks still running", unit="attack", file=sys.stderr, disable=not left
        )
        bar.mininterval, note = 10, [time.monotonic() + 60]  # Flower logs every refresh as a line

        def done(pairs):
            if pairs:
                rows.extend(self.collect(pairs))
                bar.update(len(pairs))
            if time.monotonic() > note[0]:
                note[0] += 60
                self.folder.event(f"waiting for {self.attacks_pending} attack(s)")

        with self.timings.measure("drain_wait"), bar:
            self.pipeline.drain(timeout, on_done=done)
            if self.unwritten:  # one last try for rows the disk refused
                rows += self._record([])
        return rows

    def finish(self, timeout: float) -> dict:
        """At the end of the run: collect the attacks still in flight (``drain``), keep the rows the
        disk refused, stop the workers. Returns summary.json's attack counts."""
        self.drain(timeout)
        waiting = [job for queue in self._memory_queue.values() for job in queue]
        self._memory_queue.clear()
        self._record(
            [AttackOutcome.failed(job, "never started: the attacks before it outran the drain") for job in waiting]
        )
        self.keep_unwritten()
        self.pipeline.shutdown()
        ok = sum(r["status"] == "ok" for r in self.rows)
        return {
            "attacks": len(self.rows),
            "attacks_ok": ok,
            "attacks_failed": len(self.rows) - ok,
            "attacks_unwritten": len(self.unwritten),
            "writes_refused": {k: v for k, v in self.refused.items() if v},  # rounds whose file the disk refused
            "verdict": verdict_summary(self.rows),  # images recovered per attack (fl_attack.verdict)
        }

    def timing_record(self) -> dict:
        """This strategy's and its evaluator's timings, for summary.json (fl_attack/timings.py)."""
        rounds = {str(r): {k: round(v, 3) for k, v in t.items()} for r, t in sorted(self.round_times.items())}
        return {
            **self.timings.as_dict(),
            "rounds": rounds,
            "attacker_threads": {"while_training": self.attack_threads, "last_round": self.drain_threads},
        }


class LeakageFedAvg(LeakageTracking, FedAvg):
    """FedAvg that hands each selected client update to the attacker, round after round.

    Under central DP it runs wrapped in one of Flower's DP strategy wrappers; it then sees each
    update after the clipping and before the noise, which only touches the aggregate. Pass
    ``evaluate_global`` as ``evaluate_fn`` to ``start``: it ends each round.
    """

    # -- rounds ---------------------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        start = time.perf_counter()
        server_round = self._run_round(server_round)
        self._round_started(server_round, arrays)
        messages = self._configure(grid, arrays, config, server_round, "train")  # tells clients the run's round
        if server_round > 1:  # round 1's configure belongs to the start-up span
            self.timings.add("strategy", time.perf_counter() - start)
        return messages

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        return self._configure(grid, arrays, config, self._run_round(server_round), "evaluate")

    def _configure(self, grid: Grid, arrays: ArrayRecord, config: ConfigRecord, server_round: int, stage: str):
        """FedAvg's configure_train/configure_evaluate with the participants drawn from the run's seed
        and round (strategies/sampling.py) instead of Flower's unseeded ``random.sample``."""
        fraction, minimum = (
            (self.fraction_train, self.min_train_nodes)
            if stage == "train"
            else (self.fraction_evaluate, self.min_evaluate_nodes)
        )
        if fraction == 0.0:
            return []
        size = max(int(len(list(grid.get_node_ids())) * fraction), minimum)  # Flower's count
        _, available = sample_nodes(grid, self.min_available_nodes, size)  # Flower's wait for enough nodes
        self.nodes.learn(grid, available)
        node_ids = self.nodes.sample(available, size, server_round, stage)
        flwr_log(logging.INFO, "configure_%s: Sampled %s nodes (out of %s)", stage, len(node_ids), len(available))
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        kind = MessageType.TRAIN if stage == "train" else MessageType.EVALUATE
        return self._construct_messages(record, node_ids, kind)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        server_round = self._run_round(server_round)
        replies = in_partition_order(replies)
        ok = [r for r in replies if not r.has_error()]
        self._training_received(
            server_round,
            [partition_of(r) for r in ok if partition_of(r) is not None],
            [(r.content.get("metrics") or {}).get("train-seconds") for r in ok],
            [(r.content.get("simulation") or {}).get("train-started") for r in ok],
        )
        with self.timings.measure("strategy"):
            self._dispatch(server_round, ok)  # a non-finite update becomes a failed attack row
            valid = self._exclude_non_finite(server_round, ok)
            arrays, metrics = super().aggregate_train(server_round, valid) if valid else (None, None)
            if arrays is not None:
                arrays = integer_arrays_as_max(arrays, [r.content["arrays"] for r in valid])
        self._round_trained(server_round, len(valid), (metrics or {}).get("train-loss"))
        return arrays, metrics

    def _exclude_non_finite(self, server_round: int, replies: list[Message]) -> list[Message]:
        """The replies whose weights are all finite; the others are logged and left out of the
        aggregate (a NaN would poison every later round). With none left, Flower keeps the previous
        global model."""
        valid, excluded = [], []
        for reply in replies:
            (valid if is_finite(reply.content["arrays"]) else excluded).append(reply)
        if excluded:
            who = [partition_of(r) if partition_of(r) is not None else int(r.metadata.src_node_id) for r in excluded]
            self._round[server_round]["excluded"].extend(who)
            self.folder.event(
                f"round {server_round}: excluded {len(excluded)} non-finite update(s) from the aggregate "
                f"(partitions {who})" + ("; no valid update: the global model stays as it was" if not valid else "")
            )
        return valid

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        server_round = self._run_round(server_round)
        self._evaluation_received(server_round)
        with self.timings.measure("strategy"):
            metrics = super().aggregate_evaluate(server_round, in_partition_order(replies))
        self._clients_evaluated(server_round, (metrics or {}).get("eval-loss"), (metrics or {}).get("eval-accuracy"))
        return metrics

    def evaluate_global(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Flower's ``evaluate_fn``, called at the end of every round (and with round 0 before the
        first): the server's evaluation of the global model, the round's row and its checkpoint."""
        state = arrays.to_torch_state_dict()
        run_round = self._run_round(server_round) if server_round > 0 else 0
        metrics = self.global_evaluation(run_round, state)
        if server_round > 0:
            self._finish_round(run_round, state)
        return MetricRecord(metrics) if metrics is not None else None

    # -- attacks --------------------------------------------------------------------------------
    def _dispatch(self, server_round: int, replies: list[Message]) -> None:
        w0 = self.global_arrays.get(server_round)
        nodes: dict[int, list[Message]] = {}
        for reply in replies:
            if partition_of(reply) is not None:
                nodes.setdefault(partition_of(reply), []).append(reply)
        shared = {p: [int(r.metadata.src_node_id) for r in rs] for p, rs in nodes.items() if len(rs) > 1}
        if shared:  # a deployment's SuperNodes started with the same partition-id: whose data is it?
            self.folder.event(
                f"round {server_round}: partition-id(s) {sorted(shared)} came from more than one node "
                f"(node ids {shared}): aggregated but not attacked; give each SuperNode its own partition-id"
            )
        by_partition = {p: rs[0] for p, rs in nodes.items() if len(rs) == 1}
        for partition_id in self._plan(server_round, list(by_partition)):
            reply = by_partition[partition_id]
            client_id = str(reply.content["simulation"].get("client-id", ""))
            target = AttackTarget(server_round, (partition_id,), int(reply.metadata.src_node_id), client_id)
            client = {"round": server_round, "node_id": target.node_id}
            self._submit(
                target,
                lambda reply=reply, client=client: self._observe(w0, reply, client),
                lambda partition_id=partition_id: private_samples(self.settings.data, partition_id).labels,
            )
        self.folder.event(
            f"round {server_round}: {self._round[server_round]['dispatched']} attack(s) dispatched, "
            f"{self.pipeline.in_flight} in flight"
        )
