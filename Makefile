# Two commands a newcomer needs: `make run` and `make test`. Everything else bootstraps itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run relay test lint typecheck format clean

# Idempotent: re-installs only when pyproject.toml changed since the last install.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/bastion run examples.documents_api:service --config examples/documents_api/config.toml

relay: install
	$(BIN)/mailrelay

lint: install
	$(BIN)/ruff check src tests examples
	$(BIN)/ruff format --check src tests examples

typecheck: install
	$(BIN)/mypy

test: install lint typecheck
	$(BIN)/pytest

format: install
	$(BIN)/ruff format src tests examples
	$(BIN)/ruff check --fix src tests examples

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
