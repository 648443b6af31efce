"""benchmarks/attack_step.py: it times both implementations, they agree, and it checks its arguments."""

from __future__ import annotations

import pytest
import torch

from benchmarks.attack_step import run_bench, summarize


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_runs_on_cuda():
    result = run_bench(
        datasets=("femnist",), nodes=(2,), samples=(4,), device="cuda", repeats=1, progress=lambda s: None
    )
    assert result["device"].startswith("cuda")
    assert all(r["max_grad_diff"] < 1e-9 and r["seconds_per_step"] > 0 for r in result["rows"])


def test_bench_times_both_implementations_and_they_agree():
    result = run_bench(
        datasets=("femnist",), nodes=(1, 2), samples=(4,), device="cpu", repeats=1, progress=lambda s: None
    )
    rows = result["rows"]
    assert {(r["nodes"], r["impl"]) for r in rows} == {(1, "fast"), (1, "reference"), (2, "fast"), (2, "reference")}
    for r in rows:
        assert r["seconds_per_step"] > 0 and r["gflop_per_step"] > 0 and 0 < r["peak_fraction"]
        assert r["max_grad_diff"] < 1e-9  # float64: the two implementations compute the same step
        assert r["width"] == 32
    assert result["gemm_peak_gflops"] > 0
    text = summarize(result)
    assert "speed-up" in text and "m=7 / m=1" not in text
    with pytest.raises(ValueError, match="unknown dataset"):
        run_bench(datasets=("mnist",), progress=lambda s: None)


def test_bench_rejects_bad_arguments_before_timing(capsys):
    from benchmarks.attack_step import main

    for argv in (
        ["--nodes", "0"],
        ["--widths", "4,0"],
        ["--threads", "-1"],
        ["--samples", "x"],
        ["--datasets", "femnist", "--samples", "4,100000"],
        ["--datasets", "mnist"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("python -m benchmarks.attack_step: error:") and len(err.strip().splitlines()) == 1, err


def test_batched_benchmark_runs_and_checks_its_arguments(capsys):
    from benchmarks.attack_step import main, run_batched, summarize_batched

    result = run_batched(("femnist",), (2,), (4,), clients=2, iterations=2, device="cpu", repeats=1, widths=(4,))
    (row,) = result["rows"]
    assert (row["clients"], row["samples"], row["nodes"], row["width"]) == (2, 4, 2, 4)
    assert row["sequential_seconds"] > 0 and row["batched_seconds"] > 0
    assert row["throughput_ratio"] == pytest.approx(row["sequential_seconds"] / row["batched_seconds"])
    assert row["max_lsim_diff"] < 1e-4  # float32: the two runs differ by rounding only
    assert "batched/sequential throughput" in summarize_batched(result)
    for argv in (["--batched", "-1"], ["--batched", "2", "--iterations", "0"], ["--batched", "100000"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("python -m benchmarks.attack_step: error:") and len(err.strip().splitlines()) == 1, err


def test_precision_comparison_times_fp32_and_bf16_side_by_side(capsys):
    """--precisions: the shipped step in fp32 and bf16 in one process, each against its own GEMM peak,
    bf16's gradients against fp32's, and whole attacks in each (torch emulates bf16 on a CPU without it)."""
    from benchmarks.attack_step import main, run_precisions, summarize_precisions

    result = run_precisions(
        ("femnist",), (2,), (4,), "cpu", repeats=1, widths=(4,), precisions=("bf16",), iterations=1, peak_size=64
    )
    rows = {r["precision"]: r for r in result["rows"]}
    assert list(rows) == ["fp32", "bf16"] and set(result["gemm_peak_gflops"]) == {"fp32", "bf16"}
    assert rows["fp32"]["grad_cosine"] == pytest.approx(1) and rows["fp32"]["grad_rel_error"] == 0
    # the smallest cosine and largest error of the three gradients: dL/dP1's bounds (tests/test_precision.py)
    assert rows["bf16"]["grad_cosine"] > 0.95 and 0 < rows["bf16"]["grad_rel_error"] < 0.35
    for r in rows.values():
        assert r["seconds_per_step"] > 0 and r["peak_fraction"] > 0 and r["attack_seconds"] > 0
        assert r["gemm_peak_gflops"] == result["gemm_peak_gflops"][r["precision"]]
    assert rows["bf16"]["gflop_per_step"] == pytest.approx(rows["fp32"]["gflop_per_step"])  # the same step
    assert "bf16 step" in summarize_precisions(result)
    for argv in (
        ["--precisions", "fp16"],
        ["--precisions", "tf32", "--device", "cpu"],
        ["--precisions", "bf16", "--batched", "2"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("python -m benchmarks.attack_step: error:") and len(err.strip().splitlines()) == 1, err


def test_the_compiled_benchmark_checks_its_arguments_before_compiling(capsys):
    """The benchmark itself compiles 4 steps (minutes on a small CPU): its run is docs/performance.md's
    ("Compiled step") and the GPU check's dry run; here, its argument checks."""
    from benchmarks.attack_step import main

    for argv in (
        ["--compiled", "-1"],
        ["--compiled", "2", "--iterations", "1"],
        ["--compiled", "2", "--batched", "2"],
        ["--compiled", "2", "--datasets", "mnist"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("python -m benchmarks.attack_step: error:") and len(err.strip().splitlines()) == 1, err
