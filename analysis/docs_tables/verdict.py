"""docs/verdict.md's tables: the readers (fl_attack/assets/reader_*.json), the null, floor and control at
two configurations (docs/verdict/k32 and k16, distance.csv) and the verdict's cost (overhead.csv)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .core import ROOT, _head, _table, records_table

PAGE = Path("docs/verdict.md")
READERS = {"femnist": "FEMNIST (62 classes)", "cifar100": "CIFAR-100 (100 classes)"}
CLIENT_SETS = {"femnist": "images of partitions 0–19", "cifar100": "bundled: all of them"}
CONFIGURATIONS = {"k32": "1 (k = 32)", "k16": "2 (k = 16)"}
GUESSES = [
    "attack",
    "pool mean",
    "class mean",
    "class medoid",
    "reader's pick",
    "noise start",
    "another client's, re-matched",
]


def readers() -> str:
    """One row per reader's record: its training images, wall time and epochs, accuracy on its validation
    split, on the bundled clients' images, and on those images degraded."""
    records = [Path(f"fl_attack/assets/reader_{dataset}.json") for dataset in READERS]
    rows = []
    for dataset, record in zip(READERS, records):
        r = json.loads((ROOT / record).read_text(encoding="utf-8"))
        rows.append(
            [
                READERS[dataset],
                f"{r['training_set']['size']:,}",
                f"{r['wall_seconds']:.0f} s, {r['epochs']} epochs",
                f"{r['val_accuracy']:.3f}",
                f"{r['client_accuracy']:.3f} ({r['client_set']['size']:,} {CLIENT_SETS[dataset]})",
                f"{r['client_accuracy_degraded']:.3f}",
            ]
        )
    header = [
        "reader",
        "training images",
        "wall (2 cores)",
        "validation accuracy",
        "on the bundled clients' images",
        "degraded",
    ]
    return _head(*records, page=PAGE) + "\n" + _table(header, rows)


def _null(configuration: str) -> str:
    """Per dataset: the mean fraction singled out by 1 − SSIM among k + 2,000 candidates of the attack, each
    update-free guess, the noise start and the control; the matched chance and the old 1/(k+D)."""
    record = PAGE.parent / "verdict" / configuration / "distance.csv"

    def singled_out(name: str):
        return lambda group: f"{group.set_index('images').loc[name, 'singled_out']:.3f}"

    return records_table(
        PAGE,
        record,
        [
            ("dataset", lambda group: group["dataset"].iloc[0]),
            *((("the attack" if name == "attack" else name), singled_out(name)) for name in GUESSES),
            ("chance", lambda group: f"{group['chance'].iloc[0]:.3f}"),
            ("1/(k+D)", lambda group: f"{group['chance_uniform'].iloc[0]:g}"),
        ],
        where=lambda f: (f["distance"] == "1 - SSIM") & (f["D"] == 2000),
        by="dataset",
    )


def null_k32() -> str:
    return _null("k32")


def null_k16() -> str:
    return _null("k16")


def _span(column: str, whole_from: float, scale: float = 1, unit: str = ""):
    """A group's least–most of ``column`` (× ``scale``), to 0.1 under ``whole_from`` and to the unit from
    it; one figure when they read alike."""

    def cell(group: pd.DataFrame) -> str:
        low, high = (
            f"{scale * x:.1f}" if scale * x < whole_from else f"{scale * x:.0f}"
            for x in (group[column].min(), group[column].max())
        )
        return f"{low}{unit}" if low == high else f"{low}–{high}{unit}"

    return cell


def cost() -> str:
    """Per configuration and dataset, over its clients: the attack's seconds, the verdict's, their ratio,
    and the verdict's once-per-run setup."""
    records = [PAGE.parent / "verdict" / configuration / "overhead.csv" for configuration in CONFIGURATIONS]
    return records_table(
        PAGE,
        records,
        [
            ("configuration", lambda group: CONFIGURATIONS[group["folder"].iloc[0]]),
            ("dataset", lambda group: group["dataset"].iloc[0]),
            ("attack (s)", _span("attack_seconds", 100)),
            ("the verdict (s)", _span("verdict_seconds", 10)),
            ("verdict / attack", _span("verdict_share", 10, 100, "%")),
            ("once per run (s)", _span("verdict_setup_seconds", 10)),
        ],
        by=["folder", "dataset"],
    )


BLOCKS = {
    PAGE: {"verdict-readers": readers, "verdict-null-k32": null_k32, "verdict-null-k16": null_k16, "verdict-cost": cost}
}


DISTANCES = {"1 - SSIM": "1 − SSIM", "pixel L2": "pixel L2", "LPIPS": "LPIPS"}


def distance() -> str:
    """Per configuration and dataset: the mean fraction of the attack's images singled out at D = 2,000 under
    each distance, the most any update-free output or the control reached under any of them, and the matched
    chance at D = 250 and D = 2,000."""
    records = [PAGE.parent / "verdict" / configuration / "distance.csv" for configuration in CONFIGURATIONS]

    def attack(name: str):
        def cell(group: pd.DataFrame) -> str:
            mine = group[(group["distance"] == name) & (group["D"] == 2000) & (group["images"] == "attack")]
            return f"{mine['singled_out'].iloc[0]:.3f}"

        return cell

    def others(group: pd.DataFrame) -> str:
        mine = group[(group["D"] == 2000) & (group["images"] != "attack")]
        return f"{mine['singled_out'].max():.3f}"

    def chance(group: pd.DataFrame) -> str:
        by_d = group.groupby("D")["chance"].first()
        return " / ".join(f"{100 * by_d[d]:.1f}%" for d in (250, 2000))

    return records_table(
        PAGE,
        records,
        [
            ("configuration", lambda group: CONFIGURATIONS[group["folder"].iloc[0]]),
            ("dataset", lambda group: group["dataset"].iloc[0]),
            *((f"the attack, {words}", attack(name)) for name, words in DISTANCES.items()),
            ("any other output or the control, most (all three)", others),
            ("chance at D = 250 / 2,000", chance),
        ],
        by=["folder", "dataset"],
    )


def counts() -> str:
    """Per configuration, dataset and tracked client of overhead.csv: images recovered of its k with the exact
    95% interval, the best update-free guess's count, the row's chance, the fraction singled out and the
    attack's PSNR over the best guess."""
    records = [PAGE.parent / "verdict" / configuration / "overhead.csv" for configuration in CONFIGURATIONS]
    return records_table(
        PAGE,
        records,
        [
            ("configuration", lambda row: CONFIGURATIONS[row["folder"]]),
            ("dataset", lambda row: row["dataset"]),
            ("client", lambda row: str(row["client"])),
            (
                "recovered of k (95%)",
                lambda row: f"{row['recovered']} ({row['recovered_low']}–{row['recovered_high']}) of {row['k']}",
            ),
            ("best guess", lambda row: str(row["guess_recovered"])),
            ("chance", lambda row: f"{100 * row['reid_chance']:.1f}%"),
            ("singled out", lambda row: f"{100 * row['reidentified']:.0f}%"),
            ("PSNR over the guess (dB)", lambda row: f"{row['psnr_margin']:+.1f}".replace("-", "−")),
        ],
    )


BLOCKS[PAGE].update({"verdict-distance": distance, "verdict-counts": counts})
