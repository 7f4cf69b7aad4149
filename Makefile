# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo prerequisites test test-django test-django-sqlite test-django-postgres test-django-mysql lint typecheck bench bench-servers docs clean

DEMO_STAMP := $(VENV)/.demo-installed

$(BIN)/python:
	@echo "creating $(VENV)"
	$(PYTHON) -m venv $(VENV)

# The demo needs the core alone (croniter): seconds, not the dev extra's ~100 packages.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	@echo "installing anarchon (core only) into $(VENV)"
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar on -e .
	touch $(DEMO_STAMP)

# The system packages beside Python (MariaDB client headers, Chromium): see the script.
prerequisites:
	@scripts/prerequisites.sh

$(STAMP): pyproject.toml | $(BIN)/python prerequisites
	@echo "installing anarchon with the dev extra into $(VENV) (about 100 packages, a minute or two)"
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --disable-pip-version-check -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/anarchon demo

test: prerequisites $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 --dist loadfile
	$(MAKE) -j3 --output-sync test-django

# The Django adapter's suite, once per database: a file SQLite database, PostgreSQL
# (the local server, ANARCHON_TEST_POSTGRES_HOST/PORT/USER to change it) and MariaDB or
# MySQL (the local server as root, ANARCHON_TEST_MYSQL_HOST/PORT/USER/PASSWORD).
DJANGO_TEST := DJANGO_SETTINGS_MODULE=django_project.settings
DJANGO_DBS := test-django-sqlite test-django-postgres test-django-mysql
test-django: $(DJANGO_DBS)
$(DJANGO_DBS): test-django-%: $(STAMP)
	$(DJANGO_TEST) ANARCHON_TEST_DJANGO_DB=$* $(BIN)/python -m pytest tests/django

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m benchmarks

bench-servers: $(STAMP)
	$(BIN)/python -m benchmarks servers

# The documentation site, built strictly (as tests/test_docs_site.py does in `make test`)
# into .venv/site: open .venv/site/index.html.
docs: $(STAMP)
	$(BIN)/python -m mkdocs build --strict --site-dir $(VENV)/site

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
