# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-django test-django-sqlite test-django-postgres test-django-mysql lint typecheck bench bench-servers docs docs-serve clean

DEMO_STAMP := $(VENV)/.demo-installed

$(BIN)/python:
	@echo "creating $(VENV)"
	$(PYTHON) -m venv $(VENV)

# The demo needs the core alone (croniter): seconds, not the dev extra's ~100 packages.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	@echo "installing anarchon (core only) into $(VENV)"
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar on -e .
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml | $(BIN)/python
	@echo "installing anarchon with the dev extra into $(VENV) (about 100 packages, a minute or two)"
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --disable-pip-version-check -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/anarchon demo

test: $(STAMP)
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
# into .venv/site, for a web server to serve: its links are directory URLs and its search
# loads an index, neither of which works from file://. `make docs-serve` serves it.
docs: $(STAMP)
	$(BIN)/python -m mkdocs build --strict --site-dir $(VENV)/site
	@echo "built into $(VENV)/site; read it with 'make docs-serve' (opening its files does not work)"

docs-serve: $(STAMP)
	$(BIN)/python -m mkdocs serve --strict --dev-addr 127.0.0.1:8000

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
