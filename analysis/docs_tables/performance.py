"""docs/performance.md's mixed-precision fidelity table: each method's fp32 and bf16 attacks on the same
updates (docs/precision-native/precision.csv, analysis.experiments precision)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .core import records_table

PAGE = Path("docs/performance.md")
PRECISION = Path("docs/precision-native/precision.csv")
DATASETS = {"femnist": "FEMNIST", "cifar100": "CIFAR-100"}
METHODS = {"ig": "IG", "sme": "SME", "nlsme": "NL-SME", "pisme": "PI-SME"}


def _minus(text: str) -> str:
    return text.replace("-", "−")


def _arm(group: pd.DataFrame, precision: str) -> pd.DataFrame:
    return group[group["precision"] == precision].set_index(["client", "seed"]).sort_index()


def _mean(column: str, digits: int, precision: str | None = None):
    """fp32's mean of ``column``, or with ``precision`` None 'fp32 / bf16'."""

    def cell(group: pd.DataFrame) -> str:
        arms = [precision] if precision else ["fp32", "bf16"]
        return " / ".join(f"{_arm(group, arm)[column].mean():.{digits}f}" for arm in arms)

    return cell


def _gain(group: pd.DataFrame) -> str:
    """bf16 − fp32 PSNR over the same (client, seed): mean (min .. max)."""
    diff = _arm(group, "bf16")["psnr"] - _arm(group, "fp32")["psnr"]
    return _minus(f"{diff.mean():+.2f} ({diff.min():.2f} .. {diff.max():.2f})")


def precision_fidelity() -> str:
    """Per dataset and method: PSNR in each arm, the paired bf16 − fp32 difference, and each arm's SSIM,
    LPIPS, honest Lsim and seconds per iteration (means over the clients)."""
    keys = [(d, m) for d in DATASETS for m in METHODS]
    return records_table(
        PAGE,
        PRECISION,
        [
            ("dataset", lambda g: DATASETS[g["dataset"].iloc[0]]),
            ("method", lambda g: METHODS[g["method"].iloc[0]]),
            ("PSNR fp32", _mean("psnr", 2, "fp32")),
            ("PSNR bf16", _mean("psnr", 2, "bf16")),
            ("bf16 − fp32, mean (min .. max)", _gain),
            ("SSIM fp32 / bf16", _mean("ssim", 3)),
            ("LPIPS fp32 / bf16", _mean("lpips", 3)),
            ("honest Lsim fp32 / bf16", _mean("lsim_honest", 4)),
            ("s/iteration fp32 / bf16", _mean("seconds_per_iteration", 3)),
        ],
        by=["dataset", "method"],
        rows=keys,
    )


BLOCKS = {PAGE: {"precision-fidelity": precision_fidelity}}
