"""What the learner and syncer processes share: reading run.json, signals, logging
core actions, timers. Process-level I/O only; the logic lives in the cores."""
from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import numpy as np

from diloco_chaos.trainer.config import RunConfig
from diloco_chaos.trainer.protocol.messages import describe
from diloco_chaos.trainer.protocol.protocol_base import Log
from diloco_chaos.trainer.units.events import EventWriter


def process_started() -> float | None:
    """When this process started (epoch seconds, to the kernel's clock tick), from
    /proc/self/stat and the boot time in /proc/stat; None where /proc cannot tell. A unit's
    unit_up carries it (`started`): from there to the unit_up is the unit's own start
    (Python, JAX, the task), whatever started the process (harness/judging/pace.py)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
        return round(btime + ticks / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def parse_args(argv, what: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m trainer.{what}", description=f"one {what} process of a run")
    p.add_argument("--run-dir", required=True, type=Path, help="the run directory (holds run.json)")
    p.add_argument("--id", help=f"this {what}'s name in the topology (required unless --spare)")
    p.add_argument("--spare", default=None, metavar="NAME",
                   help=f"a warm spare: get ready to be any {what}, then take the identity the harness "
                        "writes on stdin (one JSON line {\"id\", \"incarnation\"})")
    p.add_argument("--incarnation", type=int, default=0, help="restart count of this process")
    p.add_argument("--bugs", default=None, help="planted bugs, comma-separated (for the test suites); "
                   f"default: those of ${BUGS_ENV} that a {what} knows")
    args = p.parse_args(argv)
    use_compile_cache()  # before the unit imports JAX's programs: a restart loads them
    if args.id is None and args.spare is None:
        p.error("--id is required (or --spare NAME)")
    if args.bugs is None:  # a whole run with planted bugs: each process keeps the ones of its role
        from diloco_chaos.trainer.protocol.protocol_base import LEARNER_BUGS, SYNCER_BUGS
        valid = LEARNER_BUGS if what == "learner" else SYNCER_BUGS
        args.bugs = ",".join(sorted(b for b in planted_bugs() if b in valid))
    return args


BUGS_ENV = "DILOCO_CHAOS_BUGS"


def planted_bugs() -> set[str]:
    """The planted bugs a whole cluster run was started with (`DILOCO_CHAOS_BUGS=a,b`),
    for showing on real processes what a property suite catches in the simulator."""
    from diloco_chaos.trainer.protocol.protocol_base import BUGS
    bugs = {b for b in os.environ.get(BUGS_ENV, "").split(",") if b}
    if unknown := bugs - BUGS:
        raise ValueError(f"${BUGS_ENV}: unknown planted bugs {sorted(unknown)}; valid: {sorted(BUGS)}")
    return bugs


# --- warm spares ------------------------------------------------------------------------------
# A spare is a unit process started before it is needed: it imports JAX, builds what every
# unit of its role shares (the task, Θ0, the compiled programs) and waits. On `spawn` the
# harness writes the identity it takes (name, incarnation) on its stdin; from there it is
# that unit, restoring its checkpoint like any restart. Real fleets keep hot spares; here
# it takes the Python + JAX start (seconds) out of a restart's recovery.
_WARM: dict = {}


COMPILE_CACHE_ENV = "DILOCO_CHAOS_COMPILE_CACHE"  # a folder, or "off"
_CACHE_SETTINGS = {"jax_persistent_cache_min_compile_time_secs": "0",  # the units' setting since the start
                   "jax_compilation_cache_max_size": str(2 << 30)}     # 2 GiB; also turns on its file lock
# (the same three, set through jax.config, where JAX was imported first: use_compile_cache)


def default_compile_cache() -> Path:
    """The checkout's .cache/jax, or for an installed package the user's cache folder
    ($XDG_CACHE_HOME or ~/.cache, then diloco-chaos/jax; never inside site-packages)."""
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file():
        return root / ".cache" / "jax"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "diloco-chaos" / "jax"


def use_compile_cache() -> str | None:
    """JAX's persistent compilation cache, on by default (`default_compile_cache`, the folder
    the harness also gives every unit process; DILOCO_CHAOS_COMPILE_CACHE names another, or
    "off"): the simulator, the harness's evals and each unit load the programs an earlier
    process compiled (a unit's first step and eval 2.8 s -> 0.9 s here). Set through the
    environment, so every process this one starts shares it, without importing JAX (a
    command that computes nothing stays fast). The folder is trusted code: it is the user's
    own. The size cap turns on JAX's file lock: concurrent processes never read a
    half-written entry."""
    where = os.environ.get(COMPILE_CACHE_ENV) or str(default_compile_cache())
    if where in ("0", "off"):
        return None
    try:  # JAX fails at its first compile on a folder it cannot make: a read-only home goes without
        os.makedirs(where, exist_ok=True)
        if not os.access(where, os.W_OK):
            return None
    except OSError:
        return None
    _stamp_entries(where)
    settings = {"jax_compilation_cache_dir": where, **_CACHE_SETTINGS}
    for key, value in settings.items():
        os.environ.setdefault(key.upper(), value)
    import sys
    if "jax" in sys.modules:  # imported already: its config read the environment then
        import jax
        if not jax.config.jax_compilation_cache_dir:
            jax.config.update("jax_compilation_cache_dir", where)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.config.update("jax_compilation_cache_max_size", 2 << 30)
    return where


def _stamp_entries(where: str) -> None:
    """With its size cap on, JAX reads every entry's `-atime` file before each write, and an
    entry written with the cap off (the units' cache before it had one) has none: every
    write then failed with a warning. Such entries get one, dated now."""
    try:
        names = set(os.listdir(where))
    except OSError:
        return
    stamp = time.time_ns().to_bytes(8, "little")
    for name in names:
        if name.endswith("-cache") and name[:-len("-cache")] + "-atime" not in names:
            try:
                with open(os.path.join(where, name[:-len("-cache")] + "-atime"), "xb") as f:
                    f.write(stamp)
            except OSError:  # another process stamped it first, or the folder is not ours to write
                pass


def warm(key: str, make):
    """`make()` once per process: a spare builds it before it knows which unit it will be,
    the unit it becomes takes it from here."""
    if key not in _WARM:
        _WARM[key] = make()
    return _WARM[key]


def await_identity(args: argparse.Namespace) -> argparse.Namespace | None:
    """A spare, ready: says so (spares/NAME.ready) and blocks until the harness writes the
    identity it takes; None when the harness closed the pipe instead (not needed)."""
    import sys

    ready = args.run_dir / "spares" / f"{args.spare}.ready"
    ready.parent.mkdir(exist_ok=True)
    ready.write_text(f"{time.time()}\n")
    line = sys.stdin.readline()
    if not line.strip():
        return None
    who = json.loads(line)
    args.id, args.incarnation = who["id"], int(who["incarnation"])
    return args


def load_run(run_dir: Path) -> tuple[dict, RunConfig]:
    run = json.loads((run_dir / "run.json").read_text())
    return run, RunConfig.from_dict(run["config"])


class Stopper:
    """SIGTERM/SIGINT set a flag the main loop polls: the process exits cleanly."""

    def __init__(self):
        self.stop = False
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, *_):
        self.stop = True


# --- messages from and to the harness -----------------------------------------------------
# Control messages (kill_slice's `live_slices`; `faults`, the faults on the unit by kind:
# trainer/protocol/unit_faults.py) come on the unit's stdin, one JSON line each, the whole control
# state every time (CONTROL_ENV, set by every backend that starts units); the unit writes
# each to its own control/<name>.json, which a learner reads every step, a shard every loop turn, and
# which its next incarnation finds there. A unit on an engine that shares no files with the
# harness (harness/backends/docker_remote.py) also runs in stream mode (STREAM_ENV): its run
# directory is its own volume, and its event lines go out on stdout, which carries nothing
# else (the engine's log stream brings them to the harness).
STREAM_ENV = "DILOCO_CHAOS_STREAM"
CONTROL_ENV = "DILOCO_CHAOS_CONTROL"
_STREAM_FD: list[int] = []


def streaming() -> bool:
    return os.environ.get(STREAM_ENV) == "1"


def control_on_stdin() -> bool:
    return os.environ.get(CONTROL_ENV) == "stdin" or streaming()


def stream_events() -> int | None:
    """In stream mode, the descriptor event lines go to (the process's original stdout), with
    everything else that would write to stdout (print, C libraries) moved to stderr, so the
    stream holds event lines and nothing else; None otherwise. Idempotent."""
    import sys

    if not streaming():
        return None
    if not _STREAM_FD:
        sys.stdout.flush()
        _STREAM_FD.append(os.dup(1))
        os.dup2(2, 1)
    return _STREAM_FD[0]


def follow_control(run_dir: Path, name: str, stdin=None):
    """A thread that writes each control message read from stdin to control/<name>.json,
    atomically; it ends when the harness closes the pipe. Returns the thread."""
    import sys
    import threading

    stdin = stdin or sys.stdin
    path = run_dir / "control" / f"{name}.json"

    def follow() -> None:
        path.parent.mkdir(exist_ok=True)
        for line in stdin:
            if not line.strip():
                continue
            control = json.loads(line)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(control))
            tmp.replace(path)

    t = threading.Thread(target=follow, name="control", daemon=True)
    t.start()
    return t


def open_events(run_dir: Path, name: str, incarnation: int) -> EventWriter:
    (run_dir / "logs").mkdir(exist_ok=True)
    return EventWriter(run_dir / "logs" / f"{name}.{incarnation}.jsonl", src=name, stream_fd=stream_events())


def log_actions(ev: EventWriter, actions: list) -> None:
    for a in actions:
        if isinstance(a, Log):
            ev.emit(a.kind, **a.fields)


def log_msg(ev: EventWriter, kind: str, peer: str, msg, nbytes: int, **extra) -> None:
    """A `send` or `recv` line: the message's identifying fields and the frame size."""
    ev.emit(kind, peer=peer, bytes=nbytes, **describe(msg), **extra)


def rss_kb() -> int | None:
    """This process's resident set size in KiB (Linux /proc), None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return None


class ResourceLog:
    """A `resources` line {rss_kb} every `interval_s`: a process's memory along the run, so a
    reader can see it stay flat while a link is starved (one clock read per call)."""

    def __init__(self, ev: EventWriter, interval_s: float = 5.0):
        self.ev, self.interval_s, self._next = ev, interval_s, 0.0

    def maybe(self, now: float) -> None:
        if now >= self._next:
            self._next = now + self.interval_s
            self.ev.emit("resources", rss_kb=rss_kb())


class Timers:
    """The cores' SetTimer actions: key -> due time (monotonic); a later set replaces."""

    def __init__(self):
        self.due: dict[str, float] = {}

    def set(self, key: str, at: float) -> None:
        self.due[key] = at

    def pop_due(self, now: float) -> list[str]:
        keys = sorted((at, k) for k, at in self.due.items() if at <= now)
        for _, k in keys:
            del self.due[k]
        return [k for _, k in keys]

    def next_in(self, now: float, cap: float) -> float:
        return max(0.0, min([cap] + [at - now for at in self.due.values()]))


def to_ckpt(tree) -> dict:
    """A tree with strings, None and dict keys of any kind -> {"json": uint8 array,
    "arrays": {i: array}}: orbax stores arrays; the structure travels as JSON."""
    arrays: dict[str, np.ndarray] = {}

    def walk(x):
        if isinstance(x, dict):
            return {"__dict__": [[walk(k), walk(v)] for k, v in x.items()]}
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        if isinstance(x, (np.ndarray, np.generic)) or hasattr(x, "__array__"):
            key = str(len(arrays))
            arrays[key] = np.asarray(x)
            return {"__array__": key}
        return x

    meta = json.dumps(walk(tree)).encode()
    return {"json": np.frombuffer(meta, np.uint8), "arrays": arrays}


def _key(k):
    return tuple(_key(v) for v in k) if isinstance(k, list) else k


def from_ckpt(saved: dict):
    arrays = saved.get("arrays", {})

    def walk(x):
        if isinstance(x, dict) and "__array__" in x:
            return np.asarray(arrays[x["__array__"]])
        if isinstance(x, dict):
            return {_key(walk(k)): walk(v) for k, v in x["__dict__"]}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(json.loads(np.asarray(saved["json"], np.uint8).tobytes()))


def global_init(task, seed: int):
    """Θ0, the same in every process: the task's initial parameters from the run's
    seed, through one compiled program (eager init dispatches op by op: ~5 s)."""
    import jax

    return jax.jit(task.init_params)(jax.random.PRNGKey(seed))


def monotonic() -> float:
    return time.monotonic()
