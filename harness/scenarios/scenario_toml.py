"""Writing a `Scenario` back as a TOML file that `load_scenario` reads to an equal one
(run directories keep theirs as `scenario.toml`; failing properties print it)."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from diloco_chaos.faults.kinds import FAULT_KINDS
from diloco_chaos.harness.units import _shown


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON string escapes are TOML's
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def scenario_to_toml(s) -> str:
    """The scenario as a TOML file that `load_scenario` reads back to an equal Scenario.
    Durations are written as plain seconds under their short keys (`at = 20.0`)."""
    d = s.to_dict()
    line = lambda k, v: f"{_shown(k)} = {_toml(v)}"  # noqa: E731
    lines = [line(k, d[k]) for k in ("name", "seed", "description")]
    for key in ("cluster", "train", "task", "wan"):
        if key in d:
            lines += ["", f"[{key}]", *(line(k, v) for k, v in d[key].items())]
    for fault in d["faults"]:
        fields = {f.name: f for f in dataclasses.fields(FAULT_KINDS[fault["kind"]])}
        lines += ["", "[[faults]]"]
        for k, v in fault.items():
            v = fields[k].metadata.get("none_word") if v is None and k in fields else v
            if v is not None:
                lines.append(line(k, v))
    for key in ("failure_process", "expect"):
        if d.get(key):
            lines += ["", f"[{key}]", *(line(k, v) for k, v in d[key].items())]
    return "\n".join(lines) + "\n"
