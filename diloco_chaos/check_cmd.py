"""`diloco-chaos check FILE...` and `diloco-chaos faults`.

`check` validates scenario files without starting anything: every error of a file in
one pass (the scenario reader stops at its first error, so the file is read again with
each offending key taken out, until it reads or nothing is left to take out), then,
for a valid file, the run's shape and its fault schedule, the failure process's drawn
faults included. `faults` lists the fault kinds: target, parameters, defaults.
"""
from __future__ import annotations

import dataclasses

import copy
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

MAX_PASSES = 50  # how many times one file is read again, at most, to find its next error

# Values that stand in for a required key the checker itself took out (its value was
# wrong, and that error is already reported), so the rest of the file can be read.
# A long duration keeps every fault's time inside the run.
STAND_INS = {"name": "checked", "seed": 0, "train": {}, "train.steps": 100, "train.duration": 3600}


def register(sub, help_: str) -> None:
    p = sub.add_parser(
        "check", help=help_, description=(
            "Validate scenario TOML files without starting anything. Every error of a file is "
            "reported in one pass, as FILE: KEY: problem; valid: ...; a valid file shows the run's "
            "shape and its fault schedule (the failure process's draw included)."),
        epilog="exit codes: 0 every file is valid; 2 a file has an error (or cannot be read)")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="scenario TOML files, or built-in names (see `diloco-chaos scenarios`)")
    p.add_argument("--seed", type=int, default=None,
                   help="override each scenario's seed, as `run --seed` does (the training's seed; a failure "
                        "process draws from the seed the file gives it)")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list on stdout instead of text: one object per file with its "
                        "errors [{path, problem, valid}], its shape and its schedule")
    p.set_defaults(func=cmd_check)


def register_faults(sub, help_: str) -> None:
    p = sub.add_parser("faults", help=help_, description=(
        "The fault kinds a scenario's [[faults]] tables may use: each kind's target, its "
        "parameters with their types and defaults, how it is done, and what it does."))
    p.add_argument("--json", action="store_true",
                   help="print a JSON list on stdout: one object per kind with its target, parameters "
                        "and description")
    p.set_defaults(func=cmd_faults)


# ------------------------------------------------------------------ check
@dataclass
class FileCheck:
    """What checking one file found: its errors, or the scenario it describes."""

    file: str
    errors: list[dict] = field(default_factory=list)  # {path, problem, valid}
    scenario: Any = None  # the Scenario, when the file has no error

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"file": self.file, "errors": self.errors, "schedule": []}
        if self.scenario is not None:
            d["shape"] = shape_of(self.scenario)
            d["schedule"] = schedule_rows(self.scenario)
        return d


def cmd_check(args) -> int:
    results = [check_file(name, args.seed) for name in args.files]
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=1, default=str))
    else:
        for r in results:
            print_result(r)
    bad = [r for r in results if r.errors]
    if bad:
        n = sum(len(r.errors) for r in bad)
        print(f"{n} error{'s' if n != 1 else ''} in {len(bad)} file{'s' if len(bad) != 1 else ''}",
              file=sys.stderr if args.json else sys.stdout)
        return 2
    return 0


def check_file(name: str, seed: int | None = None) -> FileCheck:
    """Every error of one scenario file, or the scenario it describes."""
    from diloco_chaos.harness.scenarios.scenario import ScenarioError, locate, plugins_beside, read_toml

    try:
        path, source = locate(name)
    except ScenarioError as e:  # a bare name that is no built-in
        result = FileCheck(e.source)
        result.errors.append(_error(e))
        return result
    result = FileCheck(source)
    plugins_beside(path)
    try:
        data = read_toml(path, source)
    except ScenarioError as e:
        result.errors.append(_error(e))
        return result
    result.scenario, errors = collect_errors(data, source)
    if seed is not None and result.scenario is not None:  # as `run --seed` does: the draw keeps the file's
        result.scenario = dataclasses.replace(result.scenario, seed=seed)
    text = path.read_text(encoding="utf-8", errors="replace") if path is not None and path.is_file() else ""
    result.errors = [_error(e, text) for e in errors]
    return result


def collect_errors(data: dict, source: str):
    """(the scenario or None, every ScenarioError of `data`). The reader stops at the first
    error, so after each one the offending key (or, where it cannot go alone, the fault
    table or the table holding it) is taken out and the dict is read again."""
    from diloco_chaos.harness.scenarios.scenario import ScenarioError, scenario_from_dict

    work = _Work(copy.deepcopy(data))
    errors: list = []
    for _ in range(MAX_PASSES):
        try:
            s = scenario_from_dict(work.data, source)
            errors += _dropped_targets(work.dropped, s, source, errors)
            return (None if errors else s), errors
        except ScenarioError as e:
            if not work.fix(e, errors):
                return None, errors
    return None, errors


def _dropped_targets(dropped: list, s, source: str, errors: list) -> list:
    """A fault table taken out for another field's error still has its target judged (one
    pass shows every error: a bad duration does not hide a target the run does not have)."""
    from diloco_chaos.faults.kinds import FAULT_KINDS
    from diloco_chaos.faults.kinds.base import role_of
    from diloco_chaos.harness.scenarios.scenario import ScenarioError

    shape, out = s.shape(), []
    said = {e.path for e in errors}
    for i, table in dropped:
        kind, target = table.get("kind"), table.get("target")
        path = f"faults[{i}].target"
        if kind not in FAULT_KINDS or not isinstance(target, str) or path in said:
            continue
        if role_of(target) not in FAULT_KINDS[kind].roles:  # what the kind itself would say of it
            out.append(ScenarioError(source, path, f"{kind} cannot target {target!r}",
                                     FAULT_KINDS[kind].target_forms()))
            continue
        if _cluster_read(errors) and not shape.has_target(target):
            out.append(ScenarioError(source, path, f"unknown target {target!r} in a run with {shape.learners} "
                                                   f"learners and {shape.shards} syncer shard(s)",
                                     shape.valid_targets(FAULT_KINDS[kind].roles)))
    return out


def _cluster_read(errors: list) -> bool:
    """Whether the [cluster] table was read as written: with one of its keys wrong, the
    run's size is the default's, and a target judged against it would be a second error of
    that one cause (learners = 0 does not make learner-7 "unknown in a run with 4 learners")."""
    return not any(e.path == "cluster" or e.path.startswith("cluster.") for e in errors)


class _Work:
    """The dict being read again, and what the checker took out of it so far. Fault tables
    taken out shift the ones after them, so `ids` keeps each remaining table's index in
    the file, and every error is reported at the key as the file has it."""

    def __init__(self, data: dict):
        self.data = data
        faults = data.get("faults")
        self.ids = list(range(len(faults))) if isinstance(faults, list) else []
        self.removed: set[str] = set()  # paths as the file has them
        self.dropped: list[tuple[int, dict]] = []  # fault tables taken out whole: (index in the file, table)
        self.filled: set[str] = set()   # missing tables the checker put in, empty: their keys are that error's

    def fix(self, e, errors: list) -> bool:
        """Records `e` (unless it only says a key the checker took out is missing) and
        changes the dict so that the next read gets past it. False: nothing left to change."""
        path = self.in_file(e.path)
        if e.problem.startswith("missing (required)") and (
                _same_key(path, self.removed) or any(path.startswith(f + ".") for f in self.filled)):
            return self.stand_in(path)  # one cause, one error: the table's own
        e.path = path
        if re.fullmatch(r"faults\[\d+\]\.target", path) and e.problem.startswith("unknown target") \
                and not _cluster_read(errors):
            return self.take_out(e.path)  # judged against a cluster it does not have (_cluster_read)
        if not any((x.path, x.problem) == (e.path, e.problem) for x in errors):
            errors.append(e)
        if e.problem.startswith("missing (required)"):
            return self.stand_in(path)
        if e.path == "train.task" and isinstance(self.data.get("task"), dict):
            # the [task] table holds the failed plug-in's arguments: read without it, not as
            # options the built-in default task refuses (one error per cause, not a cascade)
            self.removed.add("task")
            del self.data["task"]
        return self.take_out(e.path)

    def in_file(self, path: str) -> str:
        """A path of the dict being read as the file has it (its fault index)."""
        m = re.match(r"faults\[(\d+)\]", path)
        if m and int(m.group(1)) < len(self.ids):
            return f"faults[{self.ids[int(m.group(1))]}]" + path[m.end():]
        return path

    def in_work(self, path: str) -> str:
        m = re.match(r"faults\[(\d+)\]", path)
        if m and int(m.group(1)) in self.ids:
            return f"faults[{self.ids.index(int(m.group(1)))}]" + path[m.end():]
        return path

    def take_out(self, path: str) -> bool:
        """Takes the key at `path` out; a key the dict does not have takes out the innermost
        table that holds it (a fault table whole). False when that would be the whole file."""
        keys = _split(self.in_work(path))
        while keys:
            parent = _get(self.data, keys[:-1])
            if isinstance(parent, (dict, list)) and _has(parent, keys[-1]):
                self.removed.add(path)
                self._delete(parent, keys)
                return True
            keys = keys[:-1]
            path = _join(keys)
        return False

    def _delete(self, parent, keys: list) -> None:
        if isinstance(parent, list):  # a whole fault table
            if isinstance(parent[keys[-1]], dict):
                self.dropped.append((self.ids[keys[-1]], parent[keys[-1]]))
            del parent[keys[-1]]
            del self.ids[keys[-1]]
        else:
            del parent[keys[-1]]

    def stand_in(self, path: str) -> bool:
        """A required key is missing: a stand-in value where one is known, else the table
        that needs it (a fault table whole) goes."""
        key = re.sub(r"_s$", "", path)
        if key in STAND_INS:
            keys = _split(self.in_work(key))
            parent = _get(self.data, keys[:-1])
            if isinstance(parent, dict) and keys[-1] not in parent:
                parent[keys[-1]] = copy.deepcopy(STAND_INS[key])
                if isinstance(STAND_INS[key], dict):
                    self.filled.add(path)
                return True
        keys = _split(self.in_work(path))
        if len(keys) < 2:
            return False
        return self.take_out(_join(keys[:-1]))


def _split(path: str) -> list:
    """`faults[1].target` -> ["faults", 1, "target"]."""
    out: list = []
    for part in path.split("."):
        m = re.fullmatch(r"(\w*)((?:\[\d+\])*)", part)
        if not m or not part:
            return []  # not a key path ("line 3, column 1", "")
        if m.group(1):
            out.append(m.group(1))
        out.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group(2)))
    return out


def _join(keys: list) -> str:
    text = ""
    for k in keys:
        text += f"[{k}]" if isinstance(k, int) else (f".{k}" if text else k)
    return text


def _get(data, keys: list):
    for k in keys:
        if not _has(data, k):
            return None
        data = data[k]
    return data


def _has(container, key) -> bool:
    if isinstance(container, dict):
        return key in container
    return isinstance(container, list) and isinstance(key, int) and 0 <= key < len(container)


def _same_key(path: str, removed: set[str]) -> bool:
    """Whether `path` names a key the checker took out (`at` and `at_s` are one key), or
    a key inside a table it took out."""
    plain = re.sub(r"_s$", "", path)
    return any(plain == re.sub(r"_s$", "", r) or path.startswith(r + ".") for r in removed)


def _error(e, text: str = "") -> dict:
    """An error as `check` reports it, with the line and column of the key in the file where
    TOML says (a syntax error) or the key can be found (file:line:col, as editors read it)."""
    out = {"path": e.path, "problem": e.problem, "valid": e.valid}
    m = re.fullmatch(r"line (\d+)(?:, column (\d+))?", e.path or "")
    if m:
        out.update(path="", line=int(m.group(1)), col=int(m.group(2) or 1))
    elif text and (at := key_position(text, e.path)):
        out.update(line=at[0], col=at[1])
    return out


def key_position(text: str, path: str) -> tuple[int, int] | None:
    """(line, column), 1-based, of the key `path` names (`cluster.learners`, `faults[1].target`,
    `train`) in a TOML file's text: its `key =` line inside its table, or the table's header;
    None where the file does not spell it (a missing key: its table's header, if any)."""
    keys = [k for k in re.split(r"\.(?![^\[]*\])", path or "") if k]
    if not keys:
        return None
    m = re.fullmatch(r"(\w+)\[(\d+)\]", keys[0])
    table, nth = (m.group(1), int(m.group(2))) if m else (keys[0], None)
    lines = text.splitlines()
    headers = [(i, ln.strip()) for i, ln in enumerate(lines) if ln.strip().startswith("[")]
    if nth is not None:
        starts = [i for i, h in headers if h.replace(" ", "") == f"[[{table}]]"]
    else:
        starts = [i for i, h in headers if h.replace(" ", "") == f"[{table}]"]
    if len(keys) == 1 and nth is None:  # a top-level key, or a whole table
        for i, ln in enumerate(lines[:headers[0][0] if headers else len(lines)]):
            if re.match(rf"\s*{re.escape(table)}\s*=", ln):
                return i + 1, ln.index(table) + 1
        return (starts[0] + 1, 1) if starts else None
    if nth is not None and nth >= len(starts) or nth is None and not starts:
        return None
    first = starts[nth if nth is not None else 0]
    end = next((i for i, _ in headers if i > first), len(lines))
    key = keys[1] if len(keys) > 1 else None
    if key is None:
        return first + 1, 1
    for i in range(first + 1, end):
        if re.match(rf"\s*{re.escape(key)}\s*=", lines[i]):
            return i + 1, lines[i].index(key) + 1
    return first + 1, 1  # missing from its table: the table's header


# ------------------------------------------------------------------ the valid file's facts
def shape_of(s) -> dict:
    """The run's shape: who runs, for how long, on what."""
    c, t = s.cluster, s.train
    return {"name": s.name, "seed": s.seed, "learners": c.learners, "slices": c.slices, "shards": c.shards,
            "backend": c.backend, "steps": t.steps, "duration_s": t.duration_s, "task": t.task, "mode": t.mode,
            "preset": t.preset, "failure_process": s.failure_process is not None}


def schedule_rows(s) -> list[dict]:
    """Every fault of the run in time order, explicit and drawn: at, kind, target, length,
    its other parameters, and where it comes from (the file or the failure process)."""
    explicit = {id(f) for f in s.faults}
    rows = []
    for f in s.schedule():
        d = f.to_dict()
        params = {k: v for k, v in d.items() if k not in ("kind", "target", "at_s", f.length_field)}
        rows.append({"at_s": f.at_s, "kind": f.kind, "target": f.target, "length_field": f.length_field,
                     "length_s": f.length_s, "parameters": params,
                     "from": "file" if id(f) in explicit else "failure_process"})
    return rows


def print_result(r: FileCheck) -> None:
    if r.errors:
        for e in r.errors:
            at = f"{r.file}:{e['line']}:{e['col']}" if e.get("line") else r.file
            where = f"{at}: {e['path']}: " if e["path"] else f"{at}: "
            print(where + e["problem"] + (f"; valid: {e['valid']}" if e["valid"] else ""))
        return
    shape = shape_of(r.scenario)
    length = f"{shape['steps']} steps per learner within {shape['duration_s']:g} s"
    print(f"{r.file}: valid: {shape['name']} (seed {shape['seed']}): {shape['learners']} learners x "
          f"{shape['slices']} slices, {shape['shards']} syncer shard{'s' if shape['shards'] != 1 else ''}, "
          f"{length}, task {shape['task']}, mode {shape['mode']}, backend {shape['backend']}")
    print_schedule(schedule_rows(r.scenario))


def print_schedule(rows: list[dict]) -> None:
    if not rows:
        print("  no faults")
        return
    table = [("at", "kind", "target", "length", "parameters", "from")]
    for row in rows:
        length = "never ends" if row["length_s"] is None else f"{row['length_s']:g} s"
        params = ", ".join(f"{k}={v}" for k, v in row["parameters"].items()) or "-"
        table.append((f"{row['at_s']:g} s", row["kind"], row["target"], f"{row['length_field'][:-2]} {length}",
                      params, row["from"]))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]) - 1)]
    for line in table:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths)) + "  " + line[-1])


# ------------------------------------------------------------------ faults
def cmd_faults(args) -> int:
    from diloco_chaos.reference import fault_kinds

    kinds = fault_kinds()
    if args.json:
        print(json.dumps(kinds, indent=1, default=str))
        return 0
    for k in kinds:
        print(f"{k['kind']}  (target: {k['target']})")
        print(f"  {k['description']}")
        for p in k["parameters"]:
            default = "required" if p["required"] else f"default {p['default']}"
            print(f"    {p['name']:<16} {p['type']:<14} {default}")
        print(f"  done by: {k['mechanism']}\n")
    print(f"{len(kinds)} fault kinds; every fault also takes target and at (seconds from time zero)")
    return 0
