"""Judging a run from its event log alone: the history of rounds (`history.py`), metrics
and goodput (`metrics.py`, `ledger.py`, `participation.py`, `losses.py`), the checks
(`check_base.py`, `checks.py`, `model_checks.py`), the verdict (`judge.py`) and its text
table (`report_text.py`). Imports nothing of the runners and restores no checkpoint (the
global evals are lines the runner wrote: harness/run/global_eval.py): a log from any
tier, or from a user's own run, is judged the same way."""
