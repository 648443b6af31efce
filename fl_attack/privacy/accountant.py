"""The privacy budget a federation's DP defense has spent: ε at a target δ, round by round.

The accounting is Google's ``dp-accounting`` library (RDP or PLD accountant); this module only says
which mechanism each round is and keeps who took part.

- ``local-dp`` (Flower's ``LocalDpMod``): each round a client takes part, it clips its update to L2
  norm C and adds Gaussian noise of std σ = C·√(2 ln(1.25/δ_round))/ε_round per coordinate, i.e. one
  Gaussian mechanism of noise multiplier z = σ/C on its whole dataset (sensitivity C). The server
  knows who was sampled, so there is no amplification by sampling: a client's ε after r rounds is the
  composition of the n ≤ r Gaussian mechanisms of the rounds it took part in. The federation's ε is
  that of the client that took part most.
- ``central-dp`` (Flower's ``DifferentialPrivacy{Server,Client}SideFixedClipping``): the aggregate
  of the n sampled clients' clipped updates gets Gaussian noise of std z·C/n, i.e. z·C on their sum.
  Each round is a Poisson-subsampled Gaussian mechanism (rate q = clients per round / clients, the
  standard approximation of Flower's fixed-size sampling, DP-FedAvg: McMahan et al., ICLR 2018),
  composed over the rounds; the same ε holds for every client. This guarantee is about the model
  and the aggregate: the server itself sees each clipped, noise-free update (docs/defenses.md).

Both are user-level DP under add/remove-one-client adjacency. ε = 0 before a client takes part;
z = 0 gives ε = inf. No torch at import.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

ACCOUNTANTS = ("rdp", "pld")  # dp_accounting's RdpAccountant (the default) and PLDAccountant (tighter, slower)
MECHANISMS = ("local-dp", "central-dp")
# The PLD accountant's discretization of the privacy loss (the library's default, 1e-4) is scaled by
# 1/z^2 below z = 1: at z = 0.05 the default grid took 19 GB; the scaled one 1 GB and agrees with the
# closed form to a relative 1e-6 (tests/test_privacy.py).
PLD_INTERVAL = 1e-4


class _Unconverged(logging.Filter):
    """Drops the RDP accountant's "failed to converge ... excluding this order" warnings: it leaves
    those fractional orders out and the ε of the remaining orders is still a valid bound."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


logging.getLogger("absl").addFilter(_Unconverged())


def gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """z = σ/C of Flower's LocalDpMod for a per-round (ε, δ): √(2 ln(1.25/δ))/ε (Dwork & Roth 2014,
    Thm. A.1, the calibration LocalDpMod uses). ValueError unless ε > 0 and 0 < δ < 1."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"a Gaussian mechanism needs epsilon > 0 and delta in (0, 1), got {epsilon}, {delta}")
    return math.sqrt(2 * math.log(1.25 / delta)) / epsilon


@lru_cache(maxsize=4096)
def composed_epsilon(
    noise_multiplier: float, count: int, target_delta: float, sampling_rate: float = 1.0, accountant: str = "rdp"
) -> float:
    """ε at ``target_delta`` of ``count`` compositions of a Gaussian mechanism of noise multiplier
    ``noise_multiplier`` (noise std / sensitivity), Poisson-subsampled at ``sampling_rate`` when it is
    below 1, from dp_accounting's ``accountant`` ("rdp" or "pld"; PLD_INTERVAL). 0.0 for count 0;
    inf for z = 0.
    ValueError for a bad argument."""
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got '{accountant}'")
    if noise_multiplier < 0 or count < 0 or not (0 < target_delta < 1) or not (0 < sampling_rate <= 1):
        raise ValueError(
            f"need noise_multiplier >= 0, count >= 0, target_delta in (0, 1) and sampling_rate in (0, 1], got "
            f"{noise_multiplier}, {count}, {target_delta}, {sampling_rate}"
        )
    if count == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    event = dp_event.GaussianDpEvent(noise_multiplier)
    if sampling_rate < 1:
        event = dp_event.PoissonSampledDpEvent(sampling_rate, event)
    if accountant == "pld":  # its grid grows as 1/z^2: a coarser one keeps small z in bounded memory
        ledger = pld_privacy_accountant.PLDAccountant(
            value_discretization_interval=PLD_INTERVAL * max(1, noise_multiplier**-2)
        )
    else:
        ledger = rdp_privacy_accountant.RdpAccountant()
    ledger.compose(event, count)
    return float(ledger.get_epsilon(target_delta))


@dataclass
class PrivacyLedger:
    """Who took part in which round, and the ε that buys (module docstring).

    mechanism: "local-dp" or "central-dp". noise_multiplier: z (noise std / clipping norm C).
    target_delta: the δ every ε is given at. sampling_rate: central-dp's q in (0, 1] (1 for
    local-dp). accountant: "rdp" or "pld". Raises ValueError for a bad value.
    """

    mechanism: str
    noise_multiplier: float
    target_delta: float
    sampling_rate: float = 1.0
    accountant: str = "rdp"
    rounds: dict[int, tuple[int, ...]] = field(default_factory=dict)  # round -> its participants' partition ids

    def __post_init__(self):
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got '{self.mechanism}'")
        composed_epsilon(self.noise_multiplier, 0, self.target_delta, self.sampling_rate, self.accountant)

    @classmethod
    def for_defense(cls, defense, clients_per_round: int, num_clients: int) -> PrivacyLedger | None:
        """The ledger of a run's DefenseSettings (fl_attack.federation.defense_settings); None without
        local-dp or central-dp. clients_per_round / num_clients: central-dp's sampling rate."""
        if defense.local_dp:
            z = gaussian_noise_multiplier(defense.epsilon, defense.delta)
            return cls("local-dp", z, defense.target_delta, 1.0, defense.accountant)
        if defense.central_dp:
            rate = min(1.0, clients_per_round / max(1, num_clients))
            return cls("central-dp", defense.noise_multiplier, defense.target_delta, rate, defense.accountant)
        return None

    @classmethod
    def from_record(cls, privacy: dict | None, rounds: Iterable[dict] = ()) -> PrivacyLedger | None:
        """The ledger of a run folder: config.json's "privacy" block (``describe``) and rounds.csv
        rows (their "round" and "participants"); None for a run without DP."""
        if not privacy:
            return None
        ledger = cls(
            privacy["mechanism"],
            float(privacy["noise_multiplier"]),
            float(privacy["target_delta"]),
            float(privacy["sampling_rate"]),
            privacy["accountant"],
        )
        ledger.restore(rounds)
        return ledger

    def describe(self) -> dict:
        """config.json's "privacy" block: the accountant and its parameters."""
        from importlib import metadata

        return {
            "mechanism": self.mechanism,
            "accountant": self.accountant,
            "library": f"dp-accounting {metadata.version('dp-accounting')}",
            "noise_multiplier": self.noise_multiplier,
            "sampling_rate": self.sampling_rate,
            "target_delta": self.target_delta,
            "adjacency": "add or remove one client (user-level)",
            "event": (
                "GaussianDpEvent(z) per round the client takes part in"
                if self.mechanism == "local-dp"
                else "PoissonSampledDpEvent(q, GaussianDpEvent(z)) per round"
            ),
        }

    def round_done(self, server_round: int, participants: Iterable[int]) -> None:
        """Round ``server_round`` ran with these partitions' updates (each sent its noised update)."""
        self.rounds[int(server_round)] = tuple(sorted({int(p) for p in participants}))

    def restore(self, rounds: Iterable[dict]) -> None:
        """Replace what the ledger holds by rounds.csv's rows (their "round" and "participants")."""
        self.rounds = {}
        for row in rounds:
            self.round_done(int(row["round"]), parse_participants(row.get("participants")))

    def cut_back(self, done: int) -> None:
        """Forget the rounds after ``done`` (a resumed run redoes them)."""
        self.rounds = {r: p for r, p in self.rounds.items() if r <= done}

    def participations(self, partition: int, server_round: int) -> int:
        """How many of rounds 1..server_round ``partition`` took part in."""
        return sum(1 for r, p in self.rounds.items() if r <= server_round and partition in p)

    def epsilon(self, server_round: int, partitions: Iterable[int] | None = None) -> float:
        """ε spent by round ``server_round`` (inclusive) at ``target_delta``: the largest over
        ``partitions`` (an aggregate's participants, or one client), or the federation's (None)."""
        if self.mechanism == "central-dp":  # the same for every client
            count = sum(1 for r in self.rounds if r <= server_round)
        else:
            who = (
                {p for r, ps in self.rounds.items() if r <= server_round for p in ps}
                if partitions is None
                else set(partitions)
            )
            count = max((self.participations(p, server_round) for p in who), default=0)
        return composed_epsilon(self.noise_multiplier, count, self.target_delta, self.sampling_rate, self.accountant)


def parse_participants(text) -> list[int]:
    """rounds.csv's "participants" ("0,3,5") as partition ids; [] for empty or missing."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return []
    return [int(p) for p in str(text).split(",") if p.strip()]


def format_epsilons(values: dict[int, float]) -> str:
    """rounds.csv's "epsilon_tracked": "0:1.23;1:0.98" (partition:ε, 6 significant digits)."""
    return ";".join(f"{p}:{e:.6g}" for p, e in sorted(values.items()))


def parse_epsilons(text) -> dict[int, float]:
    """The inverse of ``format_epsilons``; {} for empty or missing."""
    if text is None or (isinstance(text, float) and math.isnan(text)) or not str(text).strip():
        return {}
    pairs = (item.split(":") for item in str(text).split(";") if item.strip())
    return {int(p): float(e) for p, e in pairs}
