"""The run's graceful stop is judged too: a unit that fails on its SIGTERM (an error exit, e.g.
a final save that raised, so it never wrote its `done`) is a crash for `no_crash`, which
before saw only the crashes while the run went on. Real processes, real signals, the local
backend's own stop (harness/backends/processes.py `stop_all`), which sends each unit one SIGTERM."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from diloco_chaos.harness.backends import processes
from diloco_chaos.harness.backends.cluster import LocalCluster, Member

# Each unit sets its SIGTERM handling, says so in a file, then idles until stopped.
# (In this order they are reaped: learner-2 is still up when learner-0 has left, 0.3 s in.)
UNITS = {
    "learner-0": "signal.signal(signal.SIGTERM, lambda *_: leave.append(time.monotonic() + 0.3))",  # exit 0
    "learner-1": "signal.signal(signal.SIGTERM, boom)",                     # a traceback on the stop
    "learner-2": "signal.signal(signal.SIGTERM, count)",                    # counts them, leaves 0.6 s later
    "learner-3": "signal.signal(signal.SIGTERM, signal.SIG_IGN)",           # SIGKILL after its grace
    "syncer-0": "pass",                                                     # our SIGTERM, no handler
}
SCRIPT = """
import pathlib, signal, sys, time
def boom(*_):
    raise ValueError("checkpoint step 700 <= last saved step 700")
leave = []
def count(*_):
    with open(sys.argv[1] + ".sigterms", "a") as f:
        f.write("SIGTERM\\n")
    leave.append(time.monotonic() + 0.6)
{handler}
pathlib.Path(sys.argv[1]).touch()
while not leave or time.monotonic() < leave[0]:
    time.sleep(0.05)
"""


def test_an_error_exit_on_the_stop_is_a_crash_and_our_signals_are_not(tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "GRACE_S", {"learner": 2.0, "syncer": 2.0})
    cluster = LocalCluster(run_dir=tmp_path, config={})
    (tmp_path / "stdout").mkdir()
    for name, handler in UNITS.items():
        m = cluster.members[name] = Member(name, "syncer" if name.startswith("syncer") else "learner", incarnation=0)
        with open(tmp_path / "stdout" / f"{name}.0.log", "w") as out:
            m.proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(handler=handler), str(tmp_path / name)],
                                      stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30  # a give-up timeout, not the property
    while not all((tmp_path / n).exists() for n in UNITS):
        assert time.monotonic() < deadline, "the units never set their handlers"
        time.sleep(0.05)
    procs = {n: m.proc for n, m in cluster.members.items()}
    try:
        cluster.units.stop_all(cluster)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    assert {n: p.returncode for n, p in procs.items()} == {"learner-0": 0, "learner-1": 1, "learner-2": 0,
                                                          "learner-3": -9, "syncer-0": -15}
    # one SIGTERM each: a second, sent as each was reaped, once read learner-1's exit 1 as -15
    assert (tmp_path / "learner-2.sigterms").read_text() == "SIGTERM\n"
    [error] = cluster.stop_errors
    assert error["unit"] == "learner-1" and error["rc"] == 1 and error["at"] == "stop"
    assert "ValueError: checkpoint step 700 <= last saved step 700" in error["stdout_tail"]
    assert cluster.stop_kills == [{"unit": "learner-3", "incarnation": 0, "grace_s": 2.0}]  # a note, not a crash


@pytest.mark.parametrize("rc, error, killed", [(0, False, False), (1, True, False), (2, True, False),
                                               (137, False, True), (-9, False, True), (None, False, True),
                                               (143, False, False), (-15, False, False)])
def test_which_exit_codes_are_the_units_own_errors_and_which_our_sigkill(tmp_path, rc, error, killed):
    cluster = LocalCluster(run_dir=tmp_path, config={})
    cluster.record_stop(Member("learner-0", "learner", incarnation=2), rc, grace_s=8.0)
    assert (bool(cluster.stop_errors), bool(cluster.stop_kills)) == (error, killed)
