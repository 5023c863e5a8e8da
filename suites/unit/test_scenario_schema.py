"""The JSON Schema of scenario files (diloco_chaos/schema.py, published as
docs/reference/scenario.schema.json): a valid Draft 2020-12 schema that accepts every
built-in scenario and the one `init` scaffolds, and rejects every malformed file of
suites/unit/test_scenario.py whose fault is structural (an unknown or missing key, a wrong
type, a value not among the choices, a duration or bandwidth it cannot read). What needs
the run's numbers (ranges, a quorum above the learners, clashing faults) stays `check`'s:
those are counted, not required."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest
from test_scenario import MALFORMED

from diloco_chaos.schema import scenario_schema

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = sorted((ROOT / "harness" / "scenarios" / "builtin").glob("*.toml"))
STRUCTURAL = ("unknown key", "missing (required)", "expected ", "not one of the choices", "cannot read",
              "unknown fault kind", "cannot target", "cannot name a run directory")


@pytest.fixture(scope="module")
def validator():
    schema = json.loads((ROOT / "docs" / "reference" / "scenario.schema.json").read_text())
    assert schema == scenario_schema()  # the published file is the generated one
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", BUILTIN, ids=[p.stem for p in BUILTIN])
def test_every_builtin_scenario_validates(validator, path):
    errors = [e.message for e in validator.iter_errors(tomllib.loads(path.read_text()))]
    assert not errors, errors[:3]


def test_the_scaffolded_and_the_example_scenarios_validate(validator, tmp_path):
    from diloco_chaos.cli import main

    assert main(["init", str(tmp_path / "p")]) == 0
    for path in [*(tmp_path / "p").glob("*.toml"), Path(__file__).parent / "data" / "user-kill.toml"]:
        errors = [e.message for e in validator.iter_errors(tomllib.loads(path.read_text()))]
        assert not errors, (path.name, errors[:3])


def test_it_rejects_every_structurally_malformed_file(validator):
    structural, rejected = 0, 0
    for text, message in MALFORMED:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            continue  # a syntax error: no document to validate
        bad = any(validator.iter_errors(data))
        rejected += bad
        if any(word in message for word in STRUCTURAL):
            structural += 1
            assert bad, message
    assert structural >= 35 and rejected >= structural, (structural, rejected, len(MALFORMED))
