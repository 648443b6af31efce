"""The short-budget lever table (issue 50, item 1; docs/time-to-quality.md), from replays' records.

    python -m analysis.experiments.time_to_quality RUN_DIR NAME [NAME ...] [--out DIR]

Each NAME is a replay of RUN_DIR (``fl-attack replay RUN_DIR --name NAME --options ... --iterations K``,
docs/time-to-quality/run.sh runs them): its attacks.csv rows are the attacks of one lever setting on the
run's recorded updates. Writes DIR/levers.csv (one row per replay and attack: lever, round, client,
iterations, nodes m, recovered and its 95% interval, the best update-free guess's count, singled out, PSNR,
attack seconds, count_trend, recovered_curve, lsim_honest), DIR/levers.md (per lever: the count
summed over the attacked updates, each update's count, the floor, mean PSNR and attack seconds) and
DIR/seeds.md (per setting, its replays that differ only in the attack's seed, ``seed=`` in the options:
each seed's summed count and their mean), all rewritten from the records, never by hand.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fl_attack.records import csv_text, read_csv, write_text_atomic
from fl_attack.schema import FORMER_NAMES

COLUMNS = (
    "lever",
    "round",
    "client_id",
    "iterations",
    "gradients_per_iteration",  # m: the replays are PI-SME's
    "recovered",
    "recovered_low",
    "recovered_high",
    "guess_recovered",
    "k",
    "reidentified",
    "reid_chance",
    "psnr",
    "attack_seconds",
    "count_trend",
    "recovered_curve",
    "lsim_honest",
    "options",
)


def collect(run_dir: Path, names: list[str]) -> list[dict]:
    """One row per attack of each replay ``names`` of ``run_dir`` (its attacks.csv, status ok)."""
    import json

    rows = []
    for name in names:
        folder = run_dir / "replays" / name
        attacks = [r for r in read_csv(folder / "attacks.csv", FORMER_NAMES)[1] if r["status"] == "ok"]
        config = json.loads((folder / "config.json").read_text())
        options = config.get("run_config", {}).get("attack-options", "")
        for r in attacks:
            rows.append({"lever": name, **{c: r.get(c, "") for c in COLUMNS[1:-1]}, "options": options})
    return rows


def table(rows: list[dict]) -> str:
    """The markdown table: per lever, summed counts and means over its attacks."""
    lines = [
        "| replay | options | iterations | m | recovered (sum) | per update (round: each client's count) | "
        "best guess (sum) | trend | mean PSNR (dB) | mean attack (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    levers = list(dict.fromkeys(r["lever"] for r in rows))
    for lever in levers:
        mine = sorted((r for r in rows if r["lever"] == lever), key=lambda r: (int(r["round"]), r["client_id"]))
        n = len(mine)
        k = sum(int(r["k"]) for r in mine)
        rounds = dict.fromkeys(r["round"] for r in mine)  # each round's counts, its clients in order
        per = "; ".join(f"{rnd}: {', '.join(r['recovered'] for r in mine if r['round'] == rnd)}" for rnd in rounds)
        trends = ", ".join(sorted({r["count_trend"] or "n/a" for r in mine}))
        psnr = sum(float(r["psnr"]) for r in mine) / n
        secs = sum(float(r["attack_seconds"]) for r in mine) / n
        lines.append(
            f"| {lever} | `{mine[0]['options'] or '(defaults)'}` | {mine[0]['iterations']} | "
            f"{mine[0]['gradients_per_iteration']} | "
            f"{sum(int(r['recovered']) for r in mine)} of {k} | {per} | "
            f"{sum(int(float(r['guess_recovered'])) for r in mine)} | {trends} | {psnr:.2f} | {secs:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _setting(options: str) -> tuple[str, int]:
    """(the options without the attack's seed, that seed: 0 when not given)."""
    parts = [p for p in options.split(",") if p]
    seeds = [int(p.split("=", 1)[1]) for p in parts if p.startswith("seed=")]
    return ",".join(p for p in parts if not p.startswith("seed=")), (seeds[0] if seeds else 0)


def seed_table(rows: list[dict]) -> str:
    """The markdown table of one setting over seeds: each seed's count summed over the attacked updates
    (seed order), their mean, and the mean PSNR and attack seconds over every attack of the setting."""
    lines = [
        "| options | iterations | m | seeds | recovered (sum) per seed | mean | mean PSNR (dB) | mean attack (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    groups: dict = {}
    for r in rows:
        options, seed = _setting(r["options"])
        groups.setdefault((options, r["iterations"], r["gradients_per_iteration"]), {}).setdefault(seed, []).append(r)
    for (options, iterations, nodes), by_seed in groups.items():
        seeds = sorted(by_seed)
        counts = [sum(int(r["recovered"]) for r in by_seed[s]) for s in seeds]
        k = sum(int(r["k"]) for r in by_seed[seeds[0]])
        every = [r for s in seeds for r in by_seed[s]]
        psnr = sum(float(r["psnr"]) for r in every) / len(every)
        secs = sum(float(r["attack_seconds"]) for r in every) / len(every)
        lines.append(
            f"| `{options or '(defaults)'}` | {iterations} | {nodes} | {', '.join(map(str, seeds))} | "
            f"{', '.join(map(str, counts))} of {k} | {sum(counts) / len(counts):.1f} | {psnr:.2f} | {secs:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("names", nargs="+")
    parser.add_argument("--out", type=Path, default=Path("docs/time-to-quality"))
    args = parser.parse_args(argv)
    rows = collect(args.run_dir, args.names)
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "levers.csv", csv_text(rows, COLUMNS))
    levers, seeds = table(rows), seed_table(rows)
    write_text_atomic(args.out / "levers.md", levers)
    write_text_atomic(args.out / "seeds.md", seeds)
    print(levers)
    print(seeds)


if __name__ == "__main__":
    main()
