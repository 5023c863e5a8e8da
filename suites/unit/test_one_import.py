"""One way to import (docs/ARCHITECTURE.md, "Layout and import direction"): the venv's
Python resolves the project only as the installed package `diloco_chaos`. From a folder
outside the checkout, the design's folders are no top-level modules of their own (a bare
`import trainer` would load a second copy of every module: two fault-kind registries),
and the package holds nothing of the checkout beyond the folders pyproject.toml maps
under it (no `diloco_chaos.conftest`, `.suites`, `.docs`). The test process itself may
have the repository on sys.path (pytest's rootdir conftest): the question is the venv's."""
from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import importlib, json
out = {}
for name in ("trainer", "harness", "faults", "reports", "examples",
             "diloco_chaos.conftest", "diloco_chaos.suites", "diloco_chaos.docs",
             "diloco_chaos.trainer.units.learner", "diloco_chaos.faults.kinds"):
    try:
        importlib.import_module(name)
        out[name] = "imported"
    except ModuleNotFoundError as e:
        out[name] = f"ModuleNotFoundError: {e.name}"
print(json.dumps(out))
"""


def test_only_the_installed_package_imports_from_a_neutral_folder(tmp_path):
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("trainer", "harness", "faults", "reports", "examples"):
        assert got[name] == f"ModuleNotFoundError: {name}", (name, got[name])
    for name in ("diloco_chaos.conftest", "diloco_chaos.suites", "diloco_chaos.docs"):
        assert got[name].startswith("ModuleNotFoundError"), (name, got[name])
    assert got["diloco_chaos.trainer.units.learner"] == "imported" and got["diloco_chaos.faults.kinds"] == "imported", got
