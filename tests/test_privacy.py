"""The privacy budget spent (fl_attack.privacy.accountant): against the closed form of the Gaussian mechanism,
against dp-accounting called directly, against Flower's own RDP accountant (flwr.serverapp.RdpAccountant)
and against RDP written out here, and as a real (in-process) federation records it in rounds.csv and
attacks.csv under local-dp, central-dp and no DP.

The closed form (the exact privacy curve of a Gaussian mechanism of sensitivity 1 and noise std σ,
Balle & Wang, ICML 2018, Thm. 8): δ(ε) = Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ); r compositions of it
are one Gaussian mechanism of std σ/√r. It is written here with scipy only.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from flwr.serverapp import GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, RdpAccountant, SamplingMethod
from scipy.optimize import brentq
from scipy.special import gammaln, logsumexp
from scipy.stats import norm

from analysis.report import main as report
from fl_attack.audit.settings import RunSettings
from fl_attack.federation.defense_settings import DefenseSettings
from fl_attack.privacy.accountant import PrivacyLedger, composed_epsilon, parse_epsilons
from strategies.server_app import privacy_ledger, write_run_config
from tests.inprocess import federate, flower_run_config

DELTA = 1e-5


def gaussian_epsilon(sigma: float, compositions: int, delta: float) -> float:
    """ε of ``compositions`` Gaussian mechanisms of noise multiplier ``sigma`` at ``delta``, exactly."""
    s = sigma / math.sqrt(compositions)

    def excess(eps):
        return norm.cdf(1 / (2 * s) - eps * s) - math.exp(eps) * norm.cdf(-1 / (2 * s) - eps * s) - delta

    return brentq(excess, 0.0, 500.0, xtol=1e-12)


def localdp_multiplier(epsilon: float, delta: float) -> float:
    """Flower's LocalDpMod noise std over its sensitivity: sqrt(2 ln(1.25/δ))/ε (its source)."""
    return math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def library(event, count: int, accountant: str = "rdp") -> float:
    ledger = pld_privacy_accountant.PLDAccountant() if accountant == "pld" else rdp_privacy_accountant.RdpAccountant()
    ledger.compose(event, count)
    return float(ledger.get_epsilon(DELTA))


# --- Flower's own accountant, and RDP written out ----------------------------------------------------

NODES = 4  # the federation of both settings below: 4 SuperNodes, half of them sampled per round
PARTICIPANTS = {1: [0, 1], 2: [1, 2], 3: [1, 3], 4: [0, 1], 5: [1, 2]}  # round -> partitions that trained


def _ledger(**overrides) -> PrivacyLedger:
    """The ledger the ServerApp builds for a run config of 4 nodes, after the rounds of PARTICIPANTS."""
    settings = RunSettings.from_run_config(flower_run_config(fraction_train=0.5, **overrides))
    ledger = privacy_ledger(settings, NODES)
    for r, who in PARTICIPANTS.items():
        ledger.round_done(r, who)
    return ledger


def flower_epsilon(sampling: SamplingMethod, z: float, count: int, sampled: int = 2) -> float:
    """ε at DELTA of ``count`` releases of a Gaussian of noise multiplier z by Flower's RdpAccountant
    (flwr.serverapp, flwr 1.42), ``sampled`` of NODES clients each, add-or-remove-one adjacency."""
    accountant = RdpAccountant(PrivacyConfig(DELTA, NODES, NeighboringRelation.ADD_OR_REMOVE_ONE, sampling))
    accountant.compose(GaussianPrivacyEvent(noise_multiplier=z, sample_size=sampled, population_size=NODES), count)
    return accountant.get_epsilon(DELTA)


def test_flowers_own_rdp_accountant_gives_the_recorded_epsilon_of_local_dp_and_central_dp():
    """flwr 1.42 ships an RDP accountant (``flwr.serverapp.RdpAccountant``, over dp-accounting too). Told
    the mechanism of each setting, it gives the ε our ledger records, to 1e-9:

    * local-dp (ε = 2 per round, LocalDpMod's z): a Gaussian per round a client takes part in, without
      amplification (Flower's NO_AMPLIFICATION), each client by its own participations;
    * central-dp (z = 1.5, 2 of 4 clients a round): a Poisson-subsampled Gaussian per round (POISSON, rate
      2/4). Flower's DP wrappers account with NO_AMPLIFICATION only (they refuse an amplified accountant):
      that ε is an upper bound of ours (3.0 against 2.3 after 1 round, 14.7 against 5.1 after 5) and
      equals it when every client is sampled."""
    local = _ledger(defense="local-dp", defense_epsilon=2.0)
    z = localdp_multiplier(2.0, DELTA)
    assert local.noise_multiplier == pytest.approx(z, rel=1e-12)
    for p in range(NODES):
        count = sum(p in who for who in PARTICIPANTS.values())
        flower = flower_epsilon(SamplingMethod.NO_AMPLIFICATION, z, count)
        assert local.epsilon(5, [p]) == pytest.approx(flower, rel=1e-9), p
    assert local.epsilon(5) == pytest.approx(flower_epsilon(SamplingMethod.NO_AMPLIFICATION, z, 5), rel=1e-9)

    central = _ledger(defense="central-dp", defense_noise_multiplier=1.5)
    assert central.sampling_rate == 0.5
    for r in PARTICIPANTS:
        assert central.epsilon(r) == pytest.approx(flower_epsilon(SamplingMethod.POISSON, 1.5, r), rel=1e-9)
        wrapper = flower_epsilon(SamplingMethod.NO_AMPLIFICATION, 1.5, r)  # what Flower's DP wrapper logs
        assert central.epsilon(r) < wrapper
    everyone = RunSettings.from_run_config(flower_run_config(defense="central-dp", defense_noise_multiplier=1.5))
    ledger = privacy_ledger(everyone, NODES)  # fraction-train 1: no amplification to take
    for r in PARTICIPANTS:
        ledger.round_done(r, range(NODES))
    no_amplification = flower_epsilon(SamplingMethod.NO_AMPLIFICATION, 1.5, 5, sampled=NODES)
    assert ledger.epsilon(5) == pytest.approx(no_amplification, rel=1e-9)


def rdp_to_epsilon(orders, rdp, delta: float) -> float:
    """The (ε, δ) of RDP curve ``rdp`` at ``orders``: min over α of rdp(α) + ln(1 - 1/α) - ln(δα)/(α - 1)
    (Balle et al., AISTATS 2020, Prop. 12; Canonne et al. 2020)."""
    a = np.asarray(orders, dtype=np.float64)
    return max(0.0, float((np.asarray(rdp) + np.log1p(-1 / a) - np.log(delta * a) / (a - 1)).min()))


def gaussian_rdp_epsilon(z: float, count: int, delta: float) -> float:
    """``count`` Gaussian mechanisms of noise multiplier z: RDP α·count/(2z²) (Mironov 2017, Prop. 7), over
    20,000 orders from 1.01 to 4,096."""
    a = np.exp(np.linspace(math.log(1.01), math.log(4096), 20_000))
    return rdp_to_epsilon(a, count * a / (2 * z * z), delta)


def sampled_gaussian_rdp_epsilon(z: float, q: float, count: int, delta: float) -> float:
    """``count`` Poisson-subsampled Gaussians (rate q < 1), at the integer orders 2..256, where the RDP is
    ln(Σ_k C(α,k) (1-q)^(α-k) q^k exp((k²-k)/(2z²)))/(α - 1) (Mironov, Talwar & Zhang 2019, Sec. 3.3)."""
    orders, rdp = range(2, 257), []
    for a in orders:
        k = np.arange(a + 1)
        log_binomial = gammaln(a + 1) - gammaln(k + 1) - gammaln(a - k + 1)
        terms = log_binomial + (a - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * z * z)
        rdp.append(count * float(logsumexp(terms)) / (a - 1))
    return rdp_to_epsilon(orders, rdp, delta)


@pytest.mark.parametrize(
    "z,count", [(localdp_multiplier(2.0, DELTA), 1), (localdp_multiplier(2.0, DELTA), 5), (1.0, 10)]
)
def test_the_local_dp_epsilon_is_the_gaussians_rdp_written_out(z, count):
    """Against RDP computed here (numpy only): equal to 0.1% (dp-accounting's orders are a coarser grid,
    so its ε is a little above the near-continuous optimum here, by 0.05% at most, never below)."""
    ours, written = composed_epsilon(z, count, DELTA), gaussian_rdp_epsilon(z, count, DELTA)
    assert written <= ours <= written * (1 + 1e-3), (ours, written)


@pytest.mark.parametrize("z,q,count", [(1.5, 0.5, 1), (1.5, 0.5, 5), (1.0, 0.5, 10)])
def test_the_central_dp_epsilon_is_the_subsampled_gaussians_rdp_written_out(z, q, count):
    """Against the subsampled Gaussian's RDP at integer orders computed here: dp-accounting also uses
    fractional orders, so its ε is at most ours and within 3% of it (0.1%, 0.5% and 2% here)."""
    ours, written = composed_epsilon(z, count, DELTA, q), sampled_gaussian_rdp_epsilon(z, q, count, DELTA)
    assert written * (1 - 0.03) <= ours <= written * (1 + 1e-9), (ours, written)
    assert ours < gaussian_rdp_epsilon(z, count, DELTA)  # sampling amplifies


@pytest.mark.parametrize(
    "z,count",
    [(localdp_multiplier(10.0, DELTA), 1), (localdp_multiplier(10.0, DELTA), 4), (1.0, 10), (0.05, 1)],
)
def test_pld_epsilon_of_composed_gaussians_is_the_closed_form(z, count):
    exact = gaussian_epsilon(z, count, DELTA)
    assert composed_epsilon(z, count, DELTA, 1.0, "pld") == pytest.approx(exact, rel=1e-6)
    assert composed_epsilon(z, count, DELTA, 1.0, "rdp") >= exact  # RDP's conversion is an upper bound


def test_flowers_localdp_calibration_is_looser_than_its_epsilon_says_at_large_epsilon():
    """LocalDpMod's sqrt(2 ln(1.25/δ))/ε calibration is a valid (ε, δ) bound only for ε < 1
    (Dwork & Roth, Thm. A.1): at ε = 10 one round really spends ε ≈ 10.39 at the same δ."""
    assert composed_epsilon(localdp_multiplier(10.0, DELTA), 1, DELTA, 1.0, "pld") > 10.0
    assert composed_epsilon(localdp_multiplier(0.5, DELTA), 1, DELTA, 1.0, "pld") < 0.5


def test_subsampled_epsilon_is_the_librarys_and_below_the_unsampled_one():
    event = dp_event.PoissonSampledDpEvent(0.25, dp_event.GaussianDpEvent(1.1))
    for accountant in ("rdp", "pld"):
        assert composed_epsilon(1.1, 7, DELTA, 0.25, accountant) == pytest.approx(library(event, 7, accountant))
    assert composed_epsilon(1.1, 7, DELTA, 0.25) < composed_epsilon(1.1, 7, DELTA, 1.0)


def test_no_rounds_spend_nothing_and_no_noise_spends_everything():
    assert composed_epsilon(1.0, 0, DELTA) == 0.0
    assert composed_epsilon(0.0, 3, DELTA) == math.inf


def test_ledger_counts_each_clients_participations_and_cuts_back():
    ledger = PrivacyLedger("local-dp", 1.0, DELTA)
    for r, who in {1: [0, 1], 2: [1, 2], 3: [1]}.items():
        ledger.round_done(r, who)
    assert [ledger.participations(p, 3) for p in (0, 1, 2, 3)] == [1, 3, 1, 0]
    assert ledger.epsilon(3, [0]) == pytest.approx(gaussian_epsilon(1.0, 1, DELTA), rel=0.2)
    assert ledger.epsilon(3, [0]) < ledger.epsilon(3, [1]) == ledger.epsilon(3)  # the federation: the worst client
    assert ledger.epsilon(3, [0, 2]) == ledger.epsilon(1, [0])  # an aggregate: its most-spent participant
    assert ledger.epsilon(3, [3]) == 0.0
    ledger.cut_back(1)
    assert ledger.epsilon(3, [1]) == ledger.epsilon(1, [0])


def test_the_accountant_and_target_delta_are_checked_run_config_keys():
    with pytest.raises(ValueError, match="defense-accountant must be one of rdp, pld"):
        DefenseSettings.from_run_config({"defense": "local-dp", "defense-accountant": "moments"})
    with pytest.raises(ValueError, match=r"defense-target-delta must be in \(0, 1\)"):
        DefenseSettings.from_run_config({"defense": "central-dp", "defense-target-delta": 0.0})
    assert PrivacyLedger.for_defense(DefenseSettings.from_run_config({"defense": "topk"}), 2, 4) is None


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.heavy
def test_a_local_dp_federation_records_each_clients_spent_epsilon(tmp_path):
    """Half the clients train each round (drawn from the run's seed: 1 here), so the tracked clients
    spend different budgets; every recorded ε is dp-accounting's own for the
    client's participations in rounds.csv's participants column."""
    eps, rounds = 2.0, 4
    overrides = dict(defense="local-dp", defense_epsilon=eps, fraction_train=0.5, attack_clients="0,1", seed=1)
    federate(tmp_path, partitions=(0, 1, 2, 3), num_rounds=rounds, **overrides)
    z = localdp_multiplier(eps, DELTA)
    table = _rows(tmp_path / "rounds.csv")
    participants = {int(r["round"]): {int(p) for p in r["participants"].split(",")} for r in table}
    assert [len(participants[r]) for r in range(1, rounds + 1)] == [2] * rounds
    count = {p: [sum(p in participants[s] for s in range(1, r + 1)) for r in range(1, rounds + 1)] for p in (0, 1)}
    assert count[0][-1] != count[1][-1]  # the seed makes the tracked clients' budgets differ

    def spent(n):
        return library(dp_event.GaussianDpEvent(z), n) if n else 0.0

    for row in table:
        r = int(row["round"])
        tracked = parse_epsilons(row["epsilon_tracked"])
        assert tracked == pytest.approx({p: spent(count[p][r - 1]) for p in (0, 1)}, rel=1e-5)  # 6 digits
        most = max(sum(p in participants[s] for s in range(1, r + 1)) for p in range(4))
        assert float(row["epsilon"]) == pytest.approx(spent(most))
    attacks = _rows(tmp_path / "attacks.csv")
    assert {(int(a["round"]), int(a["partition_id"])) for a in attacks} == {
        (r, p) for r in participants for p in (0, 1) if p in participants[r]
    }
    for a in attacks:
        r, p = int(a["round"]), int(a["partition_id"])
        assert float(a["epsilon"]) == pytest.approx(spent(count[p][r - 1]))
        assert float(a["epsilon"]) == pytest.approx(gaussian_epsilon(z, count[p][r - 1], DELTA), rel=0.1)


@pytest.mark.heavy
def test_a_central_dp_federation_records_the_subsampled_gaussians_epsilon(tmp_path):
    z, rounds = 1.5, 3
    overrides = dict(defense="central-dp", defense_noise_multiplier=z, fraction_train=0.5, attack_clients="all")
    settings, *_ = federate(tmp_path, partitions=(0, 1, 2, 3), num_rounds=rounds, **overrides)
    event = dp_event.PoissonSampledDpEvent(0.5, dp_event.GaussianDpEvent(z))
    table = _rows(tmp_path / "rounds.csv")
    assert [float(r["epsilon"]) for r in table] == pytest.approx([library(event, r) for r in range(1, rounds + 1)])
    assert all(r["epsilon_tracked"] == "" for r in table)  # the same for every client
    for a in _rows(tmp_path / "attacks.csv"):
        assert float(a["epsilon"]) == pytest.approx(library(event, int(a["round"])))
    write_run_config(tmp_path / "run", settings, flower_run_config(**overrides), num_nodes=4)
    privacy = json.loads((tmp_path / "run" / "config.json").read_text())["privacy"]
    assert privacy["mechanism"] == "central-dp" and privacy["accountant"] == "rdp"
    assert privacy["sampling_rate"] == 0.5 and privacy["noise_multiplier"] == z and privacy["target_delta"] == DELTA
    assert privacy["library"].startswith("dp-accounting ")


@pytest.mark.heavy
def test_a_run_without_dp_leaves_the_epsilon_columns_empty(tmp_path):
    federate(tmp_path, partitions=(0, 1), num_rounds=1, defense="topk")
    assert [(r["epsilon"], r["epsilon_tracked"]) for r in _rows(tmp_path / "rounds.csv")] == [("", "")]
    assert {a["epsilon"] for a in _rows(tmp_path / "attacks.csv")} == {""}
    settings = RunSettings.from_run_config(flower_run_config(defense="topk"))
    write_run_config(tmp_path, settings, flower_run_config(defense="topk"), num_nodes=2)
    assert json.loads((tmp_path / "config.json").read_text())["privacy"] is None
    assert report([str(tmp_path), "--out", str(tmp_path / "report"), "--format", "md"]) == 0
    assert not (tmp_path / "report" / "figures" / "leakage_vs_epsilon.png").exists()


@pytest.mark.heavy
def test_replay_and_resume_carry_the_runs_spent_epsilon(tmp_path):
    """A replay's rows carry the ε the run's client had spent (config.json's accounting and
    rounds.csv's participants), and a resumed strategy's ledger restarts from rounds.csv."""
    from fl_attack.cli import main
    from strategies.server_app import build_strategy

    overrides = dict(defense="local-dp", defense_epsilon=2.0, fraction_train=0.5, attack_clients="0,1", seed=1)
    settings, strategy, _, _ = federate(tmp_path, partitions=(0, 1, 2, 3), num_rounds=3, **overrides)
    write_run_config(tmp_path, settings, flower_run_config(num_rounds=3, **overrides), num_nodes=4)
    kept = {(a["round"], a["partition_id"]): a["epsilon"] for a in _rows(tmp_path / "attacks.csv")}
    assert len(kept) >= 3 and all(float(e) > 0 for e in kept.values())

    assert (
        main(["replay", str(tmp_path), "--methods", "ig", "--iterations", "1", "--name", "r", "--device", "cpu"]) == 0
    )
    replayed = {
        (a["round"], a["partition_id"]): a["epsilon"] for a in _rows(tmp_path / "replays" / "r" / "attacks.csv")
    }
    assert replayed == kept  # the same text

    assert report([str(tmp_path), "--out", str(tmp_path / "report"), "--format", "md"]) == 0
    figure = tmp_path / "report" / "figures" / "leakage_vs_epsilon.png"
    assert figure.read_bytes().startswith(b"\x89PNG") and figure.stat().st_size > 10_000

    _, resumed, _ = build_strategy(settings, tmp_path, 4, settings.new_model(seed=0).state_dict(), round_offset=2)
    assert resumed.privacy.rounds == {r: p for r, p in strategy.privacy.rounds.items() if r <= 2}


def test_flowers_local_dp_mod_adds_the_noise_the_accountant_assumes():
    """Flower's own LocalDpMod, as the ClientApp runs it (clients/defenses.py), on a known update of
    the FEMNIST CNN (norm 50x the clipping norm): what it sends is w0 + the update clipped to C + noise.
    The noise is measured (its std over 0.4 M coordinates and its mean), and it is the accountant's
    Gaussian mechanism: std = z x C with the ledger's z. So the recorded ε is that of sensitivity C,
    user-level add/remove-one-client adjacency (the client's update against none). Under replace-one
    adjacency (any two inputs of the client, whose clipped updates may differ by 2C) the same noise
    is a mechanism of z/2: its ε, computed here, is what docs/defenses.md names ("The privacy budget spent")."""
    import numpy as np
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from clients.defenses import local_dp_mod
    from fl_attack.federation.models import build_model
    from fl_attack.federation.update import flatten

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    clip, eps = 0.01, 4.0
    run_config = flower_run_config(defense="local-dp", defense_clip_norm=clip, defense_epsilon=eps)
    w0 = build_model("femnist", seed=0).state_dict()
    gen = torch.Generator().manual_seed(0)
    update = {k: 1e-3 * torch.randn(v.shape, generator=gen) for k, v in w0.items()}
    wT = {k: w0[k] - update[k] for k in w0}
    sent = Message(
        RecordDict({"arrays": ArrayRecord(w0), "config": ConfigRecord({"server-round": 1})}),
        dst_node_id=7,
        message_type="train",
    )
    context = Context(1, 7, {"partition-id": 0, "num-partitions": 2}, RecordDict(), run_config)

    def train(msg, ctx):
        return Message(
            RecordDict({"arrays": ArrayRecord(wT), "metrics": MetricRecord({"num-examples": 8})}), reply_to=msg
        )

    before = np.random.get_state()[1].copy()
    reply = local_dp_mod(sent, context, train)
    assert np.array_equal(np.random.get_state()[1], before)  # the global generator is left as it was
    ((_, arrays),) = reply.content.array_records.items()
    seen = flatten(arrays.to_torch_state_dict()).double() - flatten(w0).double()
    raw = -flatten(update).double()
    assert float(raw.norm()) > 40 * clip  # the bound binds
    clipped = raw * clip / float(raw.norm())
    noise = seen - clipped
    measured = float(noise.std())

    ledger = PrivacyLedger.for_defense(DefenseSettings.from_run_config(run_config), clients_per_round=2, num_clients=2)
    assert measured == pytest.approx(ledger.noise_multiplier * clip, rel=0.01)  # the accountant's σ = z·C
    assert abs(float(noise.mean())) < 5 * measured / math.sqrt(noise.numel())
    assert measured == pytest.approx(localdp_multiplier(eps, DELTA) * clip, rel=0.01)  # Flower's calibration
    # what the ledger records for one round, and the same noise under replace-one adjacency (2C)
    ledger.round_done(1, [0])
    add_remove = ledger.epsilon(1, [0])
    assert add_remove == pytest.approx(composed_epsilon(ledger.noise_multiplier, 1, DELTA), rel=1e-9)
    replace_one = composed_epsilon(ledger.noise_multiplier / 2, 1, DELTA)
    assert replace_one > 1.8 * add_remove
