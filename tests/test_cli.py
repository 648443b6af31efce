"""``fl-attack attack``: a tiny real run, its files, and every bad input rejected before training."""

from __future__ import annotations

import csv
import math

import pytest
import torch
from PIL import Image

import fl_attack.attacker.runtime.run as workers  # where the standalone engine calls reconstruct (run_job)
from fl_attack.cli import main
from fl_attack.evaluation.verdict import VERDICT_COLUMNS
from tests.mounts import tmpfs

COLUMNS = [
    "dataset",
    "partition_id",
    "method",
    "local_steps",
    "gradients_per_iteration",
    "iterations",
    "labels",
    "psnr",
    "ssim",
    "fsim",
    "lpips",
    "lsim_honest",
    "lsim_calibrated",
    "label_accuracy",
    "attack_seconds",
    *VERDICT_COLUMNS,
    "psnr_recovered",  # Dimitrov et al.'s metric beside the verdict
    "lr_schedule",
]
TINY = [
    "--clients",
    "1",
    "--samples",
    "10",
    "--batch-size",
    "5",
    "--local-epochs",
    "1",
    "--iterations",
    "3",
    "--nodes",
    "2",
    "--trace-every",
    "1",
    "--device",
    "cpu",
    "--no-progress",
]


def _read(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    rc = main(["attack", *TINY, "--methods", "pisme,ig", "--out", str(out)])
    return rc, out


def test_tiny_run_writes_results(tiny_run):
    rc, out = tiny_run
    assert rc == 0
    columns, rows = _read(out / "results.csv")
    assert columns == COLUMNS
    assert [(r["partition_id"], r["method"]) for r in rows] == [("0", "pisme"), ("0", "ig")]
    for r in rows:
        assert r["dataset"] == "femnist" and r["labels"] == "recovered"
        assert int(r["local_steps"]) == 2 and int(r["iterations"]) == 3
        psnr, ssim, fsim, lpips = (float(r[k]) for k in ("psnr", "ssim", "fsim", "lpips"))
        assert math.isfinite(psnr) and psnr > 0
        assert -1 <= ssim <= 1 and math.isfinite(fsim)
        assert math.isfinite(lpips) and lpips >= 0
        assert 0 <= float(r["label_accuracy"]) <= 1
        assert 0 <= float(r["lsim_honest"]) <= 2 and 0 <= float(r["lsim_calibrated"]) <= 2
        assert float(r["attack_seconds"]) > 0
    assert {r["method"]: int(r["gradients_per_iteration"]) for r in rows} == {"pisme": 2, "ig": 1}


def test_tiny_run_writes_traces_grids_and_no_temporaries(tiny_run):
    _, out = tiny_run
    for method in ("pisme", "ig"):
        columns, rows = _read(out / f"trace-0-{method}.csv")
        assert columns[0] == "iteration" and {"loss", "lsim_honest", "lsim_calibrated", "tv", "psnr"} <= set(columns)
        assert [int(r["iteration"]) for r in rows] == [0, 1, 2]
        assert all(float(r["psnr"]) > 0 for r in rows)
        with Image.open(out / f"client-0-{method}.png") as image:
            # 10 pairs in one band: 2 rows of 28 px, 2 px gaps, scaled x2
            assert image.size == (2 * (10 * 30 + 2), 2 * (2 * 30 + 2))
    assert (out / "settings.json").is_file()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]


def test_oracle_labels_on_cifar100(tmp_path):
    out = tmp_path / "cifar"
    rc = main(
        [
            "attack",
            *TINY,
            "--dataset",
            "cifar100",
            "--classes",
            "5",
            "--methods",
            "ig",
            "--labels",
            "oracle",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    _, rows = _read(out / "results.csv")
    assert rows[0]["dataset"] == "cifar100" and rows[0]["labels"] == "oracle"
    assert float(rows[0]["label_accuracy"]) == 1.0


def test_a_failed_attack_is_recorded_and_the_others_go_on(tmp_path, monkeypatch, capsys):
    original = workers.reconstruct

    def flaky(update, method, **kw):
        if method == "sme":
            raise RuntimeError("boom")
        return original(update, method, **kw)

    monkeypatch.setattr(workers, "reconstruct", flaky)
    out = tmp_path / "run"
    assert main(["attack", *TINY, "--iterations", "1", "--methods", "sme,ig", "--out", str(out)]) == 0
    _, rows = _read(out / "results.csv")
    assert [r["method"] for r in rows] == ["sme", "ig"]
    assert math.isnan(float(rows[0]["psnr"])) and math.isnan(float(rows[0]["lsim_honest"]))
    assert rows[0]["dataset"] == "femnist" and rows[0]["local_steps"] == "2"
    assert math.isfinite(float(rows[1]["psnr"]))
    err = capsys.readouterr().err
    assert "attack 'sme' on client 0 failed: RuntimeError: boom" in err and "Traceback" not in err


def test_an_interrupted_run_keeps_the_rows_already_written(tmp_path, monkeypatch):
    original = workers.reconstruct

    def interrupted(update, method, **kw):
        if method == "sme":
            raise KeyboardInterrupt
        return original(update, method, **kw)

    monkeypatch.setattr(workers, "reconstruct", interrupted)
    out = tmp_path / "run"
    assert main(["attack", *TINY, "--iterations", "1", "--methods", "ig,sme", "--out", str(out)]) == 130
    columns, rows = _read(out / "results.csv")
    assert columns == COLUMNS and [r["method"] for r in rows] == ["ig"]


BAD_INPUTS = [
    (["--methods", "pisme,dlgx"], "argument --methods: unknown attack method 'dlgx'; choose from: dggi, dimitrov"),
    (["--methods", "pisme+memory"], "'pisme+memory' attacks a client over a federation's rounds: give attack-memory"),
    (["--dataset", "mnist"], "unknown dataset 'mnist'; choose one of: cifar100, femnist, femnist-digits"),
    (["--nodes", "0"], "the number of quadrature nodes m must be an integer >= 1, got 0"),
    (["--label-refine", "1.5"], "label_refine must be in [0, 1) (a fraction of the iterations), got 1.5"),
    (["--batch-size", "60"], "batch size B=60 is larger than the client's k=50 samples"),
    (["--samples", "5000"], "no femnist client has k=5000 samples"),
    (["--clients", "101"], "101 clients asked for, but the femnist data has only 100 client(s) with k=50 samples"),
    (["--dataset", "cifar100", "--clients", "51"], "but the cifar100 data has only 50 client(s) with k=50 samples"),
    (["--data-dir", "/nonexistent/leaf"], "data directory not found: /nonexistent/leaf"),
    (["--classes", "10"], "classes is only supported for cifar100"),
    (["--dataset", "cifar100", "--classes", "101"], "classes must be in 1..100 for cifar100, got 101"),
    (["--iterations", "0"], "iterations must be an integer >= 1, got 0"),
    (["--clients", "0"], "clients must be an integer >= 1, got 0"),
    (["--lr", "0"], "lr must be a positive finite number"),
    (["--local-epochs", "0"], "local_epochs must be >= 1"),
    (["--trace-every", "0"], "trace_every must be >= 1"),
    (["--labels", "true"], "argument --labels: labels must be 'recovered' or 'oracle', got 'true'"),
    (["--nodes", "two"], "argument --nodes: invalid int value: 'two'"),
    (["--precision", "fp16"], "argument --precision: precision must be one of fp32, bf16, tf32, auto, got 'fp16'"),
    (["--precision", "tf32", "--device", "cpu"], "precision 'tf32' needs a CUDA device"),
    (["--precision", "bf16", "--option", "precision=fp32"], "--option: precision is set here and by --precision"),
]


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    assert main(["attack", *args, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fl-attack: error: "), captured.err
    assert message in lines[0]
    assert "Traceback" not in captured.err and captured.out == ""
    assert not out.exists()


def test_missing_cuda_is_a_usage_error(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert main(["attack", "--device", "cuda", "--out", str(tmp_path / "out")]) == 2
    assert "fl-attack: error: device 'cuda' was asked for but torch sees no CUDA device" in capsys.readouterr().err


def test_no_command_is_a_usage_error(capsys):
    assert main([]) == 2
    assert capsys.readouterr().err.startswith("fl-attack: error: ")


def test_help_documents_every_flag(capsys):
    assert main(["attack", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for flag in [
        "--dataset",
        "--methods",
        "--clients",
        "--samples",
        "--batch-size",
        "--local-epochs",
        "--lr",
        "--iterations",
        "--nodes",
        "--classes",
        "--labels",
        "--seed",
        "--device",
        "--precision",
        "--data-dir",
        "--trace-every",
        "--out",
    ]:
        assert flag in text, flag
    for default in [
        "femnist",
        "pisme,nlsme,sme,ig",
        "(default: 50)",
        "(default: 10)",
        "(default: 20)",
        "(default: 0.004)",
        "(default: 1000)",
        "(default: 7)",
        "(default: recovered)",
        "(default: auto)",
        "(default: fp32)",
        "results/attack",
    ]:
        assert default in text, default
    assert "CPU-friendly settings" in text and "results.csv" in text
    assert main(["--help"]) == 0
    assert "attack" in capsys.readouterr().out


# --- exit status and file-system errors -------------------------------------------------------------

import errno  # noqa: E402
import os  # noqa: E402

import fl_attack.cli as cli  # noqa: E402
import fl_attack.records as records  # noqa: E402


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fl-attack: error: ") and "Traceback" not in err, err
    return lines[0]


def test_every_attack_failing_exits_1_with_the_rows_kept(tmp_path, monkeypatch, capsys):
    def broken(update, method, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(workers, "reconstruct", broken)
    out = tmp_path / "run"
    assert main(["attack", *TINY, "--iterations", "1", "--methods", "sme,ig", "--out", str(out)]) == 1
    _, rows = _read(out / "results.csv")
    assert [r["method"] for r in rows] == ["sme", "ig"] and all(math.isnan(float(r["psnr"])) for r in rows)
    err = capsys.readouterr().err
    assert "2 attack(s), 2 failed" in err and err.strip().endswith(
        "fl-attack: error: every attack failed; see the messages above"
    )


@pytest.fixture
def no_training(monkeypatch):
    monkeypatch.setattr(cli, "run_attack_experiment", lambda *a, **k: pytest.fail("training started"))


def test_out_pointing_at_a_file_exits_2_before_training(tmp_path, capsys, no_training):
    existing = tmp_path / "results.csv"
    existing.write_text("keep me\n")
    assert main(["attack", *TINY, "--out", str(existing)]) == 2
    assert _one_error_line(capsys.readouterr().err) == f"fl-attack: error: --out {existing}: exists and is not a folder"
    assert existing.read_text() == "keep me\n"
    assert main(["attack", *TINY, "--out", str(existing / "sub")]) == 2  # a folder below a file
    assert "cannot write there: Not a directory" in _one_error_line(capsys.readouterr().err)


def test_out_on_sysfs_exits_2_before_training(capsys, no_training):
    if not os.path.ismount("/sys"):
        pytest.skip("no sysfs at /sys")
    assert main(["attack", *TINY, "--out", "/sys/fl-attack-out"]) == 2  # not even root creates folders here
    assert "fl-attack: error: --out /sys/fl-attack-out: cannot write there: " in _one_error_line(
        capsys.readouterr().err
    )
    assert not os.path.exists("/sys/fl-attack-out")


def test_out_in_a_read_only_folder_exits_2_before_training(tmp_path, capsys, no_training):
    """File modes (skipped as root, which ignores them; the read-only mount below runs as root too)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as root: file modes are not enforced")
        assert main(["attack", *TINY, "--out", str(folder / "run")]) == 2
        assert "cannot write there: Permission denied" in _one_error_line(capsys.readouterr().err)
    finally:
        folder.chmod(0o700)


def test_out_on_a_read_only_filesystem_exits_2_before_training(tmp_path, capsys, no_training):
    """Root-safe: a tmpfs mounted read-only refuses every write in the kernel (EROFS), whoever asks.
    Both --out the mount itself (it exists: the test file is refused) and a folder below it (mkdir
    is refused) exit 2 with one line naming the folder. Skips where the machine refuses the mount."""
    with tmpfs(tmp_path / "ro", "ro,size=1m") as mount:
        for out in (mount, mount / "run"):
            assert main(["attack", *TINY, "--out", str(out)]) == 2
            line = _one_error_line(capsys.readouterr().err)
            assert line == f"fl-attack: error: --out {out}: cannot write there: Read-only file system", line
        assert list(mount.iterdir()) == []


def test_a_full_disk_during_the_run_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(records, "RETRY_DELAYS", (0.0,))

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    out = tmp_path / "run"
    rc = main(["attack", *TINY, "--methods", "ig", "--out", str(out)])
    monkeypatch.undo()
    assert rc == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"could not write {out / 'settings.json'} (4 tries, 0 of " in line and "No space left on device" in line
    assert list(out.iterdir()) == []
