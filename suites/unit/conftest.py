"""Unit-suite setup for the JAX modules: strict rank promotion (a shape bug raises
instead of broadcasting silently) and float32 everywhere."""
from __future__ import annotations

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
