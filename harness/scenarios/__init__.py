"""Scenarios: the TOML format a user writes (`scenario.py`: reading and validating it,
built-ins, the failure process's draw; `specs.py`: its [cluster], [train] and [expect]
tables) and writing one back (`scenario_toml.py`).
Imports only harness/'s basics (units, errors, links) and faults/."""
