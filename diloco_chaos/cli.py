"""The `diloco-chaos` command line.

Each command lives in its own module that exposes `register(subparsers)`; the
module adds a parser whose `func(args) -> int` runs the command. Modules are
imported lazily so `diloco-chaos --help` stays fast and one broken command does
not take the others down.
"""
from __future__ import annotations

import _thread
import argparse
import importlib
import os
import signal
import sys
import threading

from diloco_chaos.harness.errors import UserError  # noqa: F401  (re-exported for command modules)

# (command, "module:register function", one line of help). Order is the order in --help.
COMMANDS: list[tuple[str, str, str]] = [
    ("run", "diloco_chaos.run_cmd:register_run", "run a fault scenario (a TOML file or a built-in name)"),
    ("check", "diloco_chaos.check_cmd:register", "validate scenario files: every error in one pass, then the drawn fault schedule"),
    ("compare", "diloco_chaos.compare_cmd:register", "two runs side by side: figures with deltas, checks that flipped"),
    ("init", "diloco_chaos.init_cmd:register", "scaffold a scenario, a task stub and a pytest file that runs green"),
    ("scenarios", "diloco_chaos.run_cmd:register_scenarios", "list the built-in scenarios"),
    ("faults", "diloco_chaos.check_cmd:register_faults", "list the fault kinds: targets, parameters, defaults"),
    ("replay", "diloco_chaos.run_cmd:register_replay", "run a stored run again: same config, seed and schedule"),
    ("runs", "diloco_chaos.runs_cmd:register", "the runs kept under runs/, newest first: verdict, goodput, parity, folder"),
    ("demo", "diloco_chaos.run_cmd:register_demo", "run the default scenario (chaos vs data-parallel), print where results are"),
    ("report", "diloco_chaos.report_cmd:register", "render a stored run's HTML report again (like Jepsen's analyze)"),
    ("fleet", "diloco_chaos.fleet_cmd:register", "fleet-scale goodput simulator: Decoupled DiLoCo vs data-parallel"),
    ("bench", "diloco_chaos.bench:register", "run a benchmark, writing runs/bench/NAME.json"),
    ("baseline", "diloco_chaos.baseline_cmd:register", "record a scenario's known-good envelope (what its runs kept) on purpose"),
    ("planted", "diloco_chaos.planted_cmd:register", "the planted-bug catalogue: which check and which test catches each"),
    ("setup", "diloco_chaos.harness.backends.toxiproxy_setup:register", "install the Toxiproxy server the cluster tier needs"),
    ("toxiproxy", "diloco_chaos.harness.backends.toxiproxy_cmd:register", "start a Toxiproxy server in the foreground (for debugging)"),
]


EXIT_CODES = """exit codes:
  0    PASS: every check passed (check: every file valid; compare: no --fail-on rule failed)
  1    FAIL: a check failed, or ended UNKNOWN without --allow-unknown; a --fail-on rule failed
  2    bad input: a scenario, option or file that cannot be used (one line says what and where)
  130  interrupted (Ctrl-C); 143 terminated (SIGTERM): everything the run started is gone"""


def build_parser() -> argparse.ArgumentParser:
    from diloco_chaos import __version__

    parser = argparse.ArgumentParser(
        prog="diloco-chaos",
        description="Chaos-engineering test harness for Decoupled DiLoCo training.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"diloco-chaos {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, target, help_ in COMMANDS:
        module, func = target.split(":")
        try:
            mod = importlib.import_module(module)
        except ImportError as e:  # a command whose module is absent still shows up
            p = sub.add_parser(name, help=f"{help_} (unavailable: {e})")
            p.add_argument("args", nargs=argparse.REMAINDER, help="(the command cannot run)")
            p.set_defaults(func=lambda a, e=e: _unavailable(e))
            continue
        getattr(mod, func)(sub, help_)
    return parser


def _unavailable(err: Exception) -> int:
    print(f"diloco-chaos: this command cannot run: {err}", file=sys.stderr)
    return 2


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI runner cancelling the job, `kill PID`): unwinds like a Ctrl-C, so every
    process, proxy and container the command started is gone afterwards as well."""


def _terminated(signum, frame):
    raise Terminated()


def _redeliver_interrupts(previous):
    """An unraisable hook that gives back a Ctrl-C (or SIGTERM) Python swallowed.

    A signal's exception is raised wherever the main thread is at the next bytecode; when
    that is a finalizer (a `weakref.finalize` callback, a `__del__`), Python
    prints "Exception ignored in ..." and goes on: the run would then carry on to its end
    and exit 0 (seen once in CI: `run --backend docker`, Ctrl-C in mid-run). The hook
    raises the signal again, so its exception comes from wherever the main thread goes
    next, outside the finalizer. Everything else goes to the previous hook."""
    def hook(unraisable):
        exc = unraisable.exc_type
        if exc is not None and issubclass(exc, KeyboardInterrupt):
            # as if the signal arrived again, from another thread a moment later: raised
            # here, in the hook, it would be swallowed too (nothing where Python does not
            # handle the signal)
            signum = signal.SIGTERM if issubclass(exc, Terminated) else signal.SIGINT
            timer = threading.Timer(0.01, _thread.interrupt_main, (signum,))
            timer.daemon = True
            timer.start()
            return
        previous(unraisable)
    return hook


RUNS_SOMETHING = ("run", "replay", "demo", "bench")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--allow-unknown" in argv:
        from diloco_chaos.run_cmd import bare_allow_unknown
        argv = bare_allow_unknown(argv)
    args = parser.parse_args(argv)
    from diloco_chaos.trainer.units.shell import use_compile_cache
    use_compile_cache()  # for the simulator, the evals and every unit process it starts
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    from diloco_chaos.trainer.numerics.plugins import SEARCH_ENV
    search = os.environ.get(SEARCH_ENV)  # a command may name a scenario file's folder for its units
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    previous_hook = sys.unraisablehook
    if main_thread:
        sys.unraisablehook = _redeliver_interrupts(previous_hook)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"diloco-chaos {args.command}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`... | head`): no traceback, and nothing more written to it. A
        # command that only prints exits 0 (the reader took what it wanted); one that runs
        # something (run, replay, demo, bench) 1: its verdict was never printed, so it never held
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1 if args.command in RUNS_SOMETHING else 0
    except KeyboardInterrupt as e:
        term = isinstance(e, Terminated)
        print(f"diloco-chaos {args.command}: {'terminated' if term else 'interrupted'}", file=sys.stderr)
        return 143 if term else 130
    finally:
        if main_thread and previous is not None:
            signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = previous_hook
        if search is None:  # as it was: a caller in the same process (a test) sees no change
            os.environ.pop(SEARCH_ENV, None)
        else:
            os.environ[SEARCH_ENV] = search


if __name__ == "__main__":
    sys.exit(main())
