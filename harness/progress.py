"""Live progress of a cluster run: the token budget with an ETA, each unit's state,
steps, rounds and eval loss, the active faults.

Tails the processes' event files (only what was appended since the last look) and
keeps the totals the runner ends the run on (tokens trained, first steps). On a
terminal it is a `rich` live display (a bar of the token budget over a table of
units); otherwise one plain line every 5 s (a CI log stays readable).

The ETA is the sooner of two ends: the tokens left at the rate trained since time
zero, and the wall-clock end (`train.duration` + `train.end_grace`).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

PLAIN_EVERY_S = 5.0  # off a terminal: one line per this many seconds


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
    def __init__(self, run_dir: Path, scenario, enabled: bool = True, every_s: float = 0.5,
                 total_tokens: int = 0, end_s: float | None = None, clock=time.time, out=None):
        """`end_s`: when the run ends at the latest, from time zero (the run loop's
        `run_end_s`; None: `train.duration`)."""
        self.tail = Tail(run_dir / "logs")
        self.name, self.duration_s = scenario.name, scenario.train.duration_s
        self.end_s = self.duration_s if end_s is None else end_s
        self.steps_target = scenario.train.steps
        self.total_tokens = total_tokens
        self.enabled, self.every_s, self.clock = enabled, every_s, clock
        self.out = out if out is not None else sys.stdout
        self.t0 = clock()
        self.t_zero: float | None = None          # training start (set by the runner)
        self.last = 0.0
        self.steps: dict[str, int] = {}
        self.commits: dict[str, int] = {}
        self.loss: dict[str, float] = {}
        self.tokens = 0                          # tokens of every learner step so far
        self.first_step: dict[str, float] = {}   # learner -> wall time of its first step
        self.tty = self.out.isatty()
        self.live = None
        if enabled and self.tty:
            self.live = Live(self._view({}), console=Console(file=self.out), refresh_per_second=4, transient=False)
            self.live.start()

    def started(self, t_zero: float) -> None:
        """Time zero (every learner stepped): the ETA and the elapsed time count from here."""
        self.t_zero = t_zero

    def eta_s(self, now: float) -> float | None:
        """Seconds to the run's end: the sooner of the tokens left at the rate so far and
        the wall-clock end; None before time zero."""
        if self.t_zero is None:
            return None
        elapsed = max(now - self.t_zero, 1e-9)
        by_clock = max(self.t_zero + self.end_s - now, 0.0)
        left = max(self.total_tokens - self.tokens, 0)
        if not self.total_tokens or not self.tokens:
            return by_clock
        return min(by_clock, left / (self.tokens / elapsed))

    def headline(self, now: float) -> str:
        """`tokens 12,288/40,960 (30 %) · 9 s of 70 s · ETA 21 s`"""
        share = f" ({100 * self.tokens / self.total_tokens:.0f} %)" if self.total_tokens else ""
        eta = self.eta_s(now)
        when = "starting" if self.t_zero is None else f"{now - self.t_zero:.0f} s of {self.duration_s:.0f} s"
        return (f"tokens {self.tokens:,}/{self.total_tokens:,}{share} · {when} · "
                f"ETA {'-' if eta is None else f'{eta:.0f} s'}")

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
        now = self.clock()
        if not self.enabled or now - self.last < (self.every_s if self.tty else PLAIN_EVERY_S):
            return
        self.last = now
        status = {u: ("down" if u in injector.down_units else "paused" if m.paused else
                      "up" if m.proc is not None and m.proc.poll() is None else "exited")
                  for u, m in injector.control.members.items()}
        faults = [f"{f.kind}→{f.target}" for f in injector.active.values()]
        if self.live is not None:
            self.live.update(self._view(status, faults))
        else:
            units = " ".join(f"{u.split('-')[0][0]}{u.split('-')[1]}:{status[u]}/{self.steps.get(u, 0)}"
                             for u in status)
            print(f"[{self.name}] {self.headline(now)} | {units} commits={sum(self.commits.values())} "
                  f"faults={','.join(faults) or '-'}", file=self.out, flush=True)

    def _view(self, status: dict, faults: list | None = None) -> Group:
        now = self.clock()
        bar = ProgressBar(total=max(self.total_tokens, 1), completed=min(self.tokens, max(self.total_tokens, 1)),
                          width=50)
        return Group(f"[bold]{self.name}[/] {self.headline(now)}", bar, self._table(status, faults))

    def _table(self, status: dict, faults: list | None = None) -> Table:
        t = Table(caption="active faults: " + (", ".join(faults or []) or "none"))
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
