"""Field checks for frozen dataclasses built from user input (the fault kinds in
`faults.kinds`, the scenario's sections in harness/scenarios/scenario.py): a bad value
raises a `FieldError` (a ValueError) naming the class, the field, what was wrong and
what would be valid; a misspelled choice or name gets a "did you mean"."""
from __future__ import annotations

import difflib
import math
from typing import Any, Sequence


class FieldError(ValueError):
    """A bad value in one field: says which, what was wrong and what would be valid."""

    def __init__(self, owner: str, field: str, problem: str, valid: str = ""):
        self.owner, self.field, self.problem, self.valid = owner, field, problem, valid
        super().__init__(f"{owner}.{field}: {problem}" + (f"; valid: {valid}" if valid else ""))


def suggest(word: str, choices: Sequence[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_number(obj: Any, name: str, valid: str, ok, *, optional: bool = False,
                 integer: bool = False) -> None:
    """Type- and range-check `obj.name`; floats are stored as float (1 and 1.0 alike)."""
    value = getattr(obj, name)
    if value is None and optional:
        return
    owner = type(obj).__name__
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        what = "a whole number" if integer else "a number"
        raise FieldError(owner, name, f"expected {what}, got {value!r}", valid)
    if not (math.isfinite(value) and ok(value)):
        raise FieldError(owner, name, f"{value!r} is out of range", valid)
    if not integer:
        object.__setattr__(obj, name, float(value))


def check_choice(obj: Any, name: str, choices: Sequence[str]) -> None:
    value = getattr(obj, name)
    if value not in choices:
        raise FieldError(type(obj).__name__, name,
                         f"{value!r} is not one of the choices{suggest(str(value), choices)}",
                         ", ".join(choices))
