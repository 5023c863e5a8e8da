"""`diloco-chaos run | scenarios | replay | demo`."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

from diloco_chaos import ci_output, reference_store
from diloco_chaos.scenario_args import load, runner
from diloco_chaos.harness.errors import UserError

DEFAULT_SCENARIO = "chaos"


def register_run(sub, help_: str) -> None:
    from diloco_chaos.cli import EXIT_CODES

    p = sub.add_parser("run", help=help_, description=RUN_DESCRIPTION, epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", help="a TOML file, or a built-in name (see `diloco-chaos scenarios`)")
    _run_options(p)
    p.set_defaults(func=cmd_run)


RUN_DESCRIPTION = """Run a fault scenario, its checks and its report.

Two tiers, as in the README's quick start:
  --tier sim      the simulator: no Go, Chromium or Docker; the first run to try
                  (`diloco-chaos run unit-loss --tier sim`)
  --tier cluster  the full path, and the default when --tier is not given: learners
                  and syncer shards as real processes behind Toxiproxy (`diloco-chaos
                  setup` or `make setup` installs it)"""


def register_demo(sub, help_: str) -> None:
    p = sub.add_parser("demo", help=help_, description=f"`run {DEFAULT_SCENARIO} --compare dp`, fault-free reference included.")
    _run_options(p, compare=False)  # the demo always compares with data-parallel
    p.set_defaults(func=lambda a: cmd_run(_demo_args(a)))


def _demo_args(a):
    a.scenario, a.compare = DEFAULT_SCENARIO, "dp"
    return a


def _run_options(p, compare: bool = True) -> None:
    p.add_argument("--out", default="runs", type=Path, help="parent folder of run directories (default runs/)")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="run the scenario with the trainer preset NAME (paper, sparse) in place of its own "
                        "[train] preset; keys the scenario sets itself still win")
    if compare:
        p.add_argument("--compare", choices=["dp", "last"], default=None,
                       help="dp: also run the same scenario and fault draw under data-parallel; last: show "
                            "this run beside the scenario's previous run in --out (`diloco-chaos runs`)")
    p.add_argument("--reference", choices=["auto", "none"], default="auto",
                   help="loss parity against the fault-free run of the same scenario (auto: run it once, then reuse)")
    p.add_argument("--tier", choices=["cluster", "sim"], default="cluster",
                   help="sim: the simulator (no Go, Chromium or Docker); cluster (the default): the full path, "
                        "real processes behind Toxiproxy")
    p.add_argument("--backend", choices=["local", "docker"], default=None,
                   help="override the scenario's cluster.backend (docs/DOCKER.md)")
    p.add_argument("--no-live", "--quiet", dest="no_live", action="store_true",
                   help="no live progress display (the simulator's progress line on stderr included)")
    p.add_argument("--baseline", default="stored", metavar="stored|none|RUN",
                   help="stored (default): also judge the final loss against the scenario's known-good baseline, "
                        "where one is stored for its config and tier (baseline_parity_max); none: do not; RUN: a "
                        "run directory or summary.json to gate this run against with --fail-on (e.g. runs/latest "
                        "of main)")
    p.add_argument("--fail-on", default=None, metavar="SPEC",
                   help="with --baseline RUN: what fails the run against it, e.g. goodput:-3pts,parity:+1%% "
                        "(figure:signed limit; pts = percentage points, %% = relative or points for fractions, "
                        "s = seconds); default goodput:-3pts")
    p.add_argument("--json", action="store_true",
                   help="print the summary (summary.json, with the gate) as JSON on stdout; everything else "
                        "goes to stderr")
    p.add_argument("--record-baseline", action="store_true",
                   help="store this config's fault-free final loss as its known-good baseline (on purpose only: "
                        "from code you trust)")
    p.add_argument("--dry-run", action="store_true",
                   help="read the scenario and the options, print what would run (the drawn fault schedule, "
                        "as `check` does) and where, and start nothing")
    _unknown_option(p)


ANY = "*"  # `--allow-unknown=*`: what a bare --allow-unknown before the scenario is read as


def check_names() -> set[str]:
    """Every check a verdict can hold (what --allow-unknown may name)."""
    from diloco_chaos.harness.judging import checks
    from diloco_chaos.harness.judging.planted import PROOFS

    from diloco_chaos.harness.judging.envelopes import FIGURES

    return (set(PROOFS) | set(checks.EXPECT) | {"faults_applied", "no_crash", "baseline_parity_max"}
            | {f.check for f in FIGURES.values()})


def bare_allow_unknown(argv: list[str]) -> list[str]:
    """`run --allow-unknown unit-loss`: a value that names no check is the scenario after a bare
    flag, not a list of checks (argparse took it as the flag's value, then missed the scenario)."""
    if "--allow-unknown" not in argv:
        return argv
    names, out = check_names(), list(argv)
    for i, tok in enumerate(out[:-1]):
        nxt = out[i + 1]
        if tok == "--allow-unknown" and not nxt.startswith("-") and not set(filter(None, nxt.split(","))) <= names:
            out[i] = f"--allow-unknown={ANY}"
    return out


def _unknown_option(p) -> None:
    p.add_argument("--allow-unknown", nargs="?", const=True, default=False, metavar="CHECK[,CHECK]",
                   type=lambda v: True if v == ANY else tuple(x for x in v.split(",") if x),
                   help="exit 0 although checks ended UNKNOWN (the run could not judge them); by default "
                        "UNKNOWN is not a pass and the exit code is 1. Bare: any check; else only those named")


def with_baseline(summary: dict, s, tier: str, run_dir: Path | None = None, envelope_store: Path | None = None) -> dict:
    """The summary with `baseline_parity_max` added where a known-good baseline is stored
    for the scenario's config and tier (harness/judging/baseline.py), and the envelope's
    checks where a known-good envelope is stored for the scenario with its faults
    (harness/judging/envelopes.py); summary.json rewritten."""
    from diloco_chaos.harness.judging import baseline, envelopes
    from diloco_chaos.harness.judging.check_base import Result, compose

    r = baseline.check(summary.get("final_loss"), baseline.stored(s, tier),
                       s.expect.loss_parity_max or baseline.BOUND)
    added = ([] if r is None else [r]) + envelopes.checks(summary, envelopes.stored(s, tier, envelope_store), s.seed)
    if not added:
        return summary
    summary["checks"] = [*summary.get("checks", []), *(x.to_dict() for x in added)]
    summary["valid"] = compose([Result(c["name"], c.get("valid")) for c in summary["checks"]]).valid
    if run_dir is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return summary


def _record_baseline(s, tier: str, fault_free: Path) -> None:
    from diloco_chaos.harness.judging import baseline

    final = json.loads((fault_free / "summary.json").read_text()).get("final_loss")
    if final is None:
        raise UserError(f"--record-baseline: the fault-free run {fault_free} has no final loss")
    entry = baseline.record(s, tier, final)
    print(f"baseline recorded: {baseline.key(s, tier)} final loss {entry['final_loss']:.4f} in {baseline.STORE}")


def exit_code(summary: dict, allow_unknown=False) -> int:
    """0: the run held; 1: a check failed, or ended UNKNOWN without --allow-unknown
    (2, bad input, comes from UserError)."""
    from diloco_chaos.harness.judging.judge import held, unknown_checks

    unknown = unknown_checks(summary)
    ok = held(summary, allow_unknown=allow_unknown)
    if unknown and not any(c.get("valid") is False for c in summary.get("checks", [])):
        accepted = allow_unknown is True or set(unknown) <= set(allow_unknown or ())
        print(f"UNKNOWN (not judged: the run could not tell): {', '.join(unknown)}; "
              + ("accepted by --allow-unknown" if accepted else
                 "UNKNOWN is not a pass: exit 1 (--allow-unknown accepts it)"))
    return 0 if ok else 1


def judged_expect(s, reference: str):
    """(the scenario as it will be judged, a note or None): `loss_parity_max` needs a
    fault-free reference; with `--reference none`, or in a scenario without faults (its
    own reference), it is not judged, and the note says so, rather than ending UNKNOWN."""
    if s.expect.loss_parity_max is None:
        return s, None
    why = ("--reference none" if reference == "none" else
           "a scenario without faults is its own reference" if not s.faults and s.failure_process is None else None)
    if why is None:
        return s, None
    return (dataclasses.replace(s, expect=dataclasses.replace(s.expect, loss_parity_max=None)),
            f"loss_parity_max not judged ({why})")


def register_scenarios(sub, help_: str) -> None:
    p = sub.add_parser("scenarios", help=help_)
    p.set_defaults(func=cmd_scenarios)


def register_replay(sub, help_: str) -> None:
    p = sub.add_parser("replay", help=help_, description="Run a stored run again with its recorded config, seed and schedule.")
    p.add_argument("run_dir", type=Path, help="a run directory (holds events.jsonl)")
    p.add_argument("--out", default="runs", type=Path, help="parent folder of the replay's run directory (default runs/)")
    p.add_argument("--tier", choices=["cluster", "sim"], default=None,
                   help="where to replay (default: the tier the run was made on)")
    p.add_argument("--no-live", "--quiet", dest="no_live", action="store_true",
                   help="no live progress display (the simulator's progress line on stderr included)")
    _unknown_option(p)
    p.set_defaults(func=cmd_replay)


def _with_preset(s, name: str):
    from diloco_chaos.trainer.presets import PRESETS

    if name not in PRESETS:
        raise UserError(f"--preset {name!r} is not a preset; valid: {', '.join(PRESETS)}")
    return dataclasses.replace(s, train=dataclasses.replace(s.train, preset=name))


def cmd_scenarios(args) -> int:
    from diloco_chaos.harness.scenarios.scenario import RENAMED, list_scenarios

    for name, line in list_scenarios():
        print(f"{name:16s} {line}")
    for old, new in RENAMED.items():
        print(f"{old:16s} the old name of {new} (still runs it)")
    return 0


def cmd_run(args) -> int:
    s = load(args.scenario, args.seed)
    if args.preset:
        s = _with_preset(s, args.preset)
    if args.backend:
        s = dataclasses.replace(s, cluster=dataclasses.replace(s.cluster, backend=args.backend))
    baseline, gate_spec = _baseline_option(args)
    if getattr(args, "dry_run", False):
        return _dry_run(s, args)
    with _stdout_for(args) as emit:
        return _on_backend(s, args.tier, lambda: _execute(
            s, args.out, compare=args.compare, reference=args.reference, live=not args.no_live, tier=args.tier,
            allow_unknown=args.allow_unknown, baseline=baseline, record=getattr(args, "record_baseline", False),
            gate_spec=gate_spec, emit=emit))


def _dry_run(s, args) -> int:
    """`run --dry-run`: what would run, from the options as read (the scenario, its schedule,
    the tier and backend, the reference), and nothing started."""
    from diloco_chaos.check_cmd import FileCheck, print_result

    result = FileCheck(args.scenario, scenario=s)
    if args.json:
        print(json.dumps({**result.to_dict(), "tier": args.tier, "reference": args.reference, "out": str(args.out)},
                         indent=1, default=str))
        return 0
    print_result(result)
    backend = s.cluster.backend if args.tier == "cluster" else "simulator"
    print(f"would run on the {args.tier} tier ({backend}), reference {args.reference}, under {args.out}/; "
          f"nothing started (drop --dry-run to run it)")
    return 0


def _baseline_option(args):
    """(--baseline as stored | none | the baseline run's summary, the --fail-on SPEC): a bad
    SPEC or an unreadable baseline is bad input before anything runs (the SPEC first)."""
    baseline, spec = getattr(args, "baseline", "stored"), getattr(args, "fail_on", None)
    if baseline in ("stored", "none"):
        if spec:
            raise UserError("--fail-on needs --baseline RUN (a run directory or summary.json to compare against)")
        return baseline, None
    from diloco_chaos.harness.judging import gate

    spec = spec or gate.DEFAULT_FAIL_ON
    gate.parse_fail_on(spec)
    return gate.load_summary(Path(baseline)), spec


@contextlib.contextmanager
def _stdout_for(args):
    """With --json, stdout carries only the summary: what the run prints goes to stderr and
    `emit(summary)` writes the JSON to the real stdout. Without it, `emit` does nothing."""
    if not getattr(args, "json", False):
        yield lambda summary: None
        return
    real = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        yield lambda summary: print(json.dumps(summary, indent=1, default=str), file=real, flush=True)


def _on_backend(s, tier: str, go) -> int:
    """Calls `go()`; a docker run first gets an engine (starting a private one when none
    answers, stopped after: harness.backends.docker_engine.engine_for_run)."""
    if s.cluster.backend != "docker" or tier == "sim":
        return go()
    from diloco_chaos.harness.extras import require

    require("docker", "docker")  # before any engine is looked for or started: one line naming the extra
    from diloco_chaos.harness.backends.docker_engine import engine_for_run

    try:
        with engine_for_run():
            return go()
    except RuntimeError as e:
        raise UserError(str(e)) from None


def cmd_replay(args) -> int:
    from diloco_chaos.harness import eventlog
    from diloco_chaos.harness.scenarios.scenario import scenario_from_dict

    try:
        header = eventlog.read(args.run_dir).header
    except eventlog.EventLogError as e:
        raise UserError(str(e)) from None
    d = dict(header["scenario"])
    d["faults"] = header["schedule"]  # exactly the faults that ran, drawn ones included
    d.pop("failure_process", None)
    s = scenario_from_dict(d, source=str(args.run_dir / "events.jsonl"))
    tier = args.tier or header.get("tier", "cluster")
    if args.allow_unknown is not True:  # a replay runs without a fault-free reference: parity is not judged
        args.allow_unknown = tuple(args.allow_unknown or ()) + ("loss_parity_max",)
    if tier == "sim" and header.get("tier") == "sim":  # its sim parameters and planted bugs too
        from diloco_chaos.harness.judging.report_text import print_summary
        from diloco_chaos.harness.sim.run import replay_sim

        result = replay_sim(args.run_dir, args.out)
        render(result.run_dir)
        print_summary(result.summary)
        print(f"results: {result.run_dir}\nreport: {result.run_dir / 'report.html'}")
        return exit_code(result.summary, args.allow_unknown)
    if tier == "sim":  # a real run in the simulator: its parameters measured from the run's own log
        return _replay_calibrated(args, s)
    return _on_backend(s, tier, lambda: _execute(s, args.out, compare=None, reference="none", live=not args.no_live,
                                                 label=f"{s.name}-replay", tier=tier,
                                                 allow_unknown=args.allow_unknown))


def _replay_calibrated(args, s) -> int:
    import dataclasses
    import json

    from diloco_chaos.harness import eventlog
    from diloco_chaos.harness.judging import metrics
    from diloco_chaos.harness.judging.report_text import print_summary
    from diloco_chaos.harness.sim.calibrate import replay_calibrated

    stored = args.run_dir / "summary.json"  # the run's own judgement (its global evals); else judged again
    real = json.loads(stored.read_text()) if stored.is_file() else metrics.compute(eventlog.read(args.run_dir)).to_dict()
    result, params = replay_calibrated(s, args.run_dir, args.out, label=f"{s.name}-sim-replay")
    render(result.run_dir)
    print_summary(result.summary)
    real_g, sim_g = real.get("goodput"), result.summary["goodput"]
    row = {"real_goodput": real_g, "sim_goodput": sim_g,
           "sim_minus_real_points": None if real_g is None or sim_g is None else 100 * (sim_g - real_g),
           "real_final_loss": real.get("final_loss"), "sim_final_loss": result.summary["final_loss"],
           "sim_params": dataclasses.asdict(params)}
    (result.run_dir / "calibrated.json").write_text(json.dumps(row, indent=1, default=list) + "\n")
    print(f"calibrated from {args.run_dir}: step {params.step_s * 1000:.1f} ms (median of the learners'), "
          f"eval {params.eval_s * 1000:.0f} ms, checkpoint {params.ckpt_s * 1000:.0f} ms, learner start-up "
          f"{params.learner_startup_s:.2f} s, shard start-up {params.syncer_startup_s:.2f} s, spare "
          f"{params.spare_startup_s:.2f} s")
    if row["sim_minus_real_points"] is not None:
        print(f"goodput: real {real_g:.1%}, sim {sim_g:.1%} ({row['sim_minus_real_points']:+.1f} points)")
    print(f"results: {result.run_dir} (calibrated.json)\nreport: {result.run_dir / 'report.html'}")
    return exit_code(result.summary, args.allow_unknown)


def reference_run(s, out: Path, live: bool, tier: str = "cluster", beside: bool = False):
    """The fault-free run of `s` (same config, seed and tier), made once and reused: its
    folder, or (sim tier, `beside`) a `_SimReference` running it while the caller runs `s`."""
    run_scenario = runner(tier)

    if not s.faults and s.failure_process is None:
        return None
    clean = dataclasses.replace(s, faults=(), failure_process=None)
    name = f"{s.name}-{reference_store.reference_key(clean, tier)}{'-sim' if tier == 'sim' else ''}"
    ref_dir = out / "_reference" / name
    if (ref_dir / "summary.json").exists():
        print(f"reference (fault-free) run: reusing {ref_dir}")
        return ref_dir
    cached = reference_store.fetch(name, ref_dir)
    if cached is not None:
        print(f"reference (fault-free) run: reusing {ref_dir} (kept in {cached.parent}; "
              f"{reference_store.CACHE_ENV}=off makes a new one)")
        return ref_dir
    print(f"reference (fault-free) run: {ref_dir}")
    ref_dir.mkdir(parents=True, exist_ok=True)
    if tier == "sim" and beside:  # beside the faulted run, in a process of its own (below)
        return _SimReference(clean, out, ref_dir, name)
    run_scenario(clean, out, run_dir=ref_dir, live=live)
    render(ref_dir)
    reference_store.keep(name, ref_dir)
    return ref_dir


def _sim_reference_job(scenario: dict, out: str, ref_dir: str) -> None:
    from diloco_chaos.harness.scenarios.scenario import scenario_from_dict
    from diloco_chaos.harness.sim.run import run_sim

    run_sim(scenario_from_dict(scenario), Path(out), run_dir=Path(ref_dir))
    render(Path(ref_dir))


class _SimReference:
    """The fault-free simulation of a scenario, run in a second process while this one
    simulates the faulted run: the two are independent until the verdict compares them,
    and each is mostly one core's work (measured on 2 cores, unit-loss: 127 s one after the
    other, 112 s beside; JAX's own threads take part of the second core).
    `run_sim` calls it for the reference's folder when it needs it; it never outlives the
    command (a failure or Ctrl-C here stops it)."""

    def __init__(self, clean, out: Path, ref_dir: Path, name: str):
        import multiprocessing

        self.ref_dir, self.name = ref_dir, name
        self.proc = multiprocessing.get_context("spawn").Process(
            target=_sim_reference_job, args=(clean.to_dict(), str(out), str(ref_dir)), daemon=True)
        self.proc.start()

    def __call__(self) -> Path:
        try:
            self.proc.join()
        finally:
            self.close()
        if self.proc.exitcode != 0 or not (self.ref_dir / "summary.json").exists():
            raise UserError(f"the fault-free reference run failed (exit {self.proc.exitcode}); its folder: "
                            f"{self.ref_dir}; run without it: --reference none")
        reference_store.keep(self.name, self.ref_dir)
        return self.ref_dir

    def close(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)


def _compare_last(s, out: Path, run_dir: Path) -> None:
    """This run beside the scenario's previous one in `out` (figures with deltas, checks)."""
    from diloco_chaos.harness.judging import gate
    from diloco_chaos.compare_cmd import render as render_compare
    from diloco_chaos.runs_cmd import previous_run

    prev = previous_run(out, s.name, run_dir)
    if prev is None:
        print(f"--compare last: no earlier run of {s.name} in {out} (this one is the first)")
        return
    result = gate.compare(gate.load_summary(prev), gate.load_summary(run_dir))
    print(f"against the previous run of {s.name}: A = {prev}, B = this run")
    print(render_compare(result, str(prev), str(run_dir)))


def _execute(s, out: Path, *, compare, reference, live, label=None, tier="cluster", allow_unknown=False,
             baseline="none", record=False, gate_spec=None, emit=lambda summary: None) -> int:
    from diloco_chaos.harness.judging.report_text import print_summary
    from diloco_chaos.harness.run.result import stamped_dir, with_mode

    s, note = judged_expect(s, reference)
    if record and reference == "none" and (s.faults or s.failure_process is not None):
        raise UserError("--record-baseline records the fault-free reference run: leave --reference auto")
    run_scenario = runner(tier)
    ref = reference_run(s, out, live, tier, beside=True) if reference == "auto" else None
    run_dir = stamped_dir(out, label or s.name)
    print(f"running {s.name} (seed {s.seed}, {len(s.schedule().faults)} faults, tier {tier}) in {run_dir}")
    if note:
        print(note)
    try:
        result = run_scenario(s, out, run_dir=run_dir, live=live, reference=ref)
    finally:
        if isinstance(ref, _SimReference):
            ref.close()
    ref = ref.ref_dir if isinstance(ref, _SimReference) else ref
    summary = result.summary
    if record:
        _record_baseline(s, tier, ref if ref is not None else run_dir)
    if baseline == "stored":
        summary = with_baseline(summary, s, tier, run_dir)
    elif isinstance(baseline, dict):
        summary = with_gate(summary, baseline, gate_spec, run_dir)
    if compare == "dp":
        dp_dir = run_dir / "dp"
        dp_dir.mkdir()
        print(f"running {s.name} under data-parallel, same fault draw, in {dp_dir}")
        summary["dp"] = run_scenario(with_mode(s, "dp"), out, run_dir=dp_dir, live=live, reference=ref,
                                     expect=False).summary
        render(dp_dir)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    render(run_dir)  # with the DP run beside it, if there is one
    print_summary(summary)
    if compare == "last":
        _compare_last(s, out, run_dir)
    print(f"results: {run_dir}  (events.jsonl, summary.json)")
    report = run_dir / "report.html"
    print(f"report: {report}" if report.exists() else f"report: not written, see {run_dir / 'report_error.txt'}")
    code = exit_code(summary, allow_unknown)
    ci_output.publish(summary, run_dir, scenario=s.name, tier=tier, code=code)
    emit({**summary, "run_dir": str(run_dir), "exit_code": code})
    return code


def with_gate(summary: dict, baseline: dict, spec: str, run_dir: Path) -> dict:
    """The summary with `gate`: each --fail-on rule against the baseline run (harness/judging/gate.py);
    a rule that fails makes the run not valid (exit 1). summary.json rewritten."""
    from diloco_chaos.harness.judging import gate

    rows = gate.run_gate(summary, baseline, spec)
    summary["gate"] = rows
    print("\n".join(gate.report_lines(rows, spec=spec)))
    if not gate.gate_held(rows):
        summary["valid"] = False
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return summary


def render(run_dir: Path) -> Path | None:
    """The run's HTML report; a page that fails to draw never loses the run (the error
    goes to run_dir/report_error.txt)."""
    try:
        from diloco_chaos.reports import render_run

        return render_run(run_dir)
    except Exception as e:
        (run_dir / "report_error.txt").write_text(repr(e))
        return None
