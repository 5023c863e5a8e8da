"""A unit on another host (issue 18): its event lines on stdout, nothing else there, and its
control messages from stdin into its own control file (trainer/units/shell.py, "nothing shared
but the network"). Run in a child process, since stream mode moves the process's fds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

from diloco_chaos.trainer.units.events import EventWriter

CHILD = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from diloco_chaos.trainer.units import shell
    run_dir = Path(sys.argv[1])
    ev = shell.open_events(run_dir, "learner-0", 2)
    print("a print goes to stderr")
    os.write(1, b"a C library's write to fd 1 goes to stderr too\\n")
    ev.emit("step", step=1, loss=2.5)
    ev.emit("done", step=1)
    t = shell.follow_control(run_dir, "learner-0")
    t.join(10)
""")


def test_stream_mode_keeps_stdout_for_event_lines_and_writes_control_messages(tmp_path):
    env = {**os.environ, "DILOCO_CHAOS_STREAM": "1"}
    p = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], env=env, capture_output=True, timeout=60,
                       input=b'{"live_slices": 1}\n\n{"live_slices": 2, "corrupt": null}\n')
    assert p.returncode == 0, p.stderr.decode()
    lines = p.stdout.decode().splitlines()
    assert [json.loads(x)["kind"] for x in lines] == ["step", "done"]  # nothing but event lines
    assert all(json.loads(x)["src"] == "learner-0" for x in lines)
    assert "a print goes to stderr" in p.stderr.decode() and "fd 1 goes to stderr" in p.stderr.decode()
    # the unit's own copy, in its run directory (on its host: its volume), the same lines
    assert (tmp_path / "logs" / "learner-0.2.jsonl").read_text().splitlines() == lines
    # the last control message, whole: as the harness's control file on one host
    assert json.loads((tmp_path / "control" / "learner-0.json").read_text()) == {"live_slices": 2, "corrupt": None}


def test_without_stream_mode_stdout_is_untouched(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DILOCO_CHAOS_STREAM"}
    p = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], env=env, capture_output=True, timeout=60,
                       input=b"")
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().splitlines()[0] == "a print goes to stderr"  # (the name says where it goes in stream mode)
    assert len((tmp_path / "logs" / "learner-0.2.jsonl").read_text().splitlines()) == 2


def test_threads_never_split_a_streamed_line(tmp_path):
    """Lines longer than a pipe's buffer, from 4 threads at once: each arrives whole."""
    r, w = os.pipe()
    got = []
    reader = threading.Thread(target=lambda: got.append(os.fdopen(r, "rb").read()))
    reader.start()
    ev = EventWriter(tmp_path / "x.jsonl", "learner-0", stream_fd=w)

    def emit(i: int) -> None:
        for j in range(20):
            ev.emit("eval", who=i, j=j, pad="x" * 200_000)

    threads = [threading.Thread(target=emit, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ev.close()
    os.close(w)
    reader.join(10)
    lines = got[0].decode().splitlines()
    assert len(lines) == 80 and all(json.loads(x)["pad"] == "x" * 200_000 for x in lines)
