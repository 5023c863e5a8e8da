"""Real units under faults: `LocalCluster`, the `Control` protocol's host (harness/run/control.py)
with processes or docker containers as units (`cluster.py`, `docker_cluster.py`,
`docker_engine.py`, `procs.py`), the real Toxiproxy server and its client, and the process
tier's runner (`runner.py`), which drives the run loop and the injector of harness/run/.
Never imports the simulator tier (sim/), nor it this one."""
