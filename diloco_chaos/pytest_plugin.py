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


@dataclass(frozen=True)
class ChaosResult:
    """A judged run: `summary` is the run's summary.json (metrics, `checks`, `valid`)."""

    run_dir: Path
    summary: dict

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

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir

    def run(self, scenario, *, seed: int | None = None, tier: str = "sim", reference: Path | str | None = "auto"
            ) -> ChaosResult:
        """`reference`: "auto" (the fault-free run, made when [expect] asks for parity),
        a run directory to compare with, or None (no reference: parity is not judged)."""
        from diloco_chaos.harness.scenarios.scenario import Scenario, load_scenario

        if tier not in TIERS:
            raise ValueError(f"chaos.run(tier={tier!r}) is not valid; valid: {', '.join(map(repr, TIERS))}")
        s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        if seed is not None:
            s = dataclasses.replace(s, seed=seed)
        if reference == "auto":
            from diloco_chaos.run_cmd import judged_expect, _reference

            s, _ = judged_expect(s, "auto")
            reference = _reference(s, self.out_dir, False, tier) if s.expect.loss_parity_max is not None else None
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

        summary = with_baseline(result.summary, s, tier, Path(result.run_dir))  # where one is stored
        return ChaosResult(Path(result.run_dir), summary)

    def assert_held(self, result: ChaosResult, *, allow_unknown=False) -> None:
        """Fails the test, with the check table, when a check failed, or ended UNKNOWN (the
        run could not judge it: e.g. a recovery bound in a run whose restart never came).
        UNKNOWN is not a pass; `allow_unknown=True` (any) or a tuple of check names is the
        explicit opt-out."""
        from diloco_chaos.harness.judging.judge import held, unknown_checks
        from diloco_chaos.harness.judging.report_text import check_lines

        if held(result.summary, allow_unknown=allow_unknown):
            return
        unknown = unknown_checks(result.summary)
        why = "" if result.failed_checks else (f" (UNKNOWN is not a pass: {', '.join(unknown)} could not be "
                                               f"judged; allow_unknown=... accepts it)")
        pytest.fail(f"the run did not hold{why} ({result.run_dir}):\n" + "\n".join(check_lines(result.summary)),
                    pytrace=False)


@pytest.fixture
def chaos(tmp_path: Path) -> Chaos:
    return Chaos(tmp_path / "chaos-runs")
