"""The run's final loss and the task's loss floor, as the metrics and the property suites read them."""
from __future__ import annotations

import statistics

from harness.eventlog import EventLog


def final_loss(log: EventLog) -> tuple[float | None, str | None]:
    """The harness's eval of the global model; else the mean of each learner's last eval."""
    glob = [e for e in log.of("eval", src="harness") if e.get("global")]
    if glob:
        return float(glob[-1]["loss"]), "global"
    last = {e["src"]: e["loss"] for e in log.of("eval") if e["src"] != "harness"}
    return (float(statistics.fmean(last.values())), "learners") if last else (None, None)


def loss_floor(header: dict) -> float | None:
    task = header.get("task")
    v = header.get("loss_floor", task.get("loss_floor") if isinstance(task, dict) else None)
    return None if v is None else float(v)
