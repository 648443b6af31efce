"""The privacy-utility frontier (analysis/frontier.py, analysis/frontier_figure.py, analysis/docs.py's
frontier block): its grid, each setting's row read from a real run folder's verdict, the table and the
figures written from frontier.csv alone.

tests/golden/frontier/ is a fixture, NOT the study: the records of a real tiny run of the frontier grid
(3 settings, 3 writers of 8 samples, 3 rounds, 20 attack iterations; its README says how it was made).
The study's own record, once the lead runs it, is docs/frontier/."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pandas as pd
import pytest

from analysis import docs
from analysis.frontier import (
    CENTRAL_DP_NOTE,
    FRONTIER_COLUMNS,
    REGIME,
    REGIME_ROUNDS,
    REGIME_SUPERNODES,
    attack_rounds,
    dp_bound,
    frontier_grid,
    frontier_row,
    participants_fraction,
    read_frontier,
    run_config,
    run_grid,
    write_frontier,
)
from analysis.frontier_figure import frontier_markdown, pareto, plot_frontier, plot_rounds
from analysis.plots import save_figure
from fl_attack.audit.settings import RunSettings

FIXTURE = Path(__file__).parent / "golden" / "frontier"


def _fixture_settings():
    table = read_frontier(FIXTURE / "frontier.csv")
    grid = {s.name: s for s in frontier_grid(3)}
    return table, [grid[name] for name in table["setting"]]


# --- the grid -----------------------------------------------------------------------------------------------


def test_every_setting_is_a_valid_run_config_that_pins_no_attack_budget():
    """Each setting's whole run config passes the run config's own checks, attacks the panel 0,1,2 (every
    aggregate under secagg) in the first, a middle and the last round, and leaves the attack's iterations,
    nodes and schedule to pyproject.toml's defaults (the lead changes them; the grid runs whatever they are)."""
    grid = frontier_grid()
    assert len({s.name for s in grid}) == len(grid)
    families = {s.family for s in grid}
    assert {"none", "local-dp", "central-dp (server clipping)", "central-dp (client clipping)", "topk"} <= families
    assert {"low-rank", "quantize", "secagg", "local-dp+secagg (5)"} <= families
    for family in families - {"none"}:
        strengths = [s.strength for s in grid if s.family == family]
        assert len(strengths) >= 1 and all(math.isfinite(x) for x in strengths), family
    eps = sorted(s.strength for s in grid if s.family == "local-dp")
    assert eps[0] <= 1 and eps[-1] >= 1000  # epsilon per round across 1-1,000
    assert {s.config["defense-clipping"] for s in grid if s.family.startswith("central-dp")} == {"server", "client"}
    for s in grid:
        config = run_config(s, REGIME_ROUNDS)
        assert not {"attack-iterations", "attack-nodes", "attack-lr-schedule"} & set(config), s.name
        assert config["attack-rounds"] == f"1,{(REGIME_ROUNDS + 1) // 2},{REGIME_ROUNDS}"
        settings = RunSettings.from_run_config(config)  # raises for any bad key or value
        if settings.defense.secagg:
            assert config["attack-clients"] == "all" and config["attack-memory"] == "none"
            participants = int(REGIME_SUPERNODES * config["fraction-train"])
            assert participants == (s.strength if s.family == "secagg" else 5)
        else:
            assert config["attack-clients"] == "0,1,2" and config["attack-memory"] == "keep"
            assert config["fraction-train"] == 1.0
        assert config["attack-options"] == "label_estimator=aux" and config["samples-per-client"] >= 64


def test_attack_rounds_and_participants():
    assert [attack_rounds(r) for r in (1, 2, 3, 20, 25)] == ["1", "1,2", "1,2,3", "1,10,20", "1,13,25"]
    for n in range(3, 101):  # Flower's count max(int(n * F), 1) gives exactly the participants asked for
        assert all(max(int(n * participants_fraction(p, n)), 1) == p for p in range(1, n + 1))
    with pytest.raises(ValueError, match="participants must be in 1..3"):
        participants_fraction(4, 3)


def test_the_regime_is_the_documented_one():
    """docs/defenses.md states the regime; the module is what runs."""
    page = (docs.ROOT / "docs" / "defenses.md").read_text()
    assert f"{REGIME_SUPERNODES} writers" in page and f"{REGIME_ROUNDS} rounds" in page
    assert f"k = {REGIME['samples-per-client']}" in page and f"E = {REGIME['local-epochs']}" in page


# --- the bound ----------------------------------------------------------------------------------------------


def _bound_written_out(guess: int, images: int, epsilon: float, delta: float, rounds: int, target_delta: float):
    """DP's bound for LocalDpMod written out here (no fl_attack.privacy code): κ the one-sided 95%
    Clopper-Pearson upper bound (closed form 1 - 0.05^(1/n) at 0 of n), z = sqrt(2 ln(1.25/δ))/ε, μ =
    sqrt(rounds)/z, the GDP bound Φ(Φ⁻¹(κ) + μ); the (ε, δ) reading e^ε' κ + δ' at the same mechanism's
    exact ε' at δ' is never tighter for a Gaussian, so the GDP one is the row's."""
    from scipy.stats import beta, norm

    kappa = 1 - 0.05 ** (1 / images) if guess == 0 else float(beta.ppf(0.95, guess + 1, images - guess))
    mu = math.sqrt(rounds) / (math.sqrt(2 * math.log(1.25 / delta)) / epsilon)
    return min(1.0, float(norm.cdf(norm.ppf(kappa) + mu)))


def test_the_dp_bound_is_the_gaussian_rero_formula_written_out():
    config = {"defense-clip-norm": 3.0, "defense-epsilon": 1.0, "defense-delta": 1e-5, "defense-target-delta": 1e-5}
    for guess, images, rounds in ((0, 192, 1), (0, 192, 30), (3, 192, 15), (0, 24, 1)):
        bound = dp_bound(guess, images, config, rounds)
        assert bound.name == "gdp"
        assert bound.bound == pytest.approx(_bound_written_out(guess, images, 1.0, 1e-5, rounds, 1e-5), rel=1e-9)
    assert dp_bound(0, 192, {**config, "defense-epsilon": 100.0}, 30).vacuous  # ε = 100 promises nothing
    assert dp_bound(math.nan, 192, config, 3) is None and dp_bound(0, 0, config, 3) is None


# --- a setting's row, from the fixture's real records ------------------------------------------------------


def test_each_row_is_read_from_its_run_folders_verdict():
    """frontier_row of each fixture run folder gives the fixture's frontier.csv row, and its headline is
    the verdict's own columns of attacks.csv: the remembering server's latest row per tracked writer (the
    aggregate's last round under secagg), summed, with an exact interval around it."""
    table, settings = _fixture_settings()
    assert len(settings) >= 2
    for setting, expected in zip(settings, table.to_dict("records")):
        row = frontier_row(setting, FIXTURE / "runs" / setting.name)
        for column in FRONTIER_COLUMNS:
            got, want = row[column], expected[column]
            if isinstance(want, float) and math.isnan(want):
                assert got is None or got == "" or (isinstance(got, float) and math.isnan(got)), (setting.name, column)
            elif isinstance(want, float):
                assert float(got) == pytest.approx(want, rel=1e-6, abs=1e-9), (setting.name, column)
            else:
                assert str(got) == str(want), (setting.name, column)
        attacks = pd.read_csv(FIXTURE / "runs" / setting.name / "attacks.csv")
        ok = attacks[attacks["status"] == "ok"]
        memory = ok[ok["method"] == "pisme+memory"]
        if len(memory):
            end = memory.sort_values("round").groupby("partition_id").tail(1)
            assert row["end_method"] == "pisme+memory" and set(end["partition_id"]) == {0, 1, 2}
        else:  # secagg: the aggregate of the last attacked round, its k = the participants' images
            end = ok[ok["round"] == ok["round"].max()]
            assert end["partition_id"].isna().all() and int(end["k"].sum()) == row["images"]
        assert row["recovered"] == end["recovered"].sum() and row["images"] == end["k"].sum()
        assert row["guess_recovered"] == end["guess_recovered"].sum()
        assert row["fraction_low"] <= row["fraction"] <= row["fraction_high"]
        curve = json.loads(row["accuracy_curve"])
        rounds = pd.read_csv(FIXTURE / "runs" / setting.name / "rounds.csv")
        assert curve == [round(a, 4) for a in rounds["global_accuracy"]] and row["final_accuracy"] == curve[-1]
        by_round = json.loads(row["recovered_by_round"])
        assert row["best_recovered"] == max(c[0] for c in by_round.values())
        if "local-dp" in row["defense"]:
            assert row["epsilon"] > 0 and 0 < row["dp_bound"] <= 1 and row["dp_bound_name"] == "gdp"
            written = _bound_written_out(
                int(row["guess_recovered"]), int(row["images"]), 1.0, 1e-5, int(row["end_round"]), 1e-5
            )
            assert row["dp_bound"] == pytest.approx(written, rel=1e-9) and row["dp_alarm"] == ""
        else:
            assert math.isnan(row["dp_bound"])


def test_central_dp_rows_say_the_promise_does_not_cover_this_server(tmp_path):
    """A central-dp row's note says so and it has no bound (made from the fixture's none record, its
    run config and defense rewritten: a unit test)."""
    import shutil

    _, settings = _fixture_settings()
    run = tmp_path / "central"
    shutil.copytree(FIXTURE / "runs" / "none", run)
    config = json.loads((run / "config.json").read_text())
    config["run_config"]["defense"] = "central-dp"
    config["defense"]["label"] = "central-dp(server,z=1,C=0.7)"
    (run / "config.json").write_text(json.dumps(config))
    central = next(s for s in frontier_grid(3) if s.family.startswith("central-dp"))
    row = frontier_row(central, run)
    assert row["dp_note"] == CENTRAL_DP_NOTE and math.isnan(row["dp_bound"])


def test_frontier_csv_is_written_whole_and_read_back(tmp_path):
    table, _ = _fixture_settings()
    rows = table.to_dict("records")
    path = write_frontier(tmp_path / "frontier.csv", rows)
    assert read_frontier(path).equals(table)
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic writer left no temporary file
    pd.DataFrame({"setting": ["x"]}).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match="is not a frontier.csv: no family"):
        read_frontier(tmp_path / "bad.csv")


# --- the table, the figures, the docs block ------------------------------------------------------------------


def test_pareto_front():
    table = pd.DataFrame({"final_accuracy": [0.6, 0.5, 0.55, 0.2, math.nan], "fraction": [0.3, 0.1, 0.2, 0.25, 0.0]})
    assert list(pareto(table)) == [True, True, True, False, False]
    table.loc[2, "fraction"] = 0.35  # now beaten by setting 0 (more accurate, fewer images)
    assert list(pareto(table)) == [True, True, False, False, False]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_the_docs_block_and_figures_are_written_from_the_fixture(tmp_path):
    """The generator's frontier block from the fixture: one table line per setting with its count and
    interval, the Pareto front in bold, the figures linked; the figures are PNGs."""
    table, _ = _fixture_settings()
    block = docs.frontier_block(FIXTURE, second=tmp_path / "no-second")  # the repo's second record aside
    assert block.startswith(docs._generated("frontier"))
    lines = [line for line in block.splitlines() if line.startswith("|")]
    assert len(lines) == 2 + len(table)
    front = pareto(table)
    for (i, row), line in zip(table.iterrows(), lines[2:]):
        name = f"**{row.setting}**" if front[i] else row.setting
        assert line.startswith(f"| {name} |")
        assert f"{int(row.recovered)} of {int(row.images)}: {100 * row.fraction:.1f}%" in line
    assert "frontier.png)" in block and "frontier-rounds.png)" in block
    assert frontier_markdown(table) in block + "\n"
    for plot, name in ((plot_frontier, "frontier.png"), (plot_rounds, "rounds.png")):
        width, height = _png_size(save_figure(plot(table), tmp_path / name))
        assert width >= 600 and height >= 250


def test_the_committed_block_is_the_generators():
    """docs/defenses.md's frontier block is what `python -m analysis.docs frontier` writes from docs/frontier/."""
    page = (docs.ROOT / docs.DEFENSES_PAGE).read_text()
    expected = docs.with_blocks(page, {"frontier": docs.frontier_block(docs.ROOT / docs.FRONTIER_RECORD)})
    assert page == expected, "docs/defenses.md's frontier block is stale: python -m analysis.docs frontier"


def test_a_study_run_part_by_part_keeps_the_rows_of_settings_not_run_now(tmp_path):
    """A unit test (no run): run_grid of no settings over an out folder whose frontier.csv has rows keeps them,
    in the grid's order; a setting of this call is not taken from the old file (its run writes its row)."""
    table, settings = _fixture_settings()
    write_frontier(tmp_path / "frontier.csv", table.to_dict("records"))
    order = [s.name for s in settings]
    rows, failed = run_grid(tmp_path, [], 3, 3, resume=True, grid_order=list(reversed(order)))
    assert [r["setting"] for r in rows] == list(reversed(order)) and not failed
    rows, _ = run_grid(tmp_path, [], 3, 3, resume=True, grid_order=order[:1])  # only the grid's settings
    assert [r["setting"] for r in rows] == order[:1]


def test_a_submission_waits_for_the_clusters_job_agent():
    """A unit test on a fake client: Ray's "No available agent" refusal (a cluster still starting its dashboard
    agent) is asked again until the job is taken; any other error, or the last refusal, is raised."""
    from analysis.ray_jobs import NO_AGENT, _submit

    class Client:
        def __init__(self, refusals, error=NO_AGENT):
            self.refusals, self.error, self.asked = refusals, error, 0

        def submit_job(self, **job):
            self.asked += 1
            if self.asked <= self.refusals:
                raise RuntimeError(f"Request failed with status code 500: {self.error} to submit job, try again later")
            return job["submission_id"]

    said = []
    client = Client(3)
    assert _submit(client, {"submission_id": "j1"}, 0.0, said.append) == "j1" and client.asked == 4
    assert len(said) == 1  # said once, not per attempt
    with pytest.raises(RuntimeError, match=NO_AGENT):
        _submit(Client(5), {"submission_id": "j2"}, 0.0, said.append, waits=2)
    with pytest.raises(RuntimeError, match="boom"):
        _submit(Client(1, error="boom"), {"submission_id": "j3"}, 0.0, said.append)


def test_the_study_records_each_call_and_the_docs_say_how_it_ran(tmp_path):
    """A unit test (no run): record_call keeps one entry per call (rewritten at its end), and the generated
    block lists each call's command, commit and times, a killed one as never ended."""
    from analysis.studies import record_call

    first = {"command": "python -m analysis.defenses --grid frontier", "commit": "abc", "started": "t1"}
    record_call(tmp_path, {**first, "ended": None, "seconds": None, "settings": {}})
    record_call(tmp_path, {**first, "ended": "t2", "seconds": 1800.0, "settings": {"none": 1790.0}})
    # the next call finds none done (0.0 s) and is stopped while topk runs, after finishing quantize
    killed = {"none": 0.0, "quantize-1": 900.0}
    record_call(tmp_path, {**first, "started": "t3", "ended": None, "seconds": None, "settings": killed})
    calls = json.loads((tmp_path / "study.json").read_text())["calls"]
    assert [c["started"] for c in calls] == ["t1", "t3"] and calls[0]["settings"] == {"none": 1790.0}
    text = "\n".join(docs.study_calls(tmp_path))
    assert "at abc, t1: 30.0 min (none 29.8 min)" in text
    assert "- the same command at abc, t3: not ended when recorded" in text and "(quantize-1 15.0 min)" in text
    assert "2 setting(s), 0.75 h together." in text  # 1790 + 900 s: the done none not counted twice
    # a setting that every call found done ran before the record began: named, not summed
    record_call(tmp_path, {**first, "started": "t4", "ended": "t5", "seconds": 5.0, "settings": {"secagg-2": 0.0}})
    text = "\n".join(docs.study_calls(tmp_path))
    assert "0.75 h together; not in the sum, found done by these calls (run before this record): `secagg-2`." in text


def test_frontier_record_names_the_studys_folder_out(tmp_path):
    """A unit test: the recorded commands name the study's folder OUT, not this machine's path."""
    study = tmp_path / "somewhere" / "study"
    study.mkdir(parents=True)
    (study / "frontier.csv").write_text((FIXTURE / "frontier.csv").read_text())
    command = f"python -m analysis.defenses --grid frontier --out {study} --resume"
    (study / "study.json").write_text(json.dumps({"calls": [{"command": command, "started": "t"}]}))
    docs.copy_frontier(study, tmp_path / "record")
    recorded = json.loads((tmp_path / "record" / "study.json").read_text())["calls"][0]["command"]
    assert recorded == "python -m analysis.defenses --grid frontier --out OUT --resume"
    assert (tmp_path / "record" / "frontier.csv").read_text() == (FIXTURE / "frontier.csv").read_text()


def test_frontier_record_keeps_each_settings_attack_and_round_rows(tmp_path):
    """A unit test: each recorded setting's attacks.csv and rounds.csv come with the record, nothing else of
    its run folder (its config.json names this machine's folders)."""
    study = tmp_path / "study"
    shutil.copytree(FIXTURE, study)
    (study / "runs" / "none" / "config.json").write_text('{"results-dir": "/somewhere/on/this/machine"}')
    docs.copy_frontier(study, tmp_path / "record")
    settings = sorted(read_frontier(FIXTURE / "frontier.csv")["setting"])
    assert sorted(p.name for p in (tmp_path / "record" / "runs").iterdir()) == settings
    for setting in settings:
        kept = tmp_path / "record" / "runs" / setting
        assert sorted(p.name for p in kept.iterdir()) == ["attacks.csv", "rounds.csv"]
        assert (kept / "attacks.csv").read_bytes() == (FIXTURE / "runs" / setting / "attacks.csv").read_bytes()


def test_the_findings_are_checked_on_the_second_seed(tmp_path):
    """A unit test on the fixture's rows: a setting is a finding only when both seeds agree on whether it held
    the server at its floor (neither count above the best guess's); one that flips, or is missing at the
    second seed, is said so; the accuracy cost is against none of the same seed. The block names the second
    record's seed from its study.json."""
    from analysis.frontier_figure import accuracy_cost, at_floor, findings_markdown

    first = read_frontier(FIXTURE / "frontier.csv")
    second = first[first["setting"] != "secagg-2"].copy()
    second.loc[second["setting"] == "local-dp-eps1", "best_recovered"] = 2.0  # above its best guess of 0
    assert [at_floor(r) for r in first.itertuples()] == [False, True, False]
    assert [at_floor(r) for r in second.itertuples()] == [False, False]
    assert list(accuracy_cost(first).round(1)) == [0.0, 6.4, 5.4]  # none at 9.0%
    text = findings_markdown(first, second, (0, 1))
    assert (
        "| local-dp-eps1 | 6.4 / 6.4 points | 0 of 24 / 0 of 24 | 0 of 24 / 2 of 24 | 0 of 24 / 0 of 24 | yes / no |"
        in text
    )
    assert (
        "- **At the floor at both seeds** (no attacked round beat the best update-free guess), with the accuracy "
        "each cost (seed 0 / 1): no setting." in text
    )
    assert "- **Above the floor at both seeds**: no setting." in text  # none is the baseline, not a finding
    assert "- **The seeds disagree** (no finding): local-dp-eps1." in text
    assert "the server recovers 6 of 24 / 6 of 24 at the end and 6 of 24 / 6 of 24 in its best round" in text
    assert (
        "- **Not run at seed 1 yet**, seed 0's reading only: at its floor, cheapest first: no setting; "
        "above it or without a count: secagg-2." in text
    )
    # a setting not run at the second seed keeps the first seed's reading, labelled as that seed's
    only_first = findings_markdown(first, first[first["setting"] == "none"], (0, 1))
    assert "at its floor, cheapest first: local-dp-eps1 (6.4 points); above it or without a count: secagg-2." in (
        only_first
    )
    record = tmp_path / "second"
    record.mkdir()
    write_frontier(record / "frontier.csv", second.to_dict("records"))
    command = "python -m analysis.defenses --grid frontier --seed 1 --out OUT --resume"
    (record / "study.json").write_text(json.dumps({"calls": [{"command": command, "started": "t", "settings": {}}]}))
    assert docs.record_seed(record) == 1 and docs.record_seed(FIXTURE) == 0
    block = docs.frontier_block(FIXTURE, second=record)
    assert "accuracy cost, seed 0 / 1" in block and text.rstrip("\n") in block
    assert "Not run yet" in docs.frontier_block(FIXTURE, second=tmp_path / "nothing")


def test_before_a_second_seed_the_block_gives_this_seeds_findings_cheapest_first(tmp_path):
    """A unit test on the fixture's rows: without a second record the block still answers "which setting
    holds the floor, at what cost", labelled as one seed's: the settings at the floor sorted by their accuracy
    cost against none (a made-up cheaper one goes first), those above it, and none's own margin."""
    from analysis.frontier_figure import seed_findings_markdown

    table = read_frontier(FIXTURE / "frontier.csv")
    extra = table[table["setting"] == "local-dp-eps1"].copy()
    extra["setting"], extra["final_accuracy"] = "quantize-1", table["final_accuracy"].iloc[0] - 0.01
    text = seed_findings_markdown(pd.concat([table, extra], ignore_index=True), 0)
    assert (
        "- **At the floor at seed 0** (neither the count at the end nor the best round's above the best guess's), "
        "cheapest first, with the accuracy each cost against `none`: quantize-1 (1.0 points), "
        "local-dp-eps1 (6.4 points)." in text
    )
    assert "- **Above the floor at seed 0**: secagg-2." in text
    assert "recovers 6 of 24 at the end and 6 of 24 in its best round, against a best guess of 0 of 24" in text
    block = docs.frontier_block(FIXTURE, second=tmp_path / "nothing")
    assert "a finding of this seed only" in block and seed_findings_markdown(table, 0).rstrip("\n") in block


def test_a_setting_whose_later_attacks_failed_says_so_in_its_end_cell():
    """A unit test on the fixture's rows: when the last scored attacks are before the last round (the later
    ones failed, e.g. a diverged model's non-finite updates), the table names that round and the failures."""
    table = read_frontier(FIXTURE / "frontier.csv")

    def cell(name: str) -> str:
        return next(li for li in frontier_markdown(table).splitlines() if li.startswith(f"| {name} |")).split(" | ")[3]

    assert cell("**none**") == "6 of 24: 25.0% (10–47%)"  # scored in every attacked round up to the last
    assert cell("**local-dp-eps1**") == "0 of 24: 0.0% (0–14%), at round 1"  # its run attacked round 1 only
    table.loc[table["setting"] == "none", ["end_round", "attacks_ok", "attacks"]] = [1.0, 6.0, 14.0]
    assert cell("**none**") == "6 of 24: 25.0% (10–47%), at round 1 (8 of 14 attacks failed)"
