"""`LogBuilder`: small hand-made event logs for the metric and check tests
(test_metrics_goodput.py, test_metrics_summary.py, test_checks_*.py), and `rounds`, a run of merged contributions."""
from __future__ import annotations

from diloco_chaos.harness.eventlog import EventLog


class LogBuilder:
    """Event lines as the processes and the harness write them (trainer/units/learner.py,
    trainer/units/syncer.py, harness/run/injector.py), in the order given; `log()` sorts by t
    (stable, as eventlog.merge does)."""

    def __init__(self, mode="decoupled", learners=2, fragments=1, quorum=1, t_start=0.0, t_end=10.0,
                 shards=("syncer-0",), **header):
        self.names = [f"learner-{i}" for i in range(learners)]
        owners = {s: [p for p in range(fragments) if p % len(shards) == i] for i, s in enumerate(shards)}
        self.header = {"kind": "config", "seed": 0, "t_start": t_start, "t_end": t_end,
                       "config": {"diloco": {"mode": mode, "learners": learners, "fragments": fragments,
                                             "quorum": quorum}, "model": {"n_layers": 2}},
                       "topology": {"learners": self.names, "shards": owners}, **header}
        self.events: list[dict] = []
        self.version: dict[tuple, int] = {}

    def add(self, t, src, kind, **fields) -> LogBuilder:
        self.events.append({"t": t, "src": src, "kind": kind, **fields})
        return self

    # units (the process's own unit_up carries its incarnation; the harness's a reason)
    def up(self, t, unit, inc=0, step=0):
        return self.add(t, unit, "unit_up", incarnation=inc, pid=100 + inc, step=step)

    def down(self, t, unit, reason="killed"):
        return self.add(t, unit, "unit_down", reason=reason)

    def respawn(self, t, unit):
        return self.add(t, unit, "unit_up", reason="restarted", pid=1)

    def step(self, t, unit, step, dt=1.0, tokens=100, loss=2.0):
        return self.add(t, unit, "step", step=step, tokens=tokens, loss=loss, dt=dt, live_slices=1)

    def send(self, t, unit, seq, c_steps, fragment=0, inc=0, nbytes=100, base_version=0, peer="syncer-0"):
        return self.add(t, unit, "send", peer=peer, bytes=nbytes, msg="Contribution", learner=unit,
                        incarnation=inc, seq=seq, fragment=fragment, base_version=base_version,
                        c_steps=c_steps, c_tokens=100 * c_steps)

    def contribute(self, t, unit, seq, from_step, to_step, fragment=0, base_version=0, tokens=None):
        """The learner's `contribute` line (written just before its send): the Δ holds the
        incarnation's inner steps from_step + 1 … to_step (and `tokens`, when given)."""
        extra = {} if tokens is None else {"steps": to_step - from_step, "tokens": tokens}
        return self.add(t, unit, "contribute", fragment=fragment, seq=seq, base_version=base_version,
                        from_step=from_step, to_step=to_step, **extra)

    def discard(self, t, unit, step, steps, tokens, fragment=0, version=1):
        """A fetch re-anchored `fragment`, throwing away the progress since its last cut."""
        return self.add(t, unit, "discard", fragment=fragment, step=step, steps=steps, tokens=tokens,
                        version=version, why="fetch")

    def shard_drop(self, t, learner, seq, reason, fragment=0, inc=0, shard="syncer-0", **fields):
        """A shard's drop of a contribution: `stale` (staleness, max_staleness), `combined` /
        `superseded` (by_seq), ..."""
        what = "Contribution" if reason == "stale" else "contribution"
        return self.add(t, shard, "drop", what=what, fragment=fragment, learner=learner, incarnation=inc,
                        seq=seq, reason=reason, **fields)

    def global_eval(self, t, loss, snapshot=True, step=None):
        """The harness's eval of the global model: along the run (snapshot) or the final one."""
        extra = {"snapshot": True} if snapshot else {}
        return self.add(t, "harness", "eval", loss=loss, step=step, **{"global": True}, **extra)

    def merge(self, t, learner, seq, c_steps, fragment=0, inc=0, staleness=0, shard="syncer-0", version=None):
        """A merge line and its round_commit, the version counted up per (shard, fragment)."""
        v = self.version[(shard, fragment)] = (version if version is not None
                                               else self.version.get((shard, fragment), 0) + 1)
        self.add(t, shard, "merge", fragment=fragment, version=v, learner=learner, incarnation=inc, seq=seq,
                 base_version=v - 1 - staleness, staleness=staleness, weight=1.0, c_steps=c_steps,
                 c_tokens=100 * c_steps)
        return self.commit(t, v, fragment, shard)

    def commit(self, t, version, fragment=0, shard="syncer-0"):
        return self.add(t, shard, "round_commit", fragment=fragment, version=version, n=1, tokens=100,
                        opened_at=0.0, quorum_at=0.0, grace_s=0.0)

    def train(self, unit, n, *, inc=0, start=0, t0=0.0, dt=1.0, every=2, merged=(), fragment=0):
        """Steps start+1 … start+n, the k-th one's line at t0 + k·dt; every `every` steps a
        Contribution (seq 1, 2, …, c_steps = every) sent just before that step's line
        (the core sends inside the step, the line comes after); seqs in `merged` are merged
        at the same time."""
        for k in range(1, n + 1):
            t = t0 + k * dt
            if k % every == 0:
                seq = k // every
                self.send(t, unit, seq, every, fragment, inc)
                if seq in merged:
                    self.merge(t, unit, seq, every, fragment, inc)
            self.step(t, unit, start + k, dt)
        return self

    def log(self) -> EventLog:
        return EventLog(self.header, sorted(self.events, key=lambda e: e["t"]))


def rounds(b: LogBuilder, times, learner="learner-0", shard="syncer-0"):
    """One merged contribution (seq = index) per time: merge + round_commit lines."""
    for seq, t in enumerate(times, 1):
        b.merge(t, learner, seq, 1, shard=shard)
    return b
