"""Tests of analysis/: loading run folders, aggregation against hand computation, the report."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import subprocess
import sys
import time
import warnings
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import (
    METRIC_RANGES,
    MalformedLineWarning,
    NotARunError,
    compare_runs,
    load_run,
    mean_ci95,
    per_client,
    per_round,
    summary_sentences,
    write_report,
)
from analysis.aggregate import METRICS, _t975_fallback, t_quantile_975
from analysis.load import ATTACK_COLUMNS, ROUND_COLUMNS
from analysis.report import FORMATS, main

REPO = Path(__file__).resolve().parents[1]
T_0975_DF2 = 4.302652729911275  # scipy.stats.t.ppf(0.975, 2)


# ---------------------------------------------------------------- hand-made run folders


def write_png(path: Path, seed: int = 0, size: int = 8) -> None:
    """A small grid image: random originals on top, their noisy copies below."""
    import matplotlib.image

    rng = np.random.default_rng(seed)
    top = rng.random((size, size * 3))
    image = np.vstack([top, np.clip(top + 0.2 * rng.standard_normal(top.shape), 0, 1)])
    path.parent.mkdir(parents=True, exist_ok=True)
    matplotlib.image.imsave(path, image, cmap="gray")


def attack_row(round_, partition, method="pisme", psnr=20.0, status="ok", image=True, **extra):
    failed = status == "failed"
    row = {name: "" for name in ATTACK_COLUMNS}
    row.update(
        round=round_,
        node_id=1000 + partition,
        partition_id=partition,
        client_id=f"c{partition}",
        method=method,
        dataset="femnist",
        local_steps=20,
        gradients_per_iteration=4,
        iterations=200,
        labels="recovered",
        status=status,
        attack_seconds=1.5,
    )
    if failed:
        row["error"] = "RuntimeError: out of memory"
    else:
        row.update(
            psnr=psnr,
            ssim=psnr / 40,
            fsim=0.5 + psnr / 100,
            lpips=0.5 - psnr / 100,
            lsim_honest=psnr / 50,
            lsim_calibrated=psnr / 45,
            label_accuracy=1.0,
        )
        if image:
            row["image"] = f"images/round-{round_}/{method}/client-{partition}.png"
    row.update(extra)
    return row


def make_run(
    folder: Path,
    attacks: list[dict] | None,
    rounds: list[dict] | None = None,
    run_config: dict | None = None,
    pngs: bool = True,
    name: str | None = None,
) -> Path:
    """Write config.json, rounds.csv (when rounds is not None), attacks.csv (when attacks is not None)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "dataset": "femnist",
        "num-server-rounds": 3,
        "attack-method": "pisme",
        "attack-iterations": 200,
        "defense": "none",
        "local-epochs": 20,
        "seed": 0,
    }
    config.update(run_config or {})
    (folder / "config.json").write_text(
        json.dumps(
            {
                "run_config": config,
                "versions": {"fl_attack": "0.1.0", "flwr": "1.42.0", "torch": "2.x"},
                "seed": config["seed"],
                "run_name": name or folder.name,
                "started": "2025-01-01T00:00:00",
            }
        )
    )
    if rounds is not None:
        with open(folder / "rounds.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, ROUND_COLUMNS)
            writer.writeheader()
            writer.writerows(rounds)
    if attacks is not None:
        with open(folder / "attacks.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, ATTACK_COLUMNS)
            writer.writeheader()
            writer.writerows(attacks)
        if pngs:
            for i, row in enumerate(attacks):
                if row.get("image"):
                    write_png(folder / row["image"], seed=i)
    return folder


def round_rows(n: int, accuracy0: float = 0.5) -> list[dict]:
    return [
        {"round": r, "clients": 3, "train_loss": 2.0 / r, "eval_loss": 2.2 / r, "eval_accuracy": accuracy0 + 0.1 * r}
        for r in range(1, n + 1)
    ]


@pytest.fixture
def known_run(tmp_path) -> Path:
    """3 rounds; round 1 pisme psnr [10, 20, 30] + one failure; round 2 pisme [25] and sme [12, 18]."""
    attacks = [
        attack_row(1, 0, psnr=10),
        attack_row(1, 1, psnr=20),
        attack_row(1, 2, psnr=30),
        attack_row(1, 3, status="failed"),
        attack_row(2, 0, psnr=25),
        attack_row(2, 1, method="sme", psnr=12),
        attack_row(2, 2, method="sme", psnr=18),
        attack_row(3, 0, psnr=22, lpips=""),
    ]  # lpips missing although ok
    return make_run(tmp_path / "known", attacks, round_rows(3))


class TableParser(HTMLParser):
    """Collects every <table> as (classes, rows of cell texts) and every src/href attribute."""

    def __init__(self):
        super().__init__()
        self.tables: list[tuple[str, list[list[str]]]] = []
        self.links: list[str] = []
        self.images = 0
        self._cell: list[str] | None = None
        self._row: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.links += [attrs[key] for key in ("src", "href") if key in attrs]
        if tag == "img":
            self.images += 1
        if tag == "table":
            self.tables.append((attrs.get("class", ""), []))
        elif tag == "tr" and self.tables:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            if tag == "td":
                self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self.tables[-1][1].append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def table(self, cls: str) -> list[list[str]]:
        found = [rows for classes, rows in self.tables if cls in classes.split()]
        assert len(found) == 1, f"expected one table of class {cls}, found {len(found)}"
        return found[0]


def parse_report(path: Path) -> TableParser:
    parser = TableParser()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser


def as_number(text: str) -> float:
    return math.nan if text == "" else float(text)


# ---------------------------------------------------------------- aggregation


def test_t_quantile_fallback_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for dof in (1, 2, 5, 30, 31, 50, 200, 5000):
        assert _t975_fallback(dof) == pytest.approx(scipy_stats.t.ppf(0.975, dof), abs=1e-5)
    assert t_quantile_975(2) == pytest.approx(T_0975_DF2)
    with pytest.raises(ValueError, match="dof must be >= 1, got 0"):
        t_quantile_975(0)


def test_mean_ci95_by_hand():
    half = T_0975_DF2 * 10.0 / math.sqrt(3)  # sd of [10, 20, 30] is 10
    assert mean_ci95([10, 20, 30]) == pytest.approx((20.0, 20 - half, 20 + half))
    mean, low, high = mean_ci95([7.0])
    assert mean == 7.0 and math.isnan(low) and math.isnan(high)
    # Two values: no interval; PSNR's interval stops at 0 dB.
    assert mean_ci95([12, 18])[0] == 15.0 and all(math.isnan(v) for v in mean_ci95([12, 18])[1:])
    assert mean_ci95([10, 20, 30], "psnr") == pytest.approx((20.0, 0.0, 20 + half))
    assert all(math.isnan(v) for v in mean_ci95([]))


def test_per_round_matches_hand_computation(known_run):
    table = per_round(load_run(known_run).attacks)
    assert list(zip(table["round"], table["method"])) == [(1, "pisme"), (2, "pisme"), (2, "sme"), (3, "pisme")]
    first = table.iloc[0]
    # The failed row is counted, not averaged.
    assert (first["n_attacks"], first["n_ok"], first["n_failed"]) == (4, 3, 1)
    half = T_0975_DF2 * 10.0 / math.sqrt(3)
    assert first["psnr_mean"] == pytest.approx(20.0)
    assert first["psnr_median"] == pytest.approx(20.0)
    assert first["psnr_ci95_low"] == 0.0  # 20 - half < 0 dB, clipped
    assert first["psnr_ci95_high"] == pytest.approx(20.0 + half)
    assert first["ssim_mean"] == pytest.approx(0.5)  # ssim = psnr / 40
    sme = table.iloc[2]
    assert sme["psnr_mean"] == pytest.approx(15.0)
    assert math.isnan(sme["psnr_ci95_high"])  # two values: no interval
    single = table.iloc[1]
    assert single["psnr_mean"] == 25.0 and math.isnan(single["psnr_ci95_low"])
    # lpips missing on the only ok row of round 3 -> NaN, psnr still there.
    last = table.iloc[3]
    assert math.isnan(last["lpips_mean"]) and last["psnr_mean"] == 22.0


def test_per_client(known_run):
    table = per_client(load_run(known_run).attacks).set_index(["partition_id", "method"])
    client0 = table.loc[(0, "pisme")]
    assert client0["rounds_attacked"] == 3
    assert (client0["psnr_mean"], client0["psnr_min"], client0["psnr_max"]) == pytest.approx((19.0, 10, 25))
    assert (client0["psnr_first"], client0["psnr_last"]) == (10.0, 22.0)
    failed_only = table.loc[(3, "pisme")]
    assert failed_only["n_failed"] == 1 and math.isnan(failed_only["psnr_mean"])
    assert math.isnan(failed_only["psnr_first"])


def test_compare_runs_shows_exactly_the_differing_keys(tmp_path):
    rows = [attack_row(1, 0, psnr=20)]
    a = load_run(make_run(tmp_path / "a", rows, round_rows(1), {"defense": "none", "seed": 0}, pngs=False))
    b = load_run(make_run(tmp_path / "b", rows, round_rows(2), {"defense": "dp", "seed": 1}, pngs=False))
    c = load_run(make_run(tmp_path / "c", rows, round_rows(2), {"defense": "dp", "seed": 0, "clip": 1.0}, pngs=False))
    table = compare_runs([a, b, c])
    fixed = [
        "name",
        "dataset",
        "methods",
        "rounds",
        "n_attacks",
        "n_failed",
        "psnr_mean",
        "ssim_mean",
        "lpips_mean",
        "label_accuracy_mean",
        "final_accuracy",
        "accuracy_source",
    ]
    assert list(table.columns) == fixed + ["defense", "seed", "clip"]
    assert list(table["defense"]) == ["none", "dp", "dp"]
    assert table["clip"].isna().tolist() == [True, True, False]
    assert table["final_accuracy"].tolist() == pytest.approx([0.6, 0.7, 0.7])
    assert table["accuracy_source"].tolist() == ["eval_accuracy"] * 3
    # Two runs with the same config: no config columns at all.
    assert list(compare_runs([a, a]).columns) == fixed
    assert compare_runs([a, a])["name"].nunique() == 2


def test_summary_sentences(known_run):
    sentences = summary_sentences(load_run(known_run), threshold=15)
    assert sentences[0] == (
        "Overall, pisme exceeded 15 dB in 4 of 6 attacks over 3 rounds; mean PSNR 21.4 dB, best round 2 (mean 25.0 dB)."
    )
    assert sentences[1].startswith("Overall, sme exceeded 15 dB in 1 of 2 attacks")
    # No sentence per round: the numbers are in the summary table.
    assert sentences[2:] == ["Model utility: eval accuracy 80.0% after round 3."]


# ---------------------------------------------------------------- partial and broken folders


def test_truncated_last_line_is_skipped_with_a_warning(known_run):
    attacks_csv = known_run / "attacks.csv"
    text = attacks_csv.read_text()
    cut = attack_row(3, 1, psnr=40)
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow([cut[c] for c in ATTACK_COLUMNS])
    line = buffer.getvalue()
    attacks_csv.write_text(text + line[: len(line) - 6])  # cut inside the image path, no line end
    with pytest.warns(MalformedLineWarning, match="row 10"):
        run = load_run(known_run)
    assert len(run.attacks) == 8
    assert 40.0 not in run.attacks["psnr"].tolist()
    # Cut inside a numeric field: wrong field count.
    attacks_csv.write_text(text + "3,1001,1,c1,pisme,femn")
    with pytest.warns(MalformedLineWarning, match="fields"):
        assert len(load_run(known_run).attacks) == 8
    # A complete last line without a line end is kept.
    attacks_csv.write_text(text + line)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_run(known_run).attacks) == 9


def test_rounds_csv_missing_and_bad_rows(tmp_path):
    rows = [attack_row(1, 0, psnr=20), attack_row(1, 1, status="failed")]
    folder = make_run(tmp_path / "partial", rows, rounds=None)
    tail = "," * (len(ATTACK_COLUMNS) - 20) + "x.png\n"  # the empty columns after status, then the image
    with open(folder / "attacks.csv", "a") as handle:
        handle.write("2,1,1,c1,pisme,femnist,none,20,4,200,recovered,abc" + ",1" * 6 + ",1.5,ok" + tail)
        handle.write("2,1,1,c1,pisme,femnist,none,20,4,200,recovered" + ",1" * 7 + ",1.5,maybe" + tail)
    with pytest.warns(MalformedLineWarning) as caught:
        run = load_run(folder)
    messages = " ".join(str(w.message) for w in caught)
    assert "psnr='abc' is not a number" in messages and "status='maybe'" in messages
    assert run.rounds.empty and list(run.rounds.columns) == ROUND_COLUMNS
    assert len(run.attacks) == 2
    out = tmp_path / "report"
    assert main([str(folder), "--out", str(out)]) == 0
    assert (out / "report.html").is_file()


def test_failed_rows_counted_not_averaged(tmp_path):
    rows = [attack_row(1, 0, psnr=30), attack_row(1, 1, status="failed", psnr=1000.0)]
    run = load_run(make_run(tmp_path / "f", rows, round_rows(1)))
    table = per_round(run.attacks)
    assert (table.loc[0, "n_attacks"], table.loc[0, "n_failed"]) == (2, 1)
    assert table.loc[0, "psnr_mean"] == 30.0
    assert compare_runs([run]).loc[0, "psnr_mean"] == 30.0


def test_empty_run_reports_no_attacks_yet(tmp_path):
    folder = make_run(tmp_path / "empty", [], rounds=[])
    run = load_run(folder)
    assert run.attacks.empty and run.rounds.empty
    assert per_round(run.attacks).empty and per_client(run.attacks).empty
    assert summary_sentences(run)[0].startswith("No attacks yet")
    path = write_report([folder], tmp_path / "out")
    text = path.read_text()
    assert "No attacks yet" in text
    parse_report(path)
    # Zero-byte attacks.csv and no config.json: still a run.
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "attacks.csv").write_text("")
    assert load_run(bare).attacks.empty and load_run(bare).name == "bare"
    assert "No attacks yet" in write_report([bare], tmp_path / "out2", fmt="md").read_text()


def test_not_a_run_folder(tmp_path, capsys):
    folder = tmp_path / "not-a-run"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    with pytest.raises(
        NotARunError,
        match=r"not-a-run is not an fl-attack run folder \(no config.json or "
        r"attacks.csv\)",
    ):
        load_run(folder)
    with pytest.raises(NotARunError):
        load_run(tmp_path / "does-not-exist")
    assert main([str(folder), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert err.startswith("error: ") and "is not an fl-attack run folder" in err


@pytest.mark.runtime
def test_cli_exit_code_2_in_a_subprocess(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "analysis.report", str(tmp_path), "--out", str(tmp_path / "o")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: {tmp_path} is not an fl-attack run folder (no config.json or attacks.csv)"
    )


# ---------------------------------------------------------------- the report


def test_report_html_is_self_contained_and_numbers_match(known_run, tmp_path, capsys):
    other = make_run(
        tmp_path / "other", [attack_row(1, 0, psnr=14), attack_row(1, 1, psnr=16)], round_rows(1), {"defense": "dp"}
    )
    out = tmp_path / "report"
    assert main([str(known_run), str(other), "--out", str(out), "--threshold", "15"]) == 0
    path = out / "report.html"
    assert capsys.readouterr().out.strip() == str(path)

    parser = parse_report(path)
    assert parser.links, "expected inlined images"
    assert all(link.startswith("data:image/png;base64,") or link.startswith("#") for link in parser.links)
    text = path.read_text()
    assert "http://" not in text and "https://" not in text and "<script" not in text.lower()
    # 2 runs: comparison + utility plot + PSNR plot + training + 2 heat maps + reconstructions.
    assert parser.images >= 6

    # Per-round table of the first run against a direct pandas recomputation from attacks.csv.
    raw = pd.read_csv(known_run / "attacks.csv")
    ok = raw[raw["status"] == "ok"]
    tables = [rows for classes, rows in parser.tables if "per-round" in classes.split()]
    assert len(tables) == 2
    rows = tables[0]
    expected = ok.groupby(["round", "method"])
    assert len(rows) == expected.ngroups
    for row in rows:
        round_, method = int(row[0]), row[1]
        group = raw[(raw["round"] == round_) & (raw["method"] == method)]
        values = ok[(ok["round"] == round_) & (ok["method"] == method)]
        assert row[2:4] == ["none", "recovered"]
        assert [int(x) for x in row[4:7]] == [len(group), len(values), int((group["status"] == "failed").sum())]
        cells = [as_number(x) for x in row[7:-2]]
        assert as_number(row[-2]) == pytest.approx(0.5 + 0.1 * round_) and row[-1] == "eval_accuracy"
        for i, metric in enumerate(METRICS):  # the verdict's first, empty in this run recorded before it
            column = (values["recovered"] / values["k"] if metric == "recovered_fraction" else values[metric]).dropna()
            mean = column.mean() if len(column) else math.nan
            median = column.median() if len(column) else math.nan
            if len(column) >= 3:
                half = t_quantile_975(len(column) - 1) * column.std(ddof=1) / math.sqrt(len(column))
            else:
                half = math.nan
            bottom, top = METRIC_RANGES[metric]
            for got, want in zip(
                cells[4 * i : 4 * i + 4], (mean, median, max(mean - half, bottom), min(mean + half, top))
            ):
                if math.isnan(want):
                    assert math.isnan(got), (round_, method, metric)
                else:
                    assert got == pytest.approx(want, rel=1e-3, abs=1e-4), (round_, method, metric)

    comparison = parser.table("comparison")
    assert len(comparison) == 2
    assert "Round 1: pisme recovered" not in text
    summary = parser.table("summary")
    assert [row[:4] for row in summary] == [
        [known_run.name, "pisme", "none", "recovered"],
        [known_run.name, "sme", "none", "recovered"],
        ["other", "pisme", "dp", "recovered"],
    ]
    # Exports.
    for name in ("summary", "per_round", "per_client", "comparison"):
        assert (out / f"{name}.csv").is_file()
    exported = pd.read_csv(out / "per_round.csv")
    assert exported.columns[0] == "run" and len(exported) == 5
    assert list(pd.read_csv(out / "comparison.csv").columns)[-1] == "defense"
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        assert not (out / "per_round.parquet").exists()
    else:
        assert pd.read_parquet(out / "per_round.parquet").shape == exported.shape
        assert pd.read_parquet(out / "comparison.parquet").shape == (
            2,
            len(pd.read_csv(out / "comparison.csv").columns),
        )


def test_report_embeds_best_and_worst_and_tolerates_missing_images(known_run, tmp_path):
    (known_run / "images/round-1/pisme/client-0.png").unlink()  # the worst of round 1
    path = write_report([known_run], tmp_path / "out")
    text = path.read_text()
    assert "best: client 2, PSNR 30.00 dB" in text
    assert "worst: client 0, PSNR 10.00 dB" in text and "image missing" in text
    # An image path leaving the run folder is not embedded.
    attacks_csv = known_run / "attacks.csv"
    attacks_csv.write_text(attacks_csv.read_text().replace("images/round-2/pisme/client-0.png", "../../etc/passwd"))
    assert "image missing: ../../etc/passwd" in write_report([known_run], tmp_path / "out").read_text()


def test_markdown_report(known_run, tmp_path):
    out = tmp_path / "md"
    assert main([str(known_run), "--out", str(out), "--format", "md"]) == 0
    text = (out / "report.md").read_text()
    assert "## Summary" in text and "| round | method |" in text
    for target in [line.split("](", 1)[1].split(")", 1)[0] for line in text.splitlines() if line.startswith("![")]:
        assert (out / target).is_file(), target
    assert (out / "figures" / "leakage_over_rounds.png").is_file()
    assert (out / "figures" / "leakage_vs_accuracy.png").is_file()


def test_report_shows_the_evidence_of_the_attacks_that_single_out_the_most(tmp_path):
    """Under the verdict, in HTML and in Markdown: the evidence pictures beside the grids of the (at most
    3) attacks that single out the most images, most first, with what their columns are; a run recorded
    before the evidence existed shows none, and alone gives a report without the section."""
    import base64

    from fl_attack.schema import evidence_path

    verdict = dict(k=32, recovered=4, guess_recovered=0, reid_chance=1 / 2032, recognized=0.3, psnr_margin=2.0)
    verdict |= dict(recognized_truth=0.9, recognized_guess=0.1, guess_psnr=18.0, guess_ssim=0.3, guess_lpips=0.6)
    singled = [0.25, 0.5, 0.125, 0.375]  # partitions 1, 3 and 0 single out the most, 2 the fewest
    rows = [attack_row(1, c, reidentified=fraction, **verdict) for c, fraction in enumerate(singled)]
    new = make_run(tmp_path / "new", rows, round_rows(1))
    pngs = []
    for c, row in enumerate(rows):
        write_png(new / evidence_path(row["image"]), seed=100 + c)
        pngs.append((new / evidence_path(row["image"])).read_bytes())
    old = make_run(tmp_path / "old", [attack_row(1, c, reidentified=0.5, **verdict) for c in range(2)], round_rows(1))

    text = write_report([new, old], tmp_path / "html").read_text()
    at = [text.find(base64.b64encode(pngs[c]).decode("ascii")) for c in (1, 3, 0)]
    assert -1 not in at and at == sorted(at) and at[-1] < text.index('<h2 id="summary">')
    assert base64.b64encode(pngs[2]).decode("ascii") not in text
    assert text.count('<div class="evidence">') == 1  # the old run has none
    assert "new, round 1, partition 1, pisme: 16 of 32 singled out. Rows: the reconstruction | its own " in text
    assert "the distances are 1 - SSIM to the reconstruction" in text

    text = write_report([new, old], tmp_path / "md", fmt="md").read_text()
    targets = [line.split("](", 1)[1].split(")", 1)[0] for line in text.splitlines() if line.startswith("![")]
    shown = [(tmp_path / "md" / t).read_bytes() for t in targets if "/evidence/" in t]
    assert shown == [pngs[1], pngs[3], pngs[0]]
    assert text.index("### Evidence") < text.index("## Summary")

    for fmt in FORMATS:
        assert "Evidence" not in write_report([old], tmp_path / f"old-{fmt}", fmt=fmt).read_text()


def make_big_run(folder: Path, n_rounds: int = 10, n_clients: int = 10) -> Path:
    rng = np.random.default_rng(0)
    attacks = [
        attack_row(r, c, psnr=float(15 + r + rng.normal(0, 3)))
        for r in range(1, n_rounds + 1)
        for c in range(n_clients)
    ]
    rng.shuffle(attacks)  # appended as attacks finish
    return make_run(folder, attacks, round_rows(n_rounds, 0.0), {"num-server-rounds": n_rounds})


def test_ten_rounds_ten_clients_report(tmp_path):
    folder = make_big_run(tmp_path / "big")
    start = time.perf_counter()
    path = write_report([folder], tmp_path / "out")
    seconds = time.perf_counter() - start
    print(f"10 rounds x 10 clients report: {seconds:.2f} s, {path.stat().st_size / 1e6:.2f} MB")
    assert len(parse_report(path).table("per-round")) == 10


@pytest.mark.runtime
@pytest.mark.slow
def test_report_renders_in_headless_chromium(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    other = make_run(
        tmp_path / "dp",
        [attack_row(r, c, psnr=10 + r + c) for r in (1, 2) for c in range(3)],
        round_rows(2),
        {"defense": "dp"},
    )
    path = write_report([make_big_run(tmp_path / "big", 4, 5), other], tmp_path / "out")
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=1280,2000",
            path.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert shot.is_file(), "chromium wrote no screenshot"
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (2000, 1280)
    assert pixels[..., :3].std() > 0.05, "screenshot is blank"


def test_mixed_config_types_and_mixed_runs(tmp_path):
    # 200 vs "200" differ as config values and cannot share one Parquet column type.
    a = make_run(tmp_path / "a", [attack_row(1, 0, psnr=21)], round_rows(1), {"attack-iterations": 200})
    b = make_run(tmp_path / "b", [], None, {"attack-iterations": "200"})
    out = tmp_path / "out"
    (out / "images").mkdir(parents=True)
    (out / "images" / "mine.txt").write_text("keep me")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_report([a, b], out)
        path = write_report([a, b], out, fmt="md")
    assert (out / "images" / "mine.txt").read_text() == "keep me"
    assert "No attacks yet" in path.read_text()
    comparison = pd.read_csv(out / "comparison.csv")
    assert list(comparison["attack-iterations"]) == [200, 200] and list(comparison["n_attacks"]) == [1, 0]
    if (out / "comparison.parquet").exists():
        assert pd.read_parquet(out / "comparison.parquet")["attack-iterations"].tolist() == ["200", "200"]


def test_the_config_table_states_the_problem_size(tmp_path):
    """Each run's parameters against the client's pixels (breaching's data ratio), as a span over
    its attacks (clients of other k), and the client optimizer; an older run without the columns
    shows nothing."""
    from analysis.report import _config_table

    rows = [
        attack_row(1, 0, psnr=20, parameters=1000, unknowns=784 * 2, optimizer="momentum 0.9"),
        attack_row(1, 1, psnr=21, parameters=1000, unknowns=784 * 4, optimizer="momentum 0.9"),
    ]
    run = load_run(make_run(tmp_path / "run", rows))
    table = dict(_config_table([run], ["run"]).values.tolist())
    assert table["model parameters"] == "1,000"
    assert table["client pixels k*C*H*W"] == "1,568 .. 3,136"
    assert table["pixels per parameter"] == "1.568 .. 3.136"
    assert table["client optimizer"] == "momentum 0.9"
    old = [{k: v for k, v in attack_row(1, 0, psnr=20).items() if k not in ("parameters", "unknowns", "optimizer")}]
    assert (
        dict(_config_table([load_run(make_run(tmp_path / "old", old))], ["old"]).values.tolist())["model parameters"]
        is None
    )
