"""Unit tests of analysis.studies.plan_run, what a study does with a run folder it finds (no federation
runs here; tests/test_frontier_runs.py kills and resumes a real one)."""

from __future__ import annotations

import json

from analysis.studies import plan_run

CONFIG = {"num-server-rounds": 1, "samples-per-client": 8}


def test_a_finished_run_is_kept_as_it_is(tmp_path):
    folder = tmp_path / "runs" / "none"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"run_config": CONFIG}))
    (folder / "summary.json").write_text('{"rounds": 1}')
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    said = []
    assert plan_run(folder, CONFIG, 3, log=said.append) is None  # nothing to launch
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before and said == []
    assert [p.name for p in folder.parent.iterdir()] == ["none"]  # nothing set aside


def test_a_run_killed_before_its_first_checkpoint_is_set_aside_and_restarted(tmp_path):
    folder = tmp_path / "runs" / "quantize-1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"run_config": CONFIG}))
    said = []
    values = plan_run(folder, CONFIG, 3, log=said.append)
    assert values == {**CONFIG, "results-dir": str(folder.parent), "run-name": "quantize-1"}  # no "resume"
    (aside,) = folder.parent.glob("quantize-1.set-aside-*")
    assert (aside / "config.json").is_file() and not folder.exists()
    assert len(said) == 1 and said[0].startswith("restarting quantize-1: its unfinished run cannot be resumed")


def test_an_empty_folder_starts_a_run_and_without_reuse_nothing_is_checked(tmp_path):
    folder = tmp_path / "runs" / "topk-0.01"
    values = {**CONFIG, "results-dir": str(folder.parent), "run-name": "topk-0.01"}
    assert plan_run(folder, CONFIG, 3) == values
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text("{}")
    assert plan_run(folder, CONFIG, 3, reuse=False) == values  # the launcher refuses a folder holding a run
