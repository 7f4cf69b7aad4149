# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-django lint typecheck bench bench-servers clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/anarchon demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest
	$(MAKE) test-django

# The Django adapter's suite, once per database: a file SQLite database and PostgreSQL
# (the local server, ANARCHON_TEST_POSTGRES_HOST/PORT/USER to change it).
DJANGO_TEST := DJANGO_SETTINGS_MODULE=django_project.settings
test-django: $(STAMP)
	$(DJANGO_TEST) ANARCHON_TEST_DJANGO_DB=sqlite $(BIN)/python -m pytest tests/django
	$(DJANGO_TEST) ANARCHON_TEST_DJANGO_DB=postgres $(BIN)/python -m pytest tests/django

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m benchmarks

bench-servers: $(STAMP)
	$(BIN)/python -m benchmarks servers

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
