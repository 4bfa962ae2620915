# Two commands do all set-up on a fresh machine with Python 3.11:
#   make run    create .venv, install, train on the built-in corpus, then evaluate
#   make test   create .venv, install, run the test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed
WORKDIR ?= runs/default

.PHONY: run test lint bench clean-runs

# The install skips byte-compiling every installed file (about 12 of the 26 s it takes); Python writes
# the byte code of the modules a run imports, once, on first import. An environment that forbids that
# (PYTHONDONTWRITEBYTECODE, as this machine's does) would recompile them in every process, so it is unset here.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet --no-compile -e ".[test]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/python train.py --config=configs/default.py --workdir=$(WORKDIR)
	$(VENV)/bin/python eval.py --workdir=$(WORKDIR) --split=test

test: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 --dist worksteal -q --durations=15 tests

lint: $(STAMP)
	$(VENV)/bin/ruff check rank4jax tests configs bench *.py
	$(VENV)/bin/ruff format --check rank4jax tests configs bench *.py
