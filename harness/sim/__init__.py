"""The simulator tier: the same learner and syncer drivers as the processes, driven by a
virtual clock (`run.py`); the world that implements the `Cluster` protocol (`world.py`),
its links (`net.py`; their state: `wire.py`) and the two hosts (`learner.py`, `syncer.py`).
Imports backends/ for the `Cluster` protocol, the injector and the run loop, never the
other way."""
