"""The sim tier (harness/sim/run.py): determinism, the cluster tier's files and log format,
replay, and the models of time, links and checkpoints checked against numbers worked
out by hand. Small quadratic runs: each takes a fraction of a second."""
from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from diloco_chaos.harness import eventlog
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
from diloco_chaos.harness.sim.run import SimParams, model_for, replay_sim, run_sim, simulate
from diloco_chaos.trainer.numerics.inner import make_inner
from diloco_chaos.trainer.protocol.messages import Hello
from diloco_chaos.trainer.units.events import KINDS
from diloco_chaos.trainer.wire.codec import encode_frame

FAULTS = [
    {"kind": "kill_unit", "target": "learner-1", "at": "0.5s", "down_for": "2s"},
    {"kind": "partition", "target": "link:learner-2", "at": "1s", "duration": "1s", "direction": "downstream"},
    {"kind": "kill_syncer", "target": "syncer-1", "at": "1.5s", "down_for": "1s"},
    {"kind": "pause_unit", "target": "learner-0", "at": "2s", "duration": "0.5s"},
    {"kind": "slow_unit", "target": "learner-2", "at": "2.5s", "duration": "1s", "speed": 0.5},
    {"kind": "kill_slice", "target": "learner-0", "at": "3s", "duration": "1s"},
    {"kind": "reset", "target": "link:learner-0", "at": "3.2s", "duration": "0.5s"},
    {"kind": "truncate", "target": "link:learner-1~syncer-0", "at": "3.5s", "duration": "0.5s", "bytes": 300},
    {"kind": "wan", "target": "link:*", "at": "4s", "duration": "1s", "bandwidth_kbps": 64, "latency_ms": 80},
]


def scenario(faults=(), **train):
    return scenario_from_dict({
        "name": "sim-unit", "seed": 5, "cluster": {"learners": 3, "slices": 2, "shards": 2},
        "train": {"task": "quadratic", "steps": 40, "duration": "20s", **train},
        "wan": {"latency_ms": 10}, "faults": list(faults)})


def test_same_seed_gives_a_byte_identical_event_log_and_another_seed_does_not():
    s = scenario(FAULTS)
    first, second = simulate(s).text(), simulate(s).text()
    assert first == second
    assert simulate(dataclasses.replace(s, seed=6)).text() != first
    kinds = {json.loads(line)["kind"] for line in first.splitlines()}
    assert kinds <= KINDS and {"fault_start", "fault_end", "unit_down", "checkpoint_restored", "slices",
                               "round_commit", "merge", "link_down"} <= kinds


def test_run_sim_writes_the_cluster_tiers_files_and_replay_reproduces_them(tmp_path):
    result = run_sim(scenario(FAULTS[:3]), tmp_path)
    log = eventlog.read(result.run_dir)
    h = log.header
    assert h["tier"] == "sim" and h["replay"] == f"diloco-chaos replay {result.run_dir}"
    assert {"seed", "config", "scenario", "schedule", "topology", "t_start", "t_end", "sim", "task"} <= set(h)
    assert (result.run_dir / "scenario.toml").exists() and (result.run_dir / "summary.json").exists()
    assert 0 < result.summary["goodput"] <= 1 and result.summary["mode"] == "decoupled"
    assert [e["kind"] for e in log.events][-1] == "eval" and log.events[-1]["global"] is True
    assert all(a["t"] <= b["t"] for a, b in zip(log.events, log.events[1:]))
    again = replay_sim(result.run_dir, tmp_path)
    assert eventlog.read(again.run_dir).events == log.events


def test_the_replay_command_keeps_a_sim_runs_parameters_and_planted_bugs(tmp_path, capsys):
    from diloco_chaos import cli

    params = SimParams(step_s=0.05, hetero=0.5)
    result = run_sim(scenario(FAULTS[:3]), tmp_path / "a", params=params, bugs={"merge_twice"})
    assert cli.main(["replay", str(result.run_dir), "--out", str(tmp_path / "b"), "--no-live"]) in (0, 1)
    again = eventlog.read(next((tmp_path / "b").iterdir()))
    assert again.header["sim"]["bugs"] == ["merge_twice"] and again.header["sim"]["step_s"] == 0.05
    assert again.events == eventlog.read(result.run_dir).events


def test_message_sizes_are_the_transports_frame_sizes():
    run = simulate(scenario())
    hello = next(e for e in run.events if e["kind"] == "send" and e["msg"] == "Hello")
    frame = encode_frame(Hello(hello["learner"], hello["incarnation"], hello["fresh"]), run.header["topology"]["run_id"],
                         hello["learner"])
    assert hello["bytes"] == len(frame)


def test_latency_and_bandwidth_delay_a_frame_as_toxiproxy_would():
    """80 kbps = 10 KB/s (Toxiproxy's rate) and 50 ms one-way, + 0.2 ms of loopback: a
    Hello of B bytes (≈ 160 with a fresh digest) sent at t arrives at t + B / 10,000 + 0.05 + 0.0002."""
    s = dataclasses.replace(scenario(), wan=dataclasses.replace(scenario().wan, bandwidth_kbps=80.0, latency_ms=50.0))
    events = simulate(s).events
    sent = next(e for e in events if e["kind"] == "send" and e["msg"] == "Hello")
    got = next(e for e in events if e["kind"] == "recv" and e["msg"] == "Hello" and e["src"] == sent["peer"]
               and e["learner"] == sent["src"])
    assert got["t"] - sent["t"] == pytest.approx(sent["bytes"] / 10_000 + 0.05 + 0.0002, abs=2e-6)


def _step_times(events, learner):
    return {e["step"]: e["t"] for e in events if e["kind"] == "step" and e["src"] == learner}


def test_a_pause_shifts_every_later_step_by_its_length():
    free = _step_times(simulate(scenario()).events, "learner-0")
    paused = _step_times(simulate(scenario([{"kind": "pause_unit", "target": "learner-0", "at": "1s",
                                             "duration": "0.75s"}])).events, "learner-0")
    shifted = [paused[k] - free[k] for k in sorted(set(free) & set(paused)) if free[k] > free[1] + 1.2]
    assert shifted and shifted == pytest.approx([0.75] * len(shifted), abs=2e-6)


def test_a_slow_unit_runs_its_steps_at_that_fraction_of_full_speed():
    """At speed 0.5 for 1 s the unit does half a second's work: later steps lag by 0.5 s."""
    free = _step_times(simulate(scenario()).events, "learner-2")
    slow = _step_times(simulate(scenario([{"kind": "slow_unit", "target": "learner-2", "at": "1s",
                                           "duration": "1s", "speed": 0.5}])).events, "learner-2")
    shifted = [slow[k] - free[k] for k in sorted(set(free) & set(slow)) if free[k] > free[1] + 2.5]
    assert shifted and shifted == pytest.approx([0.5] * len(shifted), abs=2e-6)


def test_a_stop_closes_every_live_learner_into_theta():
    """The run's end (the token budget spent, SIGTERM to every learner): each learner still
    up closes (its `closing` line at t_end), the shards merge those closing Δs before they
    are stopped, and every learner leaves by itself within the grace (its `done` line)."""
    run = simulate(scenario())
    t_end, events = round(run.header["t_end"], 6), run.events  # (event times are to the µs)
    learners = {f"learner-{i}" for i in range(3)}
    assert {e["src"] for e in events if e["kind"] == "closing" and e["t"] == t_end} == learners
    assert {e["learner"] for e in events if e["kind"] == "merge" and e["t"] >= t_end} == learners
    assert {e["src"] for e in events if e["kind"] == "done" and e["t"] >= t_end} >= learners
    last = max(e["t"] for e in events if e["kind"] == "done" and e["src"] in learners)
    assert last < t_end + 1.0  # every closing answered: none waited out STOP_CLOSE_S (3 s) or the grace
    assert run.header["stop_kills"] == []


def test_a_learner_still_up_past_its_stop_grace_is_killed_and_noted(monkeypatch):
    from diloco_chaos.harness.sim import world

    monkeypatch.setattr(world, "GRACE_S", {"learner": 0.0, "syncer": 5.0})  # no virtual time to close in
    run = simulate(scenario())
    assert run.header["stop_kills"] == [{"unit": f"learner-{i}", "incarnation": 0, "grace_s": 0.0} for i in range(3)]
    assert not [e for e in run.events if e["kind"] == "done" and e["src"].startswith("learner")]


def test_a_killed_syncer_restores_exactly_its_last_durable_snapshot():
    events = simulate(scenario([FAULTS[2]])).events
    kill = next(e["t"] for e in events if e["kind"] == "unit_down" and e["src"] == "syncer-1")
    saved = [e for e in events if e["kind"] == "checkpoint_saved" and e["src"] == "syncer-1" and e["t"] <= kill]
    restored = next(e for e in events if e["kind"] == "checkpoint_restored" and e["src"] == "syncer-1")
    assert restored["versions"] == {str(p): v for p, v in saved[-1]["versions"].items()}
    assert restored["step"] == len(saved)  # one save number per save, as the orbax shell counts


def test_data_parallel_kill_rolls_every_learner_back_to_its_checkpoint():
    s = scenario([{"kind": "kill_unit", "target": "learner-1", "at": "7.5s", "down_for": "1s"}], mode="dp",
                 steps=80)
    events = simulate(s).events
    downs = {e["src"]: e["reason"] for e in events if e["kind"] == "unit_down"}
    assert downs == {"learner-0": "rollback", "learner-1": "killed", "learner-2": "rollback"}
    restored = {e["src"]: e["step"] for e in events if e["kind"] == "checkpoint_restored"}
    assert restored == {"learner-0": 50, "learner-1": 50, "learner-2": 50}
    killed_at = {e["src"]: max(x["step"] for x in events if x["kind"] == "step" and x["src"] == e["src"]
                               and x["t"] <= e["t"]) for e in events if e["kind"] == "unit_down"}
    assert all(step > 50 for step in killed_at.values())  # steps 51.. were rolled back


def test_the_sims_inner_step_is_bit_for_bit_the_inner_loops():
    cfg = scenario().run_config()
    m = model_for(cfg)
    loop = make_inner(dataclasses.replace(cfg, diloco=dataclasses.replace(cfg.diloco, slices=1)), m.task.loss_fn)
    p1 = p2 = m.params0
    o1 = o2 = loop.init(m.params0)
    for step in range(5):
        batch = m.task.batch(0, step)
        p1, o1, met = loop.step(p1, o1, batch)
        p2, o2, loss = m.step(p2, o2, batch)
        assert float(met["loss"]) == float(loss)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)))


def test_sim_params_are_validated():
    with pytest.raises(ValueError, match="SimParams.step_s"):
        SimParams(step_s=0)
    with pytest.raises(ValueError, match="unknown planted bugs"):
        simulate(scenario(), bugs={"merge_thrice"})


@pytest.mark.parametrize("mode", ["dp", "elastic_dp"])
def test_elastic_dp_keeps_committing_while_a_learner_is_dead_and_dp_does_not(mode):
    """learner-1 killed for 2 s: data-parallel without elasticity restarts the job (every
    learner rolls back; no commit in that window), elastic data-parallel averages the live
    learners' gradients.
    (The simulator ran elastic_dp as local training before: it checked for "dp" only.)"""
    events = simulate(scenario(FAULTS[:1], mode=mode)).events
    t0, t1 = (next(e["t"] for e in events if e["kind"] == kind) for kind in ("fault_start", "fault_end"))
    during = [e for e in events if e["kind"] == "round_commit" and t0 + 0.5 < e["t"] < t1]
    assert (len(during) > 0) == (mode == "elastic_dp")
    assert all(e["n"] == 2 for e in during)          # the two live learners


@pytest.mark.parametrize("last", [100, 101])
def test_a_stop_while_a_checkpoint_is_in_flight_keeps_the_newest_step_saved_once(last):
    """The stop lands just after learner-0's step `last`, while its step-100 save is still being
    written (ckpt_save_s). At 100: the loop's final save must see that step as taken (a
    process's orbax refuses a step twice: the unit died before its `done`), and the save in
    flight is its checkpoint at the exit. At 101: the final save is the checkpoint, not the
    older one in flight finishing after it."""
    first = simulate(scenario(steps=400, duration="20s", end_grace="0s"))
    start = first.header["t_start"]
    saved = next(e["t"] for e in first.events
                 if e["kind"] == "checkpoint_saved" and e["src"] == "learner-0" and e["step"] == 100)
    stop = next(e["t"] for e in first.events if e["kind"] == "step" and e["src"] == "learner-0" and e["step"] == last)
    assert stop - saved < SimParams().ckpt_save_s  # the step-100 save still in flight at the stop
    run = simulate(scenario(steps=400, duration=f"{stop - start + 0.0005:.4f}s", end_grace="0s"))
    mine = [e for e in run.events if e["src"] == "learner-0" and e["t"] >= saved]
    assert [(e["kind"], e["step"]) for e in mine if e["kind"] in ("checkpoint_saved", "closing", "done")] == \
        [("checkpoint_saved", 100), ("closing", last)] + ([("checkpoint_saved", 101)] if last == 101 else []) + \
        [("done", last)]
    assert run.world.learners["learner-0"].ckpt[2] == last


def test_two_restarts_at_once_each_take_a_ready_spare_from_a_pool_of_two():
    """The spare pool (`[cluster] spare_pool`), modelled as on processes: two learners killed
    together find two ready spares; with a pool of one the second takes the replacement,
    which is not ready yet (`spare_booting`)."""
    kills = [{"kind": "kill_unit", "target": f"learner-{i}", "at": "8s", "down_for": "0.5s"} for i in (0, 1)]

    def starts(pool):
        s = scenario_from_dict({
            "name": "sim-pool", "seed": 5, "cluster": {"learners": 3, "spare_pool": pool},
            "train": {"task": "quadratic", "steps": 400, "duration": "20s"}, "faults": kills})
        return sorted(e["start"] for e in simulate(s).events
                      if e["kind"] == "unit_up" and e.get("reason") == "restarted")

    assert starts(2) == ["spare", "spare"]
    assert starts(1) == ["spare", "spare_booting"]
