"""Ctrl-C in the middle of `diloco-chaos run`: no process and no proxy outlives it."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diloco_chaos.harness.backends.procs import pid_alive

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SCENARIO = """
name = "interrupted"
seed = 3
[cluster]
learners = 2
[train]
task = "markov"
steps = 400
duration = "60s"
[[faults]]
kind = "pause_unit"
target = "learner-1"
at = "1s"
duration = "50s"
[[faults]]
kind = "partition"
target = "link:learner-0"
at = "1s"
duration = "50s"
"""


def _pids(run_dir: Path) -> list[int]:
    pids = []
    for f in (run_dir / "logs").glob("*.jsonl"):
        pids += [json.loads(line)["pid"] for line in f.read_text().splitlines()
                 if '"unit_up"' in line and '"pid"' in line]
    return pids


def _sigint_default():
    """A Ctrl-C reaches the child even when this test runs in a background job (which
    starts with SIGINT ignored, inherited by its children)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["sigint", "sigterm"])
def test_sigint_midway_leaves_nothing_behind(tmp_path, sig, code):
    """Ctrl-C, or SIGTERM (how a CI runner cancels a job), in the middle of a run."""
    scenario = tmp_path / "interrupted.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "runs"
    cli = subprocess.Popen([sys.executable, "-m", "diloco_chaos", "run", str(scenario), "--out", str(out),
                            "--reference", "none", "--no-live"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           preexec_fn=_sigint_default)
    run_dir = out / "latest"  # the run directory is interrupted-<UTC time>; latest points at it
    try:
        deadline = time.monotonic() + 90  # a give-up timeout, not the property (~5 s idle)
        # wait until both learners and the syncer are up, and the faults are on
        while len(_pids(run_dir)) < 3 if run_dir.exists() else True:
            assert time.monotonic() < deadline, "the run never started"
            assert cli.poll() is None, cli.stdout.read().decode()
            time.sleep(0.2)
        time.sleep(3)
        run = json.loads((run_dir / "run.json").read_text())
        pids = _pids(run_dir) + [run["toxiproxy"]["pid"]]
        assert all(pid_alive(p) for p in pids)
        cli.send_signal(sig)
        assert cli.wait(timeout=60) == code
    finally:
        cli.kill()
    assert not [p for p in pids if pid_alive(p)], "processes left behind"
    # the server (and every proxy on it) is gone: its API port refuses connections
    import requests

    with pytest.raises(requests.ConnectionError):
        requests.get(run["toxiproxy"]["url"] + "/proxies", timeout=2)
    # what happened before the interrupt is kept
    header = json.loads((run_dir / "events.jsonl").read_text().splitlines()[0])
    assert header["interrupted"] is True
