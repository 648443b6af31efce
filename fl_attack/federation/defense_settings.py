"""The run's defense settings: the run-config keys "defense", "defense-*" and "secagg-*", parsed
and checked in one place (``DefenseSettings``). FederationSettings (fl_attack.federation.settings)
holds one as ``defense``; the ClientApp's mods (clients/defenses.py) read it alone.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from fl_attack.federation.config import check_field_types, typed_value
from fl_attack.federation.defenses import weight_matrices
from fl_attack.privacy.accountant import ACCOUNTANTS, gaussian_noise_multiplier

# --- The run's defense: "defense", "defense-*" and "secagg-*". The DP and secure aggregation
# defenses themselves are Flower's (LocalDpMod, the DP strategy wrappers, SecAgg+), wired in by
# clients/defenses.py, strategies/server_app.py and strategies/secagg.py; the compression transforms
# are the library's (fl_attack/federation/defenses.py).
DEFENSES = ("none", "local-dp", "central-dp", "secagg", "topk", "low-rank", "quantize")
CLIPPING_SIDES = ("server", "client")
# The run-config keys a DefenseSettings owns: "defense" itself, "defense-*" and "secagg-*".
_PREFIXES = ("defense-", "secagg-")


def _key_to_field(key: str) -> str:
    if key == "defense":
        return "defense"
    if key.startswith("defense-"):
        key = key[len("defense-") :]
    return key.replace("-", "_")


def _field_to_key(name: str) -> str:
    if name == "defense" or name.startswith("secagg_"):
        return name.replace("_", "-")
    return "defense-" + name.replace("_", "-")


@dataclass(frozen=True)
class DefenseSettings:
    """The defense of a run and its parameters (run-config keys in brackets).

    defense ["defense"]: "none", one of DEFENSES, or a combination joined by "+", e.g. "topk+local-dp".
    clip_norm ["defense-clip-norm"]: L2 clipping norm C of each update (local-dp, central-dp).
    epsilon, delta ["defense-epsilon", "defense-delta"]: local-dp's Gaussian mechanism, Flower's
        LocalDpMod with sensitivity C: noise std = C * sqrt(2 ln(1.25/delta)) / epsilon per coordinate.
    noise_multiplier ["defense-noise-multiplier"]: central-dp's z; Flower adds noise of std z*C/n to
        the aggregate of n clients.
    accountant ["defense-accountant"]: the DP accountant of the ε recorded for local-dp and central-dp
        (fl_attack.privacy.accountant): "rdp" (dp_accounting's RdpAccountant) or "pld" (PLDAccountant, tighter).
    target_delta ["defense-target-delta"]: the δ at which the spent ε is given.
    clipping ["defense-clipping"]: central-dp's clipping side, "server" (DifferentialPrivacyServer-
        SideFixedClipping) or "client" (DifferentialPrivacyClientSideFixedClipping + fixedclipping_mod).
    topk_fraction ["defense-topk-fraction"]: fraction in (0, 1] of update coordinates sent (topk).
    rank ["defense-rank"]: rank r of each weight matrix's update (low-rank).
    bits ["defense-bits"]: bits b of the stochastic quantisation (quantize).
    adaptive_attack ["defense-adaptive-attack"]: under topk, the attacker matches only the observed
        (non-zero) coordinates; false keeps the naive attacker, for comparison.
    secagg_num_shares, secagg_reconstruction_threshold, secagg_max_weight ["secagg-*"]: SecAgg+
        (Flower's SecAggPlusWorkflow); max weight 0 means samples-per-client, the finest quantisation
        that cannot overflow.
    """

    defense: str = "none"
    clip_norm: float = 0.05
    epsilon: float = 10.0
    delta: float = 1e-5
    noise_multiplier: float = 1.0
    clipping: str = "server"
    accountant: str = "rdp"
    target_delta: float = 1e-5
    topk_fraction: float = 0.1
    rank: int = 2
    bits: int = 4
    adaptive_attack: bool = True
    secagg_num_shares: int = 3
    secagg_reconstruction_threshold: int = 2
    secagg_max_weight: float = 0.0

    # Parsing ------------------------------------------------------------------------------
    @staticmethod
    def owns(key: str) -> bool:
        """True for the run-config keys this class parses."""
        return key == "defense" or key.startswith(_PREFIXES)

    @classmethod
    def from_run_config(cls, run_config) -> DefenseSettings:
        """The defense keys of Flower's run config (other keys are ignored), typed and checked.

        Raises ValueError naming the key for an unknown defense key or a bad value.
        """
        known = {f.name: f for f in fields(cls)}
        values = {}
        for key, value in dict(run_config).items():
            if not cls.owns(key):
                continue
            name = _key_to_field(key)
            if name not in known or _field_to_key(name) != key:
                raise ValueError(
                    f"invalid run config: unknown defense key '{key}'; known: "
                    f"{', '.join(_field_to_key(n) for n in known)}"
                )
            values[name] = typed_value(f"run config '{key}'", value, getattr(cls, name))
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Check every value that needs no model or federation; ValueError with the key otherwise."""
        check_field_types(self, _field_to_key)
        names = self.names
        unknown = [n for n in names if n not in DEFENSES]
        if unknown or not names:
            raise ValueError(
                f"invalid run config: unknown defense '{unknown[0] if unknown else self.defense}' "
                f"in defense='{self.defense}'; choose from {', '.join(DEFENSES)} or a '+' combination"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"invalid run config: defense='{self.defense}' names a defense twice")
        if "none" in names and len(names) > 1:
            raise ValueError("invalid run config: defense 'none' cannot be combined with another defense")
        if self.secagg and self.central_dp:
            raise ValueError(
                "invalid run config: central-dp cannot be combined with secagg: Flower's DP strategy "
                "wrappers run on the Message API strategy, SecAgg+ on the legacy workflow; "
                "use local-dp+secagg for DP under secure aggregation"
            )
        checks = [
            (self.clip_norm > 0, f"defense-clip-norm must be > 0, got {self.clip_norm}"),
            (self.epsilon > 0, f"defense-epsilon must be > 0 (smaller is more noise), got {self.epsilon}"),
            (0 < self.delta < 1, f"defense-delta must be in (0, 1), got {self.delta}"),
            (
                self.noise_multiplier >= 0,
                f"defense-noise-multiplier must be >= 0 (a noise scale cannot be "
                f"negative), got {self.noise_multiplier}",
            ),
            (
                self.accountant in ACCOUNTANTS,
                f"defense-accountant must be one of {', '.join(ACCOUNTANTS)}, got '{self.accountant}'",
            ),
            (0 < self.target_delta < 1, f"defense-target-delta must be in (0, 1), got {self.target_delta}"),
            (self.clipping in CLIPPING_SIDES, f"defense-clipping must be 'server' or 'client', got '{self.clipping}'"),
            (0 < self.topk_fraction <= 1, f"defense-topk-fraction must be in (0, 1], got {self.topk_fraction}"),
            (self.rank >= 1, f"defense-rank must be >= 1, got {self.rank}"),
            (1 <= self.bits <= 16, f"defense-bits must be in 1..16, got {self.bits}"),
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
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid run config: {message}")

    def check_model(self, state) -> None:
        """With low-rank: every weight matrix must allow rank r. ``state``: the model's state dict."""
        if not self.low_rank:
            return
        for name, (rows, cols) in weight_matrices(state):
            if self.rank > min(rows, cols):
                raise ValueError(
                    f"invalid run config: defense-rank={self.rank} is larger than the model's "
                    f"'{name}' update allows: a {rows}x{cols} matrix has rank at most "
                    f"{min(rows, cols)}"
                )

    def check_clients(self, num_clients: int) -> None:
        """With secagg: the clients sampled per round must reach SecAgg+'s minimum."""
        if self.secagg and num_clients < self.secagg_min_clients:
            raise ValueError(
                f"invalid federation: secagg needs at least {self.secagg_min_clients} clients per "
                f"round (SecAgg+ needs 2, and secagg-reconstruction-threshold="
                f"{self.secagg_reconstruction_threshold} shares), but only {num_clients} take part; "
                "raise num-supernodes or fraction-train, or lower the threshold"
            )

    # Views --------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [n.strip().lower() for n in self.defense.split("+") if n.strip()]

    @property
    def local_dp(self) -> bool:
        return "local-dp" in self.names

    @property
    def central_dp(self) -> bool:
        return "central-dp" in self.names

    @property
    def secagg(self) -> bool:
        return "secagg" in self.names

    @property
    def topk(self) -> bool:
        return "topk" in self.names

    @property
    def low_rank(self) -> bool:
        return "low-rank" in self.names

    @property
    def quantize(self) -> bool:
        return "quantize" in self.names

    @property
    def transforms_update(self) -> bool:
        """True when the client transforms its update itself (topk, low-rank or quantize)."""
        return self.topk or self.low_rank or self.quantize

    @property
    def observed_only(self) -> bool:
        """The attack matches only the observed (non-zero) coordinates: topk with the adaptive attacker."""
        return self.topk and self.adaptive_attack

    @property
    def secagg_min_clients(self) -> int:
        return max(2, self.secagg_reconstruction_threshold)

    @property
    def local_dp_std(self) -> float:
        """LocalDpMod's per-coordinate noise std, sensitivity C * sqrt(2 ln(1.25/delta)) / epsilon."""
        return self.clip_norm * gaussian_noise_multiplier(self.epsilon, self.delta)

    def _part(self, name: str) -> str:
        if name == "local-dp":
            return f"local-dp(C={self.clip_norm:g},eps={self.epsilon:g})"
        if name == "central-dp":
            return f"central-dp({self.clipping},z={self.noise_multiplier:g},C={self.clip_norm:g})"
        if name == "secagg":
            return f"secagg(shares={self.secagg_num_shares},t={self.secagg_reconstruction_threshold})"
        if name == "topk":
            return f"topk({self.topk_fraction:g}{'' if self.adaptive_attack else ',naive'})"
        if name == "low-rank":
            return f"low-rank({self.rank})"
        if name == "quantize":
            return f"quantize({self.bits})"
        return name

    @property
    def label(self) -> str:
        """Short text for the attacks.csv ``defense`` column, e.g. "topk(0.1)+local-dp(C=0.05,eps=10)"."""
        return "+".join(self._part(n) for n in self.names)

    def parameters(self) -> dict:
        """The run-config keys and values that configure the active defenses."""
        used = {
            "local-dp": ("clip_norm", "epsilon", "delta", "accountant", "target_delta"),
            "central-dp": ("clip_norm", "noise_multiplier", "clipping", "accountant", "target_delta"),
            "secagg": ("secagg_num_shares", "secagg_reconstruction_threshold", "secagg_max_weight"),
            "topk": ("topk_fraction", "adaptive_attack"),
            "low-rank": ("rank",),
            "quantize": ("bits",),
        }
        out = {}
        for name in self.names:
            for f in used.get(name, ()):
                out[_field_to_key(f)] = getattr(self, f)
        if self.local_dp:
            out["local-dp-noise-std"] = self.local_dp_std
        return out

    def observed(self) -> str:
        """What the attacker observes of a client under this defense, for config.json."""
        if self.names == ["none"]:
            return "each attacked client's full update (w0, wT) and its public training metadata"
        notes = []
        if self.secagg:
            notes.append(
                "SecAgg+: only the aggregate (the num-examples weighted mean of all participants' "
                "updates), attacked as one update of k = the participants' total samples and scored "
                "against all their images; num-examples and metrics still arrive in plaintext"
            )
        if self.local_dp:
            notes.append(
                f"local DP: each update clipped to L2 norm {self.clip_norm:g}, then Gaussian noise of "
                f"std {self.local_dp_std:.3g} on every coordinate (Flower's LocalDpMod)"
            )
        if self.central_dp:
            notes.append(
                f"central DP ({self.clipping}-side clipping): each client's update clipped to L2 norm "
                f"{self.clip_norm:g} and free of noise; Flower adds the noise (std z*C/n, z="
                f"{self.noise_multiplier:g}) to the aggregate only"
            )
        if self.low_rank:
            notes.append(
                f"low-rank: each weight matrix's update is a rank-{self.rank} SVD approximation (biases unchanged)"
            )
        if self.quantize:
            notes.append(f"quantize: each tensor's update stochastically quantised to {self.bits} bits")
        if self.topk:
            notes.append(
                f"top-k: only the {self.topk_fraction:g} fraction of update coordinates largest in "
                "magnitude; the rest equal w0. The attacker "
                + (
                    "matches only these observed coordinates (adaptive)"
                    if self.adaptive_attack
                    else "matches all coordinates, zeros included (naive)"
                )
            )
        return "; ".join(notes)

    def describe(self) -> dict:
        """The defense block of config.json."""
        return {
            "defense": "+".join(self.names),
            "label": self.label,
            "parameters": self.parameters(),
            "observed": self.observed(),
        }

    def update_transforms(self) -> dict:
        """The keyword arguments of ``fl_attack.federation.defenses.transform_update`` for this defense."""
        return {
            "rank": self.rank if self.low_rank else None,
            "bits": self.bits if self.quantize else None,
            "topk_fraction": self.topk_fraction if self.topk else None,
        }
