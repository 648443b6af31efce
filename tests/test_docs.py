"""The generated docs (analysis/docs.py) match the code and the record they are written from: a page or a
README block edited by hand, or code changed without regenerating them, fails here with the command that
rewrites them."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from analysis import docs
from fl_attack import schema as runs
from fl_attack.audit.run_folder import RunFolder
from fl_attack.audit.settings import RunSettings

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


def test_the_trajectory_table_and_its_records_are_current():
    """docs/time-to-quality.md's trajectory table, trajectory.csv and trajectory.md are what the contenders'
    results.csv make (analysis.experiments.trajectory): none by hand; a finished contender of each set is in."""
    made = docs.trajectory_outputs()
    for path, text in made.items():
        assert (ROOT / path).read_text() == text, _stale(path, "trajectory")
    assert "| dimitrov-T100 | 100 | m7-steps-400 | 7 | 400 |" in made[docs.TIME_TO_QUALITY_PAGE]


def test_record_tables_are_their_records():
    """Every table of analysis/docs_tables BLOCKS on its page is what its records make: a figure edited
    by hand, or a record changed without regenerating, fails here."""
    from analysis import docs_tables

    made = docs.record_outputs()
    assert set(made) == set(docs_tables.BLOCKS)
    for path, text in made.items():
        assert (ROOT / path).read_text() == text, _stale(path, "records")


def test_leakage_verdict_table_reads_its_record():
    """The dated leakage page's verdict table holds the 2026-12-06 record's round 15 (mean of three writers:
    2 of 16 recovered, 35% singled out, PSNR 1.44 dB under the guess), not the 2026-12-04 figures it
    held by hand (2.7 / 42% / -2.2)."""
    from analysis import docs_tables

    block = docs_tables.leakage_verdict()
    assert "| images recovered (of 16) | 7.7 |" in block and block.split("\n")[-3].endswith("| 2.0 |")
    assert block.split("\n")[-2].endswith("| 35% |") and block.split("\n")[-1].endswith("| −1.4 |")


def test_privacy_budget_table_reads_its_record():
    """The privacy-budget page's table has one row per setting of its record, its ε written as the page
    reads it (central-dp z = 1: 11.5 spent after 10 rounds; z = 0.01: 5.5·10⁴)."""
    from analysis import docs_tables

    block = docs_tables.privacy_budget()
    assert sum(line.startswith("|") for line in block.splitlines()) == 2 + 7  # header, rule, seven settings
    assert "| central-dp-z1 | `central-dp(server,z=1,C=0.5)` | 12/12 | 11.5 | 10.52 |" in block
    assert "| 5.5·10⁴ |" in block and docs_tables._epsilon(float("nan")) == "-"


def test_real_federations_verdict_table_reads_its_records():
    """real-federations.md's verdict table sums the paper run's rerun record (30 and 32 of its 48 images,
    not the 32 and 34 of the run before it that the page once kept), and its optimizer table pairs the
    aware and naive attacks of one update (momentum at T=10, seed 0: aware ahead on all 5 victims)."""
    from analysis.docs_tables import federations

    verdict = federations.federations_verdict()
    assert "| 30 of 48, 83%, +5.5 dB | 32 of 48, 85%, +5.3 dB |" in verdict
    assert "| momentum 0.9 | 10 | +0.76 dB, 5/5 | +0.32 dB, 4/5 | 23.4 |" in federations.client_optimizers()


def test_records_table_names_the_group_its_record_lacks():
    """A declarative table asked for a run its record does not hold says which, before writing anything."""
    from analysis.docs_tables import core, federations

    with pytest.raises(ValueError, match="no rows of run"):
        core.records_table(
            federations.PAGE, federations.STUDY, [("run", core.value("run"))], by="run", rows=["paper", "no-such-run"]
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
    folder = RunFolder("RUN")
    paths = [getattr(folder, name) for name in dir(RunFolder) if isinstance(getattr(RunFolder, name), property)]
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
    [
        ("attack-batch", "0"),
        ("attack-nodes", -1),  # 0: the audit's rule
        ("attack-labels", "x"),
        ("seed", -1),
        ("defense-bits", 17),
        ("attack-rounds", "every:0"),
        ("lr", 0.0),
    ],
)
def test_the_page_quotes_the_check_that_raises(key, value):
    """The message the page gives for a key is the one a bad value gets ({...} filled in)."""
    page_checks = [
        check
        for _, cls, keys in docs.owners()
        if key in keys
        for check in docs.checks_of(key, docs._source_strings(cls)) + docs.owner_checks(cls).get(key, [])
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


# --- links between the pages ------------------------------------------------------------------------------

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def _pages() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _anchors(text: str) -> set[str]:
    """The heading anchors GitHub gives a Markdown page: lower case, punctuation dropped, spaces to hyphens,
    "-1", "-2" after a repeated heading; lines inside ``` fences are not headings."""
    out, seen, fence = set(), {}, False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if fence or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return out


def _links(text: str) -> list[str]:
    """The relative link targets of a page, outside code blocks and inline code."""
    prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))
    return [target for target in _LINK.findall(prose) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def test_relative_links_resolve():
    """Every relative link in README.md and docs/*.md names a file or folder that exists, and a #heading
    of a Markdown page that the page has: a page moved or a heading renamed fails here."""
    broken = []
    for page in _pages():
        for target in _links(page.read_text(encoding="utf-8")):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path) if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text(encoding="utf-8")):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_readme_is_short_and_links_every_page():
    """README.md stays a five-minute read (issue #49: at most 200 lines) and links every page of docs/."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in _links(readme)}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"README.md links no docs page {unlinked}"


def test_anchors_follow_github():
    text = "# Running on Flower's deployment engine\n## Tests\n## Tests\n```\n# not a heading\n```\n"
    assert _anchors(text) == {"running-on-flowers-deployment-engine", "tests", "tests-1"}
    assert _links("[a](x.md#y) `[b](z.md)` [c](https://flower.ai)\n```\n[d](w.md)\n```") == ["x.md#y"]


# --- pointers to sections, the licence and the citation -----------------------------------------------------

# A section named in prose: README's by `(README: Running federations)`, `README's "X"`, `README, "X"`,
# `README "X"`; a docs page's by `docs/running.md, "X"`, `[running.md](running.md), "X"`, `running.md "X"`.
_README_POINTER = re.compile(r"""README(?:\.md)?(?:'s)?(?:\s*:\s*([^()"]+?)\)|,?\s+"([^"]+)")""")
_PAGE_POINTER = re.compile(r"""([a-z0-9-]+\.md)\)?,?\s+"([^"]+)\"""")
_SKIPPED = {"results", "build", "__pycache__", "node_modules"}


def _sections(text: str) -> list[str]:
    """A Markdown page's sections as prose names them: its headings and the bold lead-ins that open a line
    (`**Disjoint from the run's writers (FEMNIST).**`), outside ``` fences."""
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        named = None if fence else re.match(r"#{1,6}\s+(.*)|\*\*([^*]+)\*\*", line)
        if named:
            out.append((named.group(1) or named.group(2)).strip())
    return out


def _flat(text: str) -> str:
    """One line: a name may wrap over lines of prose, of a docstring or of `#` comments; a quote escaped in a
    Python string is the quote."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text).replace("\\'", "'")


def stale_pointers(sources: dict[str, str], pages: dict[str, str]) -> list[str]:
    """``sources``' pointers to a section that its page lacks: README.md's headings for a README pointer,
    docs/NAME.md's headings or bold lead-ins for a docs page's (a name matches a section that contains it,
    case aside). pages: {"README.md": text, "running.md": text, ...}."""
    sections = {name: [s.lower() for s in _sections(text)] for name, text in pages.items()}
    stale = []
    for source, text in sources.items():
        flat = _flat(text)
        named = [("README.md", a or b) for a, b in _README_POINTER.findall(flat)]
        named += [(page, name) for page, name in _PAGE_POINTER.findall(flat) if page in pages]
        for page, name in named:
            if not any(name.strip().lower() in section for section in sections[page]):
                stale.append(f'{source}: {page} has no section "{name.strip()}"')
    return stale


def _sources() -> dict[str, str]:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for ext in ("py", "toml"):
        paths += [
            p
            for p in sorted(ROOT.rglob(f"*.{ext}"))
            if not any(part.startswith(".") or part in _SKIPPED for part in p.relative_to(ROOT).parts)
        ]
    this = Path(__file__).resolve()  # its own made-up pointers are test_stale_pointers_are_found's
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths if p.resolve() != this}


def test_every_named_section_exists():
    """A pointer in README.md, docs/*.md or any .py / .toml file to a README section or a docs page's
    section names one the page has: a section moved out of the README (issue #49) or renamed fails here."""
    pages = {"README.md": (ROOT / "README.md").read_text(encoding="utf-8")}
    pages |= {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "docs").glob("*.md")}
    stale = stale_pointers(_sources(), pages)
    assert not stale, "\n".join(stale)


def test_stale_pointers_are_found():
    """Unit test of the check on made-up text: each form of pointer, found when its section is gone."""
    pages = {
        "README.md": "# fl-attack\n## Running federations\n",
        "running.md": "# R\n**Same seed, same study.** x\n## Running on Flower's deployment engine\n",
    }
    good = {
        "a.py": '"(README: Running federations)" (docs/running.md, "Same seed,\n    # same study")',
        "b.md": 'README\'s "Running federations"; [running.md](running.md), "Same seed"',
        "c.py": """'(docs/running.md, "Running on Flower\\'s deployment engine")'""",
    }
    assert stale_pointers(good, pages) == []
    readme = "READ" + "ME"  # spelled apart so that the repository's own pointer check does not read these
    bad = {
        "c.py": f"({readme}: Attacking your own model)",
        "d.toml": f'# {readme} "Same seed, same study"',
        "e.md": 'docs/running.md, "Running on Flower\'s simulation engine"',
    }
    assert stale_pointers(bad, pages) == [
        'c.py: README.md has no section "Attacking your own model"',
        'd.toml: README.md has no section "Same seed, same study"',
        'e.md: running.md has no section "Running on Flower\'s simulation engine"',
    ]


def test_licence_and_citation_match_the_package():
    """LICENSE is the Apache License 2.0 pyproject.toml declares, whole (its appendix included); CITATION.cff
    loads as YAML with the package's title, version and licence and cites the PI-SME paper."""
    import tomllib

    import yaml

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    licence = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert project["license"] == {"text": "Apache-2.0"}
    assert "Apache License\n                           Version 2.0, January 2004" in licence
    assert "END OF TERMS AND CONDITIONS" in licence and "APPENDIX: How to apply the Apache License" in licence
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert citation["cff-version"] == "1.2.0"
    assert (citation["title"], str(citation["version"]), citation["license"]) == (
        project["name"],
        project["version"],
        project["license"]["text"],
    )
    assert citation["message"].strip() and citation["authors"]
    (paper,) = [ref for ref in citation["references"] if "Path Integral Surrogate" in ref["title"]]
    assert [a["family-names"] for a in paper["authors"]] == ["Ghosh", "Bhattacharya"]
    assert "2610.03597" in paper["url"] and paper["year"] == 2026
