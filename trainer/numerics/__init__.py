"""The numerics: the model and its tasks, the inner and outer steps, fragments, checkpoints, the
shard's journal, and the wiring that binds them into the protocol's cores (JAX, optax, orbax)."""
