"""The import direction of docs/ARCHITECTURE.md, read from the source (every import, at
any depth, lazy ones included): trainer/ imports nothing of the others; faults/ nothing
of trainer/, harness/, reports/; harness/ never reports/ (the CLI, diloco_chaos/, is the
one layer above both); nothing imports diloco_chaos/; inside harness/, its rooms import
one way (ROOM_MAY_NOT)."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# diloco_chaos.<folder> installed: pyproject.toml's package-dir, the one list of the folders
FOLDERS = tuple(sorted(folder for name, folder in tomllib.loads((ROOT / "pyproject.toml").read_text())
                       ["tool"]["setuptools"]["package-dir"].items() if name != "diloco_chaos"))
PACKAGES = ("trainer", "faults", "harness", "reports", "diloco_chaos")
MAY_NOT = {"trainer": {"faults", "harness", "reports", "diloco_chaos"},
           "faults": {"trainer", "harness", "reports", "diloco_chaos"},
           "harness": {"reports", "diloco_chaos"},
           "reports": {"diloco_chaos"}}


def top_of(module: str) -> str:
    """The repository folder a module name lives in: the installed package maps the design's
    folders under one import name (`diloco_chaos.trainer` is trainer/), and the CLI's own
    modules (`diloco_chaos.cli`) are diloco_chaos/."""
    parts = module.split(".")
    if parts[0] == "diloco_chaos" and len(parts) > 1 and parts[1] in FOLDERS:
        return parts[1]
    return parts[0]


def imported_packages(source: str) -> set[str]:
    """The repository folders (or other top-level names) a module imports (absolute
    imports), at any depth of the file."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {top_of(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(top_of(node.module))
    return names


def test_the_reader_sees_lazy_and_nested_imports():
    src = ("def f():\n    from diloco_chaos.reports import render_run\n"
           "    import diloco_chaos.harness.judging.checks\n    from diloco_chaos.cli import main\n")
    assert imported_packages(src) == {"reports", "harness", "diloco_chaos"}


@pytest.mark.parametrize("package", sorted(MAY_NOT))
def test_the_import_direction_holds(package):
    wrong = {}
    for path in sorted((ROOT / package).glob("**/*.py")):
        bad = imported_packages(path.read_text()) & MAY_NOT[package]
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert not wrong, f"imports against the direction in docs/ARCHITECTURE.md: {wrong}"


# The rooms of harness/ (docs/ARCHITECTURE.md): what each may not import. harness/'s
# basics (its top-level modules: errors, units, links, eventlog, progress) import none.
ROOMS = ("scenarios", "judging", "run", "backends", "sim", "bench", "fleet")
ROOM_MAY_NOT = {"basics": set(ROOMS),
                "scenarios": set(ROOMS) - {"scenarios"},
                "judging": set(ROOMS) - {"judging"},  # judging imports nothing of the runners
                "fleet": set(ROOMS) - {"fleet"},      # the fleet model stands apart
                "run": {"backends", "sim", "bench", "fleet"},  # what both tiers share knows neither
                "backends": {"sim", "bench", "fleet"},
                "sim": {"backends", "bench", "fleet"},  # the tiers are siblings: each imports run/
                "bench": set()}  # bench prices scenarios with the fleet model (fidelity's third tier)


def imported_rooms(source: str) -> set[str]:
    """The rooms of harness/ a module imports (`harness.ROOM...` or `from harness import ROOM`)."""
    rooms = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        mods = [m.removeprefix("diloco_chaos.") for m in mods]
        rooms |= {m.split(".")[1] for m in mods if m.startswith("harness.") and m.split(".")[1] in ROOMS}
    return rooms


def room_of(path: Path) -> str:
    rel = path.relative_to(ROOT / "harness")
    return rel.parts[0] if len(rel.parts) > 1 else "basics"


def test_the_room_reader_sees_each_form_of_import():
    src = ("import diloco_chaos.harness.sim.run\nfrom diloco_chaos.harness import bench\n"
           "def f():\n    from diloco_chaos.harness.judging.checks import x\n")
    assert imported_rooms(src) == {"sim", "bench", "judging"}
    # planted arrows against the direction: judging importing the run, the sim the backends
    assert imported_rooms("from diloco_chaos.harness.run.result import summarize") & ROOM_MAY_NOT["judging"]
    assert imported_rooms("from diloco_chaos.harness.backends.cluster import LocalCluster") & ROOM_MAY_NOT["sim"]


def test_every_module_of_harness_lives_in_a_known_room():
    rooms = {room_of(p) for p in (ROOT / "harness").glob("**/*.py")}
    assert rooms <= set(ROOM_MAY_NOT), rooms - set(ROOM_MAY_NOT)


def test_the_rooms_of_harness_import_one_way():
    wrong = {}
    for path in sorted((ROOT / "harness").glob("**/*.py")):
        bad = imported_rooms(path.read_text()) & ROOM_MAY_NOT[room_of(path)]
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert not wrong, f"imports between harness/'s rooms against docs/ARCHITECTURE.md: {wrong}"


def test_judging_reads_logs_and_runs_no_model():
    """judging/ judges from the event log alone: it imports neither JAX nor the checkpoints
    (the global model's evaluation is the runner's: harness/run/global_eval.py)."""
    wrong = {}
    for path in sorted((ROOT / "harness" / "judging").glob("**/*.py")):
        source = path.read_text()
        mods = {a.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom) and n.module}
        bad = {m for m in mods if m.split(".")[0] in ("jax", "orbax", "flax") or m == "diloco_chaos.trainer.numerics.checkpoint"}
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert not wrong, wrong


def test_every_package_ships_in_the_wheel():
    """pyproject.toml lists the wheel's packages by hand: a new subpackage left out installs
    nothing of it (the fresh-virtualenv fixture test finds that only minutes later)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(("diloco_chaos",) * (top != "diloco_chaos") + p.parent.relative_to(ROOT).parts)
             for top in ("diloco_chaos", *FOLDERS) for p in (ROOT / top).glob("**/__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
