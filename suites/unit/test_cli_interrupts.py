"""A Ctrl-C that lands in a finalizer is not lost (diloco_chaos/cli.py `_redeliver_interrupts`).

Python raises a signal's KeyboardInterrupt wherever the main thread is; inside a finalizer
it only prints "Exception ignored" and goes on, so a run carried on to its end and exited 0
(CI: `run --backend docker` interrupted mid-run). The hook raises the signal again."""
from __future__ import annotations

import signal
import sys
import time
import weakref

import pytest

from diloco_chaos import cli


class _Thing:
    pass


def _interrupt_lands_in_a_finalizer() -> None:
    """What a Ctrl-C does when it arrives while a weakref.finalize callback runs."""
    def callback():
        raise KeyboardInterrupt
    t = _Thing()
    weakref.finalize(t, callback)
    del t  # the finalizer runs here; its KeyboardInterrupt goes to sys.unraisablehook


def _runs_on(seconds: float) -> None:
    # where it is expected to raise, `seconds` is only how long it gives the re-raised signal
    # to surface (at once on any machine: the process signals itself), a give-up timeout
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # plain bytecode: where a re-raised signal surfaces
        pass


@pytest.fixture
def python_handles_sigint():
    """Python's own SIGINT handler, whatever the runner left (a nohup'd job ignores SIGINT)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_an_interrupt_swallowed_by_a_finalizer_is_raised_again(python_handles_sigint, monkeypatch):
    monkeypatch.setattr(sys, "unraisablehook", cli._redeliver_interrupts(sys.unraisablehook))
    with pytest.raises(KeyboardInterrupt):
        _interrupt_lands_in_a_finalizer()
        _runs_on(2.0)


def test_without_the_hook_it_is_lost(python_handles_sigint, monkeypatch):
    """The planted bug: the default hook prints it and the program goes on."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    _interrupt_lands_in_a_finalizer()
    _runs_on(0.2)
    assert seen == [KeyboardInterrupt]


def test_other_unraisable_errors_go_to_the_previous_hook(monkeypatch):
    seen = []
    hook = cli._redeliver_interrupts(lambda u: seen.append(u.exc_type))
    monkeypatch.setattr(sys, "unraisablehook", hook)
    t = _Thing()
    weakref.finalize(t, lambda: 1 / 0)
    del t
    assert seen == [ZeroDivisionError]


def test_main_restores_the_hook(monkeypatch):
    before = sys.unraisablehook
    assert cli.main(["scenarios"]) == 0
    assert sys.unraisablehook is before
