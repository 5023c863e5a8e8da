"""A progress line for a simulated run, on stderr: how far in virtual time and tokens, wall
time, steps, commits, the faults active now and an ETA. On a terminal one line redrawn in
place about once a second; elsewhere (a CI log) one line per 10 % of the run. It reads the
world's event list (only what was appended since its last look) and writes nothing to the
log: the run's events are the same bytes with it on or off (suites/unit/test_sim_progress.py)."""
from __future__ import annotations

import sys
import time

TICK_S = 0.5       # virtual seconds between two looks
REDRAW_S = 1.0     # on a terminal: wall seconds between two redraws
PLAIN_STEP = 0.1   # elsewhere: one line per this share of the run


class SimProgress:
    def __init__(self, world, injector, name: str, end_s: float, total_tokens: int, out=None, clock=time.monotonic):
        self.world, self.injector, self.name = world, injector, name
        self.end_s, self.total_tokens = end_s, total_tokens
        self.out = out if out is not None else sys.stderr
        self.tty = self.out.isatty()
        self.clock, self.wall0 = clock, clock()
        self.seen, self.steps, self.commits = 0, 0, 0
        self.t0: float | None = None
        self.last_draw, self.next_share = 0.0, PLAIN_STEP
        self.on = True

    def start(self, t0: float) -> None:
        """From time zero: a look every TICK_S virtual seconds until `stop`."""
        self.t0 = t0
        self.world.clock.at(self.world.now + TICK_S, self._tick)

    def share(self) -> float:
        by_time = (self.world.now - self.t0) / self.end_s if self.end_s else 0.0
        by_tokens = self.world.tokens / self.total_tokens if self.total_tokens else 0.0
        return min(1.0, max(by_time, by_tokens))

    def line(self) -> str:
        events = self.world.events
        for e in events[self.seen:]:
            if e["kind"] == "step":
                self.steps += 1
            elif e["kind"] == "round_commit":
                self.commits += 1
        self.seen = len(events)
        wall, share = self.clock() - self.wall0, self.share()
        eta = wall / share * (1 - share) if share > 0.02 else None
        faults = ", ".join(f"{f.kind}→{f.target}" for f in self.injector.active.values()) or "none"
        return (f"[{self.name} · sim] {100 * share:.0f} % · virtual {self.world.now - self.t0:.1f} s of "
                f"{self.end_s:.0f} s · wall {wall:.0f} s · steps {self.steps:,} · commits {self.commits:,} · "
                f"faults: {faults} · ETA {'-' if eta is None else f'{eta:.0f} s'}")

    def _tick(self) -> None:
        if not self.on:
            return
        if self.tty and self.clock() - self.last_draw >= REDRAW_S:
            self.last_draw = self.clock()
            print("\r\033[K" + self.line(), end="", file=self.out, flush=True)
        elif not self.tty and self.share() >= self.next_share:
            self.next_share = (int(self.share() / PLAIN_STEP) + 1) * PLAIN_STEP
            print(self.line(), file=self.out, flush=True)
        self.world.clock.at(self.world.now + TICK_S, self._tick)

    def stop(self) -> None:
        if self.on and self.t0 is not None:
            print(("\r\033[K" if self.tty else "") + self.line(), file=self.out, flush=True)
        self.on = False
