"""Scenarios: cluster shape + training budget + WAN profile + faults + expectations.

A scenario is TOML on disk (`scenarios/NAME.toml`) or the same frozen dataclasses
in Python; docs/SCENARIOS.md describes every key. `load_scenario` reads a file (a
bare name looks in the repo's scenarios/ folder), `scenario_from_dict` builds from
a dict, `Scenario.to_dict` and `harness.scenarios.scenario_toml.scenario_to_toml` write one back out; all round-trip.
The tables [cluster], [train] and [expect] are harness/scenarios/specs.py's dataclasses
(re-exported here).

Durations are strings with a unit ("500ms", "15s", "2m", "1h") or plain numbers of
seconds; a field named `x_s` is written `x` or `x_s`. Fields named `_ms` take
milliseconds, `_kbps` kilobits per second (or "2mbps", "500kbps").

The run's length: `train.duration` is the wall-clock budget of the run, measured
from training start (t = 0, once every learner has made its first inner step; see
docs/ARCHITECTURE.md). The run ends when the job has trained its token budget
(learners × `train.steps` × batch tokens) or `train.end_grace` (20 s unless set) after
the wall-clock budget, whichever first. Fault times are checked against `train.duration`: every
fault starts before it; one may last past it (the injector heals it at teardown).

Every error is a `ScenarioError` naming the file, the key path (`faults[1].down_for`),
what was wrong and what would be valid.
"""
from __future__ import annotations

import dataclasses
import re
import sys
import tomllib
import typing
from dataclasses import MISSING, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from diloco_chaos.faults.failures import FailureProcess
from diloco_chaos.faults.fields import FieldError, check_number, suggest
from diloco_chaos.faults.kinds import FAULT_KINDS, Fault
from diloco_chaos.faults.schedule import RunShape, Schedule, ScheduleError, validate
from diloco_chaos.harness.links import LinkProfile
from diloco_chaos.harness.scenarios.specs import ClusterSpec, Expect, TrainSpec
from diloco_chaos.harness.units import _Bad, _convert, _describe, _shown, _what
from diloco_chaos.trainer.config import InnerOptConfig, RunConfig, is_plugin
from diloco_chaos.trainer.presets import with_preset

SCENARIOS_DIR = Path(resources.files(__package__)).resolve() / "builtin"  # scenarios/ in a checkout links here
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


class ScenarioError(ValueError):
    """Bad scenario input: `source` (file), `path` (key path), `problem`, `valid`."""

    def __init__(self, source: str, path: str, problem: str, valid: str = ""):
        self.source, self.path, self.problem, self.valid = source, path, problem, valid
        where = f"{source}: {path}: " if path else f"{source}: "
        super().__init__(where + problem + (f"; valid: {valid}" if valid else ""))


# The trainer's config fields each scenario key sets (for errors from RunConfig).
_TRAINER_KEYS = {"DilocoConfig.learners": "cluster.learners", "DilocoConfig.slices": "cluster.slices",
                 "RunConfig.steps": "train.steps", "InnerOptConfig.total_steps": "train.steps",
                 "InnerOptConfig.lr": "train.lr", "InnerOptConfig.second_moment": "train.second_moment",
                 "TaskConfig.kind": "train.task", "TaskConfig.options": "task",
                 **{f"DilocoConfig.{k}": f"train.{k}" for k in ("fragments", "sync_every", "quorum", "overlap",
                                                                 "mixing", "compression", "broadcast_compression",
                                                                 "sparse_density", "error_feedback",
                                                                 "merge", "mode", "max_staleness", "starve_cycles",
                                                                 "keep_local", "keep_on_fetch", "fleet_share",
                                                                 "share_by", "downlink", "align", "grace_factor")},
                 "TaskConfig.batch_size": "train.batch_size", "TaskConfig.seq_len": "train.seq_len",
                 "OuterOptConfig.lr": "train.outer_lr", "OuterOptConfig.momentum": "train.outer_momentum",
                 "OuterOptConfig.warmup": "train.outer_warmup"}


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    train: TrainSpec
    description: str = ""
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    wan: LinkProfile | None = None  # the base profile of every link; None = unshaped
    faults: tuple[Fault, ...] = ()
    failure_process: FailureProcess | None = None  # random faults, drawn into the schedule
    expect: Expect = field(default_factory=Expect)
    task_options: dict = field(default_factory=dict, hash=False)  # the [task] table: a plug-in's arguments

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", tuple(self.faults))
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise FieldError("Scenario", "name", f"{self.name!r} cannot name a run directory",
                             "lowercase letters, digits, '.', '_' and '-', e.g. 'wan-brownout'")
        check_number(self, "seed", "[0, 2**32)", lambda v: 0 <= v < 2**32, integer=True)
        if not isinstance(self.description, str):
            raise FieldError("Scenario", "description", f"expected a string, got {self.description!r}")
        m, q = self.cluster.learners, self.train.quorum
        if q is not None and q > m:
            raise FieldError("Scenario", "train.quorum", f"quorum {q} is more than the {m} learners "
                             f"(cluster.learners)", f"1..{m}")
        try:
            config = self.run_config()
        except ValueError as e:
            key = re.search(r"\b(\w+Config\.\w+)", str(e))
            raise FieldError("Scenario", _TRAINER_KEYS.get(key.group(1) if key else "", "train"), str(e)) from None
        if self.cluster.shards > config.n_fragments:
            raise FieldError("Scenario", "cluster.shards", f"{self.cluster.shards} shards for "
                             f"{config.n_fragments} fragments: a shard would own none",
                             f"1..{config.n_fragments}")
        n = len(self.faults)
        validate(self.schedule_faults(), self.shape(),
                 name=lambda i: f"faults[{i}]" if i < n else "a drawn fault")

    def spare_roles(self) -> tuple[str, ...]:
        """The roles whose units this run restarts (a kill with a return, in the schedule or
        drawn by the failure process): they keep a warm spare when `cluster.spares` is on
        (a process on local, a container on each engine that runs the role on docker)."""
        if not self.cluster.spares:
            return ()
        roles = set()
        for _, what, f in self.schedule().timeline():
            if what == "end" and f.restarts:  # its heal starts a new process of its role
                roles.add(f.role)
        return tuple(r for r in ("learner", "syncer") if r in roles)

    def shape(self) -> RunShape:
        c = self.cluster
        return RunShape(learners=c.learners, run_s=self.train.duration_s, slices=c.slices, shards=c.shards)

    def drawn_faults(self) -> list[Fault]:
        """The failure process's faults: the same for the same scenario, every time."""
        if self.failure_process is None:
            return []
        shape = self.shape()
        return self.failure_process.draw(shape.units, shape.run_s, slices=shape.slices, avoid=self.faults,
                                         dp=self.train.mode == "dp")

    def schedule_faults(self) -> list[Fault]:
        return [*self.faults, *self.drawn_faults()]

    def schedule(self) -> Schedule:
        """Every fault of the run, explicit and drawn, sorted: what the injector walks."""
        return Schedule(tuple(self.schedule_faults()))

    def run_config(self) -> RunConfig:
        """The trainer's configuration: its defaults, with this scenario's settings."""
        t, c = self.train, self.cluster
        set_ = lambda names: {k: getattr(t, k) for k in names if getattr(t, k) is not None}  # noqa: E731
        warmup = min(InnerOptConfig().warmup_steps, t.steps - 1)
        return RunConfig.from_dict(with_preset({
            "name": self.name, "seed": self.seed, "steps": t.steps,
            "diloco": {"learners": c.learners, "slices": c.slices, "mode": t.mode,
                       **set_(("fragments", "sync_every", "quorum", "grace_factor", "overlap", "mixing", "compression",
                               "broadcast_compression", "sparse_density", "error_feedback", "merge", "max_staleness", "starve_cycles",
                               "keep_local", "keep_on_fetch", "fleet_share", "share_by", "downlink", "align"))},
            "task": {"kind": t.task, **set_(("batch_size", "seq_len", "corpus_split")),
                     **({"options": dict(self.task_options)} if self.task_options else {})},
            "inner": {"total_steps": t.steps, "warmup_steps": warmup, **set_(("lr", "second_moment"))},
            "outer": {k[len("outer_"):]: v for k, v in set_(("outer_lr", "outer_momentum", "outer_warmup")).items()},
        }, t.preset))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; `scenario_from_dict` is the inverse. Unset options are left out."""
        d: dict[str, Any] = {"name": self.name, "seed": self.seed, "description": self.description,
                             "cluster": dataclasses.asdict(self.cluster), "train": _set(self.train)}
        if self.wan is not None:
            d["wan"] = _set(self.wan)
        d["faults"] = [f.to_dict() for f in self.faults]
        if self.failure_process is not None:
            d["failure_process"] = self.failure_process.to_dict()
        d["expect"] = _set(self.expect)
        if self.task_options:
            d["task"] = dict(self.task_options)
        return d


def _set(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(obj).items() if v is not None}


# ------------------------------------------------------------------ reading
def _build(cls: type, data: Any, src: str, path: str, skip: tuple[str, ...] = ()) -> tuple[Any, dict]:
    """One table -> cls(...), with units converted and errors that name the key.
    Returns the object and {field: key as written}."""
    if not isinstance(data, dict):
        raise ScenarioError(src, path, f"expected a table, got {_describe(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    keys = {**{n: n for n in fields}, **{_shown(n): n for n in fields}}
    kwargs: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, value in data.items():
        if key in skip:
            continue
        name = keys.get(key)
        if name is None:
            shown = [_shown(n) for n in fields]
            hint = f" ({key!r} belongs above the first [table])" if key in _TOP else suggest(key, shown)
            raise ScenarioError(src, f"{path}.{key}", f"unknown key{hint}", ", ".join(shown))
        if name in written:
            raise ScenarioError(src, f"{path}.{key}", f"{written[name]!r} and {key!r} set the same thing",
                                "one of them")
        try:
            kwargs[name] = _convert(fields[name], hints[name], value)
        except _Bad as e:
            raise ScenarioError(src, f"{path}.{key}", e.problem, e.valid) from None
        written[name] = key
    for name, f in fields.items():
        if name not in kwargs and f.default is MISSING and f.default_factory is MISSING:
            base = [a for a in (typing.get_args(hints[name]) or (hints[name],)) if a is not type(None)][0]
            raise ScenarioError(src, f"{path}.{_shown(name)}", "missing (required)", _what(f, base))
    try:
        return cls(**kwargs), written
    except FieldError as e:
        raise ScenarioError(src, f"{path}.{written.get(e.field, _shown(e.field))}", e.problem, e.valid) from None
    except ValueError as e:  # LinkProfile: its messages start with the field's name
        name = re.match(r"\w*", str(e)).group(0)
        key = written.get(name) or (_shown(name) if name in fields else "")
        raise ScenarioError(src, f"{path}.{key}" if key else path, str(e)) from None


_TOP = ("name", "seed", "description", "cluster", "train", "task", "wan", "faults", "failure_process", "expect")


def scenario_from_dict(d: dict, source: str = "<python>") -> Scenario:
    """A scenario from a dict (a parsed TOML file, or `Scenario.to_dict()`)."""
    if not isinstance(d, dict):
        raise ScenarioError(source, "", f"expected a table, got {_describe(d)}")
    for key in d:
        if key not in _TOP:
            raise ScenarioError(source, key, f"unknown key{suggest(key, _TOP)}", ", ".join(_TOP))
    for key, hint in (("name", 'e.g. name = "unit-loss"'), ("seed", "e.g. seed = 7"),
                      ("train", 'a [train] table with steps and duration, e.g. steps = 400, duration = "60s"')):
        if key not in d:
            raise ScenarioError(source, key, "missing (required)", hint)
    kw: dict[str, Any] = {k: d[k] for k in ("name", "seed", "description") if k in d}
    for key, cls in (("cluster", ClusterSpec), ("train", TrainSpec), ("wan", LinkProfile), ("expect", Expect)):
        if key in d:
            kw[key] = _build(cls, d[key], source, key)[0]
    if "failure_process" in d:
        table = d["failure_process"]
        if isinstance(table, dict) and "seed" not in table:
            table = {**table, "seed": d["seed"]}  # by default the scenario's seed
        kw["failure_process"] = _build(FailureProcess, table, source, "failure_process")[0]
    if "task" in d:
        if not isinstance(d["task"], dict):
            raise ScenarioError(source, "task", f"expected a table, got {_describe(d['task'])}",
                                "a [task] table of the plug-in's keyword arguments (docs/TASKS.md)")
        kw["task_options"] = d["task"]
    faults, written = _read_faults(d.get("faults", []), source)
    s = _scenario(kw, faults, written, source)
    if is_plugin(s.train.task):  # a user's task: its contract proven before any process starts
        from diloco_chaos.trainer.numerics.plugins import PluginError, check_task

        try:
            check_task(s.run_config())
        except PluginError as e:
            raise ScenarioError(source, "train.task", str(e)) from None
    return s


def _scenario(kw: dict, faults: list[Fault], written: list[dict], source: str) -> Scenario:
    try:
        return Scenario(**kw, faults=tuple(faults))
    except ScheduleError as e:
        if e.index < len(faults):
            path = f"faults[{e.index}].{written[e.index].get(e.field, _shown(e.field))}"
            raise ScenarioError(source, path, e.problem, e.valid) from None
        raise ScenarioError(source, "failure_process", f"drawn fault {e.fault.kind} of {e.fault.target} at "
                            f"{e.fault.at_s:g}s: {e.problem}", e.valid) from None
    except FieldError as e:
        raise ScenarioError(source, e.field, e.problem, e.valid) from None


def _read_faults(entries: Any, source: str) -> tuple[list[Fault], list[dict]]:
    if not isinstance(entries, list):
        raise ScenarioError(source, "faults", f"expected an array of tables ([[faults]]), got {_describe(entries)}")
    faults, written = [], []
    kinds = ", ".join(FAULT_KINDS)
    for i, entry in enumerate(entries):
        path = f"faults[{i}]"
        if not isinstance(entry, dict):
            raise ScenarioError(source, path, f"expected a table, got {_describe(entry)}")
        if "kind" not in entry:
            raise ScenarioError(source, f"{path}.kind", "missing (required)", kinds)
        kind = entry["kind"]
        if kind == "failure_process":
            raise ScenarioError(source, f"{path}.kind", "a failure process is a table of its own, "
                                "[failure_process], not one of [[faults]]", kinds)
        if kind not in FAULT_KINDS:
            raise ScenarioError(source, f"{path}.kind", f"unknown fault kind {kind!r}{suggest(str(kind), FAULT_KINDS)}",
                                kinds)
        fault, keys = _build(FAULT_KINDS[kind], entry, source, path, skip=("kind",))
        faults.append(fault)
        written.append(keys)
    return faults, written


def load_scenario(path_or_name: str | Path) -> Scenario:
    """Reads a scenario file; a bare name (no '/', no '.toml') is a built-in."""
    path, source = locate(path_or_name)
    return scenario_from_dict(read_toml(path, source), source)


def plugins_beside(path: Path) -> None:
    """A scenario file's plug-in task ("my_task.py beside this file") is looked for in its
    folder first, by this process and every unit it starts (trainer/numerics/plugins.py). The CLI
    calls it for the file it was given (and restores the environment when the command
    ends); the library's `load_scenario` changes no process state."""
    if Path(path).parent.resolve() != SCENARIOS_DIR.resolve():
        from diloco_chaos.trainer.numerics.plugins import search_first
        search_first(Path(path).parent)


# Built-in scenarios under an old name: old -> new. The old name still runs the scenario,
# with a note saying it is the old name (once per process, on stderr).
RENAMED = {"baseline": "fault-free"}  # "baseline" is a stored known-good run (docs/GLOSSARY.md)
_said_renamed: set[str] = set()


def locate(path_or_name) -> tuple[Path, str]:
    """(the file to read, how errors name it): a bare name (no '/', no '.toml') is a
    built-in scenario, which must exist (an old name in RENAMED finds the new one)."""
    text_name = str(path_or_name)
    if isinstance(path_or_name, str) and "/" not in text_name and not text_name.endswith(".toml"):
        if text_name in RENAMED:
            old, text_name = text_name, RENAMED[text_name]
            if old not in _said_renamed:
                _said_renamed.add(old)
                print(f"note: {old!r} is the old name of the built-in scenario {text_name!r}; it runs "
                      f"{text_name!r}, whose runs are named so", file=sys.stderr)
        path, source = SCENARIOS_DIR / f"{text_name}.toml", f"scenarios/{text_name}.toml"
        if not path.is_file():
            names = [n for n, _ in list_scenarios()]
            raise ScenarioError(source, "", f"no built-in scenario {text_name!r}{suggest(text_name, names)}",
                                ", ".join(names) + ", or a path to a .toml file")
        return path, source
    return Path(path_or_name), text_name


def read_toml(path: Path, source: str) -> dict:
    """The file's TOML as a dict; a file that cannot be read or parsed is one error, with
    the line and column where it can say."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(source, "", f"cannot read the file: {e.strerror}") from None
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise ScenarioError(source, f"line {line}", f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                            f"{e.start})", "a TOML file, which is UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        problem = re.sub(r"\s*\(at .*\)$", "", str(e))
        where = f"line {m.group(1)}, column {m.group(2)}" if m else ""
        raise ScenarioError(source, where, f"TOML syntax error: {problem}", "TOML, see https://toml.io") from None


def list_scenarios() -> list[tuple[str, str]]:
    """(name, one-line description) of every built-in scenario, by name."""
    out = []
    for path in sorted(SCENARIOS_DIR.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        out.append((path.stem, str(data.get("description", "")).strip().split("\n")[0]))
    return out
