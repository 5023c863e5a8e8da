"""Units in scenario values: durations ("500ms", "15s", "2m", "1h" or seconds),
bandwidths ("2mbps", "500kbps" or kbps), and the conversion of a TOML value to a
dataclass field's type with a message that says what would be valid."""
from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any


_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_DURATION = re.compile(rf"\s*({_NUM})\s*(ms|s|sec|m|min|h|d|w|y)?\s*", re.I)
# seconds per unit; days, weeks and (365-day) years for the fleet model's failure rates
PER_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_RATE = re.compile(rf"\s*({_NUM})\s*(kbps|mbps|gbps)?\s*", re.I)
_KBPS = {"kbps": 1, "mbps": 1000, "gbps": 1_000_000}


class _Bad(ValueError):
    def __init__(self, problem: str, valid: str = ""):
        super().__init__(problem + (f"; valid: {valid}" if valid else ""))
        self.problem, self.valid = problem, valid


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number_and_unit(value: Any, pattern: re.Pattern, what: str, valid: str) -> tuple[float, str | None]:
    if _is_number(value):
        return float(value), None
    m = pattern.fullmatch(value) if isinstance(value, str) else None
    if not m:
        raise _Bad(f"cannot read {value!r} as {what}", valid)
    return float(m.group(1)), m.group(2)


def parse_duration(value: Any, unit: str = "s") -> float:
    """A number (already in `unit`) or a string with a unit, in `unit` ("s" or "ms")."""
    num, u = _number_and_unit(value, _DURATION, "a duration", f'a number of {"seconds" if unit == "s" else "ms"},'
                              ' or a string with a unit ms, s, m or h, e.g. "500ms", "15s", "2m"')
    u = (u or unit).lower()
    if u == unit:
        return num
    if u == "ms":  # divide: 500 / 1000 is exactly 0.5, 500 * 0.001 is not
        return num / 1000
    return num * PER_S[u] * (1000 if unit == "ms" else 1)


def parse_bandwidth_kbps(value: Any) -> float:
    """A number of kilobits per second, or a string "500kbps", "2mbps", "1gbps"."""
    num, u = _number_and_unit(value, _RATE, "a bandwidth", "a number of kilobits per second, or a string "
                              'with a unit kbps, mbps or gbps, e.g. "2mbps"')
    return num * _KBPS[(u or "kbps").lower()]


def _shown(name: str) -> str:
    """How a field is written in a scenario file: `at_s` as `at`."""
    return name[:-2] if name.endswith("_s") else name


def _what(f: dataclasses.Field, base: Any) -> str:
    word = f.metadata.get("none_word")
    alt = f', or "{word}"' if word else ""
    if f.name.endswith("_s"):
        return f'a duration, e.g. "15s" or "500ms"{alt}'
    if f.name.endswith("_ms"):
        return f"milliseconds, e.g. 40{alt}"
    if f.name.endswith("_kbps"):
        return f'kilobits per second, e.g. 2000 or "2mbps"{alt}'
    return {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}.get(
        base, "see docs/SCENARIOS.md")


def _convert(f: dataclasses.Field, hint: Any, value: Any) -> Any:
    args = typing.get_args(hint) or (hint,)
    others = [a for a in args if a is not type(None)]
    base = others[0] if len(others) == 1 else None
    if value is None and type(None) in args:
        return None
    if f.metadata.get("none_word") is not None and value == f.metadata["none_word"]:
        return None
    if typing.get_origin(hint) is tuple:  # tuple[str, ...]: an array of strings
        if not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            raise _Bad(f"expected an array of strings, got {_describe(value)}", 'e.g. ["a", "b"]')
        return tuple(value)
    if f.name.endswith("_s"):
        return parse_duration(value, "s")
    if f.name.endswith("_ms"):
        return parse_duration(value, "ms")
    if f.name.endswith("_kbps"):
        return parse_bandwidth_kbps(value)
    ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool), float: _is_number,
          str: lambda v: isinstance(v, str), bool: lambda v: isinstance(v, bool)}.get(
        base, lambda v: isinstance(v, (str, dict)))
    if not ok(value):
        raise _Bad(f"expected {_what(f, base)}, got {_describe(value)}", _what(f, base))
    return value


def _describe(value: Any) -> str:
    kind = {bool: "a boolean", int: "a whole number", float: "a number", str: "a string", dict: "a table",
            list: "an array"}.get(type(value), type(value).__name__)
    return f"{kind} {value!r}" if not isinstance(value, (dict, list)) else kind
