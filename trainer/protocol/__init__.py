"""The sans-IO protocol: the learner's and the syncer's cores, their types and messages, the
broadcast compression and outboxes, and the drivers and loop both tiers share (no JAX, no sockets)."""
