# The two commands of the README are `make up` and `make test`; the rest serve them.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test lint down reset setup jars chromium clean

setup: $(STAMP) jars chromium

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; kron needs Python 3.11" >&2; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

jars: $(STAMP)
	@$(BIN)/kron dev jars >/dev/null

# Debian's chromium, for the dashboard's browser test (Playwright drives it; it downloads
# no browser of its own). Installed once, as root or through `sudo -n`; where neither can,
# a warning (`make up` needs no browser) and the browser test fails saying so.
chromium:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    $$SUDO apt-get install -y -qq chromium >/dev/null; } \
	  || echo "warning: could not install chromium (Debian's package, as root)" >&2; }

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
