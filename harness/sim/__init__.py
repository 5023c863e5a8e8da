"""The simulator tier: the same learner and syncer drivers as the processes, driven by a
virtual clock (`run.py`); the world, the simulator's host of the `Control` protocol
(`world.py`), its links (`net.py`; their state: `wire.py`) and the two hosts
(`learner.py`, `syncer.py`). Imports harness/run/ for the `Control` protocol, the
injector and the run loop; never the process tier (backends/), nor it this one."""
