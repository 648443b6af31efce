"""One way to read settings written as text: ``key=value`` pairs, typed like their defaults.

Every entry point (the run config, ``attack-options``, the CLI) converts values with
``typed_value``, so "2.7" is never silently truncated to the integer 2 and "yes" is a bool
everywhere. Light: no torch import.
"""
from __future__ import annotations

import math
from dataclasses import fields


def typed_value(key: str, value, default):
    """``value`` converted to the type of ``default``; ValueError starting with ``key`` (e.g.
    "run config 'seed'") otherwise. Floats must be finite numbers (NaN and inf rejected), integers
    whole numbers; a bool is not taken for a number (TOML ``seed = true`` is an error)."""
    kind = type(default)
    if kind in (int, float) and isinstance(value, bool):
        raise ValueError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if kind is bool:
        if isinstance(value, bool):
            return value
        if str(value).strip().lower() in ("true", "1", "yes"):
            return True
        if str(value).strip().lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"{key} must be true or false, got {value!r}")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{key} must be an integer, got {value!r}")
        if isinstance(value, str):
            try:
                return int(value.strip())  # exact, however many digits
            except ValueError:
                pass
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"{key} must be an integer, got {value!r}") from None
            if not number.is_integer():
                raise ValueError(f"{key} must be an integer, got {value!r}")
            return int(number)
    if kind is float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"{key} must be a finite number, got {value!r}")
        return number
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be {kind.__name__}, got {value!r}") from None


def parse_key_values(text: str, defaults: dict, what: str, noun: str = "setting") -> dict:
    """"tv_weight=0.02,label_refine=0.25" -> {"tv_weight": 0.02, "label_refine": 0.25}, each value
    typed like ``defaults[key]``. ``what`` names the source and ``noun`` its keys in error messages.

    Raises ValueError for an item without '=', an unknown key or a value of the wrong type.
    """
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if "=" not in item:
            raise ValueError(f"{what}: expected key=value, got '{item}'")
        key, value = (s.strip() for s in item.split("=", 1))
        if key not in defaults:
            raise ValueError(f"{what}: unknown {noun} '{key}'; known: {sorted(defaults)}")
        out[key] = typed_value(f"{what} '{key}'", value, defaults[key])
    return out


def check_field_types(settings, key_of) -> None:
    """Every field of the dataclass ``settings`` has its default's type: int fields a true int
    (not a bool), float fields a finite number, str and bool fields their type. ``key_of(name)``
    gives the run-config key for a field name; ValueError "invalid run config: <key> ..." otherwise.
    Catches what from_run_config's typed_value would, for settings built directly."""
    for f in fields(settings):
        kind, value = type(f.default), getattr(settings, f.name)
        if kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
            wanted = "an integer"
        elif kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            wanted = "a finite number"
        elif kind in (str, bool):
            ok, wanted = isinstance(value, kind), ("text" if kind is str else "true or false")
        else:
            continue
        if not ok:
            raise ValueError(f"invalid run config: {key_of(f.name)} must be {wanted}, got {value!r}")
