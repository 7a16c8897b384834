# The two commands of the quickstart. Each creates .venv on first use and
# installs what is needed; nothing else needs installing by hand.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench

demo: $(STAMP)
	$(BIN)/ledger demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Benchmarks (not tests): every section in one run, results in bench/results/.
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	$(BIN)/python -m bench $(BENCH_ARGS)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)
