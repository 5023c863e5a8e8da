"""The fleet goodput model (`diloco-chaos fleet`): an analytic/Monte-Carlo model of
goodput at paper scale (`model.py`) and its page (`page.py`). Stands apart from the
cluster code: imports only harness/'s basics."""
