# lossbed: every target sets itself up first. Run as root for the kernel features (namespaces,
# tc, nftables); `make setup` installs missing system packages with apt when run as root.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Rebuilt only when the dependencies change: a second `make setup` takes seconds.
STAMP := $(VENV)/.lossbed-installed

# VM hosts need qemu, a distribution kernel and busybox; Soft-RoCE needs rdma-core.
# The data plane's C core builds with gcc against Python's headers and OpenSSL's libcrypto.
SYSTEM_PACKAGES := gcc python3-dev libssl-dev iproute2 nftables ethtool openssh-server iputils-ping procps kmod \
	qemu-system-x86 linux-image-amd64 busybox-static \
	rdma-core ibverbs-utils python3-pyverbs perftest python3-apt python3-venv

# make bench LOSS=0.1: every variant at LOSS (a fraction) vs the lossless reference.
LOSS ?= 0.1
PROFILE ?= random-loss
HOSTS ?= 4
STEPS ?= 300
SEEDS ?= 4
BENCH_ARGS = --loss $(LOSS) --profile $(PROFILE) --hosts $(HOSTS) --steps $(STEPS) --seeds $(SEEDS) \
	$(BENCH_EXTRA)

# make provision INVENTORY=hosts.yml: the Ansible roles in ansible/ over the inventory.
INVENTORY ?= ansible/inventory.example.yml

.PHONY: setup system-packages test lint clean bench bench-full reproduce reproduce-full provision

setup: system-packages $(STAMP)

system-packages:
	@missing=""; \
	for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then echo "missing system packages:$$missing (run 'sudo make setup')"; exit 0; fi; \
	echo "installing system packages:$$missing"; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing \
	  || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; }

$(STAMP): pyproject.toml harness/transport/_wire.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: setup
	$(VENV)/bin/pytest --strict-markers tests

bench: setup
	$(VENV)/bin/lossbed bench $(BENCH_ARGS)

# Every variant (the ablations too), longer and with more seeds and loss realisations.
bench-full: STEPS = 1200
bench-full: SEEDS = 8
bench-full: BENCH_EXTRA = --variants reliable zero_fill unbiased unbiased_drift rps --realisations 5
bench-full: setup
	$(VENV)/bin/lossbed bench $(BENCH_ARGS)

# Both papers' claims measured here, with verdicts, and the regime map (harness/reproduce/):
# ~16 min, or ~4 hours (--full: rows 1-5 ~100 min, row 6 ~2 hours)
reproduce: setup
	$(VENV)/bin/lossbed reproduce --quick

reproduce-full: setup
	$(VENV)/bin/lossbed reproduce --full

provision: setup
	cd ansible && ../$(VENV)/bin/ansible-playbook -i $(abspath $(INVENTORY)) provision.yml

lint: setup
	$(VENV)/bin/ruff check .

# Removes every cluster lossbed made on this machine (found by name prefix), then caches.
clean:
	@if [ -x $(VENV)/bin/lossbed ]; then $(VENV)/bin/lossbed down --all; fi
	rm -rf .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
