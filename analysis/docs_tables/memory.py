"""docs/attacker-memory.md's tables: the seed-0 federation's PSNR per tracked writer and round, each round's
attack beside the remembering server's estimate (docs/attacker-memory/*.csv)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .core import ROOT, _head, _read, _table

PAGE = Path("docs/attacker-memory.md")
RECORDS = Path("docs/attacker-memory")
FEDERATION = RECORDS / "federation-attacks.csv"
# the rounds the federation's drain cut off, replayed: the memoryless attack, and the keep replay's estimate
REPLAYS = {
    "pisme": RECORDS / "replay-memoryless-r14-15-attacks.csv",
    "pisme+memory": RECORDS / "replay-keep-attacks.csv",
}


def memory_over_rounds() -> str:
    """Per tracked writer, its PSNR per round by the memoryless attack and by the remembering server (joint);
    a round the federation did not record ok comes from its replay, marked *."""
    federation = _read(FEDERATION)
    ok = federation[federation["status"] == "ok"]
    rounds = sorted(federation["round"].unique())
    rows = []
    for partition in sorted(federation["partition_id"].unique()):
        for method, title in (("pisme", "`pisme`"), ("pisme+memory", "`pisme+memory` (joint)")):
            own = ok[(ok["partition_id"] == partition) & (ok["method"] == method)].set_index("round")["psnr"]
            replay = _read(REPLAYS[method])
            replay = replay[(replay["partition_id"] == partition) & (replay["status"] == "ok")].set_index("round")
            cells = []
            for r in rounds:
                if r in own.index:
                    cells.append(f"{own[r]:.1f}")
                elif r in replay.index:
                    cells.append(f"{replay.loc[r, 'psnr']:.1f}*")
                else:
                    raise ValueError(f"{FEDERATION} and {REPLAYS[method]} have no {method} row of round {r}")
            rows.append([f"writer {partition}, {title}", *cells])
    table = _table(["round", *map(str, rounds)], rows)
    return _head(FEDERATION, *REPLAYS.values(), page=PAGE) + "\n" + table


COSTS = [RECORDS / f"cost-p{p}.json" for p in range(3)]  # python -m benchmarks.memory_cost, one per writer


def _costs() -> list[dict]:
    return [json.loads((ROOT / record).read_text(encoding="utf-8")) for record in COSTS]


def memory_joint() -> str:
    """Per writer: the kept estimate's PSNR (its round alone) against the warm joint attack's on its rounds."""
    rows = [
        [
            str(c["partition"]),
            f"{c['kept_psnr']:.2f}",
            f"{c['joint_final_psnr']:.2f}",
            _db(c["joint_final_psnr"] - c["kept_psnr"]),
        ]
        for c in _costs()
    ]
    table = _table(["writer", "kept (round 1 alone)", "joint on rounds 1–3, warm", "difference"], rows)
    return _head(*COSTS, page=PAGE) + "\n" + table


def memory_cost() -> str:
    """Per writer: seconds for one joint attack on the first n updates, and the largest per-update ratio."""
    costs = _costs()
    ns = [t["updates"] for t in costs[0]["timing"]]
    rows = [
        [str(c["partition"]), *(f"{t['seconds']:.2f}" for t in c["timing"]), f"{c['time_growth_vs_linear']:.2f}"]
        for c in costs
    ]
    header = ["writer", *(f"n = {n}" if n == ns[0] else str(n) for n in ns), "largest (t_n / n) / t_1"]
    return _head(*COSTS, page=PAGE) + "\n" + _table(header, rows)


def _db(x: float) -> str:
    return f"{x:+.2f}".replace("-", "−")


BLOCKS = {PAGE: {"memory-over-rounds": memory_over_rounds, "memory-joint": memory_joint, "memory-cost": memory_cost}}


def _span(values) -> str:
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return low if low == high else f"{low}–{high}"


def _federation(folder: str, lpips: bool, who: str = "writer"):
    """Per tracked client of one remembering-server federation's attacks.csv: round 1's PSNR, the memoryless
    attack's range over rounds 2–15 and at round 15, the remembering server's (one figure when it held one
    estimate), their gap at round 15, the mean label accuracies, and optionally both LPIPS at round 15."""
    record = RECORDS / folder / "attacks.csv"

    def make() -> str:
        frame = _read(record)
        frame = frame[frame["status"] == "ok"]
        last = int(frame["round"].max())
        rows = []
        for partition, mine in frame.groupby("partition_id"):
            alone = mine[mine["method"] == "pisme"].set_index("round")
            kept = mine[mine["method"] == "pisme+memory"].set_index("round")
            row = [
                str(partition),
                f"{alone.loc[1, 'psnr']:.2f}",
                _span(alone.loc[2:, "psnr"]),
                f"{alone.loc[last, 'psnr']:.2f}",
                _span(kept["psnr"]),
                f"{kept.loc[last, 'psnr'] - alone.loc[last, 'psnr']:+.2f}",
                f"{alone['label_accuracy'].mean():.2f} / {kept['label_accuracy'].mean():.2f}",
            ]
            if lpips:
                row.append(f"{alone.loc[last, 'lpips']:.3f} / {kept.loc[last, 'lpips']:.3f}")
            rows.append(row)
        header = [
            who,
            "round 1",
            f"memoryless, rounds 2–{last}",
            f"memoryless round {last}",
            f"`+memory`, every round 1–{last}",
            f"gap at round {last}",
            f"label acc. memoryless / `+memory` (mean 1–{last})",
        ]
        if lpips:
            header.append(f"LPIPS at round {last}, memoryless / `+memory`")
        return _head(record, page=PAGE) + "\n" + _table(header, rows)

    return make


BLOCKS[PAGE].update(
    {
        "memory-seed1": _federation("seed1", lpips=False),
        "memory-seed1-keep-aux": _federation("seed1/keep-aux", lpips=True),
        "memory-seed0-keep-aux": _federation("seed0-keep-aux", lpips=True),
        "memory-cifar100": _federation("cifar100-keep-aux", lpips=True, who="client"),
    }
)


# --- the acceptance over every 15-round federation measured ------------------------------------------

ACCEPTANCE = [  # (records: the run's attacks.csv, then replays of rounds it did not record ok; page's words)
    ([FEDERATION, *REPLAYS.values()], "FEMNIST seed 0 (the study above)", "`joint`, `support`"),
    ([RECORDS / "seed1" / "attacks.csv"], "FEMNIST seed 1", "`keep`, `support`"),
    ([RECORDS / "seed1" / "keep-aux" / "attacks.csv"], "FEMNIST seed 1, replayed", "`keep`, `aux`"),
    ([RECORDS / "seed0-keep-aux" / "attacks.csv"], "FEMNIST seed 0, run again", "`keep`, `aux`"),
    ([RECORDS / "cifar100-keep-aux" / "attacks.csv"], "CIFAR-100 seed 0", "`keep`, `aux`"),
]


def acceptance() -> str:
    """Per federation: how far the remembering server's PSNR ever fell below its round 1 (the worst tracked
    client), each client's gap over the memoryless attack at the last round, and each client's mean label
    accuracy of the ``+memory`` rows; a round the run did not record ok comes from its replay."""
    rows = []
    for records, words, mode in ACCEPTANCE:
        frames = [_read(r) for r in records]
        frame = pd.concat([f[f["status"] == "ok"] for f in frames], ignore_index=True)
        frame = frame.drop_duplicates(["partition_id", "round", "method"], keep="first")
        last = int(frame["round"].max())
        below, gaps, labels = [], [], []
        for _, mine in frame.groupby("partition_id"):
            alone = mine[mine["method"] == "pisme"].set_index("round")
            kept = mine[mine["method"] == "pisme+memory"].set_index("round")
            below.append(kept.loc[1, "psnr"] - kept["psnr"].min())
            gaps.append(f"{kept.loc[last, 'psnr'] - alone.loc[last, 'psnr']:+.1f}")
            labels.append(f"{kept['label_accuracy'].mean():.2f}")
        rows.append([words, mode, f"{max(below):.1f}", ", ".join(gaps), ", ".join(labels)])
    header = [
        "federation",
        "mode, labels",
        "`+memory` below round 1 (worst)",
        "gap at round 15 over the memoryless attack",
        "label acc. of `+memory`, mean 1–15",
    ]
    records = list(dict.fromkeys(r for run, _, _ in ACCEPTANCE for r in run))
    return _head(*records, page=PAGE) + "\n" + _table(header, rows)


BLOCKS[PAGE]["memory-acceptance"] = acceptance


# --- the same federation re-read in images recovered (the verdict) --------------------------------------------

VERDICT = RECORDS / "verdict" / "attacks.csv"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def memory_verdict() -> str:
    """Per tracked writer of the verdict re-run: images recovered of its k in round 1 (with the exact 95%
    interval), the memoryless attack's range over rounds 2–15 and at round 15 (fraction singled out, PSNR
    over the best guess), the remembering server's count in every round, the chance the verdict prints over
    all its rows, and the best update-free guess's count."""
    frame = _read(VERDICT)
    frame = frame[frame["status"] == "ok"]
    last = int(frame["round"].max())
    rows = []
    for partition, mine in frame.groupby("partition_id"):
        alone = mine[mine["method"] == "pisme"].set_index("round")
        kept = mine[mine["method"] == "pisme+memory"]
        first, end = alone.loc[1], alone.loc[last]
        chance = sorted({f"{100 * x:.1f}" for x in mine["reid_chance"]}, key=float)
        rows.append(
            [
                str(partition),
                f"{first['recovered']} ({first['recovered_low']}–{first['recovered_high']})",
                _count_span(alone.loc[2:, "recovered"]),
                f"{end['recovered']} ({_pct(end['reidentified'])}, {end['psnr_margin']:+.1f} dB)".replace("-", "−"),
                f"{_count_span(kept['recovered'])} ({_count_span(100 * kept['reidentified'].round(4))}%)",
                (chance[0] if len(chance) == 1 else f"{chance[0]}–{chance[-1]}") + "%",
                _count_span(mine["guess_recovered"]),
            ]
        )
    k = int(frame["k"].iloc[0])
    header = [
        "writer",
        f"round 1 of {k} (95%)",
        f"memoryless, rounds 2–{last}",
        f"memoryless round {last} (singled out, PSNR over the guess)",
        f"`+memory`, every round 1–{last} (singled out)",
        "chance",
        "best guess",
    ]
    return _head(VERDICT, page=PAGE) + "\n" + _table(header, rows)


def _count_span(values) -> str:
    """'7' or '0–7': the range of ``values`` (counts, or percentages rounded to whole ones)."""
    low, high = f"{min(values):.0f}", f"{max(values):.0f}"
    return low if low == high else f"{low}–{high}"


BLOCKS[PAGE]["memory-verdict"] = memory_verdict
