"""Live progress of a cluster run: steps, rounds, units up/down, active faults.

Tails the processes' event files (only what was appended since the last look) and
keeps the totals the runner ends the run on (tokens trained, first steps).
On a terminal it is a `rich` live table; otherwise one plain line every few seconds.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table


class Tail:
    """New complete lines of every logs/*.jsonl since the last call."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.offsets: dict[Path, int] = {}

    def read(self) -> list[dict]:
        out = []
        for f in sorted(self.logs.glob("*.jsonl")):
            with open(f, "rb") as fh:
                fh.seek(self.offsets.get(f, 0))
                data = fh.read()
            end = data.rfind(b"\n") + 1
            self.offsets[f] = self.offsets.get(f, 0) + end
            out += [json.loads(line) for line in data[:end].splitlines() if line]
        return out


class Progress:
    def __init__(self, run_dir: Path, scenario, enabled: bool = True, every_s: float = 0.5):
        self.tail = Tail(run_dir / "logs")
        self.name, self.duration_s = scenario.name, scenario.train.duration_s
        self.steps_target = scenario.train.steps
        self.enabled, self.every_s = enabled, every_s
        self.t0 = time.time()
        self.last = 0.0
        self.steps: dict[str, int] = {}
        self.commits: dict[str, int] = {}
        self.loss: dict[str, float] = {}
        self.tokens = 0                          # tokens of every learner step so far
        self.first_step: dict[str, float] = {}   # learner -> wall time of its first step
        self.tty = sys.stdout.isatty()
        self.live = None
        if enabled and self.tty:
            self.live = Live(self._table({}), console=Console(), refresh_per_second=4, transient=False)
            self.live.start()

    def update(self, injector) -> None:
        """Reads what the processes logged since the last call; redraws now and then."""
        for e in self.tail.read():
            if e["kind"] == "step":
                self.steps[e["src"]] = e["step"]
                self.tokens += e["tokens"]
                self.first_step.setdefault(e["src"], e["t"])
            elif e["kind"] == "round_commit":
                self.commits[e["src"]] = self.commits.get(e["src"], 0) + 1
            elif e["kind"] == "eval":
                self.loss[e["src"]] = e["loss"]
        now = time.time()
        if not self.enabled or now - self.last < (self.every_s if self.tty else 5.0):
            return
        self.last = now
        status = {u: ("down" if u in injector.down else "paused" if m.paused else
                      "up" if m.proc is not None and m.proc.poll() is None else "exited")
                  for u, m in injector.cluster.members.items()}
        faults = [f"{f.kind}→{f.target}" for f in injector.active.values()]
        if self.live is not None:
            self.live.update(self._table(status, faults))
        else:
            units = " ".join(f"{u.split('-')[0][0]}{u.split('-')[1]}:{status[u]}/{self.steps.get(u, 0)}"
                             for u in status)
            print(f"[{self.name} {now - self.t0:5.0f}s] {units} commits={sum(self.commits.values())} "
                  f"faults={','.join(faults) or '-'}", flush=True)

    def _table(self, status: dict, faults: list | None = None) -> Table:
        t = Table(title=f"{self.name}: {time.time() - self.t0:.0f}s of {self.duration_s:.0f}s",
                  caption="active faults: " + (", ".join(faults or []) or "none"))
        for col in ("unit", "status", "steps", "rounds", "eval loss"):
            t.add_column(col)
        for u, st in status.items():
            color = {"up": "green", "down": "red", "paused": "yellow"}.get(st, "dim")
            steps = f"{self.steps.get(u, 0)}/{self.steps_target}" if u.startswith("learner") else ""
            loss = f"{self.loss[u]:.3f}" if u in self.loss else ""
            t.add_row(u, f"[{color}]{st}[/]", steps, str(self.commits.get(u, "")), loss)
        return t

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
