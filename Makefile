# The two commands of the README are `make up` and `make test`; the rest serve them.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test lint down reset setup jars clean

setup: $(STAMP) jars

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; kron needs Python 3.11" >&2; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

jars: $(STAMP)
	@$(BIN)/kron dev jars >/dev/null

up: setup
	$(BIN)/kron dev up

test: setup lint
	$(BIN)/pytest -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check streams schemas api replay kron bench tests
	$(BIN)/mypy streams schemas api replay kron bench

down:
	@test -x $(BIN)/kron && $(BIN)/kron dev down || echo "nothing to stop (no venv)"

reset: $(STAMP)
	$(BIN)/kron dev reset
