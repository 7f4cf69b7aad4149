# Two commands on a fresh machine: `make demo` and `make test`. `make test-matrix` runs
# every lane: Python 3.11 with Django 5.2 (`make test`), Python 3.13 with Django 6.x.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo prerequisites test test-django test-django-sqlite test-django-postgres test-django-mysql test-matrix test-py313 test-py313-quick test-py313-django test-py313-django-sqlite test-py313-django-postgres test-py313-django-mysql lint typecheck bench bench-servers docs docs-serve clean

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

# The Python 3.13 lane, in .venv-py313 from the Python 3.13 that scripts/python3.13.sh
# finds (or builds once), with the newest Django 6.x, Celery, FastAPI and redis-py that
# install there; DJANGO=6.0 takes that series instead, in .venv-py313-django6.0. As
# everywhere, pytest makes every warning an error; PYTHONWARNINGS makes each
# DeprecationWarning one in the processes that the tests start too.
PY313_VENV := .venv-py313$(if $(DJANGO),-django$(DJANGO))
PY313 := $(PY313_VENV)/bin/python
PY313_STAMP := $(PY313_VENV)/.installed
PY313_TEST := PYTHONWARNINGS=error::DeprecationWarning $(PY313) -m pytest -W error::DeprecationWarning

$(PY313_STAMP): pyproject.toml | prerequisites
	@echo "installing anarchon with the dev extra into $(PY313_VENV) (Python 3.13)"
	python="$$(scripts/python3.13.sh)" && "$$python" -m venv --clear $(PY313_VENV)
	$(PY313) -m pip install --quiet --upgrade pip
	$(PY313) -m pip install --disable-pip-version-check -e '.[dev]' $(if $(DJANGO),'django==$(DJANGO).*')
	touch $(PY313_STAMP)

test-py313: $(PY313_STAMP)
	$(PY313_TEST) -n 2 --dist loadfile
	$(MAKE) -j3 --output-sync test-py313-django

PY313_DJANGO_DBS := test-py313-django-sqlite test-py313-django-postgres test-py313-django-mysql
test-py313-django: $(PY313_DJANGO_DBS)
$(PY313_DJANGO_DBS): test-py313-django-%: $(PY313_STAMP)
	$(DJANGO_TEST) ANARCHON_TEST_DJANGO_DB=$* $(PY313_TEST) tests/django

# What `.ci/run` runs of the 3.13 lane, a few minutes: the core suite, the distributions
# with a user's first install, and the Django suite on SQLite without its multi-process
# tests (marked slow: they time children, which a loaded machine makes flaky).
test-py313-quick: $(PY313_STAMP)
	$(PY313_TEST) -n 2 --dist loadfile tests/core tests/test_packaging.py
	$(DJANGO_TEST) ANARCHON_TEST_DJANGO_DB=sqlite $(PY313_TEST) -m "not slow" tests/django

# Every lane, one after the other (about 40 minutes on 2 cores: docs/development.md).
test-matrix:
	$(MAKE) test
	$(MAKE) test-py313
	$(MAKE) test-py313-django DJANGO=6.0

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
	rm -rf $(VENV) .venv-py313* .pytest_cache .mypy_cache .ruff_cache
