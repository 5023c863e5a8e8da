# diloco-chaos: two commands from a fresh clone.
#   make demo  - set up, then run the default chaos scenario and print where the results are
#   make test  - set up, then run the test suites
# Setup is idempotent: a second run only checks stamps and is fast.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TOOLS  := .tools
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-loaded nightly clean clean-state bench

setup: $(STAMP) $(TOOLS)/toxiproxy-server $(TOOLS)/.browser $(TOOLS)/.docker

$(STAMP): pyproject.toml requirements.lock
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] >= (3, 11), "diloco-chaos needs Python >= 3.11 (CI tests 3.11), found " + sys.version.split()[0]'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "setup: installing pinned Python dependencies into $(VENV) (once; ~1-2 min)"
	@$(PY) -m pip install -q --disable-pip-version-check -r requirements.lock
	@$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	@touch $@

$(TOOLS)/toxiproxy-server: $(STAMP)
	@$(VENV)/bin/diloco-chaos setup --tools $(TOOLS)

$(TOOLS)/.browser:
	@bash scripts/install-browser.sh && mkdir -p $(TOOLS) && touch $@

$(TOOLS)/.docker:
	@bash scripts/install-docker.sh && mkdir -p $(TOOLS) && touch $@

demo: setup
	@$(VENV)/bin/diloco-chaos demo

# Two pytest-xdist workers: the tests that start real units all on one, one after the other
# (conftest.py `pytest_xdist_make_scheduler`), the unit and property suites on the other.
test: setup
	@$(PY) -m pytest -q -p no:cacheprovider -n 2 $(PYTEST_ARGS)

# The suites that run real units (processes, containers, two hosts) beside two busy
# processes, as on a shared CI runner: no test may fail because the machine is slow or busy.
test-loaded: setup
	@bash scripts/with-load.sh -n 2 -- $(PY) -m pytest -q -p no:cacheprovider suites/cluster suites/docker suites/multihost $(PYTEST_ARGS)

# The scheduled exploration: the property suites with the nightly Hypothesis profile (not
# derandomized: every run draws new schedules; 25x the ci examples, ~40 min on 2 cores),
# and every test marked `nightly` (two built-in scenarios on Docker, the restore audit's
# outer-state run, a fault-free planted-bug control on processes, the README's one-minute
# path from a fresh install; and, out of CI's ~20 min since 2026-11-29: the planted-bug
# runs on processes of 45-65 s whose bugs CI catches in the simulator (and a data-parallel
# control), the storage bugs' process run, the unit and link faults in containers, the
# run over two engines on loopback (CI's is suites/multihost), disk_full and a warm spare in
# containers, sparse kill-and-restart on processes, 300 back-to-back sharded steps, a
# journal bug on processes, the report index under xdist: ~27 min more).
# A failure is kept in .hypothesis/ and replayed first by the next run.
nightly: setup
	@HYPOTHESIS_PROFILE=nightly $(PY) -m pytest -q suites/properties $(PYTEST_ARGS)
	@HYPOTHESIS_PROFILE=nightly $(PY) -m pytest -q -m nightly suites/unit suites/cluster suites/docker $(PYTEST_ARGS)

bench: setup
	@for b in $(BENCHES); do $(VENV)/bin/diloco-chaos bench $$b || exit 1; done

clean:
	rm -rf $(VENV) $(TOOLS) runs .hypothesis

# What this project left outside the clone, for a run from a truly fresh state: its Docker
# containers, volumes and images (by label and name), the private engine's folder, its caches.
clean-state:
	@bash scripts/clean-state.sh
