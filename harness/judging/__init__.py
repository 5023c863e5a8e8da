"""Judging a run from its event log alone: the history of rounds (`history.py`), metrics
and goodput (`metrics.py`, `ledger.py`, `participation.py`, `losses.py`,
`global_eval.py`), the checks (`check_base.py`, `checks.py`, `model_checks.py`), the
verdict (`judge.py`) and its text table (`report_text.py`). Imports nothing of the
runners: a log from any tier, or from a user's own run, is judged the same way."""
