"""A warm spare: `python -m trainer.spare learner --delay 3 --run-dir D --spare NAME`.

Waits `delay` seconds first (a replacement spare started right at a restart would take
the CPU from the unit that is restarting: on one machine the spares share the units'
cores, in a fleet they have their own), then runs the role's process entry point as a
spare (trainer/units/shell.py, "warm spares"): it gets ready and waits for the identity the
harness gives it. An identity that comes during the delay ends it: a restart that takes
a spare still waiting boots at once, never later than a cold start would."""
from __future__ import annotations

import importlib
import select
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    role, delay = argv.pop(0), 0.0
    if argv[:1] == ["--delay"]:
        delay = float(argv[1])
        argv = argv[2:]
    if role not in ("learner", "syncer"):
        raise SystemExit(f"python -m trainer.spare: role must be learner or syncer, not {role!r}")
    if delay > 0:
        readable, _, _ = select.select([sys.stdin], [], [], delay)  # the identity (or the harness gone)
        # (stderr: stdout may carry event lines only; tests read which way the delay ended)
        print("spare: " + ("taken during its delay: booting at once" if readable else "delay over: booting"),
              file=sys.stderr, flush=True)
    return importlib.import_module(f"diloco_chaos.trainer.units.{role}").main(argv)


if __name__ == "__main__":
    sys.exit(main())
