"""The CLI never answers with a traceback: 500 generated argument lists and 500 generated
scenario files, each ending with exit 0, 1 or 2 and no Python traceback (issue 55).

Argument lists are drawn from the parser's own vocabulary (every command's options) and a
pool of values a person might type, right or wrong: built-in names, missing files, a valid
and a broken scenario file, numbers, units, `=`, `--`, unicode. Commands that would start
work (`run`, `replay`, `demo`, `bench`, `fleet`) are drawn with `--dry-run` or `--help`
only where they start something, and `setup`/`toxiproxy` (which install or serve) are not
drawn. Scenario files are TOML drawn over the scenario format's keys (its JSON schema)
with values of every type, checked with `check` and with `run --dry-run`. Each example runs
`diloco_chaos.cli.main` in this process, in a fresh folder."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diloco_chaos import cli

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "docs" / "reference" / "scenario.schema.json").read_text())
SAFE = ("run", "check", "compare", "scenarios", "faults", "planted", "runs", "report", "replay", "init")
STARTS_WORK = {"run": "--dry-run", "replay": "--help", "init": None}
FUZZ = settings(max_examples=500, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _options() -> dict[str, list[str]]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return {name: sorted(k for k in p._option_string_actions if k.startswith("--"))
            for name, p in sub.choices.items() if name in SAFE}


OPTIONS = _options()
VALUES = ["unit-loss", "syncer-crash", "nope", "good.toml", "bad.toml", "missing.toml", ".", "runs", "-", "--",
          "=", "", "0", "-3", "1e999", "nan", "3pts", "goodput:-3", "goodput:-3pts", "goodput:+5%", "loss:0.1",
          "sim", "cluster", "docker", "local", "dp", "last", "none", "stored", "auto", "*", "Θ[p]", "a,b",
          "faults_applied", "x" * 300, "--tier=sim", "--seed=1", "--json"]
GOOD = 'name = "fuzz"\nseed = 1\n[cluster]\nlearners = 2\n[train]\nsteps = 20\nduration = "10s"\n[[faults]]\nkind = "kill_unit"\n' \
       'target = "learner-1"\nat = "2s"\ndown_for = "1s"\n'


@st.composite
def argv(draw) -> list[str]:
    command = draw(st.sampled_from(sorted(OPTIONS)))
    tokens = draw(st.lists(st.one_of(st.sampled_from(OPTIONS[command] or ["--help"]), st.sampled_from(VALUES),
                                     st.text(max_size=8)), max_size=6))
    extra = STARTS_WORK.get(command, "")
    if extra:
        tokens.insert(draw(st.integers(0, len(tokens))), extra)
    if command == "init":  # writes a project: only into a folder of this example's own
        tokens = [t for t in tokens if t not in ("--force",)] + ["proj"]
    return [command, *tokens]


def _main(args: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(args)
        except SystemExit as e:  # argparse: --help (0) and bad usage (2)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    return code, out.getvalue() + err.getvalue()


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.toml").write_text(GOOD)
    (tmp_path / "bad.toml").write_text("[cluster\nlearners = ")
    return tmp_path


def test_generated_argument_lists_end_in_an_exit_code_never_a_traceback(folder):
    seen = {0: 0, 1: 0, 2: 0}

    @FUZZ
    @given(argv())
    def prop(args):
        code, text = _main(args)
        assert code in (0, 1, 2), (args, code, text[-2000:])
        assert "Traceback" not in text, (args, text[-2000:])
        seen[code] += 1

    prop()
    assert seen[0] and seen[2], seen  # both the happy and the refused paths were reached


# --- scenario files --------------------------------------------------------------------------------------
def _keys(table: str) -> list[str]:
    return sorted((SCHEMA["properties"][table].get("properties") or {}))


SCALARS = st.one_of(st.integers(-5, 10_000), st.floats(allow_nan=False, width=32), st.booleans(),
                    st.sampled_from(["", "10s", "500ms", "2m", "-1s", "learner-0", "learner-9", "syncer-0",
                                     "link:learner-0", "decoupled", "dp", "markov", "fp32", "int4", "x", "Θ"]),
                    st.text(max_size=6))
VALUE = st.one_of(SCALARS, st.lists(SCALARS, max_size=3))
KINDS = [item["properties"]["kind"]["const"] for item in SCHEMA["properties"]["faults"]["items"]["oneOf"]]
FAULT_KEYS = sorted({k for item in SCHEMA["properties"]["faults"]["items"]["oneOf"] for k in item["properties"]})


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if v == v and abs(v) != float("inf") else "0"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(v, ensure_ascii=False)  # a TOML basic string


VALID = [GOOD, GOOD.replace("seed = 1", "seed = 7"), GOOD + "[expect]\ngoodput_min = 0.5\n",
         GOOD.replace('kind = "kill_unit"\ntarget = "learner-1"\nat = "2s"\ndown_for = "1s"',
                      'kind = "partition"\ntarget = "link:learner-0"\nat = "2s"\nduration = "1s"'),
         'name = "drawn"\nseed = 2\n[train]\nmode = "dp"\nsteps = 10\nduration = "5s"\n']


@st.composite
def scenario_text(draw) -> str:
    if draw(st.integers(0, 3)) == 0:  # a valid file now and then: the happy path is fuzzed too
        return draw(st.sampled_from(VALID))
    lines = []
    for key in draw(st.lists(st.sampled_from(["name", "seed", "description"]), max_size=2, unique=True)):
        lines.append(f"{key} = {_toml_value(draw(VALUE))}")
    for table in draw(st.lists(st.sampled_from(["cluster", "train", "wan", "expect", "failure_process", "task",
                                                "bogus"]), max_size=4, unique=True)):
        lines.append(f"[{table}]")
        keys = _keys(table) if table in SCHEMA["properties"] and table != "task" else ["x", "learners"]
        for key in draw(st.lists(st.sampled_from(keys + ["typo_key"]), max_size=4, unique=True)):
            lines.append(f"{key} = {_toml_value(draw(VALUE))}")
    for _ in range(draw(st.integers(0, 2))):
        lines.append("[[faults]]")
        lines.append(f"kind = {_toml_value(draw(st.sampled_from(KINDS + ['nope'])))}")
        for key in draw(st.lists(st.sampled_from(FAULT_KEYS), max_size=4, unique=True)):
            if key != "kind":
                lines.append(f"{key} = {_toml_value(draw(VALUE))}")
    return "\n".join(lines) + "\n"


def test_generated_scenario_files_end_in_an_exit_code_never_a_traceback(folder):
    seen = {0: 0, 1: 0, 2: 0}

    @FUZZ
    @given(scenario_text(), st.booleans())
    def prop(text, as_run):
        path = folder / "drawn.toml"
        path.write_text(text, encoding="utf-8")
        args = ["run", str(path), "--tier", "sim", "--dry-run"] if as_run else ["check", str(path)]
        code, out = _main(args)
        assert code in (0, 2), (text, args, code, out[-2000:])
        assert "Traceback" not in out, (text, out[-2000:])
        seen[code] += 1

    prop()
    assert seen[0] and seen[2], seen
