"""Reading a live cluster's per-unit event logs from a test while the run goes on."""
from __future__ import annotations

import json
import time
from pathlib import Path


def events(run_dir: Path, src: str) -> list[dict]:
    """Every whole line unit `src` wrote so far, over its incarnations (a line being written is left out)."""
    out = []
    for f in sorted((run_dir / "logs").glob(f"{src}.*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.endswith("}")]
    return out


def wait_for(pred, timeout_s: float, what: str) -> None:
    """Until `pred()`; `timeout_s` is a give-up timeout (set well past an idle machine's
    time), never the property a test checks."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def last_step(run_dir: Path, src: str) -> int:
    return max([e["step"] for e in events(run_dir, src) if e["kind"] == "step"], default=0)
