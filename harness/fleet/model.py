"""`diloco-chaos fleet`: fleet-scale goodput of Decoupled DiLoCo vs data-parallel.

A job of N chips runs for `job_s` of wall time while every chip fails as a
Poisson process (mean time between interruptions `mtbi_s` per chip). Three
kinds of policy meet the same failures (common random numbers):

- dp_no_elastic: any failure stalls everyone; after `detect_s` the whole job
  restarts on spares (`restart_s`) from its last checkpoint, losing the
  progress made since (a checkpoint every `checkpoint_every_s` of running).
- elastic_dp: the job drops the failed slice (`detect_s` + `reconfig_s`, all
  chips paused), runs smaller, and re-admits the slice `repair_s` later
  (another `reconfig_s` pause). No rollback: surviving replicas keep the state.
- ddl_mM: M learner units of N/M chips, each an elastic-DP job of its own; a
  failure pauses only its learner. The syncer commits while K learners are up.
  Elastic DP is exactly Decoupled DiLoCo with M = 1.

A recovery episode (restart or reconfiguration) ends with a health check, so a
chip that dies during one is handled in it; detection time is paid only by
failures that hit a running job. A chip whose slice is away cannot fail.

goodput = productive chip-time / allocated chip-time (N x job_s);
uptime = share of wall time in which the global model advances.
docs/FLEET.md has the physics, the calibration and the measured table.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from pathlib import Path

import numpy as np

from diloco_chaos.harness import units
from diloco_chaos.harness.errors import UserError

YEAR_S = float(units.PER_S["y"])
BLOCK_CHIPS = 1 << 16  # failures are drawn per block of chips, so a chip's history never depends on N
DEFAULT_CHIPS = "150k,300k,600k,1.2M,2.4M"
DEFAULT_LEARNERS = "1,2,4,8,16"
# Decoupled DiLoCo paper (arXiv 2604.21428), MTBI 1 year per chip: goodput in percent.
PAPER = {
    "chips": [150_000, 300_000, 600_000, 1_200_000, 2_400_000],
    "dp_no_elastic": [72, 57, 38, 27, 18],
    "ddl_m8": [98, 96, 94, 88, 80],
}


@dataclasses.dataclass(frozen=True)
class FleetParams:
    """Physical parameters of the fleet and the recovery machinery (seconds, chips)."""

    mtbi_s: float = YEAR_S  # mean time between interruptions of one chip (inf: none)
    job_s: float = 28 * 86400.0  # simulated wall time of the job
    slice_chips: int = 64  # failure domain an elastic job drops and re-admits as one
    detect_s: float = 12.0  # a dead chip hangs the job's collectives until the watchdog fires
    restart_s: float = 60.0  # full restart on spares: reschedule, restore, recompile from cache
    checkpoint_every_s: float = 2.0  # DP in-memory checkpoint each training step; rollback < this
    reconfig_s: float = 7.0  # elastic reshard to drop or re-admit slices, state kept in HBM
    repair_s: float = 1800.0  # until a failed slice (or a spare standing in) can rejoin
    quorum: int = 1  # K: learners the syncer needs to commit an outer round (capped at M)

    def __post_init__(self):
        if not (self.mtbi_s > 0):
            raise ValueError(f"mtbi_s must be > 0 (inf for no failures), got {self.mtbi_s}")
        if not (0 < self.job_s < math.inf):
            raise ValueError(f"job_s must be finite and > 0, got {self.job_s}")
        if int(self.slice_chips) != self.slice_chips or self.slice_chips < 1:
            raise ValueError(f"slice_chips must be an integer >= 1, got {self.slice_chips}")
        for name in ("detect_s", "restart_s", "reconfig_s", "repair_s"):
            v = getattr(self, name)
            if not (0 <= v < math.inf):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")
        if not (0 < self.checkpoint_every_s < math.inf):
            raise ValueError(f"checkpoint_every_s must be finite and > 0, got {self.checkpoint_every_s}")
        if int(self.quorum) != self.quorum or self.quorum < 1:
            raise ValueError(f"quorum must be an integer >= 1, got {self.quorum}")


def policy_names(learners: list[int]) -> list[str]:
    return ["dp_no_elastic", "elastic_dp"] + [f"ddl_m{m}" for m in learners]


def draw_failures(n_chips: int, p: FleetParams, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Failure times (s, ascending) and chip ids over chips [0, n_chips).

    Each block of BLOCK_CHIPS chips has its own stream `default_rng([seed, block])`,
    so a fleet of N chips sees exactly the failures of chips < N of any larger one.
    """
    if math.isinf(p.mtbi_s):
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    t_parts, c_parts = [], []
    for block in range(-(-n_chips // BLOCK_CHIPS)):
        rng = np.random.default_rng([seed, block])
        k = rng.poisson(BLOCK_CHIPS * p.job_s / p.mtbi_s)
        t_parts.append(rng.uniform(0.0, p.job_s, k))
        c_parts.append(block * BLOCK_CHIPS + rng.integers(0, BLOCK_CHIPS, k))
    t, c = np.concatenate(t_parts), np.concatenate(c_parts)
    keep = c < n_chips
    t, c = t[keep], c[keep]
    order = np.argsort(t, kind="stable")
    return t[order], c[order]


def _episodes(key: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Indices of the events that open a recovery episode.

    `key` is ascending. An episode opened by event i lasts dur[i]; events that land
    inside it are handled by it (its closing health check), so the next episode is
    opened by the first event at or after its end.
    """
    n = len(key)
    nxt = np.maximum(np.searchsorted(key, key + dur, side="left"), np.arange(1, n + 1)).tolist()
    opened, i = [], 0
    while i < n:  # a chain through the events; each step is one episode
        opened.append(i)
        i = nxt[i]
    return np.asarray(opened, dtype=np.int64)


def simulate_restart(t: np.ndarray, p: FleetParams) -> dict:
    """Data-parallel without elasticity; `t` are the failure times (s, ascending)."""
    T, down_s = p.job_s, p.detect_s + p.restart_s
    opened = t[_episodes(t, np.full(len(t), down_s))]
    ends = np.minimum(opened + down_s, T)
    up_s = np.maximum(np.concatenate([opened, [T]]) - np.concatenate([[0.0], ends]), 0.0)
    # a failure loses what ran since the last checkpoint; the job's end is a checkpoint
    kept_s = (np.floor(up_s[:-1] / p.checkpoint_every_s) * p.checkpoint_every_s).sum() + up_s[-1]
    paused = float((ends - opened).sum()) / T
    goodput = float(kept_s) / T
    return {"goodput": goodput, "uptime": 1.0 - paused,
            "recovery": paused, "rollback": 1.0 - paused - goodput, "slice_away": 0.0}


def _drop_while_away(t: np.ndarray, sl: np.ndarray, repair_s: float, job_s: float):
    """Failures that hit a running slice: a slice away for repair has no running chip."""
    o = np.lexsort((t, sl))
    t, sl = t[o], sl[o]
    key = sl * (2.0 * (job_s + repair_s) + 1.0) + t
    hit = np.ones(len(t), dtype=bool)
    while True:  # fixed point; converges in (longest chain of overlapping failures) + 1 rounds
        last = np.maximum.accumulate(np.where(hit, key, -np.inf))
        prev = np.concatenate([[-np.inf], last[:-1]])
        new = key - prev >= repair_s
        if np.array_equal(new, hit):
            return t[hit], sl[hit]
        hit = new


def simulate_elastic(t: np.ndarray, chip: np.ndarray, n_chips: int, learners: int,
                     p: FleetParams) -> dict:
    """M learner units (elastic DP when M = 1); `t`, `chip` from draw_failures."""
    T, S, M = p.job_s, p.slice_chips, learners
    n_slices = -(-n_chips // S)
    if M > n_slices:
        raise ValueError(f"{M} learners need at least {M} slices; {n_chips} chips make {n_slices}")
    slice_size = np.full(n_slices, float(S))
    slice_size[-1] = n_chips - (n_slices - 1) * S
    learner_of = np.arange(n_slices) * M // n_slices  # nested: learners of M split into those of 2M
    chips_m = np.bincount(learner_of, weights=slice_size, minlength=M)
    t, sl = _drop_while_away(t, chip // S, p.repair_s, T)
    lrn = learner_of[sl]
    back = t + p.repair_s < T
    ev_t = np.concatenate([t, t[back] + p.repair_s])
    ev_l = np.concatenate([lrn, lrn[back]])
    ev_d = np.concatenate([np.full(len(t), p.detect_s + p.reconfig_s),
                           np.full(int(back.sum()), p.reconfig_s)])
    off = 2.0 * (T + p.detect_s + p.reconfig_s + p.repair_s) + 1.0  # learners never overlap in key space
    key = ev_l * off + ev_t
    o = np.argsort(key, kind="stable")
    key, ev_d, ev_l, ev_t = key[o], ev_d[o], ev_l[o], ev_t[o]
    e = _episodes(key, ev_d)
    start_key = key[e]
    length = np.minimum(start_key + ev_d[e], ev_l[e] * off + T) - start_key
    down_m = np.bincount(ev_l[e], weights=length, minlength=M)
    cum = np.concatenate([[0.0], np.cumsum(length)])

    def paused_before(x):  # total paused time before key x (differences stay inside one learner)
        k = np.searchsorted(start_key, x, side="right") - 1
        kk = np.maximum(k, 0)
        part = cum[kk] + np.clip(x - start_key[kk], 0.0, length[kk])
        return np.where(k >= 0, part, 0.0)

    a = lrn * off + t
    b = lrn * off + np.minimum(t + p.repair_s, T)
    away_running = (b - a) - (paused_before(b) - paused_before(a))
    lost_away = float((slice_size[sl] * away_running).sum())
    paused_chip_s = float((chips_m * down_m).sum())
    total = n_chips * T
    goodput = (total - paused_chip_s - lost_away) / total
    return {"goodput": goodput, "uptime": _quorum_uptime(ev_t[e], length, M, min(p.quorum, M), T),
            "recovery": paused_chip_s / total, "rollback": 0.0, "slice_away": lost_away / total}


def _quorum_uptime(starts: np.ndarray, lengths: np.ndarray, m: int, k: int, T: float) -> float:
    """Share of [0, T] in which at least k of m learners are running (not paused)."""
    times = np.concatenate([starts, starts + lengths, [T]])
    delta = np.concatenate([np.ones(len(starts)), -np.ones(len(starts)), [0.0]])
    o = np.argsort(times, kind="stable")
    times, delta = times[o], delta[o]
    paused = np.cumsum(delta)  # learners paused just after each time
    seg = np.diff(np.concatenate([[0.0], times]))  # segment before each time
    before = np.concatenate([[0.0], paused[:-1]])
    return float(seg[m - before >= k].sum()) / T


def simulate(chips: list[int], learners: list[int], p: FleetParams, seed: int) -> dict:
    """The goodput/uptime table: one column per chip count, one row per policy."""
    names = policy_names(learners)
    rows = {n: {k: [] for k in ("goodput", "uptime", "recovery", "rollback", "slice_away")} for n in names}
    t_all, c_all = draw_failures(max(chips), p, seed)
    for n_chips in chips:
        sel = c_all < n_chips
        t, c = t_all[sel], c_all[sel]
        by_m = {m: simulate_elastic(t, c, n_chips, m, p) for m in sorted({1, *learners})}
        cells = {"dp_no_elastic": simulate_restart(t, p), "elastic_dp": by_m[1]}
        cells.update({f"ddl_m{m}": by_m[m] for m in learners})
        for name in names:
            for k, v in cells[name].items():
                rows[name][k].append(round(v, 6))
    out = {"chips": list(chips), "policies": names}
    out.update({n: rows[n]["goodput"] for n in names})
    out["uptime"] = {n: rows[n]["uptime"] for n in names}
    out["badput"] = {n: {k: rows[n][k] for k in ("recovery", "rollback", "slice_away")} for n in names}
    params = {k: None if v == math.inf else v for k, v in dataclasses.asdict(p).items()}  # JSON has no inf
    out.update({"seed": seed, "params": params, "paper": PAPER,
                "units": "goodput and uptime are fractions; params in seconds and chips; null mtbi_s = never"})
    return out


# ---------------------------------------------------------------- input parsing
_COUNT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKM]?)\s*$")


def parse_duration(text: str, where: str, allow_inf: bool = False) -> float:
    """A duration on the command line (harness/units.py reads it, as in scenario files)."""
    if allow_inf and text.strip().lower() in ("inf", "never"):
        return math.inf
    try:
        seconds = units.parse_duration(text)
    except ValueError:
        seconds = -1.0
    if not (0 <= seconds < math.inf):
        extra = "; or 'never' for no failures" if allow_inf else ""
        raise UserError(f"{where}: cannot read {text!r} as a duration; use a number and a unit "
                        f"(s, m or min, h, d, w, y), e.g. 90s, 15m, 2h, 30d, 1y{extra}")
    return seconds


def format_duration(seconds: float) -> str:
    """Inverse of parse_duration for display: 2419200 -> '28d', 1800 -> '30min', inf -> 'never'."""
    if math.isinf(seconds):
        return "never"
    for unit in ("y", "d", "h", "min"):
        if seconds >= units.PER_S[unit] and seconds % units.PER_S[unit] == 0:
            return f"{seconds / units.PER_S[unit]:g}{unit}"
    return f"{seconds:g}s"


def parse_counts(text: str, where: str, minimum: int = 1) -> list[int]:
    """'150k,300k,1.2M' -> [150000, 300000, 1200000] (sorted, without repeats)."""
    out = set()
    for part in text.split(","):
        m = _COUNT.match(part)
        value = float(m.group(1)) * {"": 1, "k": 1e3, "K": 1e3, "M": 1e6}[m.group(2)] if m else -1.0
        if not m or value != int(value) or value < minimum:
            raise UserError(f"{where}: cannot read {part.strip()!r} as a whole number >= {minimum}; "
                            f"use a comma list like 150k,300k,1.2M (k = 1e3, M = 1e6)")
        out.add(int(value))
    return sorted(out)


# ---------------------------------------------------------------- the parameters' meaning
PARAM_DOC = {  # FleetParams field -> physical meaning (CLI help, page, docs)
    "mtbi_s": "mean time between interruptions of one chip (Poisson)",
    "job_s": "simulated wall time of the job",
    "slice_chips": "chips per slice: the unit an elastic job drops and re-admits",
    "detect_s": "failure to detection: collectives hang until the watchdog fires",
    "restart_s": "non-elastic DP: restart of the whole job on spares after detection",
    "checkpoint_every_s": "non-elastic DP: checkpoint interval of running time (progress since is lost)",
    "reconfig_s": "elastic DP / learner: pause to drop or re-admit slices",
    "repair_s": "until a failed slice (or a spare standing in for it) can rejoin",
    "quorum": "K: learners the syncer needs to commit an outer round (capped at M)",
}
def run(chips: list[int], learners: list[int], p: FleetParams, seed: int) -> dict:
    """simulate(), with the input checks that need more than one argument."""
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    slices = -(-min(chips) // p.slice_chips)
    if max(learners) > slices:
        raise UserError(f"--learners {max(learners)}: the smallest fleet ({min(chips):,} chips) has only "
                        f"{slices} slices of {p.slice_chips} chips and a learner needs at least one; use "
                        f"fewer --learners, more --chips or a smaller --slice-chips")
    return simulate(chips, learners, p, seed)


def format_table(res: dict, key: str | None = None) -> str:
    """Plain-text table of goodput (key None) or res[key][policy], in percent."""
    chips = res["chips"]
    head = f"{'policy':<20}" + "".join(f"{short_count(n):>9}" for n in chips)
    lines = [head, "-" * len(head)]
    for name in res["policies"]:
        vals = res[name] if key is None else res[key][name]
        lines.append(f"{name:<20}" + "".join(f"{100 * v:>8.1f}%" for v in vals))
    for name in ("dp_no_elastic", "ddl_m8"):
        if key is None and set(chips) & set(PAPER["chips"]):
            ref = dict(zip(PAPER["chips"], PAPER[name]))
            lines.append(f"{'paper ' + name:<20}" + "".join(
                f"{ref[n]:>8}%" if n in ref else f"{'':>9}" for n in chips))
    return "\n".join(lines)


def short_count(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k" if n >= 1000 else str(n)


def write(res: dict, out: Path) -> tuple[Path, Path]:
    from diloco_chaos.harness.fleet.page import render

    out.mkdir(parents=True, exist_ok=True)
    js, page = out / "fleet.json", out / "fleet.html"
    js.write_text(json.dumps(res, indent=1) + "\n")
    page.write_text(render(res))
    return js, page


def bench(out_dir: Path) -> dict:
    """Seconds for the full default table (7 policies x 5 chip counts), fresh each time."""
    chips, learners = parse_counts(DEFAULT_CHIPS, "chips"), parse_counts(DEFAULT_LEARNERS, "learners")
    t0 = time.perf_counter()
    res = simulate(chips, learners, FleetParams(), seed=0)
    seconds = time.perf_counter() - t0
    return {"seconds": round(seconds, 3), "policies": len(res["policies"]), "chips": chips,
            "goodput": {n: res[n] for n in res["policies"]}}
