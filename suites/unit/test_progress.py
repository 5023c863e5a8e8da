"""The live progress of a cluster run (harness/progress.py), on a fake clock: the token
budget's share and ETA worked out by hand, one plain line per 5 s off a terminal, and
the rich view a terminal gets."""
from __future__ import annotations

import io
import json
from types import SimpleNamespace

from rich.console import Console

from diloco_chaos.harness.run.loop import run_end_s
from diloco_chaos.harness.progress import Progress
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _setup(tmp_path, end_grace="0s"):
    (tmp_path / "logs").mkdir()
    s = scenario_from_dict({"name": "p", "seed": 1, "cluster": {"learners": 2},
                            "train": {"steps": 10, "duration": "60s", "end_grace": end_grace}})
    clock, out = Clock(100.0), io.StringIO()
    member = SimpleNamespace(paused=False, proc=SimpleNamespace(poll=lambda: None))
    injector = SimpleNamespace(down_units={"learner-1"}, active={0: SimpleNamespace(kind="partition", target="link:learner-1")},
                               control=SimpleNamespace(members={"learner-0": member, "learner-1": member}))
    p = Progress(tmp_path, s, total_tokens=1000, end_s=run_end_s(s.train), clock=clock, out=out)
    return p, clock, out, injector


def _step(tmp_path, t, tokens, step=1, src="learner-0"):
    with open(tmp_path / "logs" / f"{src}.jsonl", "a") as f:
        f.write(json.dumps({"t": t, "src": src, "kind": "step", "step": step, "tokens": tokens}) + "\n")


def test_the_eta_is_the_sooner_of_the_tokens_left_and_the_wall_clock_end(tmp_path):
    p, clock, _, injector = _setup(tmp_path)
    assert p.eta_s(100.0) is None  # before time zero
    p.started(100.0)
    _step(tmp_path, 110.0, 250)
    clock.t = 110.0
    p.update(injector)
    # 250 tokens in 10 s: 25 per s, 750 left -> 30 s; the run ends at 100 + 60 + 0 -> 50 s
    assert p.eta_s(110.0) == 30.0
    assert p.headline(110.0) == "tokens 250/1,000 (25 %) · 10 s of 60 s · ETA 30 s"
    # at 2.5 tokens per s the tokens would take 390 s: the wall clock ends it first
    p.tokens = 25
    assert p.eta_s(110.0) == 50.0


def test_the_end_grace_moves_the_wall_clock_end(tmp_path):
    p, _, _, _ = _setup(tmp_path, end_grace="20s")
    p.started(100.0)
    assert p.eta_s(110.0) == 70.0  # nothing trained yet: 100 + 60 + 20 - 110


def test_off_a_terminal_one_line_per_5_s(tmp_path):
    p, clock, out, injector = _setup(tmp_path)
    p.started(100.0)
    for t, tokens in ((100.0, 0), (102.0, 100), (104.9, 100), (105.0, 100), (109.0, 100), (110.5, 100)):
        clock.t = t
        if tokens:
            _step(tmp_path, t, tokens)
        p.update(injector)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines  # at 100, 105 and 110.5
    assert lines[1] == ("[p] tokens 300/1,000 (30 %) · 5 s of 60 s · ETA 12 s | l0:up/1 l1:down/0 "
                        "commits=0 faults=partition→link:learner-1")


def test_a_terminal_gets_a_bar_and_the_unit_table(tmp_path):
    p, clock, _, injector = _setup(tmp_path)
    p.started(100.0)
    _step(tmp_path, 104.0, 400)
    clock.t = 104.0
    p.update(injector)
    screen = io.StringIO()
    Console(file=screen, width=140, color_system=None).print(p._view({"learner-0": "up", "learner-1": "down"},
                                                                     ["partition→link:learner-1"]))
    text = screen.getvalue()
    assert "tokens 400/1,000 (40 %) · 4 s of 60 s · ETA 6 s" in text
    assert "━" in text  # the bar
    assert "learner-1" in text and "down" in text and "active faults: partition→link:learner-1" in text
