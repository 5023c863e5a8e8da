"""The `chaos` fixture: a fault scenario as a test in a user's own pytest suite.

    def test_my_training_survives_kills(chaos):
        result = chaos.run("scenarios/my-kills.toml", seed=3, tier="sim")
        chaos.assert_held(result)           # fails with the check table
        assert result.goodput > 0.8

`chaos.run` takes a scenario file, a built-in's name or a `Scenario`, runs it in the
simulator (`tier="sim"`) or on real processes (`tier="cluster"`), under the test's
tmp_path, and returns a `ChaosResult` (the summary: metrics, checks, verdict, run dir).
When the scenario's [expect] asks for `loss_parity_max`, it first makes the fault-free
reference run (same config, seed and tier; reused within the test), so parity is judged.
`chaos.assert_held` fails on a failed check and on one that ended UNKNOWN (the run
could not judge it: it did not test what it was asked to); `allow_unknown=("name", ...)`
or `allow_unknown=True` is the explicit opt-out.

Options (group "chaos"):
  --chaos-tier {sim,cluster}  the tier `chaos.run` uses when the test passes no `tier=`
                              (default sim)
  --chaos-baseline DIR        gate every run against a stored one: DIR holds a run directory
                              per scenario name (DIR/NAME/summary.json), or is itself one run
                              directory; `chaos.assert_held` then also fails when a
                              --chaos-fail-on rule fails (a scenario with no stored run fails:
                              a gate that cannot judge is not a pass)
  --chaos-fail-on SPEC        the gate's rules (default goodput:-3pts; harness/judging/gate.py):
                              e.g. goodput:-3pts,final_loss:+2%,recovery:+5s
`chaos.assert_held(result, baseline=PATH, fail_on=SPEC)` gates one run explicitly, and
`chaos.gate(result, ...)` returns the gate's rows without failing.

Marker (registered by this plugin: no ini entry needed): `@pytest.mark.chaos(tier=...,
baseline=..., fail_on=...)` sets a test's defaults for the above (an argument to
`chaos.run` / `assert_held` wins over the marker, the marker over the command line; a
relative marker baseline is taken from the rootdir, --chaos-baseline from where pytest
was started).
Every test that uses the `chaos` fixture is marked `chaos`, so `-m chaos` / `-m "not
chaos"` selects the fault-scenario tests.

Every run is recorded for `--chaos-report DIR` and the JUnit figures by
reports/pytest_plugin.py, which this plugin loads. Installed with the package, both load
through the `pytest11` entry point: no conftest in the user's repository.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["diloco_chaos.reports.pytest_plugin"]
TIERS = ("sim", "cluster")
MARKER = ("chaos(tier=None, baseline=None, fail_on=None): a test that runs fault scenarios through the `chaos` "
          "fixture (added to every test using it); tier= (sim|cluster) is its default tier for chaos.run, "
          "baseline=PATH and fail_on=SPEC its baseline gate in chaos.assert_held")
_OPTIONS = pytest.StashKey[dict]()
_RUNS = pytest.StashKey[list]()  # one row per chaos.run of the session, for the terminal summary


def pytest_addoption(parser: pytest.Parser) -> None:
    from diloco_chaos.harness.judging.gate import DEFAULT_FAIL_ON

    g = parser.getgroup("chaos")
    g.addoption("--chaos-tier", dest="chaos_tier", choices=TIERS, default=None,
                help="the tier chaos.run uses when a test passes no tier= (default: sim)")
    g.addoption("--chaos-baseline", dest="chaos_baseline", metavar="DIR", default=None,
                help="gate each run in chaos.assert_held against the stored run of the same scenario: "
                     "DIR/NAME/summary.json (or DIR is itself a run directory); see --chaos-fail-on")
    g.addoption("--chaos-fail-on", dest="chaos_fail_on", metavar="SPEC", default=None,
                help=f"the baseline gate's rules (default {DEFAULT_FAIL_ON}): FIGURE:±LIMIT[,...], e.g. "
                     "goodput:-3pts,final_loss:+2%%,recovery:+5s; the sign is the way that fails; units pts "
                     "(percentage points), %% (relative; points for goodput, uptime, parity), s, or none")


def pytest_configure(config: pytest.Config) -> None:
    from diloco_chaos.harness.judging.gate import parse_fail_on
    from diloco_chaos.harness.errors import UserError

    config.addinivalue_line("markers", MARKER)
    spec = config.getoption("chaos_fail_on", None)
    if spec is not None:
        try:
            parse_fail_on(spec)
        except UserError as e:
            raise pytest.UsageError(str(e)) from None
    base = config.getoption("chaos_baseline", None)
    if base is not None:
        base = Path(config.invocation_params.dir, base).resolve()
        if not base.exists():
            raise pytest.UsageError(f"--chaos-baseline {base}: no such directory (stored runs: DIR/NAME/summary.json)")
    config.stash[_OPTIONS] = {"tier": config.getoption("chaos_tier", None), "baseline": base, "fail_on": spec}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    for item in items:  # -m chaos selects the tests that run fault scenarios
        if "chaos" in getattr(item, "fixturenames", ()) and item.get_closest_marker("chaos") is None:
            item.add_marker("chaos")


@dataclass(frozen=True)
class ChaosResult:
    """A judged run: `summary` is the run's summary.json (metrics, `checks`, `valid`)."""

    run_dir: Path
    summary: dict
    scenario_name: str | None = None  # the scenario's name: the run a --chaos-baseline DIR holds for it

    def __getattr__(self, key: str) -> Any:  # result.goodput, result.final_loss, result.valid, ...
        if key.startswith("_") or key == "summary":  # copy/pickle probe before `summary` exists
            raise AttributeError(key)
        try:
            return self.summary[key]
        except KeyError:
            raise AttributeError(f"no figure {key!r} in the summary; figures: {', '.join(sorted(self.summary))}") from None

    @property
    def failed_checks(self) -> list[dict]:
        return [c for c in self.summary.get("checks", []) if c.get("valid") is False]


class Chaos:
    """What the `chaos` fixture hands out."""

    def __init__(self, out_dir: Path, *, tier: str | None = None, baseline: Path | str | None = None,
                 fail_on: str | None = None, record=None):
        self.out_dir = out_dir
        self.record = record      # called with each run's row (the session's terminal summary)
        self.tier = tier          # chaos.run's default tier (marker, else --chaos-tier; None: sim)
        self.baseline = baseline  # the gate's baseline (marker, else --chaos-baseline; None: no gate)
        self.fail_on = fail_on    # the gate's rules (marker, else --chaos-fail-on; None: gate.DEFAULT_FAIL_ON)

    def run(self, scenario, *, seed: int | None = None, tier: str | None = None,
            reference: Path | str | None = "auto") -> ChaosResult:
        """`tier`: "sim" or "cluster"; None: the test's `chaos(tier=)` marker, else
        `--chaos-tier`, else "sim". `reference`: "auto" (the fault-free run, made when
        [expect] asks for parity), a run directory to compare with, or None (no
        reference: parity is not judged)."""
        from diloco_chaos.harness.scenarios.scenario import Scenario, load_scenario

        tier = tier if tier is not None else (self.tier or "sim")
        if tier not in TIERS:
            raise ValueError(f"chaos.run(tier={tier!r}) is not valid; valid: {', '.join(map(repr, TIERS))}")
        s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        if seed is not None:
            s = dataclasses.replace(s, seed=seed)
        if reference == "auto":
            from diloco_chaos.run_cmd import judged_expect, reference_run

            s, _ = judged_expect(s, "auto")
            reference = reference_run(s, self.out_dir, False, tier) if s.expect.loss_parity_max is not None else None
        elif reference is None:
            from diloco_chaos.run_cmd import judged_expect

            s, _ = judged_expect(s, "none")
        if tier == "sim":
            from diloco_chaos.harness.sim.run import run_sim

            result = run_sim(s, self.out_dir, reference=reference)
        else:
            from diloco_chaos.harness.backends.runner import run_scenario

            result = run_scenario(s, self.out_dir, live=False, reference=reference)
        from diloco_chaos.run_cmd import with_baseline

        from diloco_chaos.harness.judging.envelopes import store_for
        from diloco_chaos.harness.scenarios.scenario import locate

        store = None if isinstance(scenario, Scenario) else store_for(locate(scenario)[0])  # beside its file
        summary = with_baseline(result.summary, s, tier, Path(result.run_dir), store)  # where one is stored
        if self.record is not None:
            from diloco_chaos.runs_cmd import verdict

            self.record({"scenario": s.name, "tier": tier, "verdict": verdict(summary), "goodput": summary.get("goodput"),
                         "loss_parity": summary.get("loss_parity"), "run_dir": str(result.run_dir)})
        return ChaosResult(Path(result.run_dir), summary, s.name)

    def baseline_for(self, result: ChaosResult, baseline: Path | str | None = None) -> Path | None:
        """The stored run `result` is gated against: `baseline`, else the test's marker's,
        else --chaos-baseline; a directory holding summary.json (or a summary.json file) is
        that run, any other directory holds one run per scenario name (DIR/NAME). None: no
        gate was asked for."""
        base = baseline if baseline is not None else self.baseline
        if base is None:
            return None
        base = Path(base)
        if base.is_file() or (base / "summary.json").exists():
            return base
        name = result.scenario_name or _scenario_name(result.run_dir)
        return base / name

    def gate(self, result: ChaosResult, *, baseline: Path | str | None = None, fail_on: str | None = None
             ) -> list[dict]:
        """The baseline gate's rows (harness/judging/gate.py `evaluate`) for `result`: [] when
        no baseline was asked for (argument, marker or --chaos-baseline). Fails the test
        when the SPEC is bad or the baseline run is not there."""
        from diloco_chaos.harness.judging import gate
        from diloco_chaos.harness.errors import UserError

        path = self.baseline_for(result, baseline)
        if path is None:
            return []
        spec = fail_on if fail_on is not None else (self.fail_on or gate.DEFAULT_FAIL_ON)
        try:
            rules = gate.parse_fail_on(spec)
            base = gate.load_summary(path)
        except UserError as e:
            error = str(e)
        else:
            return gate.evaluate(result.summary, base, rules)
        name = result.scenario_name or _scenario_name(result.run_dir)
        pytest.fail(f"the baseline gate cannot judge scenario {name!r} (a gate that cannot judge is not a pass): "
                    f"{error}", pytrace=False)

    def assert_held(self, result: ChaosResult, *, allow_unknown=False, baseline: Path | str | None = None,
                    fail_on: str | None = None) -> None:
        """Fails the test, with the check table, when a check failed, or ended UNKNOWN (the
        run could not judge it: e.g. a recovery bound in a run whose restart never came).
        UNKNOWN is not a pass; `allow_unknown=True` (any) or a tuple of check names is the
        explicit opt-out.

        With a baseline (`baseline=PATH`, the test's `chaos(baseline=)` marker or
        `--chaos-baseline DIR`) it also fails, with the gate's lines, when the run fell
        behind the stored run by more than a `fail_on` rule allows (`fail_on=SPEC`, the
        marker's, `--chaos-fail-on`, else goodput:-3pts; harness/judging/gate.py)."""
        from diloco_chaos.harness.judging.gate import gate_held
        from diloco_chaos.harness.judging.judge import held, unknown_checks
        from diloco_chaos.harness.judging.report_text import check_lines

        parts = []
        if not held(result.summary, allow_unknown=allow_unknown):
            unknown = unknown_checks(result.summary)
            why = "" if result.failed_checks else (f" (UNKNOWN is not a pass: {', '.join(unknown)} could not be "
                                                   f"judged; allow_unknown=... accepts it)")
            parts.append(f"the run did not PASS{why} ({result.run_dir}):\n" + "\n".join(check_lines(result.summary)))
        rows = self.gate(result, baseline=baseline, fail_on=fail_on)
        if rows and not gate_held(rows):
            path = self.baseline_for(result, baseline)
            parts.append(f"the run fell behind its baseline ({path}; "
                         f"fail_on {', '.join(r['rule'] for r in rows)}):\n" + "\n".join(f"  {r['line']}" for r in rows))
        if parts:
            pytest.fail("\n\n".join(parts), pytrace=False)


def _scenario_name(run_dir: Path) -> str:
    """A run directory's scenario name (its scenario.toml's `name`), else the directory's."""
    try:
        import tomllib

        return tomllib.loads((Path(run_dir) / "scenario.toml").read_text()).get("name") or Path(run_dir).name
    except (OSError, ValueError):
        return Path(run_dir).name


@pytest.fixture
def chaos(tmp_path: Path, request: pytest.FixtureRequest) -> Chaos:
    opts = request.config.stash.get(_OPTIONS, {})
    mark = request.node.get_closest_marker("chaos")
    kw = dict(mark.kwargs) if mark is not None else {}
    unknown = set(kw) - {"tier", "baseline", "fail_on"}
    if unknown or (mark is not None and mark.args):
        pytest.fail(f"@pytest.mark.chaos takes tier=, baseline=, fail_on= only "
                    f"(got {', '.join(sorted(unknown)) or repr(mark.args)})", pytrace=False)
    if kw.get("tier") is not None and kw["tier"] not in TIERS:
        pytest.fail(f"@pytest.mark.chaos(tier={kw['tier']!r}) is not valid; valid: {', '.join(map(repr, TIERS))}",
                    pytrace=False)
    baseline = kw.get("baseline")
    if baseline is not None:
        baseline = Path(request.config.rootpath, baseline)  # relative to the rootdir
    runs = request.config.stash.setdefault(_RUNS, [])
    return Chaos(tmp_path / "chaos-runs", tier=kw.get("tier") or opts.get("tier"),
                 baseline=baseline if baseline is not None else opts.get("baseline"),
                 fail_on=kw.get("fail_on") or opts.get("fail_on"),
                 record=lambda row: runs.append({"test": request.node.nodeid, **row}))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """One line per chaos run of the session: its verdict, scenario and tier, goodput, loss
    parity, its test and its folder (`diloco-chaos report FOLDER` draws its page)."""
    runs = config.stash.get(_RUNS, [])
    if not runs:
        return
    terminalreporter.section(f"chaos runs ({len(runs)})")
    for r in runs:
        goodput = "-" if r["goodput"] is None else f"{100 * r['goodput']:.1f} %"
        parity = "-" if r["loss_parity"] is None else f"{100 * r['loss_parity']:+.2f} %"
        terminalreporter.write_line(f"{r['verdict']:7s} {r['scenario']} ({r['tier']}) goodput {goodput}, "
                                    f"parity {parity}  {r['test']}  {r['run_dir']}")
