"""The run's defense settings: the run-config keys "defense", "defense-*" and "secagg-*", parsed
and checked in one place (``DefenseSettings``). FederationSettings (fl_attack.federation.settings)
holds one as ``defense``; the ClientApp's mods (clients/defenses.py) read it alone.

Each defense is one class in the registry (fl_attack.federation.defense_registry: ``DEFENSES``,
``@register_defense``); DefenseSettings owns the keys and asks the active defenses everything else.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields

from fl_attack.federation.config import check_field_types, typed_value
from fl_attack.federation.defense_registry import (  # noqa: F401 -- CLIPPING_SIDES: its old home
    CLIPPING_SIDES,
    DEFENSES,
    Defense,
    parameter_defaults,
    register_defense,
)

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


def _with_parameter_fields(cls):
    """Class decorator: ``cls`` as a frozen dataclass with one field per parameter of the defenses
    registered so far (``parameter_defaults``), typed and defaulted like the defense's own field,
    between ``defense`` and ``plugin_parameters``."""
    own = dict(cls.__annotations__)
    annotations = {"defense": own.pop("defense")}
    for name, default in parameter_defaults().items():
        annotations[name] = type(default).__name__
        setattr(cls, name, default)
    cls.__annotations__ = {**annotations, **own}
    return dataclass(frozen=True)(cls)


@_with_parameter_fields
class DefenseSettings:
    """The defense of a run and its parameters.

    defense ["defense"]: "none", one of DEFENSES, or a combination joined by "+", e.g. "topk+local-dp".
    Then one field per parameter of each defense registered with the library (its run-config key:
    "defense-" + the name with "-" for "_", "secagg-*" for secagg's; documented on the defense's class
    in fl_attack.federation.defense_registry), e.g. clip_norm ["defense-clip-norm"], topk_fraction
    ["defense-topk-fraction"], secagg_num_shares ["secagg-num-shares"].
    plugin_parameters: the values of the parameters of defenses registered after this class was
        built (a plugin's, a test's), as (field name, value) pairs; a dict is taken too.

    ``settings.<defense>`` (e.g. ``settings.secagg``, ``settings.low_rank``) is ``uses(<defense>)``.
    """

    defense: str = "none"
    plugin_parameters: tuple = ()

    def __post_init__(self):
        items = self.plugin_parameters
        items = items.items() if isinstance(items, dict) else items
        object.__setattr__(self, "plugin_parameters", tuple(sorted((str(k), v) for k, v in items)))

    def __getattr__(self, attr: str) -> bool:
        """``settings.topk``, ``settings.low_rank``, ...: True when that registered defense is on."""
        name = attr.replace("_", "-")
        if attr.startswith("_") or name not in DEFENSES:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{attr}'")
        return self.uses(name)

    # Parsing ------------------------------------------------------------------------------
    @staticmethod
    def owns(key: str) -> bool:
        """True for the run-config keys this class parses."""
        return key == "defense" or key.startswith(_PREFIXES)

    @classmethod
    def keys(cls) -> dict[str, str]:
        """{run-config key: field name} of every key this class parses now ("defense" first, then the
        registered defenses' parameters)."""
        return {_field_to_key(n): n for n in ("defense", *parameter_defaults())}

    @classmethod
    def from_run_config(cls, run_config) -> DefenseSettings:
        """The defense keys of Flower's run config (other keys are ignored), typed and checked.

        Raises ValueError naming the key for an unknown defense key or a bad value.
        """
        defaults = {"defense": cls.defense, **parameter_defaults()}
        own = {f.name for f in fields(cls)}
        values, plugin = {}, {}
        for key, value in dict(run_config).items():
            if not cls.owns(key):
                continue
            name = _key_to_field(key)
            if name not in defaults or _field_to_key(name) != key:
                cls._unknown_key(key)
            typed = typed_value(f"run config '{key}'", value, defaults[name])
            (values if name in own else plugin)[name] = typed
        settings = cls(**values, plugin_parameters=plugin)
        settings.validate()
        return settings

    @classmethod
    def _unknown_key(cls, key: str) -> None:
        raise ValueError(f"invalid run config: unknown defense key '{key}'; known: {', '.join(cls.keys())}")

    def validate(self) -> None:
        """Check every value that needs no model or federation: every registered defense's parameters
        (whether on or not) and the combination; ValueError with the key otherwise."""
        check_field_types(self, _field_to_key)
        defaults = parameter_defaults()
        for name, _ in self.plugin_parameters:
            if name not in defaults or name in self.__dataclass_fields__:
                self._unknown_key(_field_to_key(name))
        names = self._checked_names()
        if len(set(names)) != len(names):
            raise ValueError(f"invalid run config: defense='{self.defense}' names a defense twice")
        for part in sorted(self.parts, key=lambda part: part.order):
            part.check_combination(names)
        for cls in DEFENSES.values():
            part = self._build(cls)
            check_field_types(part, _field_to_key)
            for ok, message in part.checks():
                if not ok:
                    raise ValueError(f"invalid run config: {message}")

    def _checked_names(self) -> list[str]:
        names = self.names
        unknown = [n for n in names if n not in DEFENSES]
        if unknown or not names:
            raise ValueError(
                f"invalid run config: unknown defense '{unknown[0] if unknown else self.defense}' "
                f"in defense='{self.defense}'; choose from {', '.join(DEFENSES)} or a '+' combination"
            )
        return names

    def check_model(self, state) -> None:
        """Each active defense's check of the model (low-rank: every weight matrix must allow rank r).
        ``state``: the model's state dict. ValueError "invalid run config: ..." otherwise."""
        for part in self.parts:
            if part.check_model is not None:
                part.check_model(state)

    def check_clients(self, num_clients: int) -> None:
        """Each active defense's check of the clients sampled per round (secagg: SecAgg+'s minimum)."""
        for part in self.parts:
            part.check_clients(num_clients)

    # Views --------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [n.strip().lower() for n in self.defense.split("+") if n.strip()]

    def uses(self, name: str) -> bool:
        """True when the defense ``name`` (e.g. "local-dp") is on."""
        return name in self.names

    def value(self, name: str):
        """The value of the parameter ``name`` (a field name, e.g. "topk_fraction"); KeyError when no
        registered defense has it."""
        if name in self.__dataclass_fields__:
            return getattr(self, name)
        defaults = parameter_defaults()
        if name not in defaults:
            raise KeyError(f"no registered defense has the parameter '{name}'")
        return dict(self.plugin_parameters).get(name, defaults[name])

    def _build(self, cls: type[Defense]) -> Defense:
        return cls(**{f.name: self.value(f.name) for f in fields(cls)})

    @property
    def parts(self) -> list[Defense]:
        """The active defenses, each built with this run's values, in the order ``defense`` names them."""
        return [self._build(DEFENSES[n]) for n in self._checked_names()]

    def part(self, name: str) -> Defense:
        """The defense ``name`` built with this run's values, e.g. ``part("local-dp").noise_std``."""
        if name not in DEFENSES:
            raise ValueError(f"unknown defense '{name}'; choose from {', '.join(DEFENSES)}")
        return self._build(DEFENSES[name])

    @property
    def transforms_update(self) -> bool:
        """True when the client transforms its update itself (a defense with a ``transform``)."""
        return any(part.transform is not None for part in self.parts)

    @property
    def needs_model(self) -> bool:
        """True when an active defense checks the model (``check_model``), before round 1."""
        return any(part.check_model is not None for part in self.parts)

    @property
    def observed_only(self) -> bool:
        """The attack matches only the observed (non-zero) coordinates: topk with the adaptive attacker."""
        return any(part.observed_only for part in self.parts)

    @property
    def min_clients(self) -> int:
        """The fewest clients per round the active defenses run with (secagg: SecAgg+'s minimum)."""
        return max([1, *(part.min_clients for part in self.parts)])

    @property
    def label(self) -> str:
        """Short text for the attacks.csv ``defense`` column, e.g. "topk(0.1)+local-dp(C=0.05,eps=10)"."""
        return "+".join(part.label() for part in self.parts)

    def parameters(self) -> dict:
        """The run-config keys and values that configure the active defenses, then what they derive
        from them (e.g. "local-dp-noise-std")."""
        out = {}
        for part in self.parts:
            out.update({_field_to_key(f.name): getattr(part, f.name) for f in fields(part)})
        for part in self.parts:
            out.update(part.derived())
        return out

    def observed(self) -> str:
        """What the attacker observes of a client under this defense, for config.json."""
        return "; ".join(part.observed() for part in sorted(self.parts, key=lambda part: part.order))

    def describe(self) -> dict:
        """The defense block of config.json."""
        return {
            "defense": "+".join(self.names),
            "label": self.label,
            "parameters": self.parameters(),
            "observed": self.observed(),
        }

    def transform(self, w0: dict, wT: dict, seed: int = 0) -> OrderedDict:
        """wT after each active defense's ``transform``, in their ``order`` (low-rank, quantize, then
        top-k, so that the server sees exactly top-k's fraction of non-zeros). ``w0``, ``wT``: state
        dicts (name -> tensor); ``seed`` seeds quantize's rounding. A new dict; wT's tensors when no
        defense transforms."""
        out = OrderedDict(wT.items())
        for part in sorted(self.parts, key=lambda part: part.order):
            if part.transform is not None:
                out = part.transform(w0, out, seed)
        return out
