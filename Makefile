# lossbed: every target sets itself up first. Run as root for the kernel features (namespaces,
# tc, nftables); `make setup` installs missing system packages with apt when run as root.

# The Python that makes the venv: the first of these that is 3.11 or newer (Ubuntu 22.04's
# python3 is 3.10, its python3.11 package is not); none: python3, which setup refuses with the
# fix. PYTHON=... chooses.
ifndef PYTHON
PYTHON := $(shell for p in python3 python3.13 python3.12 python3.11; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 \
	&& { echo $$p; exit 0; }; done; echo python3)
endif
# Where lossbed is installed. By default a .venv of its own, pinned by requirements.lock.
# On a GPU host whose Python already holds torch (a CUDA build):
#   make setup SYSTEM_SITE_PACKAGES=1   a .venv that also sees the system's packages
#   make setup VENV=/path/to/your/venv  install into your own environment, keeping what is there
# Either way the torch that is there is kept, never replaced (testbed/python_packages.py).
VENV ?= .venv
PY := $(VENV)/bin/python
# Rebuilt only when the dependencies change: a second `make setup` takes seconds.
STAMP := $(VENV)/.lossbed-installed

# The system packages each target needs, per distribution: testbed/system_packages.py (one
# table; `make setup PRINT=1` prints the apt command instead of running it). No kernel package
# is ever installed: VM hosts boot the distribution's kernel from .cache/vm/ (fetched there by
# `make setup`: testbed/clusters/vm/kernel.py). `make bench` needs no qemu and no kernel.

# make bench LOSS=0.1: every variant at LOSS (a fraction) vs the lossless reference.
LOSS ?= 0.1
PROFILE ?= random-loss
HOSTS ?= 4
STEPS ?= 150
SEEDS ?= 4
BENCH_ARGS = --loss $(LOSS) --profile $(PROFILE) --hosts $(HOSTS) --steps $(STEPS) --seeds $(SEEDS) \
	$(BENCH_EXTRA)

# make provision INVENTORY=hosts.yml: the Ansible roles in ansible/ over the inventory.
INVENTORY ?= ansible/inventory.example.yml

.PHONY: setup setup-bench vm-guest test test-gpu gpu-check mutate lint clean bench bench-full reproduce \
	reproduce-full provision

# setup: everything `make test` needs (its VM tests included); setup-bench: what a bench needs
ifdef PRINT
setup:
	@$(PYTHON) -m testbed.system_packages test --print
setup-bench:
	@$(PYTHON) -m testbed.system_packages bench --print
else
setup:
	@$(PYTHON) -m testbed.system_packages test
	@$(MAKE) --no-print-directory $(STAMP) vm-guest
setup-bench:
	@$(PYTHON) -m testbed.system_packages bench
	@$(MAKE) --no-print-directory $(STAMP)
endif

# VM hosts' kernel and busybox into lossbed's cache (apt-get download; nothing installed)
vm-guest: $(STAMP)
	@$(PY) -m testbed.clusters.vm.kernel fetch

# A venv made here carries .lossbed-made; one that exists without it is the user's, whose
# installed packages are all kept (--keep-installed).
$(STAMP): pyproject.toml requirements.lock harness/transport/_wire.c \
		harness/transport/wire.h harness/bench/_blaster.c
	test -x $(PY) || { $(PYTHON) -m venv $(if $(SYSTEM_SITE_PACKAGES),--system-site-packages) \
		$(VENV) && touch $(VENV)/.lossbed-made; }
	$(PY) -m testbed.python_packages constraints requirements.lock \
		$$(test -e $(VENV)/.lossbed-made || echo --keep-installed) > $(VENV)/.lossbed-constraints
	$(PY) -m pip install -q -c $(VENV)/.lossbed-constraints -e '.[dev]'
	touch $(STAMP)

# The unit tests on both cores (each file on one worker: they share no state); the tests that
# run clusters and ranks one at a time (their deadlines are timed: a busy core is loss).
test: setup
	$(VENV)/bin/pytest --strict-markers -n 2 --dist loadfile tests/unit
	$(VENV)/bin/pytest --strict-markers tests --ignore=tests/unit

# Mutation testing of the modules that decide a result (pyproject's [tool.mutmut]: which
# modules, which tests), in mutants/; not part of `make test`. Prints the score and every
# survivor (`mutmut show NAME` shows one).
mutate: setup
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children 2 || true
	$(VENV)/bin/python -m tests.mutation_score

# The hardware tier on a GPU host, with the Python that holds its CUDA torch (VENV=... names
# your own environment): one table and one JSON line; exit 3 where there is no GPU.
test-gpu: setup-bench
	$(PY) -m tests.hardware.tier

# On one GPU host (<= 8 min): how much of the lossy collective the DDP hook hides behind
# backward, and the collective's busbw (tests/hardware/gpu_check.py); exit 3 without a GPU.
gpu-check: setup-bench
	$(PY) -m tests.hardware.gpu_check

bench: setup-bench
	$(VENV)/bin/lossbed bench $(BENCH_ARGS)

# Every variant (the ablations too), longer and with more seeds and loss realisations.
bench-full: STEPS = 1200
bench-full: SEEDS = 8
bench-full: BENCH_EXTRA = --variants reliable zero_fill unbiased unbiased_drift rps --realisations 5
bench-full: setup-bench
	$(VENV)/bin/lossbed bench $(BENCH_ARGS)

# Both papers' claims measured here, with verdicts, and the regime map (harness/reproduce/):
# ~16 min, or ~4 hours (--full: rows 1-5 ~100 min, row 6 ~2 hours)
reproduce: setup-bench
	$(VENV)/bin/lossbed reproduce --quick

reproduce-full: setup-bench
	$(VENV)/bin/lossbed reproduce --full

provision: setup-bench
	cd ansible && ../$(VENV)/bin/ansible-playbook -i $(abspath $(INVENTORY)) provision.yml

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Removes every cluster lossbed made on this machine (found by name prefix), then caches.
clean:
	@if [ -x $(VENV)/bin/lossbed ]; then $(VENV)/bin/lossbed down --all; fi
	rm -rf .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
