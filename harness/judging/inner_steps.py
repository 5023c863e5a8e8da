"""inner_steps_reexecuted: a learner's sampled inner steps, redone by the judge.

A learner unit's inner step is a function of what it held before the step and of its batch.
For a sample of its steps (trainer/numerics/step_audit.py: each incarnation's first step with a
learning rate and every 400th global step) the unit writes an `inner_audit` line: θ before
the step (whole), its Adam and schedule counters, the moments at 16 coordinates of every
leaf, and what the step made there. The judge redoes the step:

- the step's number: the incarnation's step lines run consecutively from the step its
  restore named (0 for a cold start), and the audited step is one of them;
- the counters: Adam's and the schedule's count before step s is s − 1 (a restored unit's
  are its save's step);
- the gradient: the harness's own (harness/run/inner_replay.py, an `inner_gradient` line per
  audit, written by the runner after the run as it writes the global eval): the task's
  gradient at the line's θ on the batch the task draws for (this learner, global step s − 1),
  its first B·live/S rows — drawn by the harness, not taken from the unit — as the mean of
  two row groups with their spread as the noise where the fleet's second moment is on;
- the rest in the judge's own arithmetic (harness/judging/spec.py `clip_factor`, `adamw`,
  `inner_lr`, from docs/TRAINER_MATH.md): the clip over every leaf, Adam with the fleet's
  second moment, weight decay on matrices only, the warm-up/cosine schedule.

It compares, leaf by leaf at the sampled coordinates, θ, m, v (and the noise EMA) after the
step: the difference must stay within RTOL of what the step changed plus ATOL of the value
(float32 rounding). A wrong batch, a schedule restarted or shifted, a clip, moment, bias
correction or decay mask that differs from the documents, a state a restore mangled in a way
its own digests cannot see — each fails here. Not applicable to data-parallel modes (their
steps apply a mean gradient); UNKNOWN when steps ran and no line was written, or an audit
has no harness gradient (a log whose runner did not replay it).
"""
from __future__ import annotations

import numpy as np

from diloco_chaos.harness.eventlog import EventLog
from diloco_chaos.harness.judging import spec
from diloco_chaos.harness.judging.check_base import SHOW, Result
from diloco_chaos.harness.judging.history import histories, learner_names, window

NAME = "inner_steps_reexecuted"
RTOL = 1e-3       # of what the step changed: float32 against the judge's float64, far below a wrong input
ATOL = 1e-6       # of the value itself: float32 rounding (6e-8 a value)
PER_LEAF = 16     # coordinates a line carries of every leaf, evenly spread (trainer/numerics/step_audit.py)
DILOCO = ("decoupled", "streaming", "sync_diloco")


def leaf_index(n: int) -> np.ndarray:
    """The judge's own statement of the sampled coordinates (the unit's must be the same)."""
    return np.unique(np.linspace(0, n - 1, min(n, PER_LEAF)).round().astype(np.int64))


def _fleet(config: dict) -> int:
    d = config["diloco"]
    if config["inner"].get("second_moment", "fleet") == "fleet" and d.get("mode", "decoupled") in DILOCO:
        return int(d["learners"])
    return 1


def _redo(log: EventLog, line: dict, g: dict, worst: list) -> list[str]:
    """What differs between the unit's account of the step (`line`) and the judge's redoing
    of it from the harness's gradient (`g`); `worst` keeps the largest difference as a share
    of its tolerance."""
    config, why = log.config, []
    if g.get("error"):
        return [f"the harness could not take the step's gradient: {g['error']}"]
    inner, step, fleet = config["inner"], int(line["step"]), _fleet(config)
    count, lr_count = int(line["count"]), int(line["lr_count"])
    if count != step - 1 or lr_count != step - 1:
        why.append(f"before step {step} the Adam count is {count} and the schedule's {lr_count}; "
                   f"the judge's: {step - 1} (the steps taken)")
    lr = spec.inner_lr(inner, step - 1)
    c = spec.clip_factor(float(g["norm"]), float(inner["clip_norm"]))
    grads = [c * x.astype(np.float64) for x in spec.arrays_of(g["grad"])]
    noise = None
    if fleet > 1:
        noise = ([c * c * x.astype(np.float64) for x in spec.arrays_of(g["noise"])] if "noise" in g
                 else [np.zeros_like(x) for x in grads])  # one row group: no estimate
    theta, mu, nu = spec.arrays_of(line["theta"]), spec.arrays_of(line["mu"]), spec.arrays_of(line["nu"])
    sn = spec.arrays_of(line["noise"]) if fleet > 1 and "noise" in line else [None] * len(grads)
    if fleet > 1 and "noise" not in line:
        why.append("the fleet's second moment is on and the line carries no noise EMA")
        return why
    after = {k: spec.arrays_of(v) for k, v in line["after"].items()}
    for i, (name, shape) in enumerate(zip(g["names"], g["shapes"])):
        at = leaf_index(theta[i].size)
        if mu[i].size != at.size or grads[i].size != at.size:
            why.append(f"{name}: the line carries {mu[i].size} coordinates, the judge samples {at.size}")
            continue
        th = theta[i].astype(np.float64)[at]
        want = spec.adamw(th, grads[i], mu[i].astype(np.float64), nu[i].astype(np.float64),
                          None if noise is None else sn[i].astype(np.float64),
                          None if noise is None else noise[i],
                          count=step - 1, lr=lr, inner=inner, fleet=fleet, decay=len(shape) >= 2)
        was = {"theta": th, "mu": mu[i], "nu": nu[i], "noise": sn[i]}
        for part, w in zip(("theta", "mu", "nu", "noise"), want):
            if w is None or part not in after:
                continue
            x = after[part][i].astype(np.float64)
            err = float(np.linalg.norm(x - w))
            moved = float(np.linalg.norm(w - was[part]))
            tol = RTOL * moved + ATOL * float(np.linalg.norm(w)) + 1e-30
            worst[0] = max(worst[0], err / tol)
            if not err <= tol:
                why.append(f"{name} {tuple(shape)}: {part} after the step differs from the judge's by {err:.3g} "
                           f"(the step changed it by {moved:.3g}; tolerance {tol:.3g})")
    return why


def inner_steps_reexecuted(log: EventLog) -> Result:
    """Every sampled inner step of a learner (its `inner_audit` line) redone by the judge, from
    the batch it draws for that global step, with the task's loss and its own clip, Adam,
    fleet correction, decay mask and schedule: θ, m and v after the step must match, and the
    counts before it be the steps taken. FAIL with the steps that differ; PASS (value 0) when
    all agree; UNKNOWN when steps ran and no line was written (a log from before the lines)."""
    mode = log.config["diloco"].get("mode", "decoupled")
    if mode not in DILOCO:
        return Result(NAME, True, 0, 0, {"why": f"{mode}: its steps apply a mean gradient; not applicable"})
    learners = learner_names(log)
    bad, audited, redone, missing, worst = [], 0, 0, 0, [0.0]
    grads = {(e["learner"], e["audit_t"]): e for e in log.of("inner_gradient", src="harness")}
    for name, h in histories(log, window(log)[1]).items():
        if name not in learners:
            continue
        for inc in h.incs:
            start = int((inc.restored or {}).get("step") or 0)  # the save its restore named (restores_faithful's)
            steps = [int(e["step"]) for e in inc.steps]
            if steps and steps != list(range(start + 1, start + 1 + len(steps))):
                bad.append({"learner": name, "incarnation": inc.n, "why": f"its steps are not consecutive from "
                            f"the step its restore named ({start}): {steps[:3]} .. {steps[-3:]}"})
            for e in inc.events:
                if e["kind"] != "inner_audit":
                    continue
                audited += 1
                s = int(e["step"])
                if not start < s <= start + len(steps) + 1:
                    bad.append({"learner": name, "incarnation": inc.n, "step": s, "t": e["t"],
                                "why": f"step {s} is not one this incarnation took (from {start}, "
                                       f"{len(steps)} steps)"})
                    continue
                g = grads.get((name, e["t"]))
                if g is None:
                    missing += 1
                    continue
                redone += 1
                for why in _redo(log, e, g, worst)[:3]:
                    bad.append({"learner": name, "incarnation": inc.n, "step": s, "t": e["t"], "why": why})
    details = {"audited": audited, "redone": redone, "no_gradient": missing, "violations": bad[:SHOW],
               "worst_of_tolerance": round(worst[0], 4)}
    if not redone and not bad:
        if log.of("step"):
            why = ("no harness inner_gradient line for its inner_audit lines (a runner that did not replay them)"
                   if audited else "no inner_audit lines: a log from before they existed")
            return Result(NAME, None, None, 0, {**details, "why": why})
        return Result(NAME, True, 0, 0, {**details, "why": "no inner step in this run"})
    return Result(NAME, not bad, len(bad), 0, details)
