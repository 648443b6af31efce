"""The generated docs (analysis/docs.py) match the code and the record they are written from: a page or a
README block edited by hand, or code changed without regenerating them, fails here with the command that
rewrites them."""

from __future__ import annotations

import json
import re
from dataclasses import fields

import pytest

from analysis import docs
from fl_attack.audit import runs
from fl_attack.run_config import RunSettings

ROOT = docs.ROOT


def _stale(path, command) -> str:
    return f"{path} is out of date; rewrite it with `python -m analysis.docs {command}` and commit it"


def test_run_config_page_is_current():
    assert (ROOT / docs.RUN_CONFIG_PAGE).read_text() == docs.run_config_page(), _stale(
        docs.RUN_CONFIG_PAGE, "run-config"
    )


def test_run_folder_page_is_current():
    assert (ROOT / docs.RUN_FOLDER_PAGE).read_text() == docs.run_folder_page(), _stale(
        docs.RUN_FOLDER_PAGE, "run-folder"
    )


def test_readme_demo_blocks_are_the_records():
    readme = (ROOT / docs.README).read_text()
    assert readme == docs.with_blocks(readme, docs.demo_blocks(ROOT / docs.DEMO_RECORD)), (
        "README.md's demo blocks differ from docs/demo-record/; rewrite them with `python -m analysis.docs "
        "demo-block` (or record a new `make demo` run: `make demo-docs`)"
    )


def test_demo_block_holds_every_verdict_line():
    summary = json.loads((ROOT / docs.DEMO_RECORD / "summary.json").read_text())
    block = docs.demo_blocks(ROOT / docs.DEMO_RECORD)["demo"]
    assert summary["verdict"]["lines"]
    for line in summary["verdict"]["lines"]:
        assert f"\n  {line}\n" in block


def test_every_column_is_described():
    assert list(runs.ROUND_DESCRIPTIONS) == list(runs.ROUNDS)
    assert list(runs.ATTACK_DESCRIPTIONS) == list(runs.ATTACKS)
    assert all(text.strip() for text in [*runs.ROUND_DESCRIPTIONS.values(), *runs.ATTACK_DESCRIPTIONS.values()])


def test_every_file_of_run_folder_is_listed():
    folder = runs.RunFolder("RUN")
    paths = [
        getattr(folder, name) for name in dir(runs.RunFolder) if isinstance(getattr(runs.RunFolder, name), property)
    ]
    names = {p.name for p in paths if hasattr(p, "name")}
    listed = {name.split("/")[0] for name in runs.FOLDER_FILES}  # "replays/NAME/": replays
    assert names - listed == set()
    assert set(runs.RUN_FILES) <= listed


def test_every_key_has_one_owner():
    owned = [key for _, _, keys in docs.owners() for key in keys]
    assert len(owned) == len(set(owned))
    assert sorted(owned) == sorted(docs.pyproject_config())
    federation_and_audit = {f.name for f in fields(RunSettings)} - {"defense", "num_partitions", "extra"}
    assert len(federation_and_audit) == sum(len(keys) for title, _, keys in docs.owners() if "defense" not in title)


@pytest.mark.parametrize(
    "key, value",
    [("attack-batch", "0"), ("seed", -1), ("defense-bits", 17), ("attack-rounds", "every:0"), ("lr", 0.0)],
)
def test_the_page_quotes_the_check_that_raises(key, value):
    """The message the page gives for a key is the one a bad value gets ({...} filled in)."""
    page_checks = [
        check
        for _, cls, keys in docs.owners()
        if key in keys
        for check in docs.checks_of(key, docs._source_strings(cls))
    ]
    with pytest.raises(ValueError) as info:
        RunSettings.from_run_config({key: value})
    message = str(info.value).removeprefix(docs.PREFIX)
    patterns = [
        "".join(".*" if part.startswith("{") else re.escape(part) for part in re.split(r"(\{[^}]*\})", c))
        for c in page_checks
    ]
    assert any(re.fullmatch(p, message) for p in patterns), (message, page_checks)


def test_with_blocks_needs_its_markers():
    with pytest.raises(ValueError, match="demo:begin"):
        docs.with_blocks("no markers", {"demo": "x"})
    text = "a\n<!-- demo:begin -->\nold\n<!-- demo:end -->\nb\n"
    assert docs.with_blocks(text, {"demo": "new"}) == "a\n<!-- demo:begin -->\nnew\n<!-- demo:end -->\nb\n"


def test_copy_record_takes_the_record_alone(tmp_path):
    run = tmp_path / "run"
    (run / "images").mkdir(parents=True)
    for name in (*docs.RECORD_FILES, "events.log", "images/x.png"):
        (run / name).write_text(name)
    to = tmp_path / "record"
    (to).mkdir()
    (to / "stale.csv").write_text("old")
    docs.copy_record(run, to)
    assert sorted(p.name for p in to.iterdir()) == sorted(docs.RECORD_FILES)
    with pytest.raises(ValueError, match="not a finished run folder"):
        docs.copy_record(tmp_path / "nothing", to)
    docs.copy_record(to, to)  # onto itself: kept as it is
    assert sorted(p.name for p in to.iterdir()) == sorted(docs.RECORD_FILES)


def test_check_writes_nothing_and_names_the_command(monkeypatch, capsys):
    assert docs.main(["all", "--check"]) == 0
    monkeypatch.setattr(docs, "run_folder_page", lambda: "stale\n")
    before = (ROOT / docs.RUN_FOLDER_PAGE).read_text()
    assert docs.main(["run-folder", "--check"]) == 1
    assert "rewrite with: python -m analysis.docs run-folder" in capsys.readouterr().err
    assert (ROOT / docs.RUN_FOLDER_PAGE).read_text() == before
