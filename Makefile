# The two commands of the quickstart. Each creates .venv on first use and
# installs what is needed; nothing else needs installing by hand: the system
# packages come from .ci/system-packages (apt-get as root on Debian; else one
# line says what to install, and the command goes on without it: the demo
# runs its own agent outside a cell, tests that need a missing part skip).
PYTHON ?= python3
SYSTEM_PACKAGES := .ci/system-packages
VENV   ?= .venv
BIN    := $(VENV)/bin
# .installed: Ledger with its test extras (test, typecheck); .installed-demo:
# Ledger alone, all the demo needs (a full install serves it too).
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test typecheck lint bench docs

demo: $(DEMO_STAMP)
	@$(SYSTEM_PACKAGES) demo || [ $$? = 78 ]
	$(BIN)/ledger demo

test: $(STAMP)
	@$(SYSTEM_PACKAGES) test || [ $$? = 78 ]
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The type gate: src/ under mypy --strict (pyproject.toml), then the tests,
# less strictly: their fixtures are typed, so a mistyped use fails, but a
# test's own helpers need not be annotated, and fetchone()["n"] on a query
# that always returns a row, or an attribute of an Optional the test just
# asserted, is the tests' idiom.
TEST_MYPY_FLAGS := --allow-untyped-defs --allow-incomplete-defs --allow-untyped-calls \
	--allow-any-generics --no-warn-return-any --check-untyped-defs \
	--disable-error-code index --disable-error-code union-attr --disable-error-code call-overload
# mypy cannot follow the editable install's import finder, which maps the
# top-level verifiers/ and drills/ to ledger.verifiers and ledger.drills: a
# tree of two links under .venv shows it the same names.
TYPECHECK_PATH := $(VENV)/typecheck
typecheck: $(STAMP)
	@mkdir -p $(TYPECHECK_PATH)/ledger
	@ln -sfn $(CURDIR)/verifiers $(TYPECHECK_PATH)/ledger/verifiers
	@ln -sfn $(CURDIR)/drills $(TYPECHECK_PATH)/ledger/drills
	MYPYPATH=$(CURDIR)/src:$(TYPECHECK_PATH) $(BIN)/python -m mypy
	MYPYPATH=$(CURDIR)/src:$(TYPECHECK_PATH) $(BIN)/python -m mypy $(TEST_MYPY_FLAGS) tests

# The lint gate: ruff (pyflakes, pycodestyle, import order; pyproject.toml)
# over the whole tree, zero findings. `ruff check --fix` mends import order.
lint: $(STAMP)
	$(BIN)/python -m ruff check .

# Benchmarks (not tests): every section in one run, results in bench/results/.
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	$(BIN)/python -m bench $(BENCH_ARGS)

# The documentation site (docs/, mkdocs.yml), built strictly: a broken link, a
# page missing from the navigation or a reference page that cannot be generated
# fails. The site lands in site/.
docs: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)
