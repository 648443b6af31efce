"""What every paper experiment shares: scales, victims, one scored attack, and the output files.

Roles stay apart as in the rest of fl-attack (docs/PISME.md, "Threat model"): a ``Victim`` keeps its
private images and labels for the evaluator; the attack (``fl_attack.reconstruct``) is handed only
``victim.update`` (w0, wT and public metadata) and recovers the labels itself from the update.

Seeds: client ``p`` is always partition ``p`` of the bundled sample drawn with data seed 0; seed
``s`` sets the victim's initial model w0 = build_model(dataset, s), its batch shuffling and the
attack's X_hat initialisation. "Over clients and seeds" therefore means over (partition, s) pairs.
"""

from __future__ import annotations

import math
import platform
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import numpy as np
import torch

from fl_attack.attacker.api import resolve_device
from fl_attack.attacker.attacks import AttackConfig, check_compile, check_iterations, get_attack
from fl_attack.attacker.labels import check_label_mode
from fl_attack.attacker.precision import resolve_precision
from fl_attack.attacker.quadrature import check_nodes
from fl_attack.attacker.runtime.workers import Pipeline, make_workers, resolve_batch, run_job
from fl_attack.audit.settings import usable_cpus
from fl_attack.evaluation import victims as victims_module
from fl_attack.evaluation.evaluator import Evaluator, results_row
from fl_attack.evaluation.victims import Victim
from fl_attack.federation.config import PRESETS, ClientOptimizer, Preset
from fl_attack.federation.data import load_pool, num_partitions
from fl_attack.records import CsvTable, write_text_atomic
from fl_attack.schema import FORMER_NAMES, RESULT_COLUMNS

DATA_SEED = 0  # the bundled sample's partition draw; clients are partitions 0..N-1 of it
# The columns every experiment's attack row has (victim, attack, scores, cost), after its own keys.
ATTACK_ROW_COLUMNS = [
    *("local_steps", "partition_id", "seed", "method"),
    *RESULT_COLUMNS[RESULT_COLUMNS.index("gradients_per_iteration") : RESULT_COLUMNS.index("attack_seconds") + 1],
    "seconds_per_iteration",
    "gradient_evaluations",
]


@dataclass
class Context:
    """One command's settings: the scale (after --seeds/--clients/--iterations), device, precision
    (the attacks' arithmetic, ``fl_attack.attacker.precision``; --precision), data, output."""

    name: str
    scale: Preset
    out: Path
    device: torch.device
    data_dir: str | None = None
    explicit: frozenset = frozenset()  # the scale settings given on the command line (seeds, clients, ...)
    command: str = ""  # the command line, for the markdown
    workers: int = 0  # attack workers: 0 = this process, N = local processes (or Ray actors with ray_address)
    ray_address: str = ""  # a Ray cluster to run the attacks on ("" = none)
    threads: int = 1  # torch threads per worker
    precision: str = "fp32"  # the attacks' arithmetic, --precision (an experiment's own arms may set theirs)
    compile: str = "auto"  # the attacks' compiled step, --compile (fl_attack.attacker.attacks.compiled)
    batch: int = 1  # attacks run as one reconstruct_batch, --batch (fl_attack.attacker.runtime.workers.Pipeline)
    grid: dict = field(default_factory=dict)  # --grid overrides: {axis: (values, ...)}
    started: float = field(default_factory=time.perf_counter)
    invocation: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="microseconds"))
    log_file: object = None

    def log(self, message: str) -> None:
        stamp = f"[{self.name} {time.perf_counter() - self.started:7.1f}s]"
        print(f"{stamp} {message}", file=self.log_file or sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def stamp(self) -> dict:
        """A row's wall-clock columns: this invocation's UTC start and the seconds since then (s)."""
        return {"invocation": self.invocation, "elapsed": round(self.elapsed(), 1)}

    def axis(self, name: str, default: tuple) -> tuple:
        """The values of grid axis ``name`` (``AXES``): the --grid override, else ``default``."""
        return self.grid.get(name, tuple(default))

    def identity(self) -> dict:
        """What must not change between the invocations that fill one NAME.csv: the victims'
        training, the attack's size and the data. Clients, seeds and grid values may grow."""
        sc = self.scale
        identity = {
            "samples": sc.samples,
            "batch_size": sc.batch_size,
            "lr": sc.lr,
            "epochs": [list(e) for e in sc.epochs],
            "iterations": sc.iterations,
            "nodes": sc.nodes,
            "data_dir": self.data_dir,
        }
        if self.precision != "fp32":  # so a CSV of earlier (fp32) invocations still resumes
            identity["precision"] = self.precision
        return identity

    def environment(self) -> str:
        threads = torch.get_num_threads()
        dev = (
            torch.cuda.get_device_name(self.device)
            if self.device.type == "cuda"
            else f"CPU ({usable_cpus()} cores, {threads} torch thread(s))"
        )
        return f"{dev}, torch {torch.__version__}, Python {platform.python_version()}"


def make_context(
    name: str,
    scale: str = "cpu",
    out: str | Path = "results/experiments",
    device: str = "auto",
    seeds: int | None = None,
    clients: int | None = None,
    iterations: int | None = None,
    data_dir: str | None = None,
    grid: dict | None = None,
    axes: tuple = (),
    workers: int = 0,
    ray_address: str = "",
    threads: int = 1,
    precision: str = "fp32",
    compile: str = "auto",
    batch: int | str = 1,
) -> Context:
    """Validate the command's options (ValueError before any work) and build its Context.

    grid: {axis: "v1,v2,..."} (the --grid options); each axis must be one of ``axes`` (the
    experiment's ``GRID``) and its values valid for ``AXES``. workers, ray_address, threads: where
    the attacks run (``fl_attack.attacker.runtime.workers.make_workers``). precision: the attacks' arithmetic
    (``fl_attack.attacker.precision.PRECISIONS``; ValueError for another value, and for tf32 off CUDA).
    compile: off, on or auto (``AttackConfig.compile``). batch: N or "auto"
    (``fl_attack.attacker.runtime.workers.resolve_batch``): the attacks of a grid a worker runs as one
    ``reconstruct_batch``, with the rows of unbatched ones."""
    if scale not in PRESETS or PRESETS[scale].rule:
        scales = [name for name, p in PRESETS.items() if not p.rule]  # a rule preset is no fixed size
        raise ValueError(f"unknown scale '{scale}'; choose from: {', '.join(scales)}")
    sc = PRESETS[scale]
    given = {"seeds": seeds, "clients": clients, "iterations": iterations}
    for label, value in given.items():
        if label != "iterations" and value is not None and (isinstance(value, bool) or int(value) < 1):
            raise ValueError(f"--{label} must be an integer >= 1, got {value}")
    if iterations is not None:
        check_iterations(iterations)  # the attacker's one check of them: "iterations must be ..."
    sc = replace(
        sc,
        seeds=seeds or sc.seeds,
        clients=clients or sc.clients,
        iterations=iterations or sc.iterations,
        cifar_clients=None if clients else sc.cifar_clients,
    )
    if data_dir is not None and not Path(data_dir).expanduser().exists():
        raise FileNotFoundError(f"data directory not found: {data_dir}")
    explicit = frozenset(k for k, v in given.items() if v is not None)
    parsed = {axis: parse_axis(axis, text, axes, sc) for axis, text in (grid or {}).items()}
    make_workers(workers, address=ray_address, threads=max(1, threads))  # ValueError for bad counts; starts nothing
    dev = resolve_device(device)
    resolve_precision(precision, dev)
    check_compile(compile)
    batch = resolve_batch(batch, dev)
    return Context(
        name=name,
        scale=sc,
        out=Path(out),
        device=dev,
        data_dir=data_dir,
        explicit=explicit,
        grid=parsed,
        workers=int(workers),
        ray_address=ray_address,
        threads=max(1, int(threads)),
        precision=precision,
        compile=compile,
        batch=batch,
    )


# The client-optimizers experiment's regimes: the optimizer and its client learning rate (None:
# the scale's). Here, beside the grid axis that names them.
REGIMES = {
    "sgd": (ClientOptimizer(), None),
    "momentum": (ClientOptimizer("momentum", momentum=0.9), None),
    "nesterov": (ClientOptimizer("nesterov", momentum=0.9), None),
    "momentum-wd": (ClientOptimizer("momentum", momentum=0.9, weight_decay=5e-4), None),
    "adam": (ClientOptimizer("adam"), 1e-3),
    "adamw": (ClientOptimizer("adamw", weight_decay=0.01), 1e-3),
}

# Grid axes an experiment may be asked to sweep (--grid AXIS=V1,V2): their type and valid values.
AXES = {
    "dataset": (str, "femnist or cifar100", lambda v, sc: v in ("femnist", "cifar100")),
    "paper_T": (int, "the paper's T: 100 or 250", lambda v, sc: v in dict(sc.epochs)),
    "classes": (int, "classes per CIFAR-100 client, 1..100", lambda v, sc: 1 <= v <= 100),
    "labels": (str, "recovered or oracle", lambda v, sc: check_label_mode(v)),  # ValueError: its one message
    "nodes": (int, "Gauss-Legendre nodes m >= 1", lambda v, sc: check_nodes(v)),
    "regime": (str, "a client-optimizers regime", lambda v, sc: v in REGIMES),
    "local_steps": (int, "local steps T >= 1", lambda v, sc: v >= 1),
    "precision": (str, "a precision to compare with fp32: bf16 or tf32", lambda v, sc: v in ("bf16", "tf32")),
}


def parse_axis(axis: str, text: str, allowed: tuple, scale: Preset) -> tuple:
    """``--grid axis=text`` as a tuple of typed values; ValueError naming the axis otherwise."""
    if axis not in allowed:
        choices = ", ".join(allowed) if allowed else "none"
        raise ValueError(f"--grid {axis}: this experiment's grid axes are: {choices}")
    kind, meaning, valid = AXES[axis]
    values = []
    for item in str(text).split(","):
        item = item.strip()
        try:
            value = kind(item)
        except ValueError:
            raise ValueError(f"--grid {axis}: {item!r} is not {meaning}") from None
        if not valid(value, scale):  # or, for a value the attacker checks, its checker's ValueError
            raise ValueError(f"--grid {axis}: {item!r} is not {meaning}")
        if value not in values:
            values.append(value)
    return tuple(values)


# ---------------------------------------------------------------------------------- victims


def check_clients(ctx: Context, dataset: str, clients: int, samples: int, classes: int | None = None) -> None:
    """ValueError when the data holds fewer than ``clients`` clients of k = ``samples``."""
    pool = load_pool(dataset, ctx.data_dir)
    available = num_partitions(pool, samples, classes)
    if clients > available:
        raise ValueError(f"{clients} {dataset} clients of k={samples} asked for, the data has {available}")


def train_victim(
    ctx: Context,
    dataset: str,
    partition: int,
    seed: int,
    local_epochs: int,
    *,
    samples: int | None = None,
    batch_size: int | None = None,
    classes: int | None = None,
    record_states: bool = False,
    lr: float | None = None,
    optimizer=None,
) -> Victim:
    """Train client ``partition`` (data seed DATA_SEED) for E local epochs from w0 =
    build_model(dataset, seed), on the CPU, with the scale's k, B and lr unless given, by plain SGD
    or ``optimizer`` (a fl_attack.federation.config.ClientOptimizer)."""
    sc = ctx.scale
    return victims_module.train_victim(
        dataset,
        partition,
        samples=samples or sc.samples,
        batch_size=batch_size or sc.batch_size,
        local_epochs=local_epochs,
        lr=lr or sc.lr,
        seed=seed,
        data_seed=DATA_SEED,
        classes=classes,
        data_dir=ctx.data_dir,
        record_states=record_states,
        optimizer=optimizer,
    )


def attack_job(ctx: Context, victim: Victim, method: str, labels: str = "recovered", job_id: int = 0, **overrides):
    """``victim.attack_job`` at the scale's iterations, nodes and trace_every, the victim's seed and
    the context's precision (``overrides``: other AttackConfig fields, precision included). labels:
    "recovered" or "oracle"."""
    sc = ctx.scale
    settings = dict(
        iterations=sc.iterations,
        nodes=sc.nodes,
        trace_every=sc.trace_every,
        seed=victim.seed,
        precision=ctx.precision,
        compile=ctx.compile,
    )
    config = AttackConfig.from_overrides(None, **{**settings, **overrides})
    return victim.attack_job(method, config, labels, job_id)


def score_outcome(ctx: Context, victim: Victim, job, outcome) -> dict:
    """The evaluator's side: score ``outcome`` (an ok ``AttackOutcome`` of ``job``) against the
    victim's private images on matched pairs. Returns one flat result row: the results.csv
    columns (``fl_attack.evaluation.evaluator.results_row``) with seed, classes, the costs, where it ran and the
    precision it ran with."""
    config, method = job.config, job.method
    scored = Evaluator(victim.dataset).record(outcome, victim.truth)
    if scored["status"] != "ok":
        raise RuntimeError(f"scoring {method} on client {victim.partition} failed: {scored['error']}")
    row = {
        **results_row(scored),
        "seed": victim.seed,
        "classes": victim.classes,
        "seconds_per_iteration": outcome.attack_seconds / config.iterations,
        "gradient_evaluations": _gradient_evaluations(method, config, outcome.trace, config.iterations),
        "worker": f"{outcome.worker_node}/{outcome.worker_id}",
        "precision": outcome.precision,
    }
    if method == "pisme-adaptive":
        row.update(
            node_tolerance=config.node_tolerance,
            nodes_schedule=_nodes_schedule(outcome.trace),
            node_error=float(outcome.trace[-1].get("node_error", math.nan)),
        )
    nodes = outcome.gradients_per_iteration
    ctx.log(
        f"{victim.dataset} T={victim.local_steps} client {victim.partition} seed {victim.seed} {method}"
        f"{'' if nodes == 1 else f' m={nodes:.3g}'} x{config.iterations} {outcome.label_source}: "
        f"PSNR {scored['psnr']:.2f} dB, honest Lsim {outcome.lsim_honest:.4f} ({outcome.attack_seconds:.1f} s)"
    )
    return row


def attack_and_score(ctx: Context, victim: Victim, method: str, labels: str = "recovered", **overrides) -> dict:
    """One attack in this process, scored (``attack_job``, ``run_job``, ``score_outcome``).
    RuntimeError when the attack fails."""
    job = attack_job(ctx, victim, method, labels, **overrides)
    outcome = run_job(job, str(ctx.device))
    if outcome.status != "ok":
        raise RuntimeError(f"{method} on client {victim.partition} failed: {outcome.error}")
    return score_outcome(ctx, victim, job, outcome)


@dataclass
class Task:
    """One attack of an experiment's grid, for ``run_tasks``.

    key: the CsvTable key values that identify its row (a rerun skips it when recorded);
    victim: a ``Lazy`` victim (trained only when one of its attacks is still to do);
    extra: the row's experiment columns, or a function of the victim that returns them."""

    key: dict
    victim: Lazy
    method: str
    labels: str = "recovered"
    overrides: dict = field(default_factory=dict)
    extra: object = field(default_factory=dict)


def check_datasets(ctx: Context, datasets: tuple) -> None:
    """``check_clients`` for the scale's clients and k on each dataset."""
    for dataset in datasets:
        check_clients(ctx, dataset, ctx.scale.clients_for(dataset), ctx.scale.samples)


def victims(ctx: Context, datasets: tuple, steps: tuple):
    """(client, seed, dataset, paper_T, Lazy victim) for every cell of a dataset x paper_T grid, in
    client-major order: a stopped run has whole clients done in every cell. ValueError before the
    first when the data lacks clients (``check_datasets``)."""
    sc = ctx.scale
    check_datasets(ctx, datasets)
    for client in range(max(sc.clients_for(d) for d in datasets)):
        for seed in range(sc.seeds):
            for dataset in datasets:
                if client >= sc.clients_for(dataset):
                    continue
                for paper_T in steps:
                    victim = Lazy(partial(train_victim, ctx, dataset, client, seed, sc.local_epochs(paper_T)))
                    yield client, seed, dataset, paper_T, victim


def trained_victims(ctx: Context, datasets: tuple):
    """(paper_T, victim) for each dataset, paper T of the scale, client and seed, in that order, each
    victim trained when reached; the caller checks the data first (``check_datasets``)."""
    sc = ctx.scale
    for dataset in datasets:
        for paper_T, epochs in sc.epochs:
            for client in range(sc.clients_for(dataset)):
                for seed in range(sc.seeds):
                    yield paper_T, train_victim(ctx, dataset, client, seed, epochs)


def run_tasks(ctx: Context, columns: list[str], key: tuple, tasks: list[Task]) -> list[dict]:
    """Run the tasks not yet recorded in NAME.csv (a ``CsvTable`` with ``columns``, ``key`` and the
    context's identity) on the context's workers (``--workers``, ``--ray-address``: this process,
    local processes or a Ray cluster) and record each row as it is scored; returns all its rows.

    Victims are trained here, at most 2 x workers jobs ahead of the workers; the workers get only
    the update, and the rows are scored here against the victims' private images. A failed
    attack is not recorded (a rerun retries it); RuntimeError names them after the others finish.
    Each row carries ``ctx.stamp()``, so a run resumed over several invocations knows its wall time.
    A NAME.csv an older version began is read under today's column names (FORMER_NAMES).
    """
    recorder = CsvTable(ctx.out / f"{ctx.name}.csv", columns, key=key, identity=ctx.identity(), former=FORMER_NAMES)
    todo = [t for t in tasks if not recorder.done(**t.key)]
    if len(todo) < len(tasks):
        ctx.log(f"{len(tasks) - len(todo)} of {len(tasks)} attacks already recorded in {recorder.path.name}")
    workers = make_workers(ctx.workers, address=ctx.ray_address, threads=ctx.threads, device=str(ctx.device))
    pipeline = Pipeline(workers, batch=ctx.batch)
    jobs = (
        attack_job(ctx, task.victim(), task.method, task.labels, job_id=job_id, **task.overrides)
        for job_id, task in enumerate(todo)
    )
    failed = []
    try:
        for job, outcome in pipeline.run(jobs, ahead=2 * max(1, ctx.workers)):
            task = todo[job.job_id]
            if outcome.status != "ok":
                failed.append(f"{job.method} {task.key}: {outcome.error}")
                ctx.log(f"FAILED {job.method} {task.key}: {outcome.error}")
                continue
            victim = task.victim()
            extra = task.extra(victim) if callable(task.extra) else task.extra
            recorder.add({**score_outcome(ctx, victim, job, outcome), **extra, **ctx.stamp()})
    finally:
        pipeline.shutdown()
    if failed:
        raise RuntimeError(f"{len(failed)} attack(s) failed and were not recorded (rerun to retry): {failed[0]}")
    return recorder.rows


def _nodes_schedule(trace) -> str:
    """pisme-adaptive's m over the run as 'iteration:m' at each change seen in the trace, e.g. '0:3 40:2'."""
    out, last = [], None
    for r in trace:
        if r.get("nodes") != last:
            last = r.get("nodes")
            out.append(f"{r['iteration']}:{last}")
    return " ".join(out)


def _gradient_evaluations(method: str, config, trace, iterations: int) -> float:
    """Node-gradient evaluations the attack made (pisme-adaptive reports its own, checks included)."""
    if method == "pisme-adaptive":
        counted = [r["gradient_evaluations"] for r in trace if "gradient_evaluations" in r]
        if counted:
            return float(counted[-1])
    return float(get_attack(method).gradients_per_iteration(config, trace) * iterations)


# ----------------------------------------------------------------------------------- output


class Lazy:
    """A value built on first use: a victim is trained only when one of its attacks is not done."""

    def __init__(self, build):
        self._build, self._value = build, None

    def __call__(self):
        if self._value is None:
            self._value = self._build()
        return self._value


def figure(width: float, height: float):
    """A matplotlib Figure of width x height inches with constrained layout (no pyplot, no GUI backend)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def save_figure(fig, path: Path) -> None:
    """The experiments' figures: PNG at 110 dpi, written atomically (analysis.plots.save_figure)."""
    from analysis.plots import save_figure as save_png

    save_png(fig, path, dpi=110)


def fmt(value, digits: int = 2) -> str:
    """A number for a markdown cell; '-' for missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{value:.{digits}f}"


def mean_var(values) -> tuple[float, float, int]:
    """(mean, sample variance, n) of the finite values; variance NaN when n < 2."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if v.size == 0:
        return math.nan, math.nan, 0
    return float(v.mean()), float(v.var(ddof=1)) if v.size > 1 else math.nan, int(v.size)


def mean(rows: list[dict], key: str) -> float:
    """The mean of the rows' finite ``key`` values; NaN for none."""
    return mean_var(column(rows, key))[0]


def pm(values, digits: int = 2) -> str:
    """'mean ± variance' of a cell ('mean' alone for one value)."""
    average, var, n = mean_var(values)
    if n == 0:
        return "-"
    return fmt(average, digits) if n < 2 else f"{fmt(average, digits)} ± {fmt(var, digits)}"


def paired_differences(rows: list[dict], a, b, metric: str, by=("partition_id", "seed"), key="method") -> list[float]:
    """``metric`` of the row whose ``key`` (default: the method) is ``a`` minus that of the row whose
    ``key`` is ``b`` on the same victim (same ``by`` values), one difference per victim that has both;
    a margin whose spread is over victims, not methods."""
    values: dict = {}
    for row in rows:
        values.setdefault(tuple(row.get(k) for k in by), {})[row[key]] = row.get(metric)
    return [float(v[a]) - float(v[b]) for v in values.values() if v.get(a) is not None and v.get(b) is not None]


def spread(values) -> str:
    """'min .. max' of the finite values, for a markdown cell; '-' for none."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    return f"{min(v):.2f} .. {max(v):.2f}" if v else "-"


def group(rows: list[dict], *keys) -> dict:
    """Rows grouped by the values of ``keys``, in first-seen order: {(v1, v2, ...): [rows]}."""
    out: dict = {}
    for row in rows:
        out.setdefault(tuple(row.get(k) for k in keys), []).append(row)
    return out


def column(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) is not None]


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def wall_time(rows: list[dict]) -> tuple[float, int, int]:
    """(seconds, invocations, unstamped) of the rows' wall time: per invocation (``Context.stamp``),
    the elapsed seconds at its last recorded row, summed over the invocations; ``unstamped`` counts
    the rows that carry no stamp. Time an invocation spent after its last row (a stopped run's
    unfinished attacks) is not counted: nothing came of it."""
    last: dict = {}
    unstamped = 0
    for row in rows:
        if row.get("invocation") in (None, "") or row.get("elapsed") in (None, ""):
            unstamped += 1
            continue
        last[row["invocation"]] = max(last.get(row["invocation"], 0.0), float(row["elapsed"]))
    return sum(last.values()), len(last), unstamped


def recorded_clients(rows: list[dict]) -> str:
    """The clients the rows hold per dataset, for a caption: '3 femnist client(s), 2 cifar100 client(s)'.
    A resumed run's table holds the rows of every invocation, not only this one's --clients."""
    return ", ".join(
        f"{len({r['partition_id'] for r in cell})} {d} client(s)" for (d,), cell in group(rows, "dataset").items()
    )


def write_markdown(
    ctx: Context,
    title: str,
    caption: str,
    body: str,
    notes: list[str] | None = None,
    scale_note: str | None = None,
    rows: list[dict] | None = None,
) -> Path:
    """NAME.md: title, the caption (scale), the table(s), notes, the command and its wall time.

    rows: the table's attack rows. When they carry ``Context.stamp`` columns (a resumable
    experiment), the wall time is that of every invocation that recorded them (``wall_time``), and
    their summed attack seconds are reported too."""
    command = ctx.command or f"python -m analysis.experiments {ctx.name} --scale {ctx.scale.name}"
    text = [f"# {title}", "", f"*{caption}*", "", body, ""]
    for note in notes or []:
        text.append(f"- {note}")
    if notes:
        text.append("")
    text += [f"Scale note: {ctx.scale.note if scale_note is None else scale_note}", ""]
    seconds, invocations, unstamped = wall_time(rows or [])
    if invocations:
        text += [
            f"Command (rerunning it resumes or re-renders; {invocations} invocation(s) recorded these rows): "
            f"`{command}`  ",
            f"Wall time: {seconds:.0f} s ({seconds / 3600:.2f} h) over those invocations, each to its last "
            f"recorded row, on {ctx.environment()}"
            + (f"; {unstamped} older row(s) carry no wall time." if unstamped else "."),
        ]
    else:
        text += [f"Command: `{command}`  ", f"Wall time: {ctx.elapsed():.0f} s on {ctx.environment()}."]
    if rows:
        attack = sum(float(r["attack_seconds"]) for r in rows if r.get("attack_seconds") is not None)
        text.append(
            f"Attack time over all {len(rows)} rows (summed over the attacks): {attack:.0f} s ({attack / 3600:.2f} h)."
        )
    text.append("")
    path = ctx.out / f"{ctx.name}.md"
    write_text_atomic(path, "\n".join(text))
    return path
