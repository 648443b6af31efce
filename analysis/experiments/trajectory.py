"""The trajectory-length table (issue 59; docs/time-to-quality.md, "At every trajectory length"), from records.

    python -m analysis.experiments.trajectory [--root docs/time-to-quality/trajectory]

Each set (a folder of ROOT, e.g. dimitrov-T100) holds one folder per contender, each a `fl-attack attack` run on
the same victims (docs/time-to-quality/trajectory/run.sh makes them): its results.csv has one row per victim.
Writes ROOT/trajectory.csv (one row per set, contender and victim: T, m, iterations, the verdict's count and its
interval, the best update-free guess's count, Dimitrov et al.'s share above delta and its update-free null,
PSNR, attack seconds) and ROOT/trajectory.md (per set and contender: the summed count, each victim's, the
floor, the mean of Dimitrov's metric beside its null, the mean PSNR and the summed attack seconds), all
rewritten from the records, never by hand.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fl_attack.records import csv_text, read_csv, write_text_atomic
from fl_attack.schema import FORMER_NAMES

ROOT = Path(__file__).resolve().parents[2] / "docs" / "time-to-quality" / "trajectory"
COLUMNS = (
    "set",
    "contender",
    "partition_id",
    "local_steps",
    "gradients_per_iteration",  # m: every contender is PI-SME
    "iterations",
    "lr_schedule",
    "k",
    "recovered",
    "recovered_low",
    "recovered_high",
    "guess_recovered",
    "psnr_recovered",
    "guess_psnr_recovered",
    "psnr",
    "attack_seconds",
)


def collect(root: Path = ROOT) -> list[dict]:
    """One row per victim of every finished contender (its run.log, written last by run.sh) of every set
    under ``root`` (results.csv, attacks that ran)."""
    rows = []
    for results in sorted(root.glob("*/*/results.csv")):
        if not (results.parent / "run.log").is_file():  # still running, or killed part-way
            continue
        contender, name = results.parent.name, results.parent.parent.name
        schedule = _schedule(results.parent / "settings.json")
        for r in read_csv(results, FORMER_NAMES)[1]:  # older results.csv files: client, nodes, seconds
            if r.get("recovered") not in (None, ""):
                row = {"set": name, "contender": contender, **{c: r.get(c, "") for c in COLUMNS[2:]}}
                rows.append(row | {"lr_schedule": row["lr_schedule"] or schedule})
    return rows


def _schedule(settings: Path) -> str:
    """The schedule a results.csv written before its lr_schedule column ran: its settings.json's overrides on
    AttackConfig's defaults (fl_attack.attacker.attacks.schedule_name)."""
    import json

    from fl_attack.attacker.attacks import AttackConfig, schedule_name

    overrides = json.loads(settings.read_text()).get("overrides", {})
    keys = ("lr_images", "lr_decay", "lr_schedule")
    return schedule_name(AttackConfig.from_overrides(None, **{k: v for k, v in overrides.items() if k in keys}))


def _mean(rows: list[dict], column: str) -> float:
    values = [float(r[column]) for r in rows if r.get(column) not in (None, "")]
    return sum(values) / len(values) if values else float("nan")


def table(rows: list[dict]) -> str:
    """The markdown table, one line per set and contender, sets in name order and contenders by name."""
    lines = [
        "| set | T | contender | m | iterations | schedule | recovered (sum) | per victim | best guess (sum) | "
        "Dimitrov's metric (mean) | its update-free null | mean PSNR (dB) | attack (s, sum) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = dict.fromkeys((r["set"], r["contender"]) for r in rows)
    for name, contender in keys:
        mine = sorted(
            (r for r in rows if (r["set"], r["contender"]) == (name, contender)), key=lambda r: int(r["partition_id"])
        )
        first = mine[0]
        k = sum(int(r["k"]) for r in mine)
        per = ", ".join(r["recovered"] for r in mine)
        guess = sum(int(float(r["guess_recovered"])) for r in mine)
        seconds = sum(float(r["attack_seconds"]) for r in mine)
        lines.append(
            f"| {name} | {first['local_steps']} | {contender} | {first['gradients_per_iteration']} | "
            f"{first['iterations']} | "
            f"{first['lr_schedule'] or 'n/a'} | {sum(int(r['recovered']) for r in mine)} of {k} | {per} | {guess} | "
            f"{100 * _mean(mine, 'psnr_recovered'):.1f}% | {100 * _mean(mine, 'guess_psnr_recovered'):.1f}% | "
            f"{_mean(mine, 'psnr'):.2f} | {seconds:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    rows = collect(args.root)
    write_text_atomic(args.root / "trajectory.csv", csv_text(rows, COLUMNS))
    made = table(rows)
    write_text_atomic(args.root / "trajectory.md", made)
    print(made)


if __name__ == "__main__":
    main()
