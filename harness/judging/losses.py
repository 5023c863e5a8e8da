"""The run's final loss, its confidence interval, the parity with a reference run and
the task's loss floor, as the metrics and the property suites read them.

The harness's final eval of the global model keeps each held-out batch's loss
(`batch_losses` on its `eval` line). A reference run of the same task and seed was
evaluated on the same batches, so the parity (L − L_ref) / L_ref gets a *paired*
bootstrap interval: resample batch indices with replacement, recompute the ratio of the
two means on the same indices. Pairing cancels what the batches share (an easy batch is
easy for both models), which is most of the noise; an unpaired interval would be several
times wider (measured in docs/METRICS.md)."""
from __future__ import annotations

import statistics

import numpy as np

from diloco_chaos.harness.eventlog import EventLog

BOOTSTRAP = 2000     # resamples
CONFIDENCE = 0.95    # two-sided
BOOT_SEED = 0        # the interval is a function of the log alone (replayable)


def final_eval_event(t: float, step: int, batch_losses: list[float]) -> dict:
    """The harness's `eval` line for the final global model (both tiers)."""
    return {"t": round(t, 6), "src": "harness", "kind": "eval", "loss": float(np.mean(batch_losses)),
            "step": step, "global": True, "batch_losses": [round(float(x), 6) for x in batch_losses]}


def _final_global(log: EventLog) -> dict | None:
    glob = [e for e in log.of("eval", src="harness") if e.get("global")]
    return glob[-1] if glob else None


def final_loss(log: EventLog) -> tuple[float | None, str | None]:
    """The harness's eval of the global model; else the mean of each learner's last eval."""
    glob = _final_global(log)
    if glob is not None:
        return float(glob["loss"]), "global"
    last = {e["src"]: e["loss"] for e in log.of("eval") if e["src"] != "harness"}
    return (float(statistics.fmean(last.values())), "learners") if last else (None, None)


def batch_losses(log: EventLog) -> np.ndarray | None:
    """Each held-out batch's loss under the final global model (None: a log without them)."""
    glob = _final_global(log)
    v = None if glob is None else glob.get("batch_losses")
    return np.asarray(v, dtype=np.float64) if v else None


def _interval(samples: np.ndarray) -> list[float]:
    a = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(samples, [a, 1 - a])
    return [float(lo), float(hi)]


def _indices(n: int) -> np.ndarray:
    return np.random.default_rng(BOOT_SEED).integers(0, n, size=(BOOTSTRAP, n))


def mean_ci(losses: np.ndarray | None) -> list[float] | None:
    """Percentile bootstrap interval of the mean batch loss (None with < 2 batches)."""
    if losses is None or len(losses) < 2:
        return None
    return _interval(losses[_indices(len(losses))].mean(axis=1))


def parity_ci(run: np.ndarray | None, ref: np.ndarray | None) -> list[float] | None:
    """Paired bootstrap interval of (mean(run) − mean(ref)) / mean(ref) over the same batches.
    None when either side lacks batch losses or they were not taken on the same batches
    (a different count)."""
    if run is None or ref is None or len(run) != len(ref) or len(run) < 2:
        return None
    idx = _indices(len(run))
    a, b = run[idx].mean(axis=1), ref[idx].mean(axis=1)
    return _interval((a - b) / b)


def loss_floor(header: dict) -> float | None:
    task = header.get("task")
    v = header.get("loss_floor", task.get("loss_floor") if isinstance(task, dict) else None)
    return None if v is None else float(v)


def excess_loss_ratio(loss: float | None, ref: float | None, floor: float | None) -> float | None:
    """(L − floor) / (L_ref − floor): how much of the reference's reducible loss is left
    over, ≥ 1 worse. None without a floor or when the reference sits at (or under) it."""
    if loss is None or ref is None or floor is None or ref - floor <= 1e-9:
        return None
    return (loss - floor) / (ref - floor)
