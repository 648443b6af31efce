"""docs/performance.md's mixed-precision tables on a CPU with native bf16: the fidelity table, each method's
fp32 and bf16 attacks on the same updates (docs/precision-native/precision.csv, analysis.experiments
precision); the step table, from the text dumps of ``benchmarks.attack_step --precisions fp32,bf16``
(docs/precision-native/step-*.txt); and the profile table, from the ``torch.profiler`` tables of two steps
(docs/precision-native/profile-*.txt)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from .core import ROOT, _head, _table, records_table

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


# --- the step and the profile: text dumps, read by two small parsers ----------------------------------------

NATIVE = Path("docs/precision-native")
# the dumps in the page's row order: the paper's size on 2 threads, then k=10, m=3 on 1 thread
STEPS = [
    NATIVE / f"step-{name}.txt" for name in ("cifar100-t2", "femnist-t2", "cifar100-k10-m3-t1", "femnist-k10-m3-t1")
]
_DEVICE = re.compile(r"device \w+, (\d+) threads?,")
_SUMMARY = re.compile(
    r"(\w+) width=\d+ k=(\d+) m=(\d+): bf16 step ([\d.]+) s against fp32 ([\d.]+) s \(x([\d.]+)\); "
    r"(\d+)% of its GEMM peak against fp32's (\d+)%; gradients: cosine >= ([\d.]+), relative error <= ([\d.e+-]+); "
    r"whole attack \((\d+) iterations\) ([\d.]+) s against ([\d.]+) s \(x([\d.]+)\)"
)


def _step_row(record: Path) -> list[str]:
    """A step dump's row: its last line, the benchmark's summary, and its thread count.

    Raises ValueError when the dump has no summary line or no device line."""
    text = (ROOT / record).read_text(encoding="utf-8")
    summary, device = _SUMMARY.search(text), _DEVICE.search(text)
    if summary is None or device is None:
        raise ValueError(f"{record} holds no summary line of benchmarks.attack_step --precisions fp32,bf16")
    dataset, k, m, bf16, fp32, step_x, bf16_peak, fp32_peak, cos, err, iters, bf16_s, fp32_s, attack_x = (
        summary.groups()
    )
    threads = int(device.group(1))
    size = " (the paper's size)" if (k, m) == ("50", "7") else ""
    return [
        f"{DATASETS[dataset]}, k={k}, m={m}, {threads} thread{'s' if threads > 1 else ''}{size}",
        f"{fp32} ({fp32_peak}%)",
        f"{bf16} ({bf16_peak}%)",
        f"{step_x}×",
        f"{fp32_s} / {bf16_s} s ({iters} it.)",
        f"{attack_x}×",
        f"{cos}, {float(err) * 100:.1f}%",
    ]


def precision_step() -> str:
    """Per configuration: each precision's step time and share of its own GEMM peak, the step's and the whole
    attack's speed-ups, and the bf16 step's gradients against fp32 (the smallest cosine, the largest
    relative error), as the benchmark's summary line of each dump gives them."""
    header = [
        "configuration",
        "fp32 s/step (% of fp32 GEMM peak)",
        "bf16 s/step (% of bf16 GEMM peak)",
        "step speed-up",
        "whole attack fp32 / bf16",
        "attack speed-up",
        "gradients vs fp32 (min cosine, max rel. error)",
    ]
    return _head(*STEPS, page=PAGE) + "\n" + _table(header, [_step_row(r) for r in STEPS])


PROFILES = {"cifar100": NATIVE / "profile-cifar100.txt", "femnist": NATIVE / "profile-femnist.txt"}
_SECTION = re.compile(r"^== (\w+) (fp32|bf16)$", re.M)
_OPERATOR = re.compile(r"^\s*(\S+)\s+[\d.]+%\s+([\d.]+)(ms|us|s)\s", re.M)
_TOTAL = re.compile(r"Self CPU time total: ([\d.]+)(ms|us|s)")
_UNIT = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
# (the page's row, its operators (no operators: the whole two steps), whether it shows the row's share)
PROFILE_ROWS = [
    ("two steps, operator self time", (), False),
    (
        "`convolution_backward` + `mkldnn_convolution` (oneDNN)",
        ("aten::convolution_backward", "aten::mkldnn_convolution"),
        True,
    ),
    ("`mm` + `addmm`", ("aten::mm", "aten::addmm"), True),
    ("`copy_` (casts and layout copies)", ("aten::copy_",), False),
    (
        "`add`, `add_`, `mul`, `threshold_backward`",
        ("aten::add", "aten::add_", "aten::mul", "aten::threshold_backward"),
        False,
    ),
]


def _profiles(record: Path) -> dict[str, tuple[float, dict[str, float]]]:
    """{precision: (the total self time in s, {operator: its self time in s})} of a profile dump, one
    ``== DATASET PRECISION`` section per precision (``key_averages().table``'s rows, the profiler's log lines
    around them ignored).

    Raises ValueError when a section has no total."""
    text = (ROOT / record).read_text(encoding="utf-8")
    heads = list(_SECTION.finditer(text))
    out = {}
    for head, after in zip(heads, [*heads[1:], None]):
        body = text[head.end() : after.start() if after else len(text)]
        total = _TOTAL.search(body)
        if total is None:
            raise ValueError(f"{record}: the {head.group(2)} profile has no 'Self CPU time total'")
        ops = {name: float(x) * _UNIT[unit] for name, x, unit in _OPERATOR.findall(body)}
        out[head.group(2)] = (float(total.group(1)) * _UNIT[total.group(2)], ops)
    return out


def _seconds(profile: tuple[float, dict[str, float]], ops: tuple[str, ...]) -> float:
    total, times = profile
    missing = [op for op in ops if op not in times]
    if missing:
        raise ValueError(f"the profile has no row of {missing}")
    return sum(times[op] for op in ops) if ops else total


def precision_profile() -> str:
    """Per group of operators and dataset: its self time over two steps in fp32 and in bf16 (with its share of
    the step where the page shows it) and the bf16 speed-up, fp32 time / bf16 time."""
    made = {dataset: _profiles(record) for dataset, record in PROFILES.items()}
    header = ["operator"]
    for dataset in PROFILES:
        header += [f"{DATASETS[dataset]} fp32", f"{DATASETS[dataset]} bf16", "bf16 speed-up"]
    rows = []
    for label, ops, share in PROFILE_ROWS:
        row = [label]
        for profiles in made.values():
            times = {p: _seconds(profiles[p], ops) for p in ("fp32", "bf16")}
            for p, t in times.items():
                row.append(f"{t:.3f} s ({t / profiles[p][0]:.0%})" if share else f"{t:.3f} s")
            row.append(f"{times['fp32'] / times['bf16']:.2f}×")
        rows.append(row)
    return _head(*PROFILES.values(), page=PAGE) + "\n" + _table(header, rows)


BLOCKS = {
    PAGE: {
        "precision-fidelity": precision_fidelity,
        "precision-step": precision_step,
        "precision-profile": precision_profile,
    }
}
