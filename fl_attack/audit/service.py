"""The audit service: what an honest-but-curious server does with the updates it sees, without Flower.

A server (the project's FedAvg, its SecAgg+ strategy, the plugin around any Flower strategy in
strategies/audit.py) or ``fl-attack replay`` feeds one ``AuditService`` what it observes, and the
service does the rest: which attacks run (the schedule), the server's memory of its clients, the
worker pipeline, scoring through the evaluator, the run's records (events.log, rounds.csv,
attacks.csv, updates/, memory.pt), the DP ledger and the timings. Its surface:

- ``round_started(r)``, ``plan(r, partitions)``, ``observe(target, make_update, ...)``: a round
  begins, which of its clients to attack, one observed update (w0, wT, public metadata) to attack;
- ``training_received``, ``round_trained``, ``clients_evaluated``, ``global_evaluated``,
  ``end_of_round(r, state)``: what the round's row says, written with its checkpoint;
- ``collect``, ``drain``, ``finish``: finished attacks are scored and written as they come back; at
  the end the ones in flight are waited for and summary.json's counts returned.

Ground truth stays on the evaluator's side: ``truth(partition_ids)`` is called only to score a
finished attack (and for labels=oracle, an explicit leak). Without it the rows are written unscored.
Fault injection (tests) goes through ``hooks``: a callable called at each point of a round's end.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

import torch
from tqdm import tqdm

from fl_attack.attacker.labels import AuxiliaryData
from fl_attack.attacker.memory import MEMORY_SUFFIX, AttackMemory
from fl_attack.attacker.runtime.workers import AttackJob, AttackOutcome, Pipeline, Workers, memory_key, remember
from fl_attack.attacker.runtime.workers import outcomes as outcomes_of
from fl_attack.audit.run_folder import RunFolder
from fl_attack.audit.settings import RunSettings
from fl_attack.audit.timings import Timings
from fl_attack.evaluation.evaluator import Evaluator
from fl_attack.evaluation.verdict import Verdict, verdict_line, verdict_summary
from fl_attack.federation.data import run_writers
from fl_attack.federation.update import AttackTarget, ObservedUpdate, save_torch_atomic, save_update
from fl_attack.privacy.accountant import PrivacyLedger, format_epsilons
from fl_attack.records import read_csv

log = logging.getLogger(__name__)

Truth = Callable[[tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]]
# Called as hook(point, server_round, service) at "before-checkpoint" and "round-end" (tests inject faults).
Hook = Callable[[str, int, "AuditService"], None]


def federation_workers(settings: RunSettings, threads: int) -> Workers:
    """The run's attack workers (AuditSettings.make_workers), made at its first attack; tests swap it."""
    return settings.make_workers(threads)


def new_run_folder(settings: RunSettings) -> RunFolder:
    """The run's folder (AuditSettings.run_path, stamped with the time now). A named run (run-name)
    must not exist yet, so that two runs never share one record. Raises ValueError for a named
    folder that already holds a run."""
    folder = RunFolder(settings.run_path(settings.dataset, time.strftime("%Y%m%d-%H%M%S")))
    if settings.run_name and folder.holds_run:
        raise ValueError(
            f"invalid run config: run folder {folder} already holds a run; choose another "
            f'run-name, or resume it with resume="{folder}"'
        )
    return folder


class AuditService:
    """The honest-but-curious server's attacker, evaluator and records for one run (module docstring).

    settings: the run's (what to attack and how; the data settings only reach ``truth``'s default).
    run_dir: the run folder (fl_attack.audit.run_folder.RunFolder or a path). workers: a Workers object, or a
    function that makes one at the first attack (default: ``federation_workers``). clients_per_round:
    the participants of a round, for the attack threads' rule (RunSettings.attack_thread_count).
    round_offset: rounds done before this service started (a resumed run). test_set: the server's
    held-out ClientData (label_estimator=aux's public pool, the verdict's), or None. privacy: the
    run's PrivacyLedger under local-dp or central-dp, else None. truth: partition ids -> (images
    (N,C,H,W) in [0,1], labels (N,)) to score against; None: rows unscored. memory: the server's
    memory (default "run": the run config's, or memory.pt of a resumed run; None: none).
    record_updates: keep each attacked update in updates/ (default: the run config's). hooks: called
    at the points of a round's end (fault injection). verdict: the evaluator's Verdict (default: the
    run's). attack_config, defense, time_limit: the attacks' AttackConfig, the rows' defense label and
    each attack's time limit in seconds (default "run": the run config's). device: the rows' device
    where a worker did not say. model: the victims' architecture, an nn.Module (an audited app's
    own model) or a spec (default: the run config's ``model``). batch: the attacks of a round a
    worker runs as one reconstruct_batch (``Pipeline``; default: the run config's attack-batch).
    """

    def __init__(
        self,
        settings: RunSettings,
        run_dir,
        *,
        workers: Workers | Callable[[], Workers] | None = None,
        clients_per_round: int | None = None,
        round_offset: int = 0,
        test_set=None,
        privacy: PrivacyLedger | None = None,
        truth: Truth | None = None,
        memory: AttackMemory | None | str = "run",
        record_updates: bool | None = None,
        hooks: Iterable[Hook] = (),
        verdict: Verdict | None = None,
        attack_config=None,
        defense: str | None = None,
        time_limit: float | None | str = "run",
        device: str = "",
        model=None,
        batch: int | None = None,
    ) -> None:
        self.settings = settings
        self.folder = RunFolder(run_dir)  # every file of the run's record
        self.round_offset = round_offset
        self.truth = truth
        self.hooks = list(hooks)
        self.record_updates = settings.record_updates if record_updates is None else record_updates
        self.attack_config = attack_config or settings.attack_config()
        self.time_limit = settings.attack_timeout if time_limit == "run" else time_limit
        self.device = device
        self.model = settings.model if model is None else model
        self.attack_threads = settings.attack_thread_count(clients_per_round)
        self.drain_threads = settings.attack_drain_thread_count()
        # the attack workers, chosen at the first submit (Flower's Ray runtime is up by then)
        self.pipeline = Pipeline(
            workers or (lambda: federation_workers(settings, self.attack_threads)),
            batch=settings.attack_batch_size() if batch is None else batch,  # attack-batch resolved, once, here
        )
        self.timings = Timings()  # the evaluator's scoring, images and writing phases too
        public = (test_set.images, test_set.labels) if test_set is not None else None
        self.evaluator = Evaluator(
            settings.dataset,
            defense=defense or settings.defense.label,
            folder=self.folder.path,
            table=self.folder.append_attack,
            timings=self.timings,
            verdict=verdict
            or Verdict.from_data(
                settings.dataset,
                data_dir=settings.data_dir or None,
                seed=settings.seed,
                public=public,
                # FEMNIST: the verdict's pool and distractors without the run's writers, where its clients are known
                exclude_writers=run_writers(settings.data) if settings.num_partitions is not None else (),
            ),
        )
        if isinstance(memory, str):  # the server's memory of its tracked clients (a resumed run's, cut back)
            memory = settings.attack_memory_state(self.folder.memory_file, round_offset)
        self.memory = memory
        self.privacy = privacy  # the DP budget spent (fl_attack.privacy), None without local-dp or central-dp
        if privacy is not None and round_offset:  # a resumed run: who took part in the rounds kept
            privacy.restore(read_csv(self.folder.rounds_file)[1])
            privacy.cut_back(round_offset)
        self._memory_queue: dict = {}  # (partition, method) -> its "+memory" jobs waiting, oldest first
        self._memory_busy: set = set()  # the keys with a "+memory" job in flight
        self.label_aux = (
            AuxiliaryData(test_set.images, test_set.labels)
            if self.attack_config.needs_public and test_set is not None
            else None
        )
        self.round_times: dict[int, dict] = {}
        self.rows: list[dict] = []
        self.current_round = round_offset
        # per round: clients, losses, accuracies, attack counts, excluded partitions
        self._round: defaultdict[int, dict] = defaultdict(lambda: {"dispatched": 0, "skipped": 0, "excluded": []})
        self.unwritten: list[AttackOutcome] = []  # finished attacks whose rows the disk refused
        self.refused: dict[str, list[int]] = {"rounds": [], "checkpoints": [], "updates": [], "memory": []}
        self.on_row: Callable[[dict, AttackOutcome], None] | None = None  # each row written, with its outcome
        self._jobs = 0
        if clients_per_round is not None:  # a federation (a replay has no rounds of clients)
            self.folder.event(f"attacker: {settings.describe_threads(clients_per_round)}")

    # -- a round ----------------------------------------------------------------------------------
    def round_started(self, server_round: int) -> None:
        """Round ``server_round`` (the run's numbering) begins: its clients train from now on."""
        self.current_round = server_round
        self.round_times[server_round] = {"configured": time.time()}
        in_flight = self.pipeline.in_flight
        oldest = f", the oldest from round {self.pipeline.rounds_in_flight()[0]}" if in_flight else ""
        behind = f" ({self.lag_rounds()} round(s) behind)" if in_flight else ""
        self.folder.event(f"round {server_round}: training starts with {in_flight} attack(s) in flight{oldest}{behind}")

    def lag_rounds(self) -> int:
        """How many rounds the oldest attack still in flight is behind the current round (0: none)."""
        return self.current_round - self.pipeline.rounds_in_flight()[0] if self.pipeline.in_flight else 0

    def plan(self, server_round: int, candidates: list[int]) -> list[int]:
        """The partitions to attack this round (each with every method), by the run config's schedule
        (AuditSettings.schedule: attack-rounds, attack-clients, attack-max-backlog, attack-budget)."""
        targets, skipped, note = self.settings.schedule(server_round, candidates, self.pipeline.in_flight)
        self._round[server_round]["skipped"] += skipped
        if note:
            self.folder.event(f"round {server_round}: {note}")
        return targets

    def observe(
        self,
        target: AttackTarget,
        make_update: Callable[[], ObservedUpdate],
        *,
        labels: str | torch.Tensor | None = None,
        methods: Iterable[str] | None = None,
        threads: int | None | str = "run",
    ) -> None:
        """Attack the update ``make_update()`` builds (recorded in updates/ first) with every method.

        A failure to build it (bad input, a non-finite update) is a failed row and the round goes
        on. labels: "recovered", or the true labels (N,) (labels=oracle, an explicit leak); default:
        the run config's attack-labels, the truth's labels for oracle. methods: the
        run's by default. threads: each job's torch threads (default "run": the run's rule; None: the
        worker's own setting)."""
        try:  # built once, shared by every method's job
            update = make_update()
            if labels is None:
                labels = "recovered" if self.settings.attack_labels != "oracle" else self._oracle(target)
        except Exception as exc:
            update, error = None, f"{type(exc).__name__}: {exc}"
        if update is not None and self.record_updates:
            try:
                with self.timings.measure("writing"):
                    save_update(update, target, self.folder.updates)
            except Exception as exc:  # the attack can still run; only the replay copy is missing
                self.refused["updates"].append(target.round)
                self.folder.event(f"could not record the update of {target.describe()}: {type(exc).__name__}: {exc}")
        methods = tuple(self.settings.methods if methods is None else methods)
        for method in methods:
            self._jobs += 1
            if update is None:
                unbuilt = AttackJob(self._jobs, None, method, self.attack_config, target, self.settings.attack_labels)
                epsilon = self.epsilon(target.round, target.partition_ids)
                self.rows.append(self.evaluator.record(AttackOutcome.failed(unbuilt, error), None, epsilon=epsilon))
                self.folder.event(f"attack failed: {target.describe()} {method}: {error}")
                continue
            self._round[target.round]["dispatched"] += 1
            if method + MEMORY_SUFFIX in methods:  # its "+memory" twin runs it and yields its row
                continue
            job_threads = threads
            if threads == "run":
                last_round = target.round >= self.settings.num_server_rounds  # clients idle now
                job_threads = self.drain_threads if last_round else self.attack_threads
            job = AttackJob(
                self._jobs,
                update,
                method,
                self.attack_config,
                target,
                labels,
                time_limit=self.time_limit,
                threads=job_threads,
                model=self.model,
                label_aux=self.label_aux,
                with_memoryless=method.endswith(MEMORY_SUFFIX) and method.removesuffix(MEMORY_SUFFIX) in methods,
            )
            if method.endswith(MEMORY_SUFFIX):
                key = memory_key(target, method)
                self.memory.observe(key, target.round, update)
                self._memory_queue.setdefault(key, []).append(job)
                self._next_memory_job(key)
            else:
                self.pipeline.submit(job)

    def _oracle(self, target: AttackTarget) -> torch.Tensor:
        """The true labels of ``target``'s images (attack-labels=oracle), from the evaluator's truth."""
        if self.truth is None:
            raise ValueError("attack-labels=oracle needs the ground truth, and this audit has none")
        return self.truth(target.partition_ids)[1].clone()

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

    def training_received(
        self, server_round: int, partitions: Iterable[int], train_seconds: Iterable = (), train_started: Iterable = ()
    ) -> None:
        """The replies are in (called before the round's attacks are observed): the partitions whose
        updates the round received (each spent its DP budget), so that its rows carry the ε spent by
        then; then the clients' reported times (seconds; epoch seconds), None where not reported."""
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

    def dispatched(self, server_round: int) -> int:
        """How many attacks of ``server_round`` were dispatched (a "+memory" pair counts twice)."""
        return self._round[server_round]["dispatched"]

    def excluded(self, server_round: int, who: list[int]) -> None:
        """Clients (partition or node ids) whose updates were left out of the round's aggregate."""
        self._round[server_round]["excluded"].extend(who)

    def epsilon(self, server_round: int, partitions: Iterable[int] | None = None) -> float | None:
        """The DP budget spent by ``server_round`` (PrivacyLedger.epsilon); None without DP."""
        return None if self.privacy is None else self.privacy.epsilon(server_round, partitions)

    def _tracked_epsilons(self, server_round: int) -> str:
        """rounds.csv's epsilon_tracked: each attack-clients id's ε under local-dp, else ""."""
        tracked = self.settings.attack_client_ids()
        if self.privacy is None or self.privacy.mechanism != "local-dp" or not tracked:
            return ""
        return format_epsilons({p: self.privacy.epsilon(server_round, [p]) for p in tracked})

    def round_trained(self, server_round: int, clients: int, train_loss: float | None) -> None:
        """The round's aggregate is made from ``clients`` updates (train_loss: their mean, or None)."""
        record = self._round[server_round]
        record["clients"] = clients
        if train_loss is not None:
            record["train_loss"] = float(train_loss)
        self.collect()
        self.round_times.setdefault(server_round, {})["aggregated"] = time.time()

    def evaluation_received(self, server_round: int) -> None:
        self.round_times.setdefault(server_round, {})["evaluating"] = time.time()

    def clients_evaluated(self, server_round: int, eval_loss, eval_accuracy) -> None:
        """The clients' federated evaluation of the round's global model (None: not reported)."""
        values = {"eval_loss": eval_loss, "eval_accuracy": eval_accuracy}
        self._round[server_round].update({key: None if v is None else float(v) for key, v in values.items()})
        self.collect()

    def global_evaluated(self, server_round: int, loss: float | None, accuracy: float | None) -> None:
        """The server's evaluation of the round's global model on its held-out data (None: none)."""
        self._round[server_round].update(global_loss=loss, global_accuracy=accuracy)

    def end_of_round(self, server_round: int, state: dict | None) -> None:
        """The round's row in rounds.csv, then the checkpoint of its global model ``state`` (None:
        no checkpoint), then memory.pt, written atomically in that order."""
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
            self._hook("before-checkpoint", server_round)
            try:
                if state is not None:
                    self.folder.save_checkpoint(server_round, state)
            except OSError as exc:  # a resume goes back to the last checkpoint that was written
                self.refused["checkpoints"].append(server_round)
                self.folder.event(f"round {server_round}: could not write the checkpoint ({exc})")
            self.save_memory()  # after the checkpoint: a resume cuts the memory back to it
        self._hook("round-end", server_round)
        accuracy = record.get("global_accuracy")
        self.folder.event(
            f"round {server_round}: done; global accuracy "
            f"{'n/a' if accuracy is None else f'{accuracy:.4f}'}; {self.pipeline.in_flight} attack(s) "
            f"in flight, {self.lag_rounds()} round(s) behind"
        )

    def _hook(self, point: str, server_round: int) -> None:
        for hook in self.hooks:
            hook(point, server_round, self)

    # -- finished attacks -------------------------------------------------------------------------
    def settle(self, server_round: int, timeout: float) -> None:
        """Collect until no attack of a round before ``server_round`` is in flight or queued, or
        ``timeout`` seconds have passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.collect()
            queued = [job.target.round for queue in self._memory_queue.values() for job in queue]
            if all(r >= server_round for r in self.pipeline.rounds_in_flight() + queued):
                return
            time.sleep(0.05)

    def wait_below(self, pending: int) -> None:
        """Collect until fewer than ``pending`` attacks are in flight or queued (a replay's pace)."""
        while self.attacks_pending >= max(1, pending):
            if not self.collect():
                time.sleep(0.05)

    def collect(self, done: list | None = None) -> list[dict]:
        """Evaluate and record every finished attack (does not wait); ``done``: (job, outcome) pairs
        already collected from the pipeline."""
        outcomes = [
            o for job, outcome in (self.pipeline.poll() if done is None else done) for o in outcomes_of(job, outcome)
        ]
        for outcome in outcomes:
            self.timings.add("attack", outcome.attack_seconds)  # NaN (never ran to the end) is skipped
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
        if self.memory is None or self.memory.mode == "none":
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
            target = outcome.target
            outcome.device = outcome.device or self.device
            try:
                truth = self.truth(target.partition_ids) if self.truth and outcome.status == "ok" else None
                row = self.evaluator.record(
                    outcome,
                    truth,
                    lag_rounds=self.current_round - target.round if self.current_round else None,
                    epsilon=self.epsilon(target.round, target.partition_ids),
                )
            except OSError as exc:
                self.unwritten.append(outcome)
                self.folder.event(
                    f"could not write the result of {target.describe()} {outcome.method} "
                    f"({exc}); kept in memory, tried again later"
                )
                continue
            rows.append(row)
            self.folder.event(
                f"attack done: {target.describe()} {row['method']}: {verdict_line(row)}"
                if row["status"] == "ok"
                else f"attack failed: {target.describe()} {row['method']}: {row['error']}"
            )
            if self.on_row is not None:
                self.on_row(row, outcome)
        self.rows.extend(rows)
        return rows

    def keep_unwritten(self) -> None:
        """At shutdown: outcomes whose rows could still not be written go to unwritten-<n>.pt in the
        run folder, one plain dict each (``AttackOutcome.plain``), for a later look; a failure here is
        logged, not raised."""
        if not self.unwritten:
            return
        try:
            path = self.folder / f"unwritten-{len(self.unwritten)}.pt"
            save_torch_atomic(path, [o.plain() for o in self.unwritten])
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

        scoring = [0.0]  # seconds spent collecting (scoring, images, rows): timed as their own phases

        def done(pairs):
            started = time.perf_counter()
            if pairs:
                rows.extend(self.collect(pairs))
                bar.update(len(pairs))
            if time.monotonic() > note[0]:
                note[0] += 60
                self.folder.event(f"waiting for {self.attacks_pending} attack(s)")
            scoring[0] += time.perf_counter() - started

        started = time.perf_counter()
        with bar:
            self.pipeline.drain(timeout, on_done=done)
            if self.unwritten:  # one last try for rows the disk refused
                rows += self._record([])
        self.timings.add("drain_wait", time.perf_counter() - started - scoring[0])  # the waiting alone
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
            "verdict": verdict_summary(self.rows),  # images recovered per attack (fl_attack.evaluation.verdict)
        }

    def close(
        self, started: float | None = None, timeout: float | None = None, summary: dict | None = None, timings=None
    ) -> dict:
        """The run's end: ``finish`` (at most ``timeout`` s; default: the attack timeout per wave of
        workers), then summary.json (``summary``'s fields and the timings, ``timings``' added) and
        the console's last lines. started: the epoch second the rounds began. Returns the counts."""
        if timeout is None:
            waves = -(-self.attacks_pending // max(1, self.settings.attack_actors))
            timeout = self.settings.attack_timeout * waves + 60
        rounds_finished = time.time()
        counts = self.finish(timeout)
        record = {"finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if started is not None:
            record["seconds"] = round(time.time() - started, 1)
        record |= counts | (summary or {})
        record["drain_seconds"] = round(time.time() - rounds_finished, 1)
        record["timings"] = {
            **self.timing_record(),
            **(timings or {}),
            "rounds_finished": rounds_finished,
            "main_finished": time.time(),
        }
        try:  # the shutdown path must not fail on the error that may have brought it here
            self.folder.write_summary(record)
        except OSError as exc:
            print(f"fl-attack: error: could not write {self.folder.summary_file}: {exc}", flush=True)
        print(f"fl-attack: {counts['attacks_ok']}/{counts['attacks']} attacks succeeded; results in {self.folder}")
        if counts["writes_refused"] or counts["attacks_unwritten"]:
            print(f"fl-attack: error: the disk refused part of the record: {incomplete(counts)}", flush=True)
        return counts

    def timing_record(self) -> dict:
        """The service's and its evaluator's timings, for summary.json (fl_attack/audit/timings.py)."""
        rounds = {str(r): {k: round(v, 3) for k, v in t.items()} for r, t in sorted(self.round_times.items())}
        return {
            **self.timings.as_dict(),
            "rounds": rounds,
            "attacker_threads": {"while_training": self.attack_threads, "last_round": self.drain_threads},
        }


def incomplete(counts: dict) -> str:
    """What of a run's record the disk refused (summary.json's counts), in words."""
    refused = counts.get("writes_refused") or {}
    what = {"rounds": "rounds.csv rows", "checkpoints": "checkpoints", "updates": "recorded updates"}
    what["memory"] = "the attack memory (memory.pt)"
    parts = [f"{what[k]} of round(s) {','.join(map(str, sorted(set(v))))}" for k, v in refused.items()]
    if counts.get("attacks_unwritten"):
        parts.append(f"{counts['attacks_unwritten']} attacks.csv row(s) (kept in unwritten-*.pt)")
    return "; ".join(parts) + " (see events.log): the run may not resume or replay in full"
