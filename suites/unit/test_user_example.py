"""A user's own test file, as in the README ("Your own tests"): the `chaos` fixture runs a
scenario, `assert_held` fails with the check table when a check does not hold, and the
figures are plain attributes. Copied verbatim by test_chaos_fixture.py into a directory
with no conftest, where the installed plugin must provide the fixture by itself."""
from pathlib import Path

SCENARIO = Path(__file__).parent / "data" / "user-kill.toml"


def test_training_survives_a_learner_kill(chaos):
    result = chaos.run(SCENARIO, seed=3, tier="sim")
    chaos.assert_held(result)  # every check held, and the scenario's [expect] table
    assert result.restarts == 1 and result.goodput > 0.5
