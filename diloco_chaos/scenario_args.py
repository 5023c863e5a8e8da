"""A scenario named on the command line, as every command that runs or prices one opens
it (`run`, `replay`, `baseline`, `fleet --scenario`): `load` (a built-in name or a file,
its plug-in tasks beside it, the seed overridden; a UserError saying what was wrong) and
`runner`, the run function of a tier."""
from __future__ import annotations

import dataclasses

from diloco_chaos.harness.errors import UserError


def load(name_or_path: str, seed: int | None):
    """The Scenario `name_or_path` names (a built-in name or a TOML file), with `seed`
    when one is given."""
    from diloco_chaos.harness.scenarios.scenario import ScenarioError, load_scenario, locate, plugins_beside

    try:
        plugins_beside(locate(name_or_path)[0])
        s = load_scenario(name_or_path)
        return s if seed is None else dataclasses.replace(s, seed=seed)
    except (ScenarioError, ValueError, FileNotFoundError) as e:
        raise UserError(str(e)) from None


def runner(tier: str):
    """The function that runs a scenario on `tier`: the simulator's `run_sim`, or for
    "cluster" the real units' `run_scenario`."""
    if tier == "sim":
        from diloco_chaos.harness.sim.run import run_sim

        return run_sim
    from diloco_chaos.harness.backends.runner import run_scenario

    return run_scenario
