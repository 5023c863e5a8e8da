"""Benchmarks (`diloco-chaos bench NAME` writes runs/bench/NAME.json): the registry
(`benches.py`), the runs they are made of (`runs.py`), the WAN, grace-window and
simulator benches. The top of harness/: it may import every other room."""
