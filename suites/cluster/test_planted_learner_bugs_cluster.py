"""Two learner bugs proven in the simulator, on real processes (Toxiproxy, real TCP, orbax
on disk): each run with the bug and without it (the control), both in `make nightly`
(CI's time budget; their simulator proofs, suites/properties/test_planted_bugs.py, run in
CI). The catalogue: harness/judging/planted.py, `diloco-chaos planted`.

- `batch_of_incarnation` (`test_a_restarted_learner_that_restarts_its_data_stream_is_seen_on_real_processes`):
  a learner draws its batches by its incarnation's own step count, so a restart from a
  checkpoint at step s trains steps s + 1, s + 2, ... on the batches of steps 1, 2, ...
  again. `inner_steps_reexecuted` redoes each incarnation's first step (always sampled)
  from the batch the harness draws by the global step: with the bug the restored step's
  θ, m and v are not the judge's. The bug has nothing to do unless the restart restores a
  step > 0, and a learner's save is *sealed* (its manifest written: trainer/numerics/checkpoint.py)
  only when its next save starts: the step-50 save (trainer/protocol/learner_loop.py CKPT_EVERY)
  is restorable from the learner's step 100 on. A kill at fixed seconds missed that on a
  loaded machine (8 s beside two busy processes: the restart came up at step 0, where the
  bug is inert), so here the kill waits on progress, not seconds: the schedule's clock
  starts once learner-1's checkpoint folder holds a sealed step > 0 (`_after_a_sealed_save`,
  the harness's own listing, harness/backends/checkpoint_disk.py), and the kill comes
  0.5 s later. The test asserts the restart restored a step > 0, so a run where it did not
  fails loudly instead of passing vacuously. Measured (idle, and beside two busy processes):
  the kill 1.9-4.3 s after time zero, the restart at step 50 and its step 51 redone; with
  the bug the judge's θ differs by 0.0015-0.0024 where the step changed it by 0.003-0.004
  (tolerance ~4e-6), every other check held; without it every check held (or, in the
  shortest runs, global_loss_regression was UNKNOWN: too few global eval points). 20-32 s.
- `starve_backoff_doubling` (`test_a_starved_learner_asks_again_at_the_documented_pace_on_real_processes`):
  a starved learner's wait doubles with every unanswered Hello (2 ** tries cycles) instead
  of staying at 2 cycles after the first. Aligned rounds, the answer downlink (no commit
  reaches a learner whose Δ was not merged) and starve_cycles 1, as the simulator's twin;
  learner-0's upstream to the shard is cut from 1 s after time zero to the run's end, so
  every Δ and Hello it sends is lost while the RoundOpens (which answer nothing) still
  arrive. The check counts in the learner's own steps (bound after an unanswered Hello:
  2 × 1 + 2 cycles = 24 steps at H = 6), so the cut only has to outlast the bug's
  1 + 2 + 4 + 4 cycles (66 steps) of silence; a cut to the end holds every step learner-0
  makes after 1 s (the run ends at its token budget: ~300 of its 400 steps, idle and
  beside two busy processes), whatever the machine's pace. The test asserts ≥ 100 of them
  (a vacuous run fails loudly) and ≥ 4 Hellos inside the cut. (An 8 s cut held 199-338
  steps, idle and loaded; the Markov task at batch 4 steps ~40 times a second a learner.)
  Measured: the correct learner asks every 2 cycles (20-28 Hellos in the cut, every check
  held); with the bug the check names learner-0's silence of 25 steps over the bound of 24
  after its third to fifth unanswered Hello. 25-36 s a run.
  The quadratic property base, the simulator twin's, is no twin on processes: its steps
  (~5 ms) are shorter than a round trip to the shard, so with starve_cycles 1 every
  learner starves without any fault.
"""
from __future__ import annotations

import time

import pytest

from diloco_chaos.harness import eventlog
from diloco_chaos.harness.backends import checkpoint_disk, runner
from diloco_chaos.harness.run import loop
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
from diloco_chaos.trainer.units.shell import BUGS_ENV

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RESTART_DATA = {  # learner-1 killed 0.5 s after its first sealed save at a step > 0 (the walk below)
    "name": "restart-data-stream", "seed": 4,
    "cluster": {"learners": 2, "slices": 1},
    "train": {"task": "markov", "steps": 200, "duration": "40s", "batch_size": 4},
    "faults": [{"kind": "kill_unit", "target": "learner-1", "at": "0.5s", "down_for": "1s"}],
}


def _after_a_sealed_save(learner: str):
    """The run loop's walk (harness/run/loop.py), its clock started once `learner` has a
    sealed checkpoint at a step > 0 (or its token budget is spent, or `duration` passed: the
    test's assertions then say so): the schedule's times count from that moment, so the
    kill depends on the learner's progress, not on the machine's pace. The fault lines keep
    the times the faults happened at; the header's t_start stays the run's time zero."""
    def walk(schedule, clock, injector, budget, t0, train):
        folder = injector.control.run_dir / "ckpt" / learner

        def sealed() -> bool:
            return any(s > 0 for s in checkpoint_disk.listing(folder).get("sealed", []))

        clock.run_until(t0 + train.duration_s, until=lambda: budget.spent() or sealed())
        return loop.walk(schedule, clock, injector, budget, clock.now(), train)
    return walk


@pytest.mark.parametrize("bugs", [pytest.param("", marks=pytest.mark.nightly),
                                  pytest.param("batch_of_incarnation", marks=pytest.mark.nightly)])
def test_a_restarted_learner_that_restarts_its_data_stream_is_seen_on_real_processes(bugs, tmp_path, monkeypatch):
    monkeypatch.setenv(BUGS_ENV, bugs)
    monkeypatch.setattr(runner, "walk", _after_a_sealed_save("learner-1"))
    began = time.monotonic()
    result = runner.run_scenario(scenario_from_dict(RESTART_DATA), tmp_path, live=False)
    log = eventlog.read(result.run_dir)
    where = str(result.run_dir)
    assert result.summary["faults_applied"] == 1, (result.summary, where)
    restored = [e["step"] for e in log.of("checkpoint_restored", src="learner-1")]
    up = [e for e in log.of("unit_up", src="learner-1") if e.get("incarnation") == 1]  # the restart's own line
    assert restored and restored[0] > 0 and [e["step"] for e in up] == restored[:1], (
        "learner-1's restart restored no step > 0: the bug had nothing to do", restored, up, where)
    audited = [e["step"] for e in log.of("inner_audit", src="learner-1") if e["t"] > up[0]["t"]]
    assert audited and audited[0] == restored[0] + 1, (audited, restored, where)  # the restart's first step was redone
    by = {c["name"]: c for c in result.summary["checks"]}
    r = by["inner_steps_reexecuted"]
    assert r["valid"] is (not bugs), (bugs, r, where)
    if bugs:  # the restored step's: learner-1, incarnation 1
        assert any(v.get("learner") == "learner-1" for v in r["details"]["violations"]), (r, where)
    failed = sorted(n for n, c in by.items() if c["valid"] is False and n != "inner_steps_reexecuted")
    assert failed == [], (bugs, {n: by[n] for n in failed}, where)
    killed = log.of("fault_start", src="harness")[0]["t"] - log.header["t_start"]
    print(bugs or "control", f"killed {killed:.1f} s after time zero, restored {restored}",
          f"{time.monotonic() - began:.1f} s", r["details"].get("violations", [])[:1],
          "not held:", {n: c["valid"] for n, c in by.items() if c["valid"] is not True})


STARVED_PACE = {  # learner-0's Δs and Hellos lost from 1 s to the run's end; it still hears the RoundOpens
    "name": "starved-pace", "seed": 3,
    "cluster": {"learners": 2, "slices": 1},
    "train": {"task": "markov", "steps": 400, "duration": "30s", "batch_size": 4,
              "align": True, "downlink": "answer", "starve_cycles": 1},
    "faults": [{"kind": "partition", "target": "link:learner-0~syncer-0", "direction": "upstream",
                "at": "1s", "duration": "30s"}],
}


@pytest.mark.parametrize("bugs", [pytest.param("", marks=pytest.mark.nightly),
                                  pytest.param("starve_backoff_doubling", marks=pytest.mark.nightly)])
def test_a_starved_learner_asks_again_at_the_documented_pace_on_real_processes(bugs, tmp_path, monkeypatch):
    monkeypatch.setenv(BUGS_ENV, bugs)
    began = time.monotonic()
    result = runner.run_scenario(scenario_from_dict(STARVED_PACE), tmp_path, live=False)
    log = eventlog.read(result.run_dir)
    where = str(result.run_dir)
    assert result.summary["faults_applied"] == 1, (result.summary, where)
    start, = [e["t"] for e in log.of("fault_start", src="harness")]
    end = next((e["t"] for e in log.of("fault_end", src="harness")), log.header["t_end"])
    inside = [e["step"] for e in log.of("step", src="learner-0") if start <= e["t"] <= end]
    assert len(inside) >= 100, ("the cut held too few of learner-0's steps to show the doubling", len(inside), where)
    asked = [e["tries"] for e in log.of("starved", src="learner-0") if e["shard"] == "syncer-0" and start <= e["t"] <= end]
    assert len(asked) >= 4, (asked, where)  # it asked again and again inside the cut
    by = {c["name"]: c for c in result.summary["checks"]}
    r = by["starved_learners_reanchor"]
    assert r["valid"] is (not bugs), (bugs, r, where)
    if bugs:  # the silence inside the cut, over the bound of 2 + 2 cycles (24 steps)
        assert any(v["learner"] == "learner-0" and v["shard"] == "syncer-0" and start <= v["t"] <= end
                   and v["bound_steps"] == 24 for v in r["details"]["violations"]), (r, where)
    print(bugs or "control", f"{len(inside)} steps in the cut, Hellos (tries) {asked}",
          f"{time.monotonic() - began:.1f} s", r["details"].get("violations", [])[:1],
          "not held:", {n: c["valid"] for n, c in by.items() if c["valid"] is not True})
