"""What a run leaves, on either tier: its directory (never shared), its verdict in
summary.json (harness/judging/judge.py over the event log), and the `RunResult` a caller
gets back; and the same scenario under another training mode (the data-parallel
comparison)."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from diloco_chaos.harness import eventlog, listeners
from diloco_chaos.harness.scenarios.scenario import Scenario


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    summary: dict


def unique_dir(parent: Path, name: str) -> Path:
    """parent/name, or parent/name-2, -3, ... : two runs never share a folder."""
    parent.mkdir(parents=True, exist_ok=True)
    for i in range(1, 10_000):
        d = parent / (name if i == 1 else f"{name}-{i}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise RuntimeError(f"no free run directory for {name} under {parent}")


def stamped_dir(parent: Path, name: str, now: datetime | None = None) -> Path:
    """parent/NAME-YYYYMMDDTHHMMSSZ (UTC; -2, -3 ... within the same second), and
    parent/latest pointing at it: runs sort by time and the newest has one name."""
    now = now or datetime.now(timezone.utc)
    d = unique_dir(parent, f"{name}-{now.strftime('%Y%m%dT%H%M%SZ')}")
    link = parent / "latest"
    tmp = parent / f".latest-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(d.name)  # relative: the folder can move
    os.replace(tmp, link)  # atomic: a reader sees the old run or the new one, never none
    return d


def with_mode(s: Scenario, mode: str) -> Scenario:
    """The same scenario (and fault draw) under another training mode, e.g. dp."""
    return dataclasses.replace(s, train=dataclasses.replace(s.train, mode=mode))


def summarize(run_dir: Path, s: Scenario, reference: Path | None = None, expect: bool = True) -> dict:
    """Judges the run (harness/judging/judge.py) and writes summary.json."""
    from diloco_chaos.harness.judging.judge import judge

    log = eventlog.read(run_dir)
    ref = eventlog.read(reference) if reference else None
    summary = {**judge(log, ref, dataclasses.asdict(s.expect) if expect else None),
               "run_dir": str(run_dir), "reference_dir": str(reference) if reference else None}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    listeners.run_written(run_dir)  # e.g. the pytest plugin: the test running now gets its page
    return summary

