"""A tiny decoder-only transformer language model in pure JAX.

Why no flax: one dependency fewer, and the parameters are an explicit dict pytree
with stable, human-readable names. Decoupled DiLoCo moves parameters around by
*leaf* (fragments are sets of leaves, pseudo-gradients are lists of leaf arrays,
checkpoints are dicts), so a plain dict is the most convenient representation;
a module system would only add a layer to unwrap.

Parameter names (every leaf float32):

    embed/tok        V x D   token embedding
    embed/pos        C x D   learned positions (C = context)
    layer_i/ln1      D       RMSNorm scale before attention
    layer_i/qkv      D x 3 x H x K  fused query/key/value projection (K = D/H)
    layer_i/attn_out H x K x D
    layer_i/ln2      D       RMSNorm scale before the MLP
    layer_i/mlp_up   D x F
    layer_i/mlp_down F x D
    final/ln         D
    final/unembed    D x V   untied output head

Pre-norm residual blocks, causal multi-head attention, GELU MLP, no biases.
`layer_i` sub-dicts matter: strided fragmentation assigns whole layers. The head
count lives in the `qkv` shape, so `apply(params, tokens)` needs no config.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from diloco_chaos.trainer.config import ModelConfig

Params = dict


def init_params(cfg: ModelConfig, key: jax.Array) -> Params:
    """Normal(0, 0.02) matrices; residual output projections scaled by 1/sqrt(2·n_layers)
    (GPT-2 style) so the residual stream does not grow with depth; norm scales = 1."""
    D, F, V, C = cfg.d_model, cfg.d_ff, cfg.vocab, cfg.context
    H, K = cfg.n_heads, cfg.d_model // cfg.n_heads
    std, out_std = 0.02, 0.02 / (2 * cfg.n_layers) ** 0.5

    def normal(k, shape, s):
        return s * jax.random.normal(k, shape, jnp.float32)

    k_tok, k_pos, k_un, k_layers = jax.random.split(key, 4)
    params: Params = {
        "embed": {"tok": normal(k_tok, (V, D), std), "pos": normal(k_pos, (C, D), std)},
        "final": {"ln": jnp.ones((D,), jnp.float32), "unembed": normal(k_un, (D, V), std)},
    }
    for i in range(cfg.n_layers):
        k_qkv, k_out, k_up, k_down = jax.random.split(jax.random.fold_in(k_layers, i), 4)
        params[f"layer_{i}"] = {
            "ln1": jnp.ones((D,), jnp.float32),
            "qkv": normal(k_qkv, (D, 3, H, K), std),
            "attn_out": normal(k_out, (H, K, D), out_std),
            "ln2": jnp.ones((D,), jnp.float32),
            "mlp_up": normal(k_up, (D, F), std),
            "mlp_down": normal(k_down, (F, D), out_std),
        }
    return params


def n_layers_of(params: Params) -> int:
    return sum(1 for k in params if k.startswith("layer_"))


def _rms_norm(x_BxLxD: jax.Array, scale_D: jax.Array) -> jax.Array:
    ms_BxLx1 = jnp.mean(jnp.square(x_BxLxD), axis=-1, keepdims=True)
    return x_BxLxD * jax.lax.rsqrt(ms_BxLx1 + 1e-6) * scale_D[None, None, :]


def _attention(p: Params, x_BxLxD: jax.Array) -> jax.Array:
    L, K = x_BxLxD.shape[1], p["qkv"].shape[-1]
    qkv_BxLx3xHxK = jnp.einsum("bld,dthk->blthk", x_BxLxD, p["qkv"])
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = (qkv_BxLx3xHxK[:, :, j] for j in range(3))
    scores_BxHxLxL = jnp.einsum("bqhk,bthk->bhqt", q_BxLxHxK, k_BxLxHxK) * (K ** -0.5)
    causal_LxL = jnp.tril(jnp.ones((L, L), dtype=bool))
    scores_BxHxLxL = jnp.where(causal_LxL[None, None], scores_BxHxLxL, jnp.float32(-1e30))
    probs_BxHxLxL = jax.nn.softmax(scores_BxHxLxL, axis=-1)
    out_BxLxHxK = jnp.einsum("bhqt,bthk->bqhk", probs_BxHxLxL, v_BxLxHxK)
    return jnp.einsum("blhk,hkd->bld", out_BxLxHxK, p["attn_out"])


def _mlp(p: Params, x_BxLxD: jax.Array) -> jax.Array:
    return jax.nn.gelu(x_BxLxD @ p["mlp_up"]) @ p["mlp_down"]


def apply(params: Params, tokens_BxL: jax.Array) -> jax.Array:
    """Logits for integer tokens; L <= context. Shapes (heads included) come from params."""
    L = tokens_BxL.shape[1]
    x_BxLxD = params["embed"]["tok"][tokens_BxL] + params["embed"]["pos"][:L][None]
    for i in range(n_layers_of(params)):
        p = params[f"layer_{i}"]
        x_BxLxD = x_BxLxD + _attention(p, _rms_norm(x_BxLxD, p["ln1"]))
        x_BxLxD = x_BxLxD + _mlp(p, _rms_norm(x_BxLxD, p["ln2"]))
    x_BxLxD = _rms_norm(x_BxLxD, params["final"]["ln"])
    return x_BxLxD @ params["final"]["unembed"]


def loss(params: Params, batch_BxL1: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy in nats. A batch row holds L+1 tokens: inputs are
    tokens[:, :-1], targets tokens[:, 1:]."""
    inputs_BxL, targets_BxL = batch_BxL1[:, :-1], batch_BxL1[:, 1:]
    logp_BxLxV = jax.nn.log_softmax(apply(params, inputs_BxL), axis=-1)
    nll_BxL = -jnp.take_along_axis(logp_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
    return jnp.mean(nll_BxL)
