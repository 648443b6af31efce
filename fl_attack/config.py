"""One way to read settings written as text: ``key=value`` pairs, typed like their defaults.

Every entry point (the run config, ``attack-options``, the CLI) converts values with
``typed_value``, so "2.7" is never silently truncated to the integer 2 and "yes" is a bool
everywhere. Light: no torch import.
"""
from __future__ import annotations

import math


def typed_value(key: str, value, default):
    """``value`` converted to the type of ``default``; ValueError starting with ``key`` (e.g.
    "run config 'seed'") otherwise. Floats must be finite numbers, integers whole numbers."""
    kind = type(default)
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
        if math.isnan(number):
            raise ValueError(f"{key} must be a number, got {value!r}")
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
