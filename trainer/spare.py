"""A warm spare: `python -m trainer.spare learner --delay 3 --run-dir D --spare NAME`.

Sleeps `delay` seconds first (a replacement spare started right at a restart would take
the CPU from the unit that is restarting: on one machine the spares share the units'
cores, in a fleet they have their own), then runs the role's process entry point as a
spare (trainer/shell.py, "warm spares"): it gets ready and waits for the identity the
harness gives it."""
from __future__ import annotations

import importlib
import sys
import time


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    role, delay = argv.pop(0), 0.0
    if argv[:1] == ["--delay"]:
        delay = float(argv[1])
        argv = argv[2:]
    if role not in ("learner", "syncer"):
        raise SystemExit(f"python -m trainer.spare: role must be learner or syncer, not {role!r}")
    time.sleep(delay)
    return importlib.import_module(f"trainer.{role}").main(argv)


if __name__ == "__main__":
    sys.exit(main())
