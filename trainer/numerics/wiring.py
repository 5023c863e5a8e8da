"""Binds the numerics (fragments, outer math, compression) into the sans-IO cores.

The cores take their math as injected functions (trainer/protocol/: the cores' `*Math`); this module
builds those functions from a RunConfig, once, for the process shells and the
simulator alike. It also builds the cores' configs from the run's topology.
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from diloco_chaos.trainer.config import RunConfig
from diloco_chaos.trainer.numerics import outer
from diloco_chaos.trainer.numerics.fragments import Fragmenter, due_fragment
from diloco_chaos.trainer.numerics.tally import AUDIT_SAMPLE, audit_index, b64 as _b64
from diloco_chaos.trainer.protocol import compression
from diloco_chaos.trainer.protocol.learner_types import LearnerConfig, LearnerMath
from diloco_chaos.trainer.protocol.protocol_base import DILOCO_MODES
from diloco_chaos.trainer.protocol.syncer_types import SyncerConfig, SyncerMath

# A fetch keeps the local progress no Δ holds when it is at most this many versions ahead
# of the progress's base (LearnerCore._keeps_on_fetch); 0: any, as an answer does, and the
# staleness bound (max_staleness from the copy its oldest step was made on) throws what is
# too old on either. It was 1 (where an answer would have put it) while nothing else bounded
# how stale kept progress could be; a starved learner's re-anchoring fetch under a slow WAN
# is a few versions ahead, and threw 24 % of wan-brownout's tokens away (docs/PROTOCOL.md
# "keep_local"). Progress cut off by a broken link while rounds went on: the `cut` rule.
KEEP_GAP = 0


def fragmenter_for(cfg: RunConfig, params: dict) -> Fragmenter:
    return Fragmenter(params, cfg.n_fragments, cfg.diloco.fragmentation)


def learner_math(cfg: RunConfig, frag: Fragmenter) -> LearnerMath:
    d = cfg.diloco
    H, P = d.sync_every, cfg.n_fragments

    def pseudo_grad_payload(base, local):
        # Δ = Θ_base[p] − θ_m[p], compressed for the wire; the syncer decodes to fp32.
        return compression.encode(outer.pseudo_grad(base, local), d.compression, d.sparse_density)

    def shard_view(base, payload):
        # θ[p] as the shard sees it once it decodes a lossy Δ: base − Δ̂. Kept as the
        # reference the next Δ is measured from (keep_local), so what Δ̂ left out goes out
        # again with the next one: the uplink's error feedback (docs/PROTOCOL.md)
        return [np.asarray(b, np.float32) - x for b, x in zip(base, compression.decode(payload))]

    return LearnerMath(
        get_fragment=frag.get,
        set_fragment=frag.set,
        rebase=frag.rebase,
        pseudo_grad_payload=pseudo_grad_payload,
        mix=outer.mix,
        due_fragment=lambda step: due_fragment(step, H, P),
        # data-parallel gradients travel uncompressed, as in a standard all-reduce
        grad_payload=lambda arrays: compression.encode([np.asarray(a, np.float32) for a in arrays], "fp32"),
        apply_delta=compression.apply_delta,
        digest=digest,
        shard_view=shard_view if d.uplink_feedback else None,
    )


def digest(arrays: list) -> str:
    """A short content digest of a list of arrays (dtype, shape and bytes): a fresh learner's
    Θ0 against the shard's (trainer/protocol/messages.py, Hello)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def contribution_combiner(cfg: RunConfig):
    """(old, new) -> one Contribution: two unsent Δs of one learner and fragment, waiting on a
    slow link, go out as their sum (they hold disjoint steps: docs/PROTOCOL.md), compressed
    as the run compresses pseudo-gradients; counters add up, staleness is the older's."""
    kind, density = cfg.diloco.compression, cfg.diloco.sparse_density

    def combine(old, new):
        total = [a + b for a, b in zip(compression.decode(old.payload), compression.decode(new.payload))]
        # sparse: the sum holds at most both Δs' entries per chunk, and keeps them all
        # (only the 2-bit levels are drawn again)
        return dataclasses.replace(new, base_version=min(old.base_version, new.base_version),
                                   c_steps=old.c_steps + new.c_steps, c_tokens=old.c_tokens + new.c_tokens,
                                   payload=compression.encode(total, kind, min(1.0, 2 * density)))
    return combine


def logged_combiner(cfg: RunConfig, emit):
    """contribution_combiner that also says so: `drop reason=combined` of the older seq,
    by_seq the newer (what the shards' own combining logs), through `emit(kind, **fields)`."""
    combine = contribution_combiner(cfg)

    def logged(old, new):
        emit("drop", what="contribution", fragment=old.fragment, learner=old.learner, incarnation=old.incarnation,
             seq=old.seq, reason="combined", by_seq=new.seq, where="outbox")
        return combine(old, new)
    return logged


# commit_audit: a commit whose Θ[p] has at most AUDIT_WHOLE values is sampled whole; a larger
# one at AUDIT_SAMPLE coordinates evenly spread over the flattened fragment (trainer/numerics/tally.py,
# whose learner-side record uses the same ones), with every Δ's norm and the RDA direction's
# (the judge's only inputs it cannot rebuild from the sample)
MATH_BUGS = frozenset({"steep_discount"})  # planted bugs that live in the math, not the cores


def syncer_math(cfg: RunConfig, frag: Fragmenter, bugs: frozenset = frozenset()) -> SyncerMath:
    d = cfg.diloco
    opt = outer.OuterOptimizer(cfg.outer)
    # DESIGN: plain weighted mean for the embedding fragment (RDA's renormalisation
    # suits dense layers; embedding rows updated by few tokens would be stretched).
    # The cores do not pass p to the math, so the embedding fragment is recognised
    # by its exact list of leaf shapes.
    mean_sigs = {_signature(frag, p) for p in range(cfg.n_fragments) if frag.is_embedding(p)}

    def kind_of(theta, mean):
        kind = "mean" if mean else d.merge  # mean: a closing round (trainer/protocol/syncer_core.py)
        if kind == "rda" and tuple(tuple(np.shape(a)) for a in theta) in mean_sigs:
            kind = "mean"
        return kind

    def merge_and_step(theta, outer_state, deltas, weights, scale=1.0, mean=False):
        merged = outer.merge(deltas, weights, kind_of(theta, mean))
        if scale != 1.0:
            merged = [np.float32(scale) * x for x in merged]
        return opt.step(theta, outer_state, merged)

    def weight(c_tokens, c_steps, staleness):
        return outer.contribution_weight(c_tokens, c_steps, staleness, d.weighting, d.staleness_discount, bugs)

    def audit(theta, outer_state, deltas, weights, theta_after, outer_after, closing):
        kind = kind_of(theta, closing)
        flat = [np.concatenate([np.ravel(np.asarray(a, np.float32)) for a in arrays]) if len(arrays) else
                np.zeros(0, np.float32) for arrays in (theta, outer_state, theta_after, outer_after, *deltas)]
        n = flat[0].size
        idx = audit_index(n)
        pick = (lambda x: x) if idx is None else (lambda x: x[idx] if x.size else x)
        th, tr, th2, tr2, *ds = (_b64(pick(x)) for x in flat)
        out = {"merge": kind, "weights": [float(w) for w in weights], "theta": th, "trace": tr,
               "theta_after": th2, "trace_after": tr2, "deltas": ds,
               "sample": None if idx is None else AUDIT_SAMPLE, "size": int(n),
               "shapes": [list(np.shape(a)) for a in theta]}
        if idx is not None:  # what the sample cannot rebuild: the norms RDA takes over the whole fragment
            out["norms"] = [outer.fragment_norm(x) for x in deltas]
            if kind == "rda" and sum(weights) > 0:
                total = float(sum(weights))
                unit = [[np.float32(w / total) * np.asarray(a, np.float32) / np.float32(max(nrm, 1e-30)) for a in x]
                        for x, w, nrm in zip(deltas, weights, out["norms"]) if w > 0 and nrm > outer.EPS]
                out["direction_norm"] = outer.fragment_norm([sum(u[i] for u in unit) for i in range(len(theta))]) \
                    if unit else 0.0
        return out

    def average(grads, weights):
        return outer.merge(grads, weights, "mean")

    def broadcast_delta(theta, held):
        return compression.broadcast_delta(theta, held, d.broadcast_compression, d.sparse_density)

    def combine(a, b):  # two Δs of one learner with disjoint steps: their sum, kept in fp32
        return compression.encode([x + y for x, y in zip(compression.decode(a), compression.decode(b))], "fp32")

    def rms(arrays) -> float:  # the corrupt guard's size (float64: an fp32 sum of squares overflows)
        n = sum(int(np.size(a)) for a in arrays)
        return float(np.sqrt(sum(float(np.sum(np.square(np.asarray(a, np.float64)))) for a in arrays) / max(n, 1)))

    return SyncerMath(merge_and_step=merge_and_step, weight=weight, decode=compression.decode,
                      outer_init=opt.init, average=average, combine=combine, digest=digest, rms=rms, audit=audit,
                      broadcast_delta=None if d.broadcast_compression == "fp32" else broadcast_delta)


def _signature(frag: Fragmenter, p: int) -> tuple:
    return tuple(frag._shapes[path] for path in frag.leaf_paths(p))


def owners(topology: dict) -> dict[int, str]:
    """fragment p -> the syncer shard that owns it."""
    return {p: shard for shard, frags in topology["shards"].items() for p in frags}


def learner_config(cfg: RunConfig, topology: dict, learner: str, incarnation: int,
                   bugs: frozenset = frozenset()) -> LearnerConfig:
    d = cfg.diloco
    own = owners(topology)
    return LearnerConfig(learner=learner, incarnation=incarnation,
                         owners=[own[p] for p in range(cfg.n_fragments)],
                         mode=d.mode, tau=d.overlap, alpha=d.mixing, starve_cycles=d.starve_cycles,
                         keep_local=d.keep_local and d.mode in DILOCO_MODES, keep_on_fetch=d.keep_on_fetch,
                         keep_gap=KEEP_GAP, max_staleness=d.max_staleness,
                         align=d.align and d.mode == "decoupled", bugs=bugs)


def syncer_config(cfg: RunConfig, topology: dict, shard: str, bugs: frozenset = frozenset()) -> SyncerConfig:
    d = cfg.diloco
    return SyncerConfig(shard=shard, fragments=tuple(topology["shards"][shard]),
                        learners=tuple(topology["learners"]), mode=d.mode, quorum=d.quorum,
                        tau=d.overlap, grace_gamma=d.grace_factor, max_staleness=d.max_staleness,
                        fleet_share=d.fleet_share, share_by=d.share_by, downlink=d.downlink,
                        align=d.align and d.mode == "decoupled", guard_factor=d.guard_factor,
                        outer_warmup=cfg.outer.warmup, warmup_scale=min(1.0, cfg.outer.lr) / cfg.outer.lr, bugs=bugs)
