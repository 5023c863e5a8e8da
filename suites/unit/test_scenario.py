"""Scenarios (harness/scenarios/scenario.py): the built-ins, round trips, units, and a table of
malformed scenarios with the message each must give (file, key path, what is valid)."""
from __future__ import annotations

import dataclasses
import json
import tomllib

import pytest

from diloco_chaos.faults.failures import FailureProcess
from diloco_chaos.faults.kinds import KillUnit, Partition
from diloco_chaos.harness.scenarios.scenario import (SCENARIOS_DIR, ClusterSpec, Expect, Scenario, ScenarioError, TrainSpec,
                              list_scenarios, load_scenario, scenario_from_dict)
from diloco_chaos.harness.scenarios.scenario_toml import scenario_to_toml
from diloco_chaos.harness.units import parse_bandwidth_kbps, parse_duration

BUILT_INS = [name for name, _ in list_scenarios()]
REQUIRED = {"fault-free", "unit-loss", "rolling-kills", "heterogeneous", "wan-brownout", "partition",
            "syncer-crash", "chaos"}


def test_the_required_built_ins_exist():
    assert REQUIRED <= set(BUILT_INS) and len(BUILT_INS) >= 8
    assert all(desc and "\n" not in desc for _, desc in list_scenarios())


@pytest.mark.parametrize("name", BUILT_INS)
def test_built_in_loads_small_and_round_trips(name):
    s = load_scenario(name)
    assert s.name == name and s.description
    # 4 learner units on this 2-core machine; the paper's operating point needs the paper's M = 8
    m = 8 if name == "paper-1.2m" else 4
    assert (s.cluster.learners, s.train.task) == (m, "markov") and 60 <= s.train.duration_s <= 90
    assert s.cluster.slices == (2 if any(f.kind == "kill_slice" for f in s.faults) else 1)
    assert scenario_from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert scenario_from_dict(tomllib.loads(scenario_to_toml(s))) == s
    assert load_scenario(SCENARIOS_DIR / f"{name}.toml") == s
    s.schedule().validate(s.shape())
    assert s.run_config().diloco.learners == m


# 4 learners on this project's 2-core machine, idle: ~15 inner steps/s each (rolling-kills'
# 400 steps took 27 s). A built-in whose token budget is spent before its last fault is
# over (plus time to recover) ends before it tests what it says; at the time of writing
# unit-loss ended 27 s in, before its killed unit came back at 35 s. Again on Docker in a
# fresh-state CI run (2026-11-28): 24.6 steps/s per learner, its 750 steps spent at 34.2 s,
# 0.8 s before the restart (recovery UNKNOWN); it has 900 now. The bound below is not yet
# raised to that pace: 12 built-ins would need more steps at 26 steps/s (work left; the
# deeper fix is a run that does not end before its schedule has played out).
FAST_STEPS_PER_S, SETTLE_S = 16.0, 10.0


@pytest.mark.parametrize("name", BUILT_INS)
def test_built_in_schedule_plays_out_before_the_token_budget_is_spent(name):
    s = load_scenario(name)
    d = s.train.duration_s
    # faults for the whole run (heterogeneous hardware) show at any length
    ends = [min(d, f.at_s if f.end_s is None else f.end_s) for f in s.schedule()
            if not (f.at_s <= 0 and (f.end_s is None or f.end_s >= d))]
    if not ends:
        return
    need = (max(ends) + SETTLE_S) * FAST_STEPS_PER_S * 4 / s.cluster.learners  # M units share the 2 cores
    assert s.train.steps >= need, (f"{name}: {s.train.steps} steps are spent in "
                                   f"{s.train.steps / FAST_STEPS_PER_S:.0f} s at {FAST_STEPS_PER_S:g} steps/s, "
                                   f"before its last fault ends ({max(ends):g} s) + {SETTLE_S:g} s")


def test_every_fault_kind_appears_in_some_built_in():
    kinds = {f.kind for n in BUILT_INS for f in load_scenario(n).schedule()}
    assert kinds >= {"kill_unit", "kill_slice", "pause_unit", "slow_unit", "kill_syncer", "wan", "partition",
                     "reset", "truncate"}


def test_chaos_draws_the_same_faults_every_time_at_the_documented_rate():
    s = load_scenario("chaos")
    fp = s.failure_process
    assert fp.seed == s.seed and fp.mix == "llama3"
    assert (80 - 5) * 4 * fp.chips_per_unit / fp.mtbi_s == pytest.approx(8.0)  # as the file says
    assert load_scenario("chaos").schedule() == s.schedule() and len(s.schedule()) == 7


def test_paper_operating_point_is_the_fleet_models_at_1_2m_chips_compressed_4x():
    from diloco_chaos.harness.run.result import with_mode

    s = load_scenario("paper-1.2m")
    fp = s.failure_process
    year = 365.25 * 86400
    assert s.cluster.learners * fp.chips_per_unit == 1_200_000 and fp.mtbi_s == pytest.approx(year / 4)
    assert (80 - 5) * 1_200_000 / fp.mtbi_s == pytest.approx(11.4, abs=0.05)  # as the file says
    assert fp.repair_s == (12 + 7) / 4 and fp.restart_s == (12 + 60) / 4 - 13  # FleetParams: detect, reconfig, restart; less the boot
    ddl, dp = s.schedule(), with_mode(s, "dp").schedule()
    assert len(ddl) == 12 and {f.kind for f in ddl} == {"pause_unit"}
    assert {f.target for f in ddl} == {f"learner-{i}" for i in range(8)}
    assert {f.kind for f in dp} == {"kill_unit"} and {(f.at_s, f.target) for f in dp} <= {(f.at_s, f.target) for f in ddl}


@pytest.mark.parametrize("text, seconds", [("500ms", 0.5), ("15s", 15.0), ("2m", 120.0), ("1h", 3600.0),
                                           ("1.5min", 90.0), (" 20 s ", 20.0), (45, 45.0), (0.25, 0.25),
                                           ("30", 30.0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_durations_in_milliseconds_and_bandwidths():
    assert parse_duration("40ms", "ms") == 40.0 and parse_duration("0.1s", "ms") == 100.0
    assert parse_duration(40, "ms") == 40.0
    assert [parse_bandwidth_kbps(v) for v in ("2mbps", "500kbps", "1Gbps", 2000, "64")] == \
        [2000.0, 500.0, 1e6, 2000.0, 64.0]
    for bad in ("2 MB/s", "fast", True):
        with pytest.raises(ValueError, match="as a bandwidth"):
            parse_bandwidth_kbps(bad)


def test_python_scenario_and_run_config():
    s = Scenario(name="py", seed=3, train=TrainSpec(steps=50, duration_s=30, quorum=2, lr=1e-3, compression="int4"),
                 cluster=ClusterSpec(learners=3), faults=(KillUnit("learner-2", 5, None),),
                 expect=Expect(goodput_min=0.5))
    c = s.run_config()
    assert (c.diloco.learners, c.diloco.quorum, c.diloco.compression, c.inner.lr) == (3, 2, "int4", 1e-3)
    assert (c.steps, c.inner.total_steps, c.inner.warmup_steps, c.seed) == (50, 50, 20, 3)
    assert scenario_from_dict(s.to_dict()) == s
    assert 'down_for = "never"' in scenario_to_toml(s)
    with pytest.raises(ValueError, match="train.quorum: quorum 4 is more than the 3 learners"):
        Scenario(name="py", seed=3, train=TrainSpec(steps=50, duration_s=30, quorum=4),
                 cluster=ClusterSpec(learners=3))


def test_the_paper_preset_sets_its_keys_and_keys_beside_it_win():
    c = Scenario(name="py", seed=3, train=TrainSpec(steps=50, duration_s=30, preset="paper")).run_config()
    d = c.diloco
    assert (d.sync_every, d.fragments, d.overlap, d.compression, d.broadcast_compression, d.downlink, d.align,
            d.share_by) == (64, 8, 2, "int4", "int4", "answer", True, "merged")
    assert (c.outer.lr, c.outer.momentum, c.outer.nesterov, c.outer.warmup) == (1.3, 0.0, True, 1)
    c = Scenario(name="py", seed=3, train=TrainSpec(steps=50, duration_s=30, preset="paper", sync_every=32,
                                                    downlink="all")).run_config()
    assert (c.diloco.sync_every, c.diloco.downlink, c.diloco.fragments) == (32, "all", 8)
    assert Scenario(name="py", seed=3, train=TrainSpec(steps=50, duration_s=30)).run_config().diloco.downlink == "all"


def test_the_outer_optimizer_is_set_by_its_own_keys_and_errors_name_them():
    d = {"name": "x", "seed": 1, "train": {"steps": 10, "duration": 5, "outer_lr": 0.7, "outer_momentum": 0.9}}
    s = scenario_from_dict(d)
    outer = s.run_config().outer
    assert (outer.lr, outer.momentum, outer.nesterov) == (0.7, 0.9, True)
    assert scenario_from_dict(tomllib.loads(scenario_to_toml(s))) == s
    d["train"]["outer_momentum"] = 1.5
    with pytest.raises(ScenarioError, match=r"train.outer_momentum: OuterOptConfig.momentum = 1.5 is out of range"):
        scenario_from_dict(d)


def test_failure_process_avoids_explicit_faults_and_defaults_to_the_scenario_seed():
    d = {"name": "x", "seed": 5, "train": {"steps": 10, "duration": "2m"},
         "faults": [{"kind": "kill_unit", "target": "learner-0", "at": 1, "down_for": "never"}],
         "failure_process": {"mtbi": "1m", "chips_per_unit": 4, "repair": "5s", "mix": {"kill_unit": 1}}}
    s = scenario_from_dict(d)
    assert s.failure_process.seed == 5 and s.drawn_faults()
    assert not any(f.target == "learner-0" for f in s.drawn_faults())
    assert s.schedule().faults[0] == KillUnit("learner-0", 1.0, None)


def test_the_old_name_baseline_runs_fault_free_and_says_so(capsys, monkeypatch):
    """`baseline` was the fault-free built-in's name until "baseline" came to mean a stored
    known-good run: the old name still loads it, with a note (once) that it is the old name."""
    from diloco_chaos.harness.scenarios import scenario as scenario_mod

    monkeypatch.setattr(scenario_mod, "_said_renamed", set())
    s = load_scenario("baseline")
    assert s == load_scenario("fault-free") and s.name == "fault-free" and not s.faults
    load_scenario("baseline")
    err = capsys.readouterr().err
    assert err.count("'baseline' is the old name of the built-in scenario 'fault-free'") == 1, err
    assert "baseline" not in BUILT_INS


def test_bare_name_and_path_errors():
    with pytest.raises(ScenarioError, match=r"^scenarios/unit-los.toml: no built-in scenario 'unit-los' "
                                            r"\(did you mean 'unit-loss'\?\); valid: chaos, fault-free"):
        load_scenario("unit-los")
    with pytest.raises(ScenarioError, match="nowhere/x.toml: cannot read the file"):
        load_scenario("nowhere/x.toml")


# ------------------------------------------------------------------ malformed scenarios
HEAD = 'name = "x"\nseed = 1\n'
CLUSTER = "[cluster]\nlearners = 4\n"
TRAIN = '[train]\nsteps = 100\nduration = "60s"\n'
OK = HEAD + CLUSTER + TRAIN


def fault(kind: str, **kv) -> str:
    body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in kv.items())
    return f'\n[[faults]]\nkind = "{kind}"\n{body}'


KILL = fault("kill_unit", target="learner-1", at="20s", down_for="15s")
MALFORMED = [
    # top level
    ("nmae = 'x'\n" + OK, "nmae: unknown key (did you mean 'name'?)"),
    ("seed = 1\n" + CLUSTER + TRAIN, "name: missing (required)"),
    (HEAD + CLUSTER, "train: missing (required); valid: a [train] table"),
    ('name = "My Run"\nseed = 1\n' + CLUSTER + TRAIN, "name: 'My Run' cannot name a run directory"),
    ('name = "x"\nseed = -1\n' + CLUSTER + TRAIN, "seed: -1 is out of range; valid: [0, 2**32)"),
    (HEAD + "cluster = 4\n" + TRAIN, "cluster: expected a table, got a whole number 4"),
    (HEAD + 'faults = "none"\n' + CLUSTER + TRAIN, "faults: expected an array of tables ([[faults]]), got a string"),
    (HEAD + "seed =\n" + TRAIN, "line 3, column 7: TOML syntax error: Invalid value"),
    (OK + "[train]\nsteps = 3\n", "line 8, column 7: TOML syntax error"),
    # cluster
    (HEAD + "[cluster]\nlearner = 4\n" + TRAIN, "cluster.learner: unknown key (did you mean 'learners'?)"),
    (HEAD + '[cluster]\nbackend = "k8s"\n' + TRAIN, "cluster.backend: 'k8s' is not one of the choices; "
                                                    "valid: local, docker"),
    (HEAD + "[cluster]\nlearners = 0\n" + TRAIN, "cluster.learners: 0 is out of range; valid: 1..1024"),
    (HEAD + '[cluster]\nengines = ["unix:///a.sock"]\n' + TRAIN,
     "cluster.engines: engines are for backend = \"docker\", not 'local'"),
    (HEAD + '[cluster]\nbackend = "docker"\nengines = ["host-b:2376"]\n' + TRAIN,
     "cluster.engines: 'host-b:2376' is not a Docker engine URL; valid: unix:///path/docker.sock, tcp://"),
    (HEAD + '[cluster]\nbackend = "docker"\nengines = "unix:///a.sock"\n' + TRAIN,
     "cluster.engines: expected an array of strings, got a string 'unix:///a.sock'"),
    (HEAD + '[cluster]\nlisten = "my-laptop"\n' + TRAIN, "cluster.listen: 'my-laptop' is not an IP address"),
    (HEAD + '[cluster]\nlisten = "8.8.8.8"\n' + TRAIN, "cluster.listen: '8.8.8.8' is a public address"),
    (HEAD + '[cluster]\nlisten = "0.0.0.0"\n' + TRAIN, "cluster.listen: '0.0.0.0' is every address"),
    (HEAD + '[cluster]\nlisten_public = "yes"\n' + TRAIN, "cluster.listen_public: expected true or false, got a string 'yes'"),
    (HEAD + "[cluster]\nshards = 5\n" + TRAIN, "cluster.shards: 5 shards for 3 fragments: a shard would own none"),
    # train
    (HEAD + CLUSTER + '[train]\nsteps = 100\n', "train.duration: missing (required); valid: a duration"),
    (HEAD + CLUSTER + '[train]\nduration = "60s"\n', "train.steps: missing (required); valid: a whole number"),
    (HEAD + CLUSTER + '[train]\nsteps = 100\nduration = "60 parsecs"\n',
     "train.duration: cannot read '60 parsecs' as a duration; valid: a number of seconds"),
    (HEAD + CLUSTER + '[train]\nsteps = 100\nduration = "-5s"\n', "train.duration: -5.0 is out of range; valid: > 0"),
    (HEAD + CLUSTER + '[train]\nsteps = "400"\nduration = 60\n',
     "train.steps: expected a whole number, got a string '400'"),
    (HEAD + CLUSTER + '[train]\nsteps = 1.5\nduration = 60\n', "train.steps: expected a whole number, got a number"),
    (OK + 'faults = "none"\n', "train.faults: unknown key ('faults' belongs above the first [table]); valid: steps"),  # a key below [train]
    (OK + 'keep_local = "yes"\n', "train.keep_local: expected true or false, got a string 'yes'"),
    (OK + "align = 1\n", "train.align: expected true or false"),
    (OK + "quorum = 5\n", "train.quorum: quorum 5 is more than the 4 learners (cluster.learners); valid: 1..4"),
    (OK + 'task = "markow"\n', "train.task: 'markow' is not one of the choices (did you mean 'markov'?)"),
    (OK + 'mode = "async"\n', "train.mode: 'async' is not one of the choices; valid: decoupled"),
    (OK + 'compression = "int3"\n', "train.compression: 'int3' is not one of the choices"),
    (OK + "[expect]\nparticipation_min = 0.5\n", "expect.participation_min: 0.5 is out of range; valid: >= 1"),
    (OK + 'preset = "papers"\n', "train.preset: 'papers' is not one of the choices (did you mean 'paper'?)"),
    (OK + 'downlink = "some"\n', "train.downlink: 'some' is not one of the choices; valid: all, answer"),
    (OK + "seq_len = 1000\n", "train.seq_len: TaskConfig.seq_len = 1000 exceeds ModelConfig.context"),
    (HEAD + "[cluster]\nslices = 2\n" + TRAIN + "batch_size = 7\n",
     "train.batch_size: TaskConfig.batch_size = 7 must be divisible by DilocoConfig.slices = 2"),
    (OK + "sync_every = 0\n", "train.sync_every: DilocoConfig.sync_every = 0 is out of range"),
    (OK + "warmup = 3\n", "train.warmup: unknown key (did you mean 'outer_warmup'?); valid: steps, duration, task"),
    # wan
    (OK + '[wan]\nbandwidth_kbps = "2 MB/s"\n', "wan.bandwidth_kbps: cannot read '2 MB/s' as a bandwidth"),
    (OK + "[wan]\nlatency_ms = 10\njitter_ms = 20\n", "wan.jitter_ms: jitter_ms must be in [0, latency_ms=10.0]"),
    (OK + "[wan]\nbandwith_kbps = 100\n", "wan.bandwith_kbps: unknown key (did you mean 'bandwidth_kbps'?)"),
    # faults: kinds and keys
    (OK + fault("kil_unit", target="learner-1", at=1, down_for=1),
     "faults[0].kind: unknown fault kind 'kil_unit' (did you mean 'kill_unit'?); valid: kill_unit, kill_slice"),
    (OK + '[[faults]]\ntarget = "learner-1"\n', "faults[0].kind: missing (required); valid: kill_unit"),
    (OK + fault("failure_process"), "faults[0].kind: a failure process is a table of its own, [failure_process]"),
    (OK + fault("kill_unit", target="learner-1", at="20s"),
     'faults[0].down_for: missing (required); valid: a duration, e.g. "15s" or "500ms", or "never"'),
    (OK + fault("kill_unit", target="learner-1", at="20s", donw_for="5s"),
     "faults[0].donw_for: unknown key (did you mean 'down_for'?); valid: target, at, down_for"),
    (OK + fault("kill_unit", target="learner-1", at="20s", at_s=20, down_for=5),
     "faults[0].at_s: 'at' and 'at_s' set the same thing"),
    (OK + fault("truncate", target="link:*", at="20s", duration="5s"), "faults[0].bytes: missing (required)"),
    # faults: targets
    (OK + fault("kill_unit", target="learner-7", at="20s", down_for="5s"),
     "faults[0].target: unknown target 'learner-7' in a run with 4 learners and 1 syncer shard(s); "
     "valid: learner-0..learner-3"),
    (OK + fault("kill_unit", target="syncer-0", at="20s", down_for="5s"),
     "faults[0].target: kill_unit cannot target 'syncer-0'; valid: learner-N"),
    (OK + fault("kill_syncer", target="syncer-1", at="20s", down_for="5s"),
     "faults[0].target: unknown target 'syncer-1'"),
    (OK + fault("partition", target="link:learner-2~syncer", at="20s", duration="5s"),
     "faults[0].target: partition cannot target 'link:learner-2~syncer'; valid: link:learner-N, "),
    (OK + fault("reset", target="link:learner-1~syncer-3", at="20s", duration="5s"),
     "faults[0].target: unknown target 'link:learner-1~syncer-3'"),
    # faults: values and times
    (OK + fault("kill_unit", target="learner-1", at="-1s", down_for="5s"),
     "faults[0].at: -1.0 is out of range; valid: >= 0 seconds"),
    (OK + fault("kill_unit", target="learner-1", at="90s", down_for="5s"),
     "faults[0].at: 90s is at or past the end of the run (60s); valid: [0, 60) seconds"),
    (OK + fault("pause_unit", target="learner-1", at="1m", duration="5s"), "faults[0].at: 60s is at or past the end"),
    (OK + fault("kill_syncer", target="syncer-0", at="20s", down_for="never"),
     "faults[0].down_for: cannot read 'never' as a duration"),
    (OK + fault("slow_unit", target="learner-1", at=0, duration="10s", speed=1.5),
     "faults[0].speed: 1.5 is out of range; valid: (0, 1)"),
    (OK + fault("slow_unit", target="learner-1", at=0, duration="10s", speed=0.5, period_ms="5ms"),
     "faults[0].period_ms: 5.0 is out of range; valid: [10, 10000] ms"),
    (OK + fault("partition", target="link:*", at=0, duration="10s", direction="sideways"),
     "faults[0].direction: 'sideways' is not one of the choices; valid: both, upstream, downstream"),
    (OK + fault("wan", target="link:*", at=0), "faults[0].bandwidth_kbps: a wan fault with no bandwidth limit"),
    (OK + fault("kill_slice", target="learner-1", at="5s", duration="5s"), "faults[0].target: learner-1 has 1 slice"),
    (HEAD + "[cluster]\nslices = 2\n" + TRAIN + fault("kill_slice", target="learner-1", at=5, duration=5, slices=2),
     "faults[0].slices: 2 of 2 slices: the unit would have none left; valid: 1..1"),
    # faults: impossible overlaps
    (OK + KILL + fault("kill_unit", target="learner-1", at="30s", down_for="5s"),
     "faults[1].at: overlaps faults[0] (kill_unit of learner-1, 20s–35s): the unit is already down; "
     "valid: start it at or after 35s, when faults[0] ends"),
    (OK + fault("kill_unit", target="learner-1", at="20s", down_for="never")
     + fault("pause_unit", target="learner-1", at="40s", duration="5s"),
     "faults[1].at: overlaps faults[0] (kill_unit of learner-1, 20s–the end): a unit cannot be paused while it is down"),
    (OK + fault("slow_unit", target="learner-2", at=0, duration="60s", speed=0.5)
     + fault("pause_unit", target="learner-2", at="10s", duration="5s"),
     "faults[1].at: overlaps faults[0] (slow_unit of learner-2, 0s–60s): pause and slow both drive SIGSTOP/SIGCONT"),
    (OK + fault("wan", target="link:*", at=0, latency_ms=40) + fault("wan", target="link:learner-1", at=10,
                                                                      duration=5, bandwidth_kbps=100),
     "faults[1].at: overlaps faults[0] (wan of link:*, 0s–the end): two wan faults on one link at once "
     "(the second would replace the first's toxic); valid: give faults[0] an end at or before 10s"),
    # failure process and expectations
    (OK + '[failure_process]\nmtbi = "5m"\nchips_per_unit = 8\nrepair = "10s"\nmix = "llama2"\n',
     "failure_process.mix: unknown mix 'llama2' (did you mean 'llama3'?)"),
    (OK + '[failure_process]\nmtbi = "0s"\nchips_per_unit = 8\nrepair = "10s"\n',
     "failure_process.mtbi: 0.0 is out of range; valid: > 0 seconds"),
    (OK + '[failure_process]\nmtbi = "5m"\nrepair = "10s"\n', "failure_process.chips_per_unit: missing (required)"),
    (OK + '[failure_process]\nmtbi = "5m"\nchips_per_unit = 8\nrepair = "10s"\nmix = { gpu = 1 }\n',
     "failure_process.mix: unknown cause or kind 'gpu'"),
    (OK + "[expect]\ngoodput_min = 1.5\n", "expect.goodput_min: 1.5 is out of range; valid: [0, 1]"),
    (OK + '[expect]\nrecovery_max = "soon"\n', "expect.recovery_max: cannot read 'soon' as a duration"),
    (OK + '[expect]\nrecovery_max = "20s"\nrecovery_max_s = 20\n',
     "expect.recovery_max_s: 'recovery_max' and 'recovery_max_s' set the same thing"),
    (OK + "[expect]\nrejoin_cycles_max = 0\n",
     "expect.rejoin_cycles_max: 0 is out of range; valid: > 0 fragment cycles (of H inner steps)"),
    (OK + "[expect]\ngoodput = 0.8\n", "expect.goodput: unknown key (did you mean 'goodput_min'?)"),
]


@pytest.mark.parametrize("text, fragment", MALFORMED, ids=[f"{i:02d}" for i in range(len(MALFORMED))])
def test_malformed_scenario_is_rejected_with_file_key_and_valid(tmp_path, text, fragment):
    path = tmp_path / "x.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as e:
        load_scenario(str(path))
    assert str(e.value).startswith(f"{path}: ")
    assert fragment in str(e.value), str(e.value)


def test_the_malformed_table_is_big_enough():
    assert len(MALFORMED) >= 30


def test_a_file_that_is_not_utf8_text_names_the_file_the_line_and_the_byte(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'name = "x"\nseed = 1\ndescription = "caf\xe9"\n')
    with pytest.raises(ScenarioError) as e:
        load_scenario(str(path))
    assert str(e.value) == (f"{path}: line 3: not UTF-8 text (byte 0xe9 at offset 38); "
                            f"valid: a TOML file, which is UTF-8 text")


def test_from_dict_names_the_python_source():
    with pytest.raises(ScenarioError, match=r"^<python>: train.steps: missing"):
        scenario_from_dict({"name": "x", "seed": 1, "train": {"duration": 5}})
    d = load_scenario("partition").to_dict()
    d["faults"][1]["target"] = "link:learner-9"
    with pytest.raises(ScenarioError, match=r"^<python>: faults\[1\].target: unknown target 'link:learner-9'"):
        scenario_from_dict(d)


def test_a_scenario_can_be_written_and_read_back_by_hand(tmp_path):
    s = Scenario(name="hand", seed=9, description='quotes " and \\ survive',
                 train=TrainSpec(steps=10, duration_s=20),
                 faults=(Partition("link:learner-0~syncer-0", 1.5, 2.25, direction="downstream"),),
                 failure_process=FailureProcess(30, 2, 1, mix={"thermal": 1, "nic": 2}, seed=1))
    path = tmp_path / "hand.toml"
    path.write_text(scenario_to_toml(s))
    assert load_scenario(str(path)) == s


def test_engines_and_listen_round_trip():
    s = load_scenario("unit-loss")
    s = dataclasses.replace(s, cluster=dataclasses.replace(
        s.cluster, backend="docker", engines=("unix:///tmp/a.sock", "ssh://me@host-b"), listen="10.0.0.5"))
    text = scenario_to_toml(s)
    assert 'engines = ["unix:///tmp/a.sock", "ssh://me@host-b"]' in text
    assert scenario_from_dict(tomllib.loads(text)) == s
    assert load_scenario("unit-loss").cluster.engines == () and load_scenario("unit-loss").cluster.listen == "127.0.0.1"
    # a public address only when asked for, and the ask survives the round trip
    public = dataclasses.replace(s, cluster=dataclasses.replace(s.cluster, listen="0.0.0.0", listen_public=True))
    assert scenario_from_dict(tomllib.loads(scenario_to_toml(public))) == public
