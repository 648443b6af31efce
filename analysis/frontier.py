"""The privacy-utility frontier (issue #57): which defense, at what strength, at what cost.

    python -m analysis.defenses --grid frontier --out DIR [--resume] [--only none,topk-0.01]
    python -m analysis.defenses --grid frontier --out DIR --resume --ray-address HEAD:6379

One real FEMNIST federation per setting of ``frontier_grid`` (every defense at two to four strengths,
from no visible effect to a broken model), all in ``REGIME``: REGIME_SUPERNODES = 80 real LEAF writers
of the bundled sample (partitions 0..79 of the 100 with >= 64 LEAF-train samples), each a client of
k = 64 of its own samples, B = 16, E = 5 (T = 20 steps) of SGD with momentum 0.9 at lr 0.05 (Flower's
quickstart optimizer; PI-SME models it, docs/PISME.md "Optimizers"), all 80 training every round for
REGIME_ROUNDS = 30 rounds, the server's 1,000 held-out samples scoring the global model every round
(rounds.csv). Why this regime: FedAvg on 64-sample writers learns slowly. Measured in process (the
same data, model and FedAvg, training only; docs/defenses.md has the curves): 20 writers with plain SGD
(E = 2, lr 0.05) reached 34% in 15 rounds, and 20 writers' 1,280 samples cap even centralised training
at 54%; 50 writers with momentum reached 59.5% in 30 rounds; 80 writers 60.0% in 25. The measured
``none`` setting's curve (the real federation) is in docs/defenses.md.

A tracked panel of three writers (partitions 0, 1, 2) is attacked in the first round, one in the
middle and the last (``attack_rounds``) by the audit's default attack (PI-SME at whatever
iterations, nodes and schedule pyproject.toml's run config holds: none of them is pinned here), with
labels recovered by the ``aux`` estimator (the demo's) and a server that remembers
(``attack-memory="keep"``: "pisme+memory" rows). Under SecAgg+ the server sees one aggregate a round,
so the aggregate of each attacked round is attacked (``attack-clients="all"``) without memory (refused there),
and the secagg settings train 2 or 5 writers a round: the aggregate's images are what is attacked,
and its size is the defense's strength.

Each setting's row of ``frontier.csv`` (``FRONTIER_COLUMNS``, ``frontier_row``) is read from its run
folder's records (the verdict's columns of attacks.csv, never recomputed; rounds.csv's accuracy and
ε) and the file is rewritten atomically as each setting finishes. ``frontier.md`` and the figures
(analysis/frontier_figure.py) are written from frontier.csv alone, as the docs generator does
(``python -m analysis.docs frontier``).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

# --- the regime and the grid -------------------------------------------------------------------------------

REGIME_SUPERNODES = 80  # writers, partitions 0..79 of the 100 with >= 64 LEAF-train samples
REGIME_ROUNDS = 30
REGIME = {
    "dataset": "femnist",
    "partitioner": "paper",  # one client per LEAF writer
    "samples-per-client": 64,  # k
    "batch-size": 16,  # B
    "local-epochs": 5,  # E: T = E * ceil(k / B) = 20 steps
    "lr": 0.05,
    "client-optimizer": "momentum",
    "client-momentum": 0.9,
    "fraction-train": 1.0,  # every writer every round: the panel is attacked in every round it names
    "fraction-evaluate": 0.0,  # the server's held-out set scores the model; the clients' evaluation is not needed
    "server-test-samples": 1000,
    "attack-method": "pisme",
    "attack-clients": "0,1,2",  # the tracked panel
    "attack-memory": "keep",
    "attack-options": "label_estimator=aux",
    "seed": 0,
}
# C of local-dp and central-dp: about the median round-1 update norm of this regime's writers (3.1; 2.8
# by round 25), so clipping leaves most updates as they are.
CLIP_NORM = 3.0


def attack_rounds(rounds: int) -> str:
    """The attacked rounds "1,M,R" (M = the middle one) as attack-rounds reads them; fewer for R < 3."""
    chosen = sorted({1, (rounds + 1) // 2, rounds})
    return ",".join(str(r) for r in chosen)


def participants_fraction(participants: int, supernodes: int) -> float:
    """fraction-train that makes Flower's count max(int(n * F), 1) exactly ``participants`` of ``supernodes``
    (the middle of the interval, safe from rounding). ValueError outside 1..supernodes."""
    if not 1 <= participants <= supernodes:
        raise ValueError(f"participants must be in 1..{supernodes}, got {participants}")
    return min(1.0, (participants + 0.5) / supernodes)


@dataclass(frozen=True)
class Setting:
    """One setting of the frontier: its run-config overrides, and where it sits on the figure.

    name: its run folder's name; family: the line it is drawn on (a defense, a clipping side);
    strength_name, strength: the one number that moves it along the line (NaN for none); config: the
    run-config keys it sets over ``REGIME``."""

    name: str
    family: str
    strength_name: str
    strength: float
    config: dict = field(default_factory=dict)


def frontier_grid(supernodes: int = REGIME_SUPERNODES) -> list[Setting]:
    """Every setting of the study, in the order they run (docs/defenses.md lists them and why)."""
    grid = [Setting("none", "none", "", math.nan, {"defense": "none"})]
    for eps in (1000.0, 100.0, 10.0, 1.0):  # LocalDpMod's epsilon per round, sensitivity C
        config = {"defense": "local-dp", "defense-clip-norm": CLIP_NORM, "defense-epsilon": eps}
        grid.append(Setting(f"local-dp-eps{eps:g}", "local-dp", "epsilon per round", eps, config))
    for side, multipliers in (("server", (0.01, 0.1, 1.0)), ("client", (0.1,))):
        for z in multipliers:
            config = {
                "defense": "central-dp",
                "defense-clipping": side,
                "defense-clip-norm": CLIP_NORM,
                "defense-noise-multiplier": z,
            }
            grid.append(
                Setting(f"central-dp-{side}-z{z:g}", f"central-dp ({side} clipping)", "noise multiplier", z, config)
            )
    for fraction in (0.1, 0.01, 0.001):
        config = {"defense": "topk", "defense-topk-fraction": fraction, "defense-adaptive-attack": True}
        grid.append(Setting(f"topk-{fraction:g}", "topk", "fraction sent", fraction, config))
    for rank in (8, 2, 1):
        grid.append(
            Setting(f"low-rank-{rank}", "low-rank", "rank", float(rank), {"defense": "low-rank", "defense-rank": rank})
        )
    for bits in (8, 2, 1):
        grid.append(
            Setting(f"quantize-{bits}", "quantize", "bits", float(bits), {"defense": "quantize", "defense-bits": bits})
        )
    for n in (2, 5):  # a federation of fewer writers (a quick look) has them all take part
        m = min(n, supernodes)
        grid.append(Setting(f"secagg-{n}", "secagg", "participants per round", float(m), _secagg(m, supernodes)))
    for eps in (100.0, 10.0):  # distributed DP: each client's noise, only the aggregate of 5 seen
        config = {
            **_secagg(min(5, supernodes), supernodes),
            "defense": "local-dp+secagg",
            "defense-clip-norm": CLIP_NORM,
            "defense-epsilon": eps,
        }
        grid.append(Setting(f"local-dp-eps{eps:g}+secagg-5", "local-dp+secagg (5)", "epsilon per round", eps, config))
    return grid


def _secagg(participants: int, supernodes: int) -> dict:
    """SecAgg+ over ``participants`` writers a round: the aggregate of each attacked round attacked
    (attack-clients="all"), no memory."""
    return {
        "defense": "secagg",
        "fraction-train": participants_fraction(participants, supernodes),
        "attack-clients": "all",
        "attack-memory": "none",
    }


def run_config(setting: Setting, rounds: int, overrides: dict | None = None) -> dict:
    """The setting's whole run config over ``REGIME``: its own keys, the rounds and attacked rounds,
    then ``overrides`` (a quick look's smaller k or attack budget: not the study)."""
    return {
        **REGIME,
        "num-server-rounds": rounds,
        "attack-rounds": attack_rounds(rounds),
        **setting.config,
        **(overrides or {}),
    }


# --- what a setting reports ----------------------------------------------------------------------------------

FRONTIER_COLUMNS = [
    "setting",
    "family",
    "defense",
    "strength_name",
    "strength",
    "rounds",
    "participants",
    "final_accuracy",
    "accuracy_curve",
    "end_method",
    "end_round",
    "recovered",
    "images",
    "fraction",
    "fraction_low",
    "fraction_high",
    "best_round",
    "best_recovered",
    "best_images",
    "best_fraction",
    "best_fraction_low",
    "best_fraction_high",
    "guess_recovered",
    "guess_fraction",
    "chance",
    "recovered_by_round",
    "memory_by_round",
    "attacks_ok",
    "attacks",
    "epsilon",
    "epsilon_attacked",
    "delta",
    "dp_bound",
    "dp_bound_name",
    "dp_alarm",
    "dp_note",
    "seconds",
]
COLUMN_MEANINGS = {
    "setting": "the setting's name (its run folder under runs/)",
    "family": "the line it is drawn on: the defense, and central-dp's clipping side",
    "defense": "the defense's label in attacks.csv",
    "strength_name": "what its strength counts",
    "strength": "the one number that moves the setting along its family's line (empty for none)",
    "rounds": "the rounds the federation ran",
    "participants": "the writers whose updates each round averaged (rounds.csv clients, the last round's)",
    "final_accuracy": "the global model's accuracy on the server's 1,000 held-out samples after the last round",
    "accuracy_curve": "JSON list: that accuracy after each round",
    "end_method": "whose recovered images the headline counts: pisme+memory (the remembering server at the end) "
    "or, without memory (secagg), pisme in the last attacked round",
    "end_round": "the round of those rows (the last one attacked)",
    "recovered": "images recovered at the end, summed over the panel (the verdict's recovered column)",
    "images": "the images attacked at the end: the panel's k each, or under SecAgg+ the aggregate's",
    "fraction": "recovered / images",
    "fraction_low": "its exact (Clopper-Pearson) two-sided 95% interval, low end",
    "fraction_high": "... high end",
    "best_round": "the attacked round whose memoryless attacks recovered the largest fraction",
    "best_recovered": "that round's recovered images, summed over the panel",
    "best_images": "... of its images",
    "best_fraction": "best_recovered / best_images",
    "best_fraction_low": "its exact 95% interval, low end",
    "best_fraction_high": "... high end",
    "guess_recovered": "the best update-free guess's count on the end rows (the verdict's guess_recovered): the floor",
    "guess_fraction": "guess_recovered / images",
    "chance": "the verdict's matched chance (reid_chance: update-free outputs singled out under the same "
    "matching), the end rows' k-weighted mean; an upper bound on recovery by chance",
    "recovered_by_round": "JSON {round: [recovered, images]} of the memoryless attacks, summed over the panel",
    "memory_by_round": "JSON {round: [recovered, images]} of the remembering server's rows",
    "attacks_ok": "attacks that finished ok",
    "attacks": "attacks in attacks.csv",
    "epsilon": "the ε spent by the last round (rounds.csv: the most any client spent); empty without DP",
    "epsilon_attacked": "the ε the attacked clients had spent by the end rows' round (attacks.csv, the largest)",
    "delta": "the δ that ε is spent at (defense-target-delta)",
    "dp_bound": "local-dp: DP's promised upper bound on the fraction any attacker recovers after the end "
    "round's releases (fl_attack.privacy.rero: the tighter of Φ(Φ⁻¹(κ)+μ) and e^ε κ + δ, κ the best guess's "
    "one-sided 95% upper bound); vacuous at 1",
    "dp_bound_name": "which bound dp_bound is: gdp (Gaussian, Dong-Roth-Su trade-off) or rero-eps-delta",
    "dp_alarm": "the loud check's message when fraction_low exceeds a non-vacuous dp_bound (an accounting bug)",
    "dp_note": "what the DP promise covers here",
    "seconds": "the ServerApp's wall time (summary.json seconds; for a resumed run, its last part only)",
}
CENTRAL_DP_NOTE = "no promise against this server: it sees each update before the noise (the ε covers the model)"
LOCAL_DP_NOTE = "DP's promise against this server: every release of the client up to the end round, user-level"


def dp_bound(guess_recovered: float, images: float, config: dict, compositions: float):
    """DP's promise for a local-dp row (fl_attack.privacy.rero.local_dp_rero_bound): the tightest ReRo bound
    on the fraction of ``images`` any attacker recovers from ``compositions`` of a client's LocalDpMod
    releases (the rounds the remembering server had seen by its end row: user-level, each round one
    Gaussian release of sensitivity C), with κ the one-sided 95% Clopper-Pearson upper bound of the best
    update-free guess's ``guess_recovered`` / ``images`` (``kappa_upper``: an observed 0 is not κ = 0).
    ``config`` is the run config (defense-clip-norm, -epsilon, -delta, -target-delta). None when a count
    is unknown."""
    from fl_attack.privacy.rero import kappa_upper, local_dp_rero_bound

    if not all(math.isfinite(v) for v in (guess_recovered, images, compositions)) or images <= 0:
        return None
    return local_dp_rero_bound(
        clip_norm=float(config["defense-clip-norm"]),
        epsilon=float(config["defense-epsilon"]),
        delta=float(config["defense-delta"]),
        compositions=int(compositions),
        kappa=kappa_upper(int(guess_recovered), int(images)),
        target_delta=float(config.get("defense-target-delta", 1e-5)),
    )


def exact_interval(recovered: float, images: float) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided 95% interval of recovered / images; NaNs without images."""
    from scipy.stats import binomtest

    if not (math.isfinite(recovered) and math.isfinite(images)) or images <= 0:
        return math.nan, math.nan
    ci = binomtest(int(recovered), int(images)).proportion_ci(0.95, method="exact")
    return float(ci.low), float(ci.high)


def _counts(rows: pd.DataFrame) -> dict[str, list[int]]:
    """{round: [recovered, images]} summed over ``rows`` (scored attack rows), in round order."""
    out = {}
    for r, group in rows.groupby("round", sort=True):
        out[str(int(r))] = [int(group["recovered"].sum()), int(group["k"].sum())]
    return out


def frontier_row(setting: Setting, run_dir: str | Path) -> dict:
    """The setting's row of frontier.csv (FRONTIER_COLUMNS, COLUMN_MEANINGS) from its finished run folder."""
    from fl_attack.privacy.rero import check_bound

    from .load import load_run

    run = load_run(run_dir)
    attacks, rounds = run.attacks, run.rounds
    ok = attacks[attacks["status"] == "ok"]
    scored = ok[ok["recovered"].notna() & ok["k"].notna()]
    remembered = scored["memory"].fillna("").astype(str) != ""
    memoryless, memory = scored[~remembered], scored[remembered]
    if len(memory):  # what the remembering server holds at the end: each tracked client's latest row
        end = memory.sort_values("round").groupby("partition_id", sort=True).tail(1)
    elif len(memoryless):
        end = memoryless[memoryless["round"] == memoryless["round"].max()]
    else:
        end = memoryless
    recovered, images = float(end["recovered"].sum()), float(end["k"].sum())
    if not len(end):
        recovered = images = math.nan
    by_round = _counts(memoryless)
    best = max(by_round.items(), key=lambda item: (item[1][0] / item[1][1], -int(item[0])), default=None)
    accuracy = rounds["global_accuracy"] if "global_accuracy" in rounds else pd.Series(dtype=float)
    config = run.config.get("run_config", {})
    defense = run.config.get("defense", {})
    names = str(config.get("defense", "none")).split("+")
    epsilon = rounds["epsilon"].dropna()
    epsilon_attacked = float(end["epsilon"].max()) if len(end) and end["epsilon"].notna().any() else math.nan
    delta = float(config.get("defense-target-delta", math.nan)) if {"local-dp", "central-dp"} & set(names) else math.nan
    guess = float(end["guess_recovered"].sum()) if len(end) and end["guess_recovered"].notna().all() else math.nan
    summary = _summary(Path(run_dir))
    row = {
        "setting": setting.name,
        "family": setting.family,
        "defense": defense.get("label", config.get("defense", "")),
        "strength_name": setting.strength_name,
        "strength": setting.strength,
        "rounds": int(rounds["round"].max()) if len(rounds) else 0,
        "participants": int(rounds["clients"].iloc[-1])
        if len(rounds) and pd.notna(rounds["clients"].iloc[-1])
        else math.nan,
        "final_accuracy": float(accuracy.dropna().iloc[-1]) if accuracy.notna().any() else math.nan,
        "accuracy_curve": json.dumps([None if pd.isna(a) else round(float(a), 4) for a in accuracy]),
        "end_method": str(end["method"].iloc[0]) if len(end) else "",
        "end_round": int(end["round"].max()) if len(end) else math.nan,
        "recovered": recovered,
        "images": images,
        "fraction": recovered / images if images else math.nan,
        "best_round": int(best[0]) if best else math.nan,
        "best_recovered": best[1][0] if best else math.nan,
        "best_images": best[1][1] if best else math.nan,
        "best_fraction": best[1][0] / best[1][1] if best else math.nan,
        "guess_recovered": guess,
        "guess_fraction": guess / images if images else math.nan,
        "chance": float((end["reid_chance"] * end["k"]).sum() / end["k"].sum()) if len(end) else math.nan,
        "recovered_by_round": json.dumps(by_round),
        "memory_by_round": json.dumps(_counts(memory)),
        "attacks_ok": int(len(ok)),
        "attacks": int(len(attacks)),
        "epsilon": float(epsilon.iloc[-1]) if len(epsilon) else math.nan,
        "epsilon_attacked": epsilon_attacked,
        "delta": delta,
        "dp_note": CENTRAL_DP_NOTE if "central-dp" in names else LOCAL_DP_NOTE if "local-dp" in names else "",
        "seconds": float(summary.get("seconds", math.nan)),
    }
    row["fraction_low"], row["fraction_high"] = exact_interval(recovered, images)
    bound = dp_bound(guess, images, config, row["end_round"]) if "local-dp" in names else None
    row["dp_bound"] = bound.bound if bound else math.nan
    row["dp_bound_name"] = bound.name if bound else ""
    row["dp_alarm"] = (check_bound(row["fraction_low"], bound) or "") if bound else ""
    row["best_fraction_low"], row["best_fraction_high"] = exact_interval(row["best_recovered"], row["best_images"])
    return {column: row[column] for column in FRONTIER_COLUMNS}


def _summary(folder: Path) -> dict:
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def write_frontier(path: str | Path, rows: list[dict]) -> Path:
    """frontier.csv: ``rows`` (FRONTIER_COLUMNS), written atomically (fl_attack.records); a NaN is an
    empty cell (not measured, or not defined for the setting), as in rounds.csv."""
    from fl_attack.records import csv_text, write_text_atomic

    cells = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()} for row in rows]
    return write_text_atomic(path, csv_text(cells, FRONTIER_COLUMNS))


def read_frontier(path: str | Path) -> pd.DataFrame:
    """frontier.csv as a DataFrame, numbers as floats, the JSON columns as text. ValueError naming the
    file when it lacks a column of FRONTIER_COLUMNS."""
    table = pd.read_csv(path, keep_default_na=True)
    missing = [c for c in FRONTIER_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{path} is not a frontier.csv: no {', '.join(missing)}")
    for column in ("family", "defense", "strength_name", "end_method", "dp_bound_name", "dp_alarm", "dp_note"):
        table[column] = table[column].astype(object).fillna("").astype(str)
    return table


# --- running the grid ----------------------------------------------------------------------------------------


def run_grid(
    out: Path,
    settings: list[Setting],
    rounds: int,
    supernodes: int,
    *,
    resume: bool,
    overrides: dict | None = None,
    ray_address: str = "",
    job_resource: str = "",
    log=print,
    grid_order: list[str] | None = None,
    timings: dict | None = None,
    on_setting=None,
) -> tuple[list[dict], list[str]]:
    """Run every setting into out/runs/NAME (``analysis.studies.plan_run``: with ``resume`` a finished
    run is kept, an interrupted one resumed, one that cannot be resumed restarted), one after another,
    or with ``ray_address`` as Ray jobs on that cluster (``analysis.ray_jobs``); rewrite
    out/frontier.csv as each finishes, in ``grid_order`` (default: the settings' order), keeping the rows
    an earlier call wrote for settings not run now (a study run part by part with --only). ``timings``
    gets each setting's wall time in this call (seconds; one after another, so each is that setting's
    alone: a finished setting kept by --resume takes about 0) and ``on_setting()`` is called after each
    (the study records its call there). Returns (the rows, the settings that failed)."""
    from .studies import launch_run, plan_run

    results, rows, failed = out / "runs", {}, []
    order = list(grid_order or [s.name for s in settings])
    if (out / "frontier.csv").is_file():
        earlier = read_frontier(out / "frontier.csv").to_dict("records")
        running = {s.name for s in settings}
        rows = {r["setting"]: r for r in earlier if r["setting"] in order and r["setting"] not in running}
    by_name = {s.name: s for s in settings}

    def finished(name: str, ok: bool) -> None:
        if not ok:
            failed.append(name)
            return
        rows[name] = frontier_row(by_name[name], results / name)
        write_frontier(out / "frontier.csv", [rows[n] for n in order if n in rows])
        log(f"{name}: {_said(rows[name])}; frontier.csv has {len(rows)} row(s)")
        if rows[name]["dp_alarm"]:
            log(f"{name}: ERROR {rows[name]['dp_alarm']}")

    configs = {s.name: run_config(s, rounds, overrides) for s in settings}
    if not ray_address:
        for s in settings:
            started = time.time()
            ok = launch_run(results / s.name, configs[s.name], supernodes, log, reuse=resume)
            if timings is not None:
                timings[s.name] = round(time.time() - started, 1)
            finished(s.name, ok)
            if on_setting is not None:
                on_setting()
        return [rows[n] for n in order if n in rows], failed
    from .ray_jobs import run_as_jobs

    planned = []
    for s in settings:
        values = plan_run(results / s.name, configs[s.name], supernodes, log, reuse=resume)
        if values is None:
            finished(s.name, True)
        else:
            planned.append((s.name, values, supernodes))
    run_as_jobs(ray_address, planned, finished, log=log, resource=job_resource, flwr_home=out / "flwr-home")
    return [rows[n] for n in order if n in rows], failed


def _said(row: dict) -> str:
    """A setting's row in a few words: accuracy and what was recovered."""
    accuracy = row["final_accuracy"]
    acc = "n/a" if pd.isna(accuracy) else f"{100 * accuracy:.1f}%"
    if pd.isna(row["recovered"]):
        return f"accuracy {acc}, no scored attack"
    return f"accuracy {acc}, {int(row['recovered'])} of {int(row['images'])} images recovered ({row['end_method']})"
