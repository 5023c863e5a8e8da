"""The simulator calibrated from a real run's log (harness/sim/calibrate.py): each
parameter worked out by hand on a small made-up log, and the simulator taking the
measured step times, eval and checkpoint costs."""
from __future__ import annotations

import dataclasses

import pytest

from diloco_chaos.harness.sim.calibrate import params_from_log
from diloco_chaos.harness.sim.world import SimParams
from suites.unit.log_builder import LogBuilder


def _log():
    """Two learners launched at t = 0: learner-0 steps every 0.05 s, learner-1 every 0.08 s,
    of which the step itself (`dt`) is 0.045 s and 0.075 s (the loop's own work: 5 ms);
    both up at 0.5 s, learner-0's first step line at 1.05 s, learner-1's at 1.28 s; after step 100 (an eval
    step) each waits 0.04 s more, after steps 50 and 150 (checkpoints) 0.01 s more; the shard is up
    at 0.6 s."""
    b = LogBuilder(learners=2, t_launch=0.0)
    b.header["config"]["eval_every"] = 100
    b.up(0.6, "syncer-0")
    for name, dt, first in (("learner-0", 0.05, 1.05), ("learner-1", 0.08, 1.28)):
        b.up(0.5, name)
        t = first
        for s in range(1, 201):  # the first step compiles: 0.3 s
            b.step(round(t, 6), name, s, dt=0.3 if s == 1 else round(dt - 0.005, 6))
            t += dt + (0.04 if s == 100 else 0.01 if s in (50, 150) else 0.0)
    return b.log()


def test_each_parameter_is_measured_from_the_log():
    p = params_from_log(_log())
    assert p.step_s_by_unit == pytest.approx((0.045, 0.075)) and p.loop_s == pytest.approx(0.005)
    assert p.step_s == pytest.approx(0.06) and p.hetero == 0.0           # the median of the two
    assert p.eval_s == pytest.approx(0.04) and p.ckpt_s == pytest.approx(0.01)
    assert p.learner_startup_s == pytest.approx(0.5 + 0.3 - 0.06)  # unit_up, and the compile (0.3 − 0.045 / 0.075)
    assert p.syncer_startup_s == pytest.approx(0.6)
    assert p.spare_startup_s == SimParams().spare_startup_s  # no spare restart to measure: the default
    assert (p.step_jitter, p.ckpt_save_s, p.held_kib) == (SimParams().step_jitter, 0.2, 352.0)


def test_the_simulator_takes_the_measured_step_times_and_host_work():
    from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
    from diloco_chaos.harness.sim.run import simulate

    s = scenario_from_dict({"name": "cal", "seed": 1, "cluster": {"learners": 2},
                            "train": {"task": "quadratic", "steps": 200, "duration": "60s"}})
    base = SimParams(step_jitter=0.0, step_s_by_unit=(0.05, 0.08))  # loop_s 0: the steps back to back
    steps = {}
    for params in (base, dataclasses.replace(base, eval_s=0.5, ckpt_s=0.25, loop_s=0.01)):
        run = simulate(s, params=params)
        steps[params.eval_s] = {n: [e for e in run.events if e["kind"] == "step" and e["src"] == n]
                                for n in ("learner-0", "learner-1")}
    for name, dt in (("learner-0", 0.05), ("learner-1", 0.08)):
        lines = steps[0.0][name]
        assert lines[10]["t"] - lines[9]["t"] == pytest.approx(dt)
        slow = steps[0.5][name]
        # 10 ms of the loop's own work after every step; after step 50 a checkpoint (0.25 s
        # more before step 51 ends); after step 100 an eval (every 100 steps) and a checkpoint
        assert slow[10]["t"] - slow[9]["t"] == pytest.approx(dt + 0.01)
        assert slow[50]["t"] - slow[49]["t"] == pytest.approx(dt + 0.01 + 0.25)
        assert slow[100]["t"] - slow[99]["t"] == pytest.approx(dt + 0.01 + 0.75)
        assert slow[10]["dt"] == pytest.approx(dt)  # the step line's own time: the step alone


def test_bad_step_times_are_refused_with_the_field():
    with pytest.raises(ValueError, match="step_s_by_unit"):
        SimParams(step_s_by_unit=(0.05, 0.0))


def test_a_run_replayed_calibrated_from_its_own_log_comes_back_to_its_goodput(tmp_path, capsys):
    """A simulated run with known step times, passed off as a real one (tier cluster in its
    header): `replay --tier sim` measures those step times back from the log and the replay's
    goodput lands within a point of the run's; with the default parameters it does not."""
    import json

    from diloco_chaos import cli
    from diloco_chaos.harness import eventlog
    from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
    from diloco_chaos.harness.sim.run import run_sim

    s = scenario_from_dict({"name": "cal", "seed": 3, "cluster": {"learners": 3},
                            "train": {"task": "quadratic", "steps": 120, "duration": "60s"},
                            "faults": [{"kind": "pause_unit", "target": "learner-1", "at": "1s",
                                        "duration": "3s"}]})
    truth = SimParams(step_s_by_unit=(0.03, 0.04, 0.05), step_jitter=0.0, eval_s=0.2, loop_s=0.004)
    made = run_sim(s, tmp_path / "real", params=truth)
    path = made.run_dir / "events.jsonl"
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["tier"] = "cluster"
    header.pop("sim")
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert cli.main(["replay", str(made.run_dir), "--tier", "sim", "--out", str(tmp_path / "replay"),
                     "--no-live"]) in (0, 1)
    (folder,) = (tmp_path / "replay").iterdir()
    row = json.loads((folder / "calibrated.json").read_text())
    assert row["sim_params"]["step_s_by_unit"] == pytest.approx([0.03, 0.04, 0.05], rel=1e-3)
    assert row["sim_params"]["eval_s"] == pytest.approx(0.2, abs=1e-3)
    assert row["sim_params"]["loop_s"] == pytest.approx(0.004, abs=1e-4)
    assert abs(row["sim_minus_real_points"]) < 1.0, row
    assert "goodput: real" in capsys.readouterr().out
    default = run_sim(s, tmp_path / "default")
    assert abs(default.summary["goodput"] - made.summary["goodput"]) * 100 > 1.0
    assert eventlog.read(folder).header["sim"]["step_s_by_unit"] == row["sim_params"]["step_s_by_unit"]
