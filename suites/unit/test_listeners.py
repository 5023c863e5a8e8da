"""harness/listeners.py: who hears of a written run, and that a listener's error does not
reach the run (the pytest plugin's recorder must never fail the run it is told about)."""
from __future__ import annotations

from pathlib import Path

from diloco_chaos.harness import listeners


def test_subscribers_hear_each_run_until_they_unsubscribe(tmp_path):
    heard = []
    stop = listeners.subscribe(heard.append)
    try:
        assert listeners.run_written(tmp_path / "a") == []
    finally:
        stop()
    listeners.run_written(tmp_path / "b")
    stop()  # twice is harmless
    assert heard == [Path(tmp_path / "a")]


def test_a_failing_listener_is_reported_not_raised_and_the_others_still_hear(tmp_path):
    heard = []

    def broken(run_dir):
        raise RuntimeError("recorder bug")

    stops = [listeners.subscribe(broken), listeners.subscribe(heard.append)]
    try:
        errors = listeners.run_written(tmp_path)
    finally:
        for stop in stops:
            stop()
    assert [str(e) for e in errors] == ["recorder bug"] and heard == [tmp_path]
