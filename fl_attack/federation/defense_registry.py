"""The defenses a run can switch on: one class each, registered in ``DEFENSES`` by ``@register_defense``.

A defense is a frozen dataclass subclass of ``Defense`` whose fields are its run-config parameters
(field ``topk_fraction`` is the key "defense-topk-fraction", ``secagg_num_shares`` is
"secagg-num-shares"; the default is the key's), and whose methods answer every question the run asks
of it: its checks (``checks``, ``check_combination``, ``check_model``, ``check_clients``), its label
in attacks.csv's ``defense`` column (``label``), what config.json records (``derived``, ``observed``),
the client's update transform (``transform``) and whether the attacker matches only the observed
coordinates (``observed_only``). ``DefenseSettings`` (fl_attack.federation.defense_settings) parses the
keys and asks the registered classes; the Flower parts (LocalDpMod, the DP strategy wrappers,
SecAgg+) stay in clients/defenses.py and strategies/, as the library imports no Flower.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from fl_attack.federation.defenses import low_rank_update, quantize_update, topk_update, weight_matrices
from fl_attack.privacy.accountant import ACCOUNTANTS, gaussian_noise_multiplier

CLIPPING_SIDES = ("server", "client")
PARAMETER_TYPES = (bool, int, float, str)  # what a run-config value can be (config.typed_value)


@dataclass(frozen=True)
class Defense:
    """One defense and its parameters. Subclass it as a frozen dataclass, one field per parameter,
    each with its default, and register it with ``@register_defense``.

    name: the ``defense`` value that switches it on (e.g. "topk"); it joins others with "+".
    order: where its note stands in config.json's observed text and its transform among the client's
        update transforms, ascending (top-k last, so that the server sees exactly its fraction of
        non-zeros).
    refuses: {another defense: why they cannot run together}, checked at validation.
    transform: None, or a method (w0, wT, seed) -> wT on state dicts (name -> tensor) that the
        client applies to its returned weights (clients/defenses.py, update_transform_mod), after
        the training and any DP noise; seed: the client's (run seed, round, partition) seed.
    check_model: None, or a method (state dict) raising ValueError "invalid run config: ..." when
        the run's model cannot take this defense (checked once, before round 1).
    """

    name: ClassVar[str] = ""
    order: ClassVar[int] = 0
    refuses: ClassVar[Mapping[str, str]] = MappingProxyType({})
    transform: ClassVar = None
    check_model: ClassVar = None

    def checks(self) -> list[tuple[bool, str]]:
        """(condition, message) of each parameter's range; the message names the key."""
        return []

    def check_combination(self, names: list[str]) -> None:
        """ValueError when this defense cannot run with the others of ``names`` (``refuses``)."""
        for other in names:
            if other in self.refuses:
                raise ValueError(
                    f"invalid run config: {self.name} cannot be combined with {other}: {self.refuses[other]}"
                )

    @property
    def min_clients(self) -> int:
        """The fewest clients per round it can run with."""
        return 1

    def check_clients(self, num_clients: int) -> None:
        """ValueError "invalid federation: ..." when ``num_clients`` per round are too few."""

    @property
    def observed_only(self) -> bool:
        """True when the attacker should match only the observed (non-zero) update coordinates."""
        return False

    def label(self) -> str:
        """Its part of the attacks.csv ``defense`` column, e.g. "topk(0.1)"."""
        return self.name

    def derived(self) -> dict:
        """Values derived from its parameters that config.json records beside them, by key."""
        return {}

    def observed(self) -> str:
        """What the attacker observes of a client under it, one clause of config.json's ``observed``."""
        raise NotImplementedError(f"{type(self).__name__}.observed: say what the server observes")


# name -> Defense subclass, in registration order (the order of the "choose from" list).
DEFENSES: dict[str, type[Defense]] = {}


def parameter_defaults() -> dict[str, object]:
    """{field name: default} of every registered defense's parameters, in registration order (a
    parameter shared by several defenses, e.g. clip_norm, once)."""
    out = {}
    for cls in DEFENSES.values():
        for f in dataclasses.fields(cls):
            out.setdefault(f.name, f.default)
    return out


def register_defense(cls: type[Defense]) -> type[Defense]:
    """Class decorator: add a defense to ``DEFENSES`` under ``cls.name``.

    Raises TypeError unless ``cls`` is a subclass of Defense decorated with @dataclass(frozen=True)
    whose every field has a bool, int, float or str default; ValueError for a name already
    registered, empty or with a "+", or for a parameter another defense declares with another default.
    """
    if not (isinstance(cls, type) and issubclass(cls, Defense) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"register_defense: {cls!r} is not a dataclass subclass of Defense")
    if "__dataclass_params__" not in vars(cls):  # its own fields would not be parameters
        raise TypeError(f"register_defense: decorate {cls.__name__} with @dataclass(frozen=True)")
    name = cls.name
    if not name or "+" in name or name != name.strip().lower():
        raise ValueError(f"register_defense: {cls.__name__}.name must be lower-case text without '+', got {name!r}")
    if name in DEFENSES:
        raise ValueError(f"register_defense: '{name}' is registered already ({DEFENSES[name].__name__})")
    known = parameter_defaults()
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING or type(f.default) not in PARAMETER_TYPES:
            raise TypeError(f"register_defense: {cls.__name__}.{f.name} needs a bool, int, float or str default")
        if f.name in known and (type(known[f.name]), known[f.name]) != (type(f.default), f.default):
            raise ValueError(
                f"register_defense: {cls.__name__}.{f.name} defaults to {f.default!r}, another defense's "
                f"{f.name} to {known[f.name]!r}; a shared parameter has one default"
            )
    DEFENSES[name] = cls
    return cls


# --- the defenses ---------------------------------------------------------------------------------


@register_defense
@dataclass(frozen=True)
class NoDefense(Defense):
    """No defense: the server sees each client's full update."""

    name: ClassVar[str] = "none"

    def check_combination(self, names: list[str]) -> None:
        if len(names) > 1:
            raise ValueError("invalid run config: defense 'none' cannot be combined with another defense")

    def observed(self) -> str:
        return "each attacked client's full update (w0, wT) and its public training metadata"


class _Clipped:
    """The parameters local-dp and central-dp share: the clipping norm C of each update and the
    accountant of the ε recorded for them (fl_attack.privacy.accountant)."""

    clip_norm: float
    accountant: str
    target_delta: float

    def shared_checks(self) -> list[tuple[bool, str]]:
        return [
            (self.clip_norm > 0, f"defense-clip-norm must be > 0, got {self.clip_norm}"),
            (
                self.accountant in ACCOUNTANTS,
                f"defense-accountant must be one of {', '.join(ACCOUNTANTS)}, got '{self.accountant}'",
            ),
            (0 < self.target_delta < 1, f"defense-target-delta must be in (0, 1), got {self.target_delta}"),
        ]


@register_defense
@dataclass(frozen=True)
class LocalDp(_Clipped, Defense):
    """Flower's LocalDpMod on each client: the update clipped to L2 norm C, then Gaussian noise of std
    C * sqrt(2 ln(1.25/delta)) / epsilon on every coordinate (sensitivity C; Dwork & Roth 2014, Thm. A.1).

    clip_norm ["defense-clip-norm"]: C. epsilon, delta ["defense-epsilon", "defense-delta"]: the
    Gaussian mechanism's per-round (ε, δ). accountant ["defense-accountant"]: "rdp" or "pld", the
    accountant of the recorded ε; target_delta ["defense-target-delta"]: the δ it is given at.
    """

    name: ClassVar[str] = "local-dp"
    order: ClassVar[int] = 20
    clip_norm: float = 0.05
    epsilon: float = 10.0
    delta: float = 1e-5
    accountant: str = "rdp"
    target_delta: float = 1e-5

    def checks(self) -> list[tuple[bool, str]]:
        return [
            *self.shared_checks(),
            (self.epsilon > 0, f"defense-epsilon must be > 0 (smaller is more noise), got {self.epsilon}"),
            (0 < self.delta < 1, f"defense-delta must be in (0, 1), got {self.delta}"),
        ]

    @property
    def noise_std(self) -> float:
        """LocalDpMod's per-coordinate noise std, C * sqrt(2 ln(1.25/delta)) / epsilon."""
        return self.clip_norm * gaussian_noise_multiplier(self.epsilon, self.delta)

    def label(self) -> str:
        return f"local-dp(C={self.clip_norm:g},eps={self.epsilon:g})"

    def derived(self) -> dict:
        return {"local-dp-noise-std": self.noise_std}

    def observed(self) -> str:
        return (
            f"local DP: each update clipped to L2 norm {self.clip_norm:g}, then Gaussian noise of "
            f"std {self.noise_std:.3g} on every coordinate (Flower's LocalDpMod)"
        )


# Why central-dp and secagg cannot run together here (strategies/server_app.py, strategies/secagg.py).
CENTRAL_DP_UNDER_SECAGG = (
    "Flower's central-DP wrappers (DifferentialPrivacyServerSideFixedClipping, "
    "DifferentialPrivacyClientSideFixedClipping) wrap a Message-API strategy, while SecAgg+ runs only in "
    "Flower's legacy workflow around a legacy strategy, which receives the unmasked aggregate alone (every "
    "participant's reply carries the same weighted mean): server-side clipping would clip that aggregate, "
    "not each client's update, and the noise would not be calibrated to one client; use local-dp+secagg "
    "for DP under secure aggregation (each client clips and noises its update before it is masked)"
)


@register_defense
@dataclass(frozen=True)
class CentralDp(_Clipped, Defense):
    """Flower's central DP: DifferentialPrivacyServerSideFixedClipping, or with clipping "client"
    DifferentialPrivacyClientSideFixedClipping + fixedclipping_mod, around the audited strategy; each
    client's update is clipped to L2 norm C and Flower adds noise of std z*C/n to the aggregate of n.

    clip_norm ["defense-clip-norm"]: C. noise_multiplier ["defense-noise-multiplier"]: z.
    clipping ["defense-clipping"]: "server" or "client". accountant, target_delta: as local-dp's.
    """

    name: ClassVar[str] = "central-dp"
    order: ClassVar[int] = 30
    refuses: ClassVar[Mapping[str, str]] = MappingProxyType({"secagg": CENTRAL_DP_UNDER_SECAGG})
    clip_norm: float = 0.05
    noise_multiplier: float = 1.0
    clipping: str = "server"
    accountant: str = "rdp"
    target_delta: float = 1e-5

    def checks(self) -> list[tuple[bool, str]]:
        return [
            *self.shared_checks(),
            (
                self.noise_multiplier >= 0,
                f"defense-noise-multiplier must be >= 0 (a noise scale cannot be "
                f"negative), got {self.noise_multiplier}",
            ),
            (self.clipping in CLIPPING_SIDES, f"defense-clipping must be 'server' or 'client', got '{self.clipping}'"),
        ]

    def label(self) -> str:
        return f"central-dp({self.clipping},z={self.noise_multiplier:g},C={self.clip_norm:g})"

    def observed(self) -> str:
        return (
            f"central DP ({self.clipping}-side clipping): each client's update clipped to L2 norm "
            f"{self.clip_norm:g} and free of noise; Flower adds the noise (std z*C/n, z="
            f"{self.noise_multiplier:g}) to the aggregate only"
        )


@register_defense
@dataclass(frozen=True)
class SecAgg(Defense):
    """Flower's SecAgg+ (SecAggPlusWorkflow, secaggplus_mod): the server sees only the aggregate.

    secagg_num_shares, secagg_reconstruction_threshold, secagg_max_weight ["secagg-*"]: the workflow's;
    max weight 0 means samples-per-client, the finest quantisation that cannot overflow.
    """

    name: ClassVar[str] = "secagg"
    order: ClassVar[int] = 10
    secagg_num_shares: int = 3
    secagg_reconstruction_threshold: int = 2
    secagg_max_weight: float = 0.0

    def checks(self) -> list[tuple[bool, str]]:
        return [
            (self.secagg_num_shares >= 3, f"secagg-num-shares must be >= 3, got {self.secagg_num_shares}"),
            (
                2 <= self.secagg_reconstruction_threshold < self.secagg_num_shares,
                f"secagg-reconstruction-threshold must be in 2..secagg-num-shares-1 "
                f"({self.secagg_num_shares - 1}), got {self.secagg_reconstruction_threshold}",
            ),
            (
                self.secagg_max_weight >= 0,
                f"secagg-max-weight must be >= 0 (0 = samples-per-client), got {self.secagg_max_weight}",
            ),
        ]

    @property
    def min_clients(self) -> int:
        """SecAgg+ needs 2 clients, and as many as the reconstruction threshold."""
        return max(2, self.secagg_reconstruction_threshold)

    def check_clients(self, num_clients: int) -> None:
        if num_clients < self.min_clients:
            raise ValueError(
                f"invalid federation: secagg needs at least {self.min_clients} clients per "
                f"round (SecAgg+ needs 2, and secagg-reconstruction-threshold="
                f"{self.secagg_reconstruction_threshold} shares), but only {num_clients} take part; "
                "raise num-supernodes or fraction-train, or lower the threshold"
            )

    def label(self) -> str:
        return f"secagg(shares={self.secagg_num_shares},t={self.secagg_reconstruction_threshold})"

    def observed(self) -> str:
        return (
            "SecAgg+: only the aggregate (the num-examples weighted mean of all participants' "
            "updates), attacked as one update of k = the participants' total samples and scored "
            "against all their images; num-examples and metrics still arrive in plaintext"
        )


@register_defense
@dataclass(frozen=True)
class TopK(Defense):
    """Top-k sparsification (fl_attack.federation.defenses.topk_update).

    topk_fraction ["defense-topk-fraction"]: the fraction in (0, 1] of update coordinates sent.
    adaptive_attack ["defense-adaptive-attack"]: the attacker matches only the observed (non-zero)
    coordinates; false keeps the naive attacker, for comparison.
    """

    name: ClassVar[str] = "topk"
    order: ClassVar[int] = 60
    topk_fraction: float = 0.1
    adaptive_attack: bool = True

    def checks(self) -> list[tuple[bool, str]]:
        return [
            (0 < self.topk_fraction <= 1, f"defense-topk-fraction must be in (0, 1], got {self.topk_fraction}"),
        ]

    @property
    def observed_only(self) -> bool:
        return self.adaptive_attack

    def transform(self, w0: dict, wT: dict, seed: int) -> dict:
        return topk_update(w0, wT, self.topk_fraction)

    def label(self) -> str:
        return f"topk({self.topk_fraction:g}{'' if self.adaptive_attack else ',naive'})"

    def observed(self) -> str:
        return (
            f"top-k: only the {self.topk_fraction:g} fraction of update coordinates largest in "
            "magnitude; the rest equal w0. The attacker "
            + (
                "matches only these observed coordinates (adaptive)"
                if self.adaptive_attack
                else "matches all coordinates, zeros included (naive)"
            )
        )


@register_defense
@dataclass(frozen=True)
class LowRank(Defense):
    """Each weight matrix's update replaced by its best rank-r approximation
    (fl_attack.federation.defenses.low_rank_update). rank ["defense-rank"]: r."""

    name: ClassVar[str] = "low-rank"
    order: ClassVar[int] = 40
    rank: int = 2

    def checks(self) -> list[tuple[bool, str]]:
        return [(self.rank >= 1, f"defense-rank must be >= 1, got {self.rank}")]

    def check_model(self, state: dict) -> None:
        """Every weight matrix of the model's state dict must allow rank r."""
        for name, (rows, cols) in weight_matrices(state):
            if self.rank > min(rows, cols):
                raise ValueError(
                    f"invalid run config: defense-rank={self.rank} is larger than the model's "
                    f"'{name}' update allows: a {rows}x{cols} matrix has rank at most "
                    f"{min(rows, cols)}"
                )

    def transform(self, w0: dict, wT: dict, seed: int) -> dict:
        return low_rank_update(w0, wT, self.rank)

    def label(self) -> str:
        return f"low-rank({self.rank})"

    def observed(self) -> str:
        return f"low-rank: each weight matrix's update is a rank-{self.rank} SVD approximation (biases unchanged)"


@register_defense
@dataclass(frozen=True)
class Quantize(Defense):
    """Unbiased stochastic quantisation of each tensor's update (fl_attack.federation.defenses.
    quantize_update), seeded per client and round. bits ["defense-bits"]: b, 2**b levels."""

    name: ClassVar[str] = "quantize"
    order: ClassVar[int] = 50
    bits: int = 4

    def checks(self) -> list[tuple[bool, str]]:
        return [(1 <= self.bits <= 16, f"defense-bits must be in 1..16, got {self.bits}")]

    def transform(self, w0: dict, wT: dict, seed: int) -> dict:
        return quantize_update(w0, wT, self.bits, seed=seed)

    def label(self) -> str:
        return f"quantize({self.bits})"

    def observed(self) -> str:
        return f"quantize: each tensor's update stochastically quantised to {self.bits} bits"
