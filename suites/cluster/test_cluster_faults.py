"""Every fault kind on real units and a real Toxiproxy, on both backends, each judged
by what it did to the event log (not by which calls were made). The same tests run on

  local    processes: SIGKILL, SIGSTOP/SIGCONT, a SIGSTOP duty cycle for slow_unit
  docker   containers: docker kill + a new container, docker pause (the cgroup
           freezer), a CFS CPU quota for slow_unit (slower hardware)

with slices and links done the same way on both (the control file, Toxiproxy). Two
short runs per backend share the work (in containers: nightly)."""
from __future__ import annotations

import json
import os

import pytest

from diloco_chaos.harness import eventlog
from diloco_chaos.harness.backends.runner import run_scenario
from diloco_chaos.harness.scenarios.scenario import scenario_from_dict

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# In containers: `make nightly` (CI's time budget). CI still runs units in containers, killed,
# restarted and paused the engine's way (suites/docker: disk_full, spares, pause, cleanup, engines).
BACKENDS = ["local", pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.nightly])]


def _scenario(name, faults, *, backend, slices=1, learners=2, shards=1, steps=1500, duration="28s", wan=None):
    # a token budget larger than the 28 s can train and no end grace: the run lasts exactly
    # `duration`, so every fault fires (the last ends at 25 s) however fast the machine is
    # spares off: these runs keep the cold restart path covered through the runner (on
    # docker it is the only one; warm spares: test_spares.py), and start no spare beside the units
    d = {"name": name, "seed": 1,
         "cluster": {"learners": learners, "slices": slices, "shards": shards, "backend": backend,
                     "spares": False},
         "train": {"task": "markov", "steps": steps, "duration": duration, "end_grace": "0s",
                   "batch_size": 16},
         "faults": faults}
    if wan:
        d["wan"] = wan
    return scenario_from_dict(d)


def _steps(log, src, t0, t1):
    return [e for e in log.of("step", src=src) if t0 <= e["t"] < t1]


def _window(log, fault_kind):
    start = next(e for e in log.of("fault_start") if e["fault"]["kind"] == fault_kind)
    end = next(e for e in log.of("fault_end") if e["id"] == start["id"])
    return start["t"], end["t"]


def _run(request, tmp_path_factory, scenario):
    """Runs `scenario` on the fixture's backend -> (event log, run.json)."""
    if request.param == "docker":  # module-scoped: start the engine before the run
        request.getfixturevalue("docker_engine")
    result = run_scenario(scenario, tmp_path_factory.mktemp("runs"), live=False)
    return eventlog.read(result.run_dir), json.loads((result.run_dir / "run.json").read_text())


@pytest.fixture(scope="module", params=BACKENDS)
def unit_faults(request, tmp_path_factory):
    s = _scenario("unit-faults", [
        {"kind": "kill_slice", "target": "learner-0", "at": "6s", "duration": "4s"},
        {"kind": "pause_unit", "target": "learner-1", "at": "6s", "duration": "3s"},
        {"kind": "slow_unit", "target": "learner-0", "at": "13s", "duration": "5s", "speed": 0.15},
        {"kind": "kill_unit", "target": "learner-1", "at": "13s", "down_for": "4s"},
        {"kind": "wan", "target": "link:learner-0", "at": "20s", "duration": "5s", "bandwidth_kbps": 400},
    ], slices=2, backend=request.param)
    return _run(request, tmp_path_factory, s)


@pytest.fixture(scope="module", params=BACKENDS)
def link_faults(request, tmp_path_factory):
    s = _scenario("link-faults", [
        {"kind": "partition", "target": "link:learner-0", "at": "6s", "duration": "4s"},
        {"kind": "kill_syncer", "target": "syncer-1", "at": "7s", "down_for": "3s"},
        {"kind": "reset", "target": "link:learner-1~syncer-0", "at": "12s", "duration": "2s"},
        # on syncer-0's link: syncer-1's cold restart (from 10 s) is the machine's pace; a
        # docker one under load took 10.3 s, past this window, and there was no connection to cut
        {"kind": "truncate", "target": "link:learner-0~syncer-0", "at": "16s", "duration": "3s", "bytes": 1000},
        LATENCY_SPIKE,
    ], shards=2, backend=request.param)
    return _run(request, tmp_path_factory, s)


# docs/ARCHITECTURE.md "Adding a fault kind": the worked example, tested on both tiers
LATENCY_SPIKE = {"kind": "latency_spike", "target": "link:learner-1~syncer-0", "at": "21s", "duration": "4s",
                 "latency_ms": 800}


def test_kill_slice_shrinks_the_batch(unit_faults):
    log, _ = unit_faults
    t0, t1 = _window(log, "kill_slice")
    steps = log.of("step", src="learner-0")
    before = [e for e in steps if e["t"] < t0]
    # judged by when each step started (its line comes at its end, t - dt its start), not
    # by a count in the window: the first step on one slice compiles its program, which on
    # a busy machine took longer than the 4 s window (no step *ended* inside it)
    one = [e for e in steps if e["live_slices"] == 1]
    assert one, "no step ran on one slice"
    # the heal lands when the learner reads its control message (its `slices` line back to
    # 2, after the fault_end line: on a busy machine 54 ms after it, one step started between)
    back = min((e["t"] for e in log.of("slices", src="learner-0") if e["live_slices"] == 2 and e["t"] >= t1),
               default=float("inf"))  # (never: the last assertion below says so)
    assert all(t0 - 0.05 <= e["t"] - e["dt"] < back for e in one), [(e["t"] - t0, e["dt"]) for e in one]
    assert {e["tokens"] for e in one} == {before[-1]["tokens"] // 2}
    # every step that started inside the window (past the control message's landing) ran on one
    assert all(e["live_slices"] == 1 for e in steps if t0 + 0.5 <= e["t"] - e["dt"] < t1)
    assert steps[-1]["live_slices"] == 2 and steps[-1]["t"] > t1  # back to both slices


def test_pause_stops_steps_then_resumes(unit_faults):
    log, _ = unit_faults
    t0, t1 = _window(log, "pause_unit")
    # frozen (SIGSTOP / the cgroup freezer): no step finished; 0.5 s for the call to land
    assert not _steps(log, "learner-1", t0 + 0.5, t1)
    assert _steps(log, "learner-1", t1, t1 + 3)


def test_slow_unit_runs_at_a_fraction(unit_faults):
    log, _ = unit_faults
    t0, t1 = _window(log, "slow_unit")
    slow = len(_steps(log, "learner-0", t0, t1)) / (t1 - t0)
    # its normal rate: the same unit in the same run, where no fault touched it (from 2 s
    # in, after its first compile, to the kill_slice; from 1 s after the slow fault to the
    # wan fault): relative, so a busy machine slows both sides alike (under two busy loops
    # the 2.5 s just before the fault once held no step: the one-slice compile ran into it)
    ws, we = _window(log, "wan")
    calm = [(log.header["t_start"] + 2, _window(log, "kill_slice")[0]), (t1 + 1, ws)]
    normal = sum(len(_steps(log, "learner-0", a, b)) for a, b in calm) / sum(b - a for a, b in calm)
    # speed 0.15: on docker a CPU quota of 0.15 of one core, which only slows a unit that was
    # using more. Three units and the harness on 2 shared cores give a unit ~0.5 core, less
    # under other load; with speed 0.3 CI once measured 11.4 steps/s slowed against 15.6
    # before (0.73; learner-1, dead in the same window, freed its share). 0.15 is below any
    # share a unit gets here, so the check sees the fault whatever else runs.
    assert normal > 0, "learner-0 made no step in the run's calm stretches"
    assert slow < 0.7 * normal, (slow, normal)


# Each test below takes one run: a test taking both fixtures would pair every backend of
# one with every backend of the other, and re-run the module-scoped runs to do it.
def test_unit_faults_done_the_backends_way(unit_faults):
    _done_the_backends_way(*unit_faults)


def test_link_faults_done_the_backends_way(link_faults):
    _done_the_backends_way(*link_faults)


def test_no_unit_outlives_the_unit_faults_run(unit_faults, request):
    _nothing_outlives(*unit_faults, request)


def test_no_unit_outlives_the_link_faults_run(link_faults, request):
    _nothing_outlives(*link_faults, request)


def _done_the_backends_way(log, run) -> None:
    """Each fault_start says how it was done: signals on local, the Docker API on docker;
    the links through Toxiproxy on both."""
    backend = run["backend"]["name"]
    assert log.header["topology"]["backend"]["name"] == backend
    via = {e["fault"]["kind"]: e["via"] for e in log.of("fault_start")}
    assert len(via) >= 4
    for kind, how in via.items():
        if kind in ("pause_unit", "kill_unit", "kill_syncer", "slow_unit"):
            assert how.startswith("docker ") == (backend == "docker"), (kind, how)
        else:
            assert how.startswith(("Toxiproxy", "slice control")), (kind, how)


def _nothing_outlives(log, run, request) -> None:
    """After the run: no process of it is alive (local), no container of it exists (docker)."""
    if run["backend"]["name"] == "docker":  # a unit's own pid is its container's, not ours
        from diloco_chaos.harness.backends.docker_engine import LABEL

        engine = request.getfixturevalue("docker_engine")
        assert not engine.containers.list(all=True, filters={"label": f"{LABEL}={run['topology']['run_id']}"})
    else:
        pids = [e["pid"] for e in log.of("unit_up") if e.get("pid")]
        assert len(pids) >= 3
        assert not [p for p in pids if _alive(p)]
    assert not log.header.get("crashes"), log.header.get("crashes")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = open(f"/proc/{pid}/stat").read()  # a zombie is not alive
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_kill_unit_restarts_and_contributes_again(unit_faults):
    log, _ = unit_faults
    t0, t1 = _window(log, "kill_unit")
    assert not _steps(log, "learner-1", t0 + 0.5, t1)
    ups = [e for e in log.of("unit_up", src="learner-1") if "incarnation" in e]
    assert [e["incarnation"] for e in ups] == [0, 1]
    assert any(m["learner"] == "learner-1" and m["incarnation"] == 1 for m in log.of("merge"))
    restart = next(e for e in log.of("unit_up", src="learner-1") if e.get("reason") == "restarted")
    assert restart["start"] == "cold"  # a new process (spares off here)


def test_wan_fault_throttles_the_link(unit_faults):
    log, _ = unit_faults
    t0, t1 = _window(log, "wan")
    # by when each frame arrived (`at`: the link's read thread stamps it), not when the
    # learner's loop logged it: a busy learner handles frames that came before the throttle
    # seconds later (under two busy loops: 724 kbit/s "in" the window counted by `t`)
    recv = [e for e in log.of("recv", src="learner-0") if t0 + 1 <= e.get("at", e["t"]) < t1]
    # the window's first frame (180 KB) may have been mostly sent before the throttle took
    # effect and only finished inside the window: a fresh-clone CI run measured 725 kbit/s
    # with it counted; every later frame crossed the throttled link whole
    rate_kbps = sum(e["bytes"] for e in recv[1:]) * 8 / 1000 / (t1 - t0 - 1)
    assert rate_kbps < 400 * 1.3, rate_kbps


def test_partition_blackholes_the_link(link_faults):
    log, _ = link_faults
    t0, t1 = _window(log, "partition")
    # a frame already past the proxy when the toxic landed may still arrive (a 180 KB
    # fragment on a loaded machine): nothing after the first 1.5 s of the 4 s window
    assert not [e for e in log.of("recv", src="learner-0") if t0 + 1.5 <= e["t"] < t1]
    assert [e for e in log.of("recv", src="learner-0") if e["t"] >= t1]  # healed
    assert _steps(log, "learner-0", t0, t1)  # and the learner never stopped stepping


def test_kill_syncer_restores_from_checkpoint(link_faults):
    log, _ = link_faults
    restored = log.of("checkpoint_restored", src="syncer-1")
    assert len(restored) == 1
    t0, t1 = _window(log, "kill_syncer")
    assert [e for e in log.of("round_commit", src="syncer-1") if e["t"] > t1]


def test_reset_and_truncate_cut_connections(link_faults):
    log, _ = link_faults
    for kind, learner in (("reset", "learner-1"), ("truncate", "learner-0")):
        t0, t1 = _window(log, kind)
        # when the link saw the cut (`at`, its read thread's stamp), not when the learner's
        # busy loop logged it (past t1 + 1 on a busy machine)
        downs = [e for e in log.of("link_down", src=learner) if t0 <= e.get("at", e["t"]) <= t1 + 1]
        assert downs, f"{kind}: no connection was cut"


def test_global_model_is_evaluated_along_the_run(link_faults):
    # two shards, one crashed 7-10 s: each kept a checkpoint per 3 s of the 28 s run, so Θ
    # is evaluated ≥ 5 times in the window, in time order; it learns (Θ0 is at about
    # ln 256 = 5.5 nats, the byte vocabulary; the Markov floor 1.71; measured here 4.0 at
    # t = 0.8 s, 1.83 at 3.7 s, 1.717 at the end), and ends near the floor. Not "the last
    # kept Θ ≈ the final one": in one docker run both the global model and learner-0's own
    # eval rose to 1.81 / 1.83 at 45 s, 4 s before a final 1.72
    log, _ = link_faults
    glob = [e for e in log.of("eval", src="harness") if e.get("global")]
    along, final = [e for e in glob if e.get("snapshot")], glob[-1]
    assert not final.get("snapshot") and len(along) >= 5, (glob, log.header.get("global_eval_errors"))
    t0, t1 = log.header["t_start"], log.header["t_end"]
    assert all(t0 <= e["t"] <= t1 for e in along) and [e["t"] for e in along] == sorted(e["t"] for e in along)
    assert along[0]["loss"] > along[-1]["loss"], [round(e["loss"], 3) for e in along]
    # near the floor, not below it by more than the eval's sampling noise: a mean over the
    # held-out batches can dip under the entropy floor (measured: the last snapshot at 1.7137
    # and 1.7142 against a floor of 1.7132; issue 16's 95 % interval is about ±0.006), so a
    # bound of `floor <` failed once in the four runs of this test on 2026-11-25
    floor, noise = log.header["task"]["loss_floor"], 0.03
    assert all(floor - noise < e["loss"] < floor + 0.25 for e in (along[-1], final)), (along[-1], final)


def test_every_learner_up_at_the_end_closes_into_theta(link_faults):
    """The budget spent, the harness SIGTERMs the learners: each closes (its `closing` line
    after t_end), the shards, still up, merge those closing Δs, and each learner leaves by
    itself within its grace (its `done` line), before the shards are stopped."""
    log, _ = link_faults
    t_end, learners = log.header["t_end"], {"learner-0", "learner-1"}
    assert {e["src"] for e in log.of("closing") if e["t"] >= t_end} == learners
    assert {e["learner"] for e in log.of("merge") if e["t"] >= t_end} == learners
    assert log.header["crashes"] == []  # none failed on its stop (once: a final save at a step in flight)
    done = {e["src"]: e["t"] for e in log.of("done")}
    assert learners <= done.keys() and max(done[n] for n in learners) < min(done["syncer-0"], done["syncer-1"])


def _one_way_s(log, learner, shard, t0, t1) -> list[float]:
    """How long each numbered message (a contribution: `seq` is unique per incarnation)
    `learner` sent to `shard` in [t0, t1) took to be received. Messages without a seq (a
    Hello at each reconnect) would pair with an earlier one of the same shape."""
    key = lambda e: (e["msg"], e.get("incarnation"), e.get("seq"), e.get("fragment"))  # noqa: E731
    sent: dict = {}  # key -> its send times (a message resent after a reconnect keeps its seq)
    for e in log.of("send", src=learner):
        if e["peer"] == shard and t0 <= e["t"] < t1 and e.get("seq") is not None:
            sent.setdefault(key(e), []).append(e["t"])
    out = []
    for r in log.of("recv", src=shard):
        before = [t for t in sent.get(key(r), ()) if t <= r["t"]] if r["peer"] == learner else []
        if before:
            out.append(r["t"] - max(before))
    return sorted(out)


def _latency_spike_delays_its_link(log, via_prefix: str) -> None:
    start = next(e for e in log.of("fault_start") if e["fault"]["kind"] == "latency_spike")
    t0, t1 = _window(log, "latency_spike")
    assert start["via"].startswith(via_prefix) and "latency toxic" in start["via"], start["via"]
    during = _one_way_s(log, "learner-1", "syncer-0", t0 + 0.2, t1 - 1.0)
    before = _one_way_s(log, "learner-1", "syncer-0", t0 - 4.0, t0 - 0.5)
    other = _one_way_s(log, "learner-0", "syncer-0", t0 + 0.2, t1 - 1.0)  # a link it does not target
    assert during and before and other, (len(during), len(before), len(other))
    assert during[len(during) // 2] >= 0.8 and during[0] >= 0.75, during  # 800 ms, no jitter
    assert before[len(before) // 2] < 0.4 and other[len(other) // 2] < 0.4, (before, other)


def test_latency_spike_delays_its_link(link_faults):
    _latency_spike_delays_its_link(link_faults[0], "Toxiproxy")


def test_latency_spike_delays_its_link_in_the_sim():
    # the same spike 15 s earlier in a 13 s run (the check needs 4 s before it and its
    # 4 s): the sim computes every inner step, 18.7 s of a CI run for the 28 s one
    from diloco_chaos.harness.sim.run import simulate

    spike = {**LATENCY_SPIKE, "at": "6s"}
    s = _scenario("latency-spike", [spike], shards=2, backend="local", duration="13s")
    _latency_spike_delays_its_link(simulate(s).log(), "simulated: Toxiproxy")
