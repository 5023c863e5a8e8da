"""Examples installed with the package: `diloco_chaos.examples.flax_mlp` is a task plug-in
(docs/TASKS.md) for a Flax model; flax-unit-loss.toml runs it (needs `diloco-chaos[flax]`)."""
