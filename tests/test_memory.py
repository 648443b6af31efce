"""The server that remembers (fl_attack.attacker.memory): its choices on real updates, its record in a real
federation, and that it survives a replay and a resume. Unit tests (no attack) are named so."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from flwr.supercore.task_identity import TaskIdentity

from fl_attack import AttackConfig, ObservedUpdate, reconstruct
from fl_attack.attacker.memory import AttackMemory, Candidate, attack_with_memory, memory_methods, parse_joint_rounds
from fl_attack.cli import main
from fl_attack.federation.data import client_partition, load_pool
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local
from fl_attack.records import read_csv
from strategies.server_app import write_run_config
from tests.inprocess import federate, flower_run_config

SCORES = ("psnr", "ssim", "lpips", "label_accuracy", "lsim_honest")


@pytest.fixture(scope="module")
def watched():
    """One real FEMNIST writer (k=8) watched over 4 rounds: each round trains from the last wT."""
    split = client_partition(load_pool("femnist"), 3, 8)
    model, updates = build_model("femnist", seed=0), []
    for _ in range(4):
        result = train_local(
            model, split.train.images, split.train.labels, dataset="femnist", lr=0.05, batch_size=4, local_epochs=2
        )
        updates.append(result.update)
        model.load_state_dict(result.update.wT)
    return updates, split.train.labels


CONFIG = AttackConfig(iterations=15, nodes=2)


def test_unit_joint_rounds_and_memory_methods_parse_or_refuse():
    assert parse_joint_rounds("best:2,latest:1") == (2, 1) and parse_joint_rounds("latest:3") == (0, 3)
    assert parse_joint_rounds("all") is None
    for bad in ("", "best:0", "best:-1,latest:1", "first:2", "best:x", "best:1,best:2"):
        with pytest.raises(ValueError, match="attack-memory-rounds"):
            parse_joint_rounds(bad)
    assert memory_methods("pisme,ig", "keep") == ("pisme", "ig", "pisme+memory", "ig+memory")
    assert memory_methods("pisme+memory", "joint") == ("pisme+memory",)
    assert memory_methods("pisme,ig", "none") == ("pisme", "ig")
    with pytest.raises(ValueError, match="needs attack-memory"):
        memory_methods("pisme+memory", "none")


def test_unit_the_memory_takes_observed_updates_and_the_attackers_candidates_only(watched):
    updates, labels = watched
    memory = AttackMemory("keep")
    with pytest.raises(TypeError, match="ObservedUpdates only"):
        memory.observe("c", 1, {"w0": updates[0].w0, "private_images": torch.zeros(8, 1, 28, 28)})
    with pytest.raises(TypeError, match="Candidates only"):
        memory.remember("c", [torch.zeros(8, 1, 28, 28)])
    with pytest.raises(TypeError, match="from a Reconstruction"):
        Candidate.of({"images": torch.zeros(8, 1, 28, 28), "labels": labels}, [1])
    with pytest.raises(ValueError, match="attack-memory must be one of"):
        AttackMemory("forever")


@pytest.mark.heavy
def test_keep_holds_the_best_fit_so_far_and_joint_fits_several_updates(watched):
    """On real updates of one writer: the held estimate's fit never gets worse; each round's first
    candidate is exactly the memoryless attack; a joint candidate is fitted to the chosen rounds."""
    updates, _ = watched
    keep, joint = AttackMemory("keep"), AttackMemory("joint", "best:1,latest:1")
    held_fits = []
    for r, update in enumerate(updates, start=1):
        alone = reconstruct(update, "pisme", config=CONFIG, device="cpu")
        for memory in (keep, joint):
            memory.observe("c", r, update)
            inputs = memory.inputs("c", r)
            candidates, memoryless = attack_with_memory(update, "pisme", inputs, config=CONFIG, device="cpu")
            assert torch.equal(memoryless.images, alone.images) and torch.equal(candidates[0].images, alone.images)
            held = memory.remember("c", candidates)
            assert held.fit == min(c.fit for c in memory.clients["c"].history)
            if memory is keep:
                held_fits.append(held.fit)
                assert held.rounds in {(q,) for q in range(1, r + 1)}
            elif r > 1:
                assert candidates[-1].rounds[-1] == r and len(candidates[-1].rounds) >= 2
                assert [q for q, _, _ in inputs.earlier] == sorted(inputs.earlier and [q for q, _, _ in inputs.earlier])
    assert held_fits == sorted(held_fits, reverse=True)  # non-increasing
    assert all(math.isfinite(f) and 0 <= f <= 2 for f in held_fits)


def test_unit_a_waiting_round_keeps_the_updates_it_may_choose(watched):
    """Rounds 2 and 3 observed before round 2's result is back: round 3 still gets rounds {1, 2}
    (best:1, latest:1), as it would had it come later (the federation's queue and a replay agree)."""
    updates, labels = watched
    memory = AttackMemory("joint", "best:1,latest:1")

    def candidate(rounds, fit):
        return Candidate(torch.zeros(8, 1, 28, 28), labels, fit, rounds, dict.fromkeys(rounds, fit))

    memory.observe("c", 1, updates[0])
    memory.remember("c", [candidate((1,), 0.05)])
    memory.observe("c", 2, updates[1])
    memory.observe("c", 3, updates[2])
    memory.remember("c", [candidate((2,), 0.2)])
    assert [r for r, _, _ in memory.inputs("c", 3).earlier] == [1, 2]
    memory.remember("c", [candidate((3,), 0.3)])
    assert sorted(memory.clients["c"].observed) == [1, 3]  # what round 4 may choose: best (1), latest (3)


def test_unit_a_job_sees_only_what_the_server_held_before_its_round(watched):
    """``replay --missing`` completes a round's +memory job after the resumed run's later rounds are
    merged: the job still starts from the rounds before its own (a later estimate is the future)."""
    updates, labels = watched

    def candidate(rounds, fit):
        return Candidate(torch.full((8, 1, 28, 28), fit), labels, fit, rounds, dict.fromkeys(rounds, fit))

    memory = AttackMemory("keep")
    memory.observe("c", 1, updates[0])
    memory.remember("c", [candidate((1,), 0.3)])
    memory.observe("c", 4, updates[3])
    memory.remember("c", [candidate((4,), 0.1)])
    assert memory.inputs("c", 1).kept is None and memory.inputs("c", 1).labels is None
    assert memory.inputs("c", 2).kept.rounds == (1,) and memory.inputs("c", 4).kept.rounds == (1,)
    assert memory.inputs("c", 5).kept.rounds == (4,)
    assert memory.held("c").rounds == (4,)  # what the server holds now is still the best of all
    # round 2's job, completed last, is merged as in its turn and its row scores the estimate of then
    memory.observe("c", 2, updates[1])
    assert memory.remember("c", [candidate((2,), 0.2)]).rounds == (2,)
    assert memory.inputs("c", 3).kept.rounds == (2,) and memory.held("c").rounds == (4,)


def test_unit_only_a_joint_memory_keeps_the_waiting_updates(watched, tmp_path):
    """A backlog of "+memory" jobs (the soak: 20 waiting) made memory.pt hold every waiting update,
    16 MB rewritten after each merge; keep and labels read no update again, so they keep none."""
    updates, labels = watched
    keep, joint = AttackMemory("keep"), AttackMemory("joint", "all")
    for r, update in enumerate(updates, start=1):
        keep.observe("c", r, update)
        joint.observe("c", r, update)
    assert keep.clients["c"].observed == {} and sorted(joint.clients["c"].observed) == [1, 2, 3, 4]
    keep.save(tmp_path / "keep.pt")
    joint.save(tmp_path / "joint.pt")
    assert (tmp_path / "keep.pt").stat().st_size < 10_000 < (tmp_path / "joint.pt").stat().st_size


def test_the_memory_is_saved_and_cut_back(watched, tmp_path):
    updates, _ = watched
    memory = AttackMemory("joint", "all")
    for r, update in enumerate(updates[:3], start=1):
        memory.observe("c", r, update)
        candidates, _ = attack_with_memory(update, "ig", memory.inputs("c", r), config=CONFIG, device="cpu")
        memory.remember("c", candidates)
    memory.save(tmp_path / "memory.pt")
    loaded = AttackMemory.load(tmp_path / "memory.pt")
    assert (loaded.mode, loaded.rounds) == ("joint", "all")
    mine, theirs = memory.clients["c"], loaded.clients["c"]
    assert [c.fit for c in theirs.history] == [c.fit for c in mine.history]
    assert all(torch.equal(a.images, b.images) for a, b in zip(mine.history, theirs.history))
    assert sorted(theirs.observed) == [1, 2, 3] and isinstance(theirs.observed[2][0], ObservedUpdate)
    loaded.cut_back(1)
    assert sorted(loaded.clients["c"].observed) == [1]
    assert all(max(c.rounds) <= 1 for c in loaded.clients["c"].history)


class _Planted:
    """A pickle that, when unpickled, creates the file it names: what a foreign memory.pt could do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_memory_file_that_names_anything_else_is_refused_and_runs_nothing(tmp_path):
    """The weights-only reader: a memory.pt whose pickle names a callable outside the memory's own
    types (here open(), creating a file) is refused in one line, and the callable never runs. Red
    with torch.load(weights_only=False): the marker file appears."""
    marker = tmp_path / "ran"
    path = tmp_path / "memory.pt"
    torch.save({"format": 1, "mode": "keep", "rounds": "best:2,latest:1", "clients": {"c": _Planted(marker)}}, path)
    with pytest.raises(ValueError, match="is not an attack memory fl-attack wrote"):
        AttackMemory.load(path)
    assert not marker.exists()


# --- a real federation (in process) and its replay --------------------------------------------------

RUN = dict(
    num_rounds=3,
    attack_clients="0",
    attack_iterations=15,
    attack_nodes=2,
    attack_method="pisme",
    attack_threads=1,
    attack_memory="joint",
    attack_memory_rounds="best:1,latest:1",
)


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("memory-run")
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        settings, strategy, _, jobs = federate(folder, **RUN)
    finally:
        torch.set_num_threads(before)
    write_run_config(folder, settings, flower_run_config(**RUN), num_nodes=2)
    return folder, strategy, jobs


def _rows(path):
    return sorted(read_csv(path)[1], key=lambda r: (int(r["round"]), r["method"]))


@pytest.mark.heavy
def test_a_federation_records_the_memoryless_and_the_remembering_rows(memory_run):
    folder, strategy, jobs = memory_run
    rows = _rows(folder / "attacks.csv")
    assert [(r["round"], r["method"]) for r in rows] == [
        (str(r), m) for r in (1, 2, 3) for m in ("pisme", "pisme+memory")
    ]
    assert all(r["status"] == "ok" for r in rows)
    assert [r["memory"] for r in rows] == ["", "joint"] * 3
    assert len(jobs) == 3  # one job per round: the twin ran the memoryless attack too
    first, remembered = rows[0], rows[1]
    assert {c: first[c] for c in SCORES} == {c: remembered[c] for c in SCORES}  # round 1: nothing to remember
    fits = [float(r["lsim_honest"]) for r in rows if r["method"] == "pisme+memory"]
    assert fits == sorted(fits, reverse=True)
    # the record holds exactly what the attacker produced: ObservedUpdates and Candidates
    memory = AttackMemory.load(folder / "memory.pt")
    (key,) = memory.clients
    assert key == (0, "pisme+memory") and memory.mode == "joint"
    client = memory.clients[key]
    assert all(isinstance(c, Candidate) for c in client.history)
    assert all(isinstance(u, ObservedUpdate) for u, _ in client.observed.values())
    assert client.best.fit == pytest.approx(fits[-1])


@pytest.mark.heavy
@pytest.mark.slow  # 32 s; CI keeps the memory's path: the federation's rows (memory_run) and keep's best fit
def test_a_replay_reproduces_the_memory_and_none_reproduces_todays_rows(memory_run, tmp_path):
    folder, _, _ = memory_run
    run = tmp_path / "run"
    shutil.copytree(folder, run)
    assert main(["replay", str(run), "--name", "same", "--device", "cpu", "--threads", "1"]) == 0
    mine, theirs = _rows(run / "replays" / "same" / "attacks.csv"), _rows(run / "attacks.csv")
    assert [(r["round"], r["method"]) for r in mine] == [(r["round"], r["method"]) for r in theirs]
    for a, b in zip(mine, theirs):
        assert {c: a[c] for c in SCORES} == {c: b[c] for c in SCORES}, (a["round"], a["method"])
    assert (run / "replays" / "same" / "memory.pt").is_file()
    # memory none: today's attack, the same rows as the run's memoryless ones
    assert main(["replay", str(run), "--name", "none", "--memory", "none", "--device", "cpu", "--threads", "1"]) == 0
    plain = _rows(run / "replays" / "none" / "attacks.csv")
    assert [r["method"] for r in plain] == ["pisme"] * 3 and all(r["memory"] == "" for r in plain)
    for a, b in zip(plain, [r for r in theirs if r["method"] == "pisme"]):
        assert {c: a[c] for c in SCORES} == {c: b[c] for c in SCORES}
    assert not (run / "replays" / "none" / "memory.pt").exists()
    # only the remembering rows, under another mode
    args = ["replay", str(run), "--name", "keep", "--memory", "keep", "--methods", "pisme+memory", "--threads", "1"]
    assert main(args) == 0
    kept = _rows(run / "replays" / "keep" / "attacks.csv")
    assert [(r["method"], r["memory"]) for r in kept] == [("pisme+memory", "keep")] * 3
    assert kept[0]["psnr"] == theirs[0]["psnr"]  # round 1: nothing remembered yet, the memoryless attack


@pytest.mark.heavy
def test_the_report_draws_the_remembering_servers_curve_per_client(memory_run, tmp_path):
    from analysis.load import load_run
    from analysis.plots import plot_memory
    from analysis.report import write_report

    folder, _, _ = memory_run
    run = load_run(folder)
    fig = plot_memory(run)
    (ax,) = [a for a in fig.axes if a.get_visible()]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert set(lines) == {"pisme (each round alone)", "pisme+memory (joint)"}
    psnr = {
        m: [float(r["psnr"]) for r in _rows(folder / "attacks.csv") if r["method"] == m]
        for m in ("pisme", "pisme+memory")
    }
    assert lines["pisme+memory (joint)"] == pytest.approx(psnr["pisme+memory"])
    assert lines["pisme (each round alone)"] == pytest.approx(psnr["pisme"])
    html = write_report([folder], tmp_path / "report").read_text()
    held = "the estimate the remembering server holds after each round (dashed)"
    assert html.count(held) == 4  # two figures (by round, by accuracy), each with its alt text and caption
    assert "(solid), against the round." in html and "(solid), against the model" in html
    plain = run.attacks[~run.attacks["method"].str.endswith("+memory")]
    with pytest.raises(ValueError, match="no '\\+memory' rows"):
        plot_memory(type(run)(**{**vars(run), "attacks": plain}))
