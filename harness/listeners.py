"""Who wants to know when a run directory is written: a process-wide list of callbacks.

`run_written(run_dir)` is called once a run's events (and, for a judged run, its
summary.json) are on disk: by the runner's `summarize` (both tiers) and by the
simulator's `SimRun.write` (a failing property's example). The pytest plugin
(reports/pytest_plugin.py) subscribes, so every test that runs a scenario gets its page
and JUnit figures without a line in the test; harness/ itself knows nothing of reports/.
A listener that raises does not fail the run: `run_written` returns its error and the
runners go on (a recorder's bug must not lose the run it was told about).
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

_LOCK = threading.Lock()
_LISTENERS: list[Callable[[Path], None]] = []


def subscribe(fn: Callable[[Path], None]) -> Callable[[], None]:
    """Calls `fn(run_dir)` for every run written from now on; returns the unsubscribe."""
    with _LOCK:
        _LISTENERS.append(fn)

    def unsubscribe() -> None:
        with _LOCK:
            if fn in _LISTENERS:
                _LISTENERS.remove(fn)
    return unsubscribe


def run_written(run_dir: Path) -> list[BaseException]:
    """Tells every listener that `run_dir` was written; returns the errors they raised."""
    with _LOCK:
        listeners = list(_LISTENERS)
    errors = []
    for fn in listeners:
        try:
            fn(Path(run_dir))
        except Exception as e:  # a recorder's bug must not lose the run it was told about
            errors.append(e)
    return errors
