# Two commands for a newcomer:  make run   |   make test
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=
# the offline demo model unless ARGS names a model (ARGS="--port 8000" keeps the demo)
DEMO = $(if $(filter --model% --demo,$(ARGS)),,--demo)

.PHONY: run test coverage venv dev clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: requirements.txt $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements-dev.txt $(VENV)/.installed
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

## make run: set up .venv and start the app (ARGS="--model DIR" for a real model; default --demo)
run: $(VENV)/.installed
	$(BIN)/python app_sensevoice.py $(DEMO) $(ARGS)

# pytest-xdist workers for make test: one per core, at most 4 (each may run app processes of its own)
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST := $(BIN)/python -m pytest -q --durations=25
# the suite in parallel (a file per worker at a time), then the timing-sensitive files (marker serial,
# tests/conftest.py SERIAL_FILES) alone; $(1) / $(2): more options for each run; $$rc: 0 if both passed
run_tests = rc=0; \
	$(PYTEST) $(1) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial" tests || rc=$$?; \
	$(PYTEST) $(2) -m serial tests || rc=$$?
COVERAGE_DIR := $(CURDIR)/.cache/coverage
COV := --cov=pipeline --cov-config=.coveragerc --cov-report=

## make test: set up .venv (with test tools), lint (ruff: pyflakes) and run every test; fails if any fails
test: $(VENV)/.installed-dev
	$(BIN)/ruff check pipeline tests bench app_sensevoice.py
	$(call run_tests,,); exit $$rc

## make coverage: make test's runs measuring line coverage of pipeline (app subprocesses included)
coverage: $(VENV)/.installed-dev
	rm -rf $(COVERAGE_DIR) && mkdir -p $(COVERAGE_DIR)
	export COVERAGE_FILE=$(COVERAGE_DIR)/.coverage; \
	$(call run_tests,$(COV),$(COV) --cov-append); \
	$(BIN)/coverage combine -q --append --rcfile=.coveragerc 2>/dev/null; \
	$(BIN)/coverage report --rcfile=.coveragerc --sort=-miss --format=markdown > $(COVERAGE_DIR)/report.md; \
	head -n 17 $(COVERAGE_DIR)/report.md; echo "total: $$($(BIN)/coverage report --rcfile=.coveragerc --format=total) %"; \
	exit $$rc

clean:
	rm -rf $(VENV) .pytest_cache
