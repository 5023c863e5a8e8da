"""A JSON Schema of scenario files, generated from the classes that read them (the tables'
dataclasses, every fault kind's), so an editor completes and validates keys as the user
types (Even Better TOML, VS Code's and JetBrains' TOML plugins read JSON Schemas):
docs/reference/scenario.schema.json, regenerated with the rest of the reference.

It says what the structure can: the tables and keys (each `x_s` key also as `x`), required
keys, JSON types, durations and bandwidths as numbers or strings with a unit, the fault
kinds and their targets. What needs the run's numbers (a quorum above the learners, a
target that does not exist, two faults that clash) stays `diloco-chaos check`'s."""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

URL = "https://json-schema.org/draft/2020-12/schema"
DURATION = {"anyOf": [{"type": "number", "minimum": 0},
                      {"type": "string", "pattern": r"^\s*[+]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*"
                                                    r"(ms|s|sec|m|min|h|d|w|y)?\s*$"}],
            "description": 'seconds, or a string with a unit: "500ms", "15s", "2m", "1h"'}
BANDWIDTH = {"anyOf": [{"type": "number", "exclusiveMinimum": 0},
                       {"type": "string", "pattern": r"(?i)^\s*(\d+(\.\d*)?|\.\d+)\s*(kbps|mbps|gbps)?\s*$"}],
             "description": 'kilobits per second, or a string with a unit: "500kbps", "2mbps"'}
NAME = {"type": "string", "pattern": r"^[a-z0-9][a-z0-9._-]*$",
        "description": "the run's name: lowercase letters, digits, '.', '_' and '-'"}


def _of_type(hint: Any) -> dict:
    """The JSON Schema of a field's Python type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [_of_type(a) for a in args if a is not type(None)]
        return kinds[0] if len(kinds) == 1 else {"anyOf": kinds}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if hint is str:
        return {"type": "string"}
    if origin in (tuple, list) or hint in (tuple, list):
        item = [a for a in args if a is not Ellipsis]
        return {"type": "array", **({"items": _of_type(item[0])} if len(item) == 1 else {})}
    if origin is dict or hint is dict:
        return {"type": "object"}
    return {}


def _field(f: dataclasses.Field, hint: Any) -> dict:
    if f.name.endswith(("_s", "_ms")):
        schema = dict(DURATION)
    elif f.name.endswith("_kbps"):
        schema = dict(BANDWIDTH)
    else:
        schema = _of_type(hint)
    word = f.metadata.get("none_word")
    if word:  # `never`, `end`: None written as a word
        schema = {"anyOf": [schema, {"const": word}]}
    return schema


def _written(name: str) -> str:
    return name[:-2] if name.endswith("_s") else name


def choices() -> dict[tuple[str, str], tuple]:
    """(class, field) -> the values its check accepts: the same constants the checks use."""
    from diloco_chaos.faults.kinds import CORRUPT_MODES, DIRECTIONS
    from diloco_chaos.harness.scenarios import specs
    from diloco_chaos.trainer import config
    from diloco_chaos.trainer.presets import PRESETS

    return {("ClusterSpec", "backend"): specs.BACKENDS, ("TrainSpec", "mode"): config.MODES,
            ("TrainSpec", "preset"): tuple(PRESETS), ("TrainSpec", "compression"): config.COMPRESSIONS,
            ("TrainSpec", "broadcast_compression"): config.COMPRESSIONS, ("TrainSpec", "merge"): config.MERGES,
            ("TrainSpec", "downlink"): config.DOWNLINKS, ("TrainSpec", "share_by"): config.SHARE_BY,
            ("TrainSpec", "corpus_split"): config.CORPUS_SPLITS,
            ("TrainSpec", "second_moment"): config.SECOND_MOMENTS,
            ("Partition", "direction"): DIRECTIONS, ("Corrupt", "mode"): CORRUPT_MODES}


def table(cls: type, skip: tuple[str, ...] = (), extra: dict | None = None) -> dict:
    """A dataclass's table: each field under its written name (and, for `x_s`, `x_s` too),
    the required ones required (either spelling), nothing else allowed."""
    hints = typing.get_type_hints(cls)
    props: dict[str, dict] = dict(extra or {})
    required = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        schema = _field(f, hints[f.name])
        if (cls.__name__, f.name) in (known := choices()):
            schema = {"enum": list(known[cls.__name__, f.name])}
        props[_written(f.name)] = schema
        if f.name != _written(f.name):
            props[f.name] = schema
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append({"required": [_written(f.name)]} if f.name == _written(f.name) else
                            {"anyOf": [{"required": [_written(f.name)]}, {"required": [f.name]}]})
    out = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["allOf"] = required
    return out


def fault_items() -> dict:
    """One branch per fault kind: its `kind`, a target of its roles' forms, `at`, its fields."""
    from diloco_chaos.faults.kinds import FAULT_KINDS, TARGET_FORMS

    branches = []
    for kind, cls in FAULT_KINDS.items():
        pattern = "|".join(TARGET_FORMS[role][0].pattern for role in cls.roles)
        target = {"type": "string", "pattern": f"^(?:{pattern})$", "description": cls.target_forms()}
        t = table(cls, skip=("target",), extra={"kind": {"const": kind, "description": (cls.__doc__ or "").split(".")[0]},
                                                "target": target})
        t["allOf"] = [{"required": ["kind", "target"]}, *t.get("allOf", [])]
        branches.append(t)
    return {"type": "array", "items": {"oneOf": branches}}


def _with_task(train: dict) -> dict:
    """train.task: a built-in task, or a plug-in written "package.module:factory"."""
    from diloco_chaos.trainer.config import TASK_KINDS

    task = {"anyOf": [{"enum": list(TASK_KINDS)}, {"type": "string", "pattern": r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"}],
            "description": 'a built-in task, or your own: "package.module:factory" (docs/TASKS.md)'}
    train["properties"]["task"] = task
    return train


def scenario_schema() -> dict:
    from diloco_chaos.faults.failures import FailureProcess
    from diloco_chaos.harness.links import LinkProfile
    from diloco_chaos.harness.scenarios.specs import ClusterSpec, Expect, TrainSpec

    return {
        "$schema": URL,
        "title": "diloco-chaos scenario",
        "description": "A fault scenario: the cluster, the training, the faults, what must hold "
                       "(docs/SCENARIOS.md; every key: docs/reference/scenario-keys.md).",
        "type": "object",
        "properties": {
            "name": NAME,
            "seed": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
            "description": {"type": "string"},
            "cluster": table(ClusterSpec),
            "train": _with_task(table(TrainSpec)),
            "wan": table(LinkProfile),
            "failure_process": table(FailureProcess),
            "expect": table(Expect),
            "task": {"type": "object", "description": "keyword arguments of a plug-in task"},
            "faults": fault_items(),
        },
        "required": ["name", "seed", "train"],
        "additionalProperties": False,
    }
