"""``fl-attack replay``: attack a run's recorded updates again, offline, and record the result as a run.

A federation with record-updates=true keeps every attacked update in ``<run>/updates/`` (index.csv,
round-R/w0.pt, round-R/client-P.pt or aggregate.pt; fl_attack.federation.update). A replay reads them back
(checksums verified), attacks each with other methods or settings, scores the reconstructions
against the ground truth (the private samples of the partition ids, drawn as the federation drew
them from the run config's data settings) and writes its own record under
``<run>/replays/<name>/``, in the format of a run: config.json (the run's config with the
replay's methods, labels and attack settings in its run_config), rounds.csv (the run's, copied:
the model did not change), attacks.csv (one row per attack, appended atomically as it finishes),
images/, events.log and summary.json. ``python -m analysis.report RUN RUN/replays/NAME`` then
compares the two.

The attacks run on the project's worker pool (``fl_attack.attacker.runtime.workers``): this process (``workers=0``,
one attack after another), N local processes, or N actors of a Ray cluster (``ray_address``). A
worker gets only what the attacker sees (the recorded update; the true labels only with
labels=oracle); this process scores each reconstruction against the ground truth and appends its
row as it comes back, so with several workers the rows' order is the order the attacks finished
(``analysis.load`` sorts them). Each row names where its attack ran (worker_node, worker_id).

With ``missing=True`` it completes the run itself instead: the recorded updates whose
(round, partition, method) has no row in the run's attacks.csv are attacked with the run's own
methods and settings, and their rows appended to the run's attacks.csv.

The run config is read back with the run's own parser (fl_attack.audit.settings.RunSettings).
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import torch

from fl_attack.attacker.api import resolve_device
from fl_attack.attacker.attacks import AttackConfig, check_own_settings
from fl_attack.attacker.labels import check_label_mode
from fl_attack.attacker.memory import MEMORY_SUFFIX, AttackMemory, check_memory_labels, memory_methods
from fl_attack.attacker.precision import resolve_precision
from fl_attack.attacker.runtime.workers import RayWorkers, make_workers, resolve_batch
from fl_attack.audit.run_folder import RunFolder
from fl_attack.audit.service import AuditService
from fl_attack.audit.settings import OWN_KEYS, RunSettings
from fl_attack.evaluation.verdict import verdict_line, verdict_summary
from fl_attack.evaluation.victims import ground_truth
from fl_attack.federation.config import parse_key_values
from fl_attack.federation.update import AttackTarget, load_update, read_update_index, verify_update
from fl_attack.privacy.accountant import PrivacyLedger
from fl_attack.records import header_mismatch, read_csv, write_bytes_atomic
from fl_attack.schema import ATTACK_COLUMNS

__all__ = ["REPLAYS", "ReplayError", "RecordedRun", "open_run", "Replay", "prepare_replay", "run_replay"]

REPLAYS = "replays"  # <run>/replays/<name>/
# The settings with a run-config key of their own (OWN_KEYS) that a replay takes as flags: not seed, the federation's.
FLAGS = {key: f"--{key}" for key in OWN_KEYS if key != "seed"}


class ReplayError(ValueError):
    """Bad input found before any attack ran: not a run folder, nothing recorded, an unknown method,
    a corrupt record, bad settings. The CLI reports it in one line with exit status 2."""


@dataclass
class RecordedRun:
    """A run folder with recorded updates, as a replay needs it.

    config: config.json; run_config: its flat Flower run config (kebab-case keys), parsed as the
    federation parsed it into ``settings`` (fl_attack.audit.settings.RunSettings); attack_config: the
    run's own AttackConfig; defense: the run's defense label; index: the rows of
    updates/index.csv, in file order; privacy: config.json's DP accounting with rounds.csv's
    participants, so a replayed row carries the ε the run's client had spent.
    """

    def epsilon(self, target: AttackTarget) -> float | None:
        """The DP budget ``target``'s client(s) had spent by its round; None without DP."""
        return None if self.privacy is None else self.privacy.epsilon(target.round, target.partition_ids)

    path: Path
    config: dict
    run_config: dict
    settings: RunSettings
    attack_config: AttackConfig
    defense: str
    index: list[dict]
    threads: dict = field(default_factory=dict)  # (round, partition id text) -> the torch threads its attack ran with
    privacy: PrivacyLedger | None = None  # the run's DP accounting and participants (None: no DP)

    updates = property(lambda self: self.path / "updates")
    data = property(lambda self: self.settings.data)  # how the clients' private samples were drawn
    methods = property(lambda self: tuple(self.settings.methods))
    labels = property(lambda self: self.settings.attack_labels)
    model = property(lambda self: self.settings.model)  # the victims' architecture ("" = the paper's CNN)


def _methods(text: str, what: str, memory: str = "none") -> tuple[str, ...]:
    try:
        return memory_methods(text, memory, what)
    except ValueError as exc:
        raise ReplayError(str(exc)) from None


def open_run(path: str | Path) -> RecordedRun:
    """Read the run folder ``path``: config.json and updates/index.csv.

    Raises ReplayError when it is not a run folder (no config.json, unreadable, a run config that
    does not parse here, a model spec that does not resolve here), when it audited an app's own model
    (strategies/audit.py records its class, not a way to rebuild it), or when it recorded no update.
    """
    folder = RunFolder(path)
    if not folder.path.is_dir():
        raise ReplayError(f"{folder} is not a run folder (no such folder)")
    if not folder.config_file.is_file():
        raise ReplayError(f"{folder} is not a run folder (no config.json)")
    try:
        config = folder.read_config()
    except ValueError as exc:
        raise ReplayError(str(exc)) from None
    run_config = config.get("run_config")
    if not isinstance(run_config, dict):
        raise ReplayError(f"{folder.config_file} has no run_config")
    audit = config.get("audit")
    if isinstance(audit, dict) and audit.get("model"):  # strategies/audit.py: an app's own model instance
        raise ReplayError(
            f"{folder} audited an app's own model ({audit['model']}), which a replay cannot rebuild (it builds "
            "the model a run config's `model` names); run the app again with more attack-iterations instead"
        )
    try:
        settings = RunSettings.from_run_config(run_config)  # the model spec must resolve here too
        # The federation's node count: the Flower partitioners' ground truth needs it (config.json).
        settings = settings.with_partitions(config.get("num_nodes"))
        attack_config = AttackConfig.from_overrides(None, **dict(config.get("attack_config") or {}))
    except (TypeError, ValueError) as exc:
        raise ReplayError(f"{folder.config_file}: {exc}") from None
    index = read_update_index(folder.updates)
    if not index:
        raise ReplayError(
            f"{folder} has no recorded updates ({Path('updates') / 'index.csv'}); "
            "a run records them with record-updates=true"
        )
    defense = config.get("defense")
    label = defense.get("label") if isinstance(defense, dict) else None
    threads = {  # what reproduces the run's rows exactly (attacks.csv's threads column, when it has one)
        (int(r["round"]), r.get("partition_id") or ""): int(r["threads"])
        for r in read_csv(folder.attacks_file)[1]
        if r.get("threads") and r.get("round")
    }
    label = str(label or settings.defense.label)
    try:
        privacy = PrivacyLedger.from_record(config.get("privacy"), read_csv(folder.rounds_file)[1])
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplayError(
            f"{folder}: its DP accounting (config.json 'privacy', rounds.csv) does not parse: {exc}"
        ) from None
    return RecordedRun(folder.path, config, dict(run_config), settings, attack_config, label, index, threads, privacy)


@dataclass
class Replay:
    """A checked replay, ready to run (``run_replay``).

    out: where the rows go (``<run>/replays/<name>``, or the run itself when ``missing``).
    work: per recorded update (its index row and target), the methods to run on it.
    truths: the ground truth (images (N,C,H,W) in [0,1], labels) of each target's partition ids.
    threads: torch threads of each attack (0: this process's setting, with workers=0 only).
    workers: 0 = this process, else that many local processes, or Ray actors with ray_address.
    """

    run: RecordedRun
    name: str
    out: Path
    methods: tuple[str, ...]
    labels: str
    config: AttackConfig
    options: dict
    rounds: tuple[int, ...] | None
    threads: int
    device: torch.device
    missing: bool
    work: list[tuple[dict, AttackTarget, tuple[str, ...]]]
    truths: dict
    workers: int = 0
    ray_address: str = ""
    memory: AttackMemory | None = None  # the replaying server's memory of each client (attack-memory)
    test_set: object = None  # the server's held-out ClientData: label_estimator=aux's public data, the verdict's pool
    batch: int = 1  # attacks of one round run as one reconstruct_batch (fl_attack.workers.Pipeline)
    batch_given: str = ""  # --batch as given ("": the run's attack-batch), for the replay's run config

    @property
    def attacks(self) -> int:
        return sum(len(methods) for _, _, methods in self.work)

    def where(self) -> str:
        """Where the attacks run, in words (for events.log)."""
        if self.ray_address:
            return f"{max(1, self.workers)} Ray actor(s) at {self.ray_address}"
        return f"{self.workers} local process(es)" if self.workers else "this process"


def _default_name(methods, labels, iterations, nodes, options: dict, rounds, precision=None) -> str:
    parts = ["-".join(methods), labels]
    parts += [f"K{iterations}"] if iterations else []
    parts += [f"m{nodes}"] if nodes else []
    parts += [precision] if precision else []
    parts += [f"{k}{v}" for k, v in options.items()]
    parts += ["rounds" + "_".join(map(str, rounds))] if rounds else []
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", "-".join(parts))


# A Ray cluster address as RayWorkers takes it: auto, host:port or ray://host:port.
_RAY_ADDRESS = re.compile(r"(ray://)?[A-Za-z0-9._-]+:(\d{1,5})")


def _check_workers(workers, ray_address: str, threads: int) -> int:
    """ReplayError for a bad ``workers`` or ``ray_address``; returns the torch threads per attack:
    ``threads``, or for threads=0 with workers torch's count here split over the local processes
    (at least 1), and 1 per Ray actor (its CPU request). 0 stays 0 in this process (torch's setting)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ReplayError(f"--workers must be an integer >= 0 (0: this process), got {workers!r}")
    if ray_address:
        match = _RAY_ADDRESS.fullmatch(ray_address)
        if ray_address != "auto" and not (match and 1 <= int(match.group(2)) <= 65535):
            raise ReplayError(
                f"--ray-address must be auto, HOST:PORT or ray://HOST:PORT (a running Ray cluster), got {ray_address!r}"
            )
        if importlib.util.find_spec("ray") is None:
            raise ReplayError("--ray-address needs Ray, which is not installed here (pip install 'ray[default]')")
        return threads or 1
    if workers and not threads:
        return max(1, torch.get_num_threads() // workers)
    return threads


def _done_attacks(path: Path) -> set[tuple[int, str, str]]:
    """(round, partition_id text, method) of every row of an attacks.csv ("" for an aggregate's id)."""
    return {
        (int(r["round"]), r.get("partition_id") or "", r["method"])
        for r in read_csv(path)[1]
        if r.get("round") and r.get("method")
    }


def prepare_replay(
    run_dir: str | Path,
    *,
    methods: str | tuple | None = None,
    labels: str | None = None,
    iterations: int | None = None,
    nodes: int | None = None,
    options: str = "",
    rounds=None,
    threads: int = 0,
    device: str = "auto",
    name: str | None = None,
    missing: bool = False,
    workers: int = 0,
    ray_address: str = "",
    memory: str | None = None,
    memory_rounds: str | None = None,
    precision: str | None = None,
    compile: str | None = None,
    batch: int | str | None = None,
) -> Replay:
    """Check everything a replay needs, before any attack: the run folder, the settings, the
    recorded updates' checksums and the ground truth of every target.

    methods: comma-separated or a tuple (default: the run's); labels: "recovered" or "oracle"
    (default: the run's); iterations (K), nodes (m), options ("tv_weight=0.02,..."): AttackConfig
    overrides on top of the run's attack_config; rounds: the rounds to replay (default: every
    recorded one); threads: torch threads (0: leave torch's setting); name: the folder under
    ``<run>/replays/`` (default: built from the settings). missing: complete the run's own
    attacks instead (no methods, labels, iterations, nodes, options or name then). workers: where
    the attacks run (``fl_attack.attacker.runtime.workers.make_workers``): 0 = this process, one after another; N =
    N local processes, or N Ray actors (at least 1) on the cluster at ``ray_address``, each with
    ``threads`` torch threads (0 there: this process's torch threads split over the N processes,
    1 per Ray actor).
    memory, memory_rounds: the replaying server's attack memory (fl_attack.attacker.memory; default: the
    run's attack-memory and attack-memory-rounds): each method also runs as "METHOD+memory", and
    the updates are attacked one after another in round order. With ``missing``, the run's own
    memory.pt is where it starts from; a new replay starts from none and saves its own memory.pt.
    precision: the attacks' arithmetic (``fl_attack.attacker.precision``: fp32, bf16, tf32 or auto; default:
    the run's attack-precision, fp32 for a run recorded before it existed), checked on ``device``.
    compile: off, on or auto (``AttackConfig.compile``; default: the run's attack-compile). batch: the
    attacks of one round a worker runs as one ``reconstruct_batch`` (N or "auto",
    ``fl_attack.attacker.runtime.workers.resolve_batch`` on ``device``; default: the run's attack-batch); rows
    as unbatched.
    Raises ReplayError, with a one-line message, for anything that does not fit.
    """
    run = open_run(run_dir)
    flags = {"methods": methods, "labels": labels, "iterations": iterations, "nodes": nodes, "options": options}
    given = [f"--{flag}" for flag, value in (flags | {"name": name, "precision": precision}).items() if value]
    if missing and given:
        raise ReplayError(
            f"--missing completes the run's own attacks with its own settings; it takes no {', '.join(given)}"
        )
    if missing and (memory is not None or memory_rounds is not None):
        raise ReplayError("--missing completes the run's own attacks with its own memory; it takes no --memory")
    memory = run.settings.attack_memory if memory is None else memory
    memory_rounds = run.settings.attack_memory_rounds if memory_rounds is None else memory_rounds
    if isinstance(methods, (tuple, list)):
        methods = ",".join(methods)
    methods = _methods(run.settings.attack_method if methods is None else methods, "methods", memory)
    remembers = any(m.endswith(MEMORY_SUFFIX) for m in methods)
    labels = labels or run.labels
    try:
        check_label_mode(labels)
        check_memory_labels(methods, labels)
        option_values = parse_key_values(options or "", asdict(AttackConfig()), "--options", "attack setting")
        given = {"iterations": iterations, "nodes": nodes, "precision": precision, "compile": compile}
        given = {key: value for key, value in given.items() if value is not None}
        try:
            check_own_settings(option_values, {key: FLAGS[key] for key in given})
        except ValueError as exc:
            raise ReplayError(f"--options: {exc}") from None
        config = AttackConfig.from_overrides(run.attack_config, **option_values, **given)
        dev = resolve_device(device)
        resolve_precision(config.precision, dev)  # tf32 off CUDA, before any attack
        batch_given, batch = batch, resolve_batch(run.settings.attack_batch if batch is None else batch, dev)
    except (TypeError, ValueError) as exc:
        raise ReplayError(str(exc)) from None
    state = None
    if remembers:
        try:
            state = AttackMemory(memory, memory_rounds)
            if missing and (run.path / "memory.pt").is_file():
                state = AttackMemory.load(run.path / "memory.pt")
        except ValueError as exc:
            raise ReplayError(str(exc)) from None
    if isinstance(threads, bool) or int(threads) < 0:
        raise ReplayError(f"threads must be an integer >= 0 (0: torch's default), got {threads}")
    threads = _check_workers(workers, ray_address or "", int(threads))

    recorded = sorted({int(r["round"]) for r in run.index})
    if rounds is not None:
        rounds = tuple(sorted({int(r) for r in rounds}))
        absent = [r for r in rounds if r not in recorded]
        if absent:
            raise ReplayError(
                f"no update recorded in round(s) {','.join(map(str, absent))} of {run.path}; "
                f"recorded: {','.join(map(str, recorded))}"
            )
    if missing:
        out, name = run.path, ""
    else:
        name = name or _default_name(methods, labels, iterations, nodes, option_values, rounds, precision)
        if not re.fullmatch(r"[A-Za-z0-9._=-]+", name) or name in (".", ".."):
            raise ReplayError(f"--name must be a plain folder name (letters, digits, . _ = -), got {name!r}")
        out = run.path / REPLAYS / name
        if (out / "attacks.csv").exists() or (out / "config.json").exists():
            raise ReplayError(f"replay folder {out} already holds a replay; choose another --name")

    if missing:
        header = read_csv(run.path / "attacks.csv")[0]
        differs = header_mismatch(header, ATTACK_COLUMNS) if header else ""
        if differs:
            raise ReplayError(
                f"{run.path / 'attacks.csv'} has other columns than this version writes ({differs}); "
                "replay into a new folder (no --missing)"
            )
    done = _done_attacks(run.path / "attacks.csv") if missing else set()
    work, truths = [], {}
    for row in run.index:
        try:
            target = AttackTarget.from_row(row)
        except (KeyError, ValueError) as exc:
            raise ReplayError(f"{run.updates / 'index.csv'}: bad row {row}: {exc}") from None
        if rounds is not None and target.round not in rounds:
            continue
        pid = "" if target.partition_id is None else str(target.partition_id)
        todo = tuple(m for m in methods if (target.round, pid, m) not in done)
        if not todo:
            continue
        try:
            verify_update(run.updates, row)
        except (ValueError, KeyError) as exc:
            raise ReplayError(str(exc)) from None
        except FileNotFoundError as exc:
            raise ReplayError(f"recorded update missing: {exc.filename}") from None
        if target.partition_ids not in truths:
            try:
                truths[target.partition_ids] = ground_truth(run.data, target.partition_ids)
            except (ValueError, FileNotFoundError) as exc:
                raise ReplayError(f"ground truth of {target.describe()}: {exc}") from None
        work.append((row, target, todo))
    return Replay(
        run=run,
        name=name,
        out=out,
        methods=tuple(methods),
        labels=labels,
        config=config,
        options=option_values,
        rounds=rounds,
        threads=int(threads),
        device=dev,
        missing=missing,
        work=work,
        truths=truths,
        workers=workers,
        ray_address=ray_address or "",
        memory=state,
        test_set=_server_test_set(run.settings, config),
        batch=batch,
        batch_given="" if batch_given is None else str(batch_given),
    )


def _server_test_set(settings: RunSettings, config: AttackConfig):
    """The run's held-out pool (None with server-test-samples = 0), drawn once. ReplayError when
    the attack needs it (label_estimator aux or rlu, start=public) and the run had none."""
    test_set = settings.server_test_set()
    if test_set is None and config.needs_public:
        raise ReplayError(
            f"{config.needs_public} needs the server's held-out pool: the run had server-test-samples = 0"
        )
    return test_set


def _replay_run_config(replay: Replay) -> dict:
    """The run's run config with the replay's attack settings, typed like the originals."""
    rc, config = dict(replay.run.run_config), replay.config
    options = parse_key_values(
        str(rc.get("attack-options", "")), asdict(AttackConfig()), "attack-options", "attack setting"
    )
    options.update(replay.options)
    for key in FLAGS:  # written as their own run-config keys below
        options.pop(key, None)
    rc.update(
        {
            "attack-method": ",".join(replay.methods),
            "attack-labels": replay.labels,
            "attack-iterations": 0 if "iterations" in config.auto else config.iterations,  # 0: the audit's rule
            "attack-nodes": 0 if "nodes" in config.auto else config.nodes,
            "attack-precision": config.precision,
            "attack-compile": config.compile,
            "attack-options": ",".join(f"{k}={v}" for k, v in options.items()),
        }
    )
    if replay.batch_given:
        rc["attack-batch"] = replay.batch_given
    if replay.memory is not None:
        rc.update({"attack-memory": replay.memory.mode, "attack-memory-rounds": replay.memory.rounds})
        rc["attack-method"] = (
            ",".join(m for m in replay.methods if not m.endswith(MEMORY_SUFFIX)) or rc["attack-method"]
        )
    if replay.rounds is not None:
        rc["attack-rounds"] = ",".join(map(str, replay.rounds))
    if replay.threads:
        rc["attack-threads"] = replay.threads
    rc["attack-device"] = replay.device.type
    return rc


def _start_record(replay: Replay) -> None:
    """config.json, rounds.csv (the run's) and the first events.log line of a new replay folder."""
    run = replay.run
    RunFolder(replay.out).write_config(
        {
            "run_config": _replay_run_config(replay),
            "attack_config": asdict(replay.config),
            "run_name": f"{run.config.get('run_name') or run.path.name}/{REPLAYS}/{replay.name}",
            "seed": run.config.get("seed"),
            "num_nodes": run.config.get("num_nodes"),
            "defense": run.config.get("defense"),
            "privacy": run.config.get("privacy"),
            "replay": {
                "of": str(run.path.resolve()),
                "name": replay.name,
                "methods": list(replay.methods),
                "labels": replay.labels,
                "rounds": list(replay.rounds) if replay.rounds else None,
                "threads": replay.threads,
                "device": str(replay.device),
                "workers": replay.workers,
                "ray_address": replay.ray_address,
                "options": replay.options,
            },
        }
    )
    if (run.path / "rounds.csv").is_file():  # the same federation: its rounds, for accuracy plots
        write_bytes_atomic(replay.out / "rounds.csv", (run.path / "rounds.csv").read_bytes())


def run_replay(replay: Replay, log: TextIO | None = None) -> list[dict]:
    """Run every attack of ``replay`` on its workers and append each attack's row
    (``ATTACK_COLUMNS``) to ``replay.out``/attacks.csv as it finishes; images under
    ``replay.out``/images/.

    The recorded updates are fed, in the record's order, to an ``fl_attack.audit.service.AuditService``
    (the federation's own: the same jobs, memory, scoring and rows), at most 2 x workers attacks
    ahead (one at a time in this process); the workers get the recorded update (and the true labels
    only with labels=oracle), and each outcome is scored here against the ground truth. A failing
    attack is a row with status "failed" and its error; the others go on. An interrupt stops the
    workers and leaves no row for the attacks it cut short (``missing=True`` completes them).
    Returns the rows, in the order they finished. ReplayError, before anything is written, when the
    Ray cluster cannot be joined.
    """
    log = sys.stderr if log is None else log
    workers = make_workers(
        replay.workers, address=replay.ray_address or None, threads=replay.threads or 1, device=str(replay.device)
    )
    if isinstance(workers, RayWorkers):
        try:
            workers.start()
        except Exception as exc:
            workers.shutdown()
            raise ReplayError(f"cannot join the Ray cluster at {replay.ray_address}: {exc}") from None
    previous_threads = torch.get_num_threads()
    if replay.threads:  # this process's attacks (workers=0) and the scoring
        torch.set_num_threads(replay.threads)
    started, out = time.time(), RunFolder(replay.out)
    what = "missing attacks" if replay.missing else f"replay '{replay.name}'"
    service = None
    try:
        if not replay.missing:
            _start_record(replay)
        out.event(
            f"{what} of {replay.run.path}: {replay.attacks} attack(s), methods {','.join(replay.methods)}, "
            f"labels {replay.labels}, K={replay.config.iterations}, m={replay.config.nodes}, "
            f"precision {replay.config.precision}, "
            f"{replay.threads or torch.get_num_threads()} torch thread(s) on {replay.device}, in {replay.where()}",
        )
        service = _service(replay, workers, log)
        ahead = 2 * max(1, replay.workers) if replay.workers or replay.ray_address else 1
        ahead = max(ahead, replay.batch * len(replay.methods))  # a batch's worth held before it is sent
        for index_row, target, methods in replay.work:
            service.wait_below(ahead)
            update, _ = load_update(replay.run.updates, index_row)
            pid = "" if target.partition_id is None else str(target.partition_id)
            labels = "recovered"
            if replay.labels == "oracle":  # an explicit leak the replay asked for, recorded as such
                labels = replay.truths[target.partition_ids][1].clone()
            threads = None if replay.threads else replay.run.threads.get((target.round, pid))  # the run's, by default
            service.observe(target, lambda update=update: update, labels=labels, methods=methods, threads=threads)
        service.drain(math.inf)
    finally:
        if service is not None:
            service.pipeline.shutdown()  # an interrupt: the attacks in flight are stopped, with no row
        else:
            workers.shutdown()
        torch.set_num_threads(previous_threads)
        rows = service.rows if service is not None else []
        if not replay.missing and (replay.out / "config.json").is_file():
            ok = sum(r["status"] == "ok" for r in rows)
            out.write_summary(
                {
                    "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "seconds": round(time.time() - started, 1),
                    "attacks": len(rows),
                    "attacks_ok": ok,
                    "attacks_failed": len(rows) - ok,
                    "replay_of": str(replay.run.path.resolve()),
                    "verdict": verdict_summary(rows),
                },
            )
        if replay.out.is_dir():
            out.event(f"{what}: {len(rows)} of {replay.attacks} attack(s) recorded")
    return rows


def _service(replay: Replay, workers, log: TextIO) -> AuditService:
    """The audit service a replay feeds: the run's settings with the replay's attack settings,
    memory and ground truth; no update recorded again, no time limit, rows echoed to ``log``."""
    settings = replay.run.settings
    service = AuditService(
        settings,
        replay.out,
        workers=workers,
        test_set=replay.test_set,
        privacy=replay.run.privacy,
        truth=lambda partition_ids: replay.truths[partition_ids],
        memory=replay.memory,
        record_updates=False,
        attack_config=replay.config,
        defense=replay.run.defense,
        time_limit=None,
        device=replay.device.type,
        batch=replay.batch,
    )

    def echo(row: dict, outcome) -> None:
        target = outcome.target
        text = (
            f"{target.describe()} {row['method']}: {verdict_line(row)} ({row['attack_seconds']:.1f} s)"
            if row["status"] == "ok"
            else f"{target.describe()} {row['method']} failed: {row['error']}"
        )
        print(f"fl-attack: {text}", file=log, flush=True)

    service.on_row = echo
    return service
