# Two commands for a newcomer:  make run   |   make test
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=
# the offline demo model unless ARGS names a model (ARGS="--port 8000" keeps the demo)
DEMO = $(if $(filter --model% --demo,$(ARGS)),,--demo)

.PHONY: run test venv dev clean

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

## make test: set up .venv (with test tools), lint (ruff: pyflakes) and run every test
test: $(VENV)/.installed-dev
	$(BIN)/ruff check pipeline tests bench app_sensevoice.py
	$(BIN)/python -m pytest -q --durations=25 tests

clean:
	rm -rf $(VENV) .pytest_cache
