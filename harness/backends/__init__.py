"""Real units under faults: the `Cluster` protocol and its local implementation with
processes or docker containers as units (`cluster.py`, `docker_cluster.py`,
`docker_engine.py`, `procs.py`), the real Toxiproxy server and its client, the injector
(Jepsen's nemesis: it targets only the `Cluster` protocol), the run loop both tiers share
(`run_loop.py`) and the process tier's runner (`runner.py`)."""
