"""Settings of the test project; ``ANARCHON_TEST_DJANGO_DB`` picks the database.

``sqlite`` (default) uses files, never ``:memory:``: the subprocess tests and the ORM
backend's own thread open their own connections, which see nothing of an in-memory
database. ``postgres`` uses the local server (``ANARCHON_TEST_POSTGRES_HOST`` …), and
``mysql`` the local MariaDB/MySQL server as root (``ANARCHON_TEST_MYSQL_HOST``, ``_PORT``,
``_USER``, ``_PASSWORD``), whose test database has a case-insensitive default collation,
as most MySQL databases have: the store's key columns must compare exactly regardless.

The tests run on a test database of their own; ``NAME`` is a database that exists (the
server's ``test``, one SQLite file for every run), as ``manage.py check`` connects to it
from Django 6.1 on: its model checks run against every database.

The process tests start ``manage.py anarchon run`` children on the test database:
``ANARCHON_TEST_DJANGO_NAME`` replaces the database NAME (the parent's test database),
``ANARCHON_TEST_BACKEND`` the store URL, ``ANARCHON_TEST_SETTINGS`` (JSON) is merged into
``ANARCHON`` and ``ANARCHON_TEST_TIME_ZONE`` sets ``TIME_ZONE``; ``shop/jobs.py`` reads
its jobs from ``ANARCHON_TEST_JOBS``.
"""

from __future__ import annotations

import json
import os
import tempfile
from importlib.util import find_spec
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent
ENGINE = os.environ.get("ANARCHON_TEST_DJANGO_DB", "sqlite")
_DATA = Path(os.environ.get("ANARCHON_TEST_DJANGO_DIR", tempfile.gettempdir()))

if ENGINE == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("ANARCHON_TEST_POSTGRES_DB", "test"),
            "USER": os.environ.get("ANARCHON_TEST_POSTGRES_USER", "postgres"),
            "HOST": os.environ.get("ANARCHON_TEST_POSTGRES_HOST", "127.0.0.1"),
            "PORT": os.environ.get("ANARCHON_TEST_POSTGRES_PORT", "5432"),
            "TEST": {"NAME": f"anarchon_django_test_{os.getpid()}"},
        }
    }
elif ENGINE == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": os.environ.get("ANARCHON_TEST_MYSQL_DB", "test"),
            "USER": os.environ.get("ANARCHON_TEST_MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("ANARCHON_TEST_MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("ANARCHON_TEST_MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("ANARCHON_TEST_MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {
                "NAME": f"test_anarchon_{os.getpid()}",
                "CHARSET": "utf8mb4",
                "COLLATION": "utf8mb4_unicode_ci",
            },
        }
    }
elif ENGINE == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(_DATA / "anarchon-django.sqlite3"),
            "TEST": {"NAME": str(_DATA / f"anarchon-django-test-{os.getpid()}.sqlite3")},
        }
    }
else:
    raise RuntimeError(f"ANARCHON_TEST_DJANGO_DB={ENGINE!r}: use sqlite, postgres or mysql")
if os.environ.get("ANARCHON_TEST_DJANGO_NAME"):
    DATABASES["default"]["NAME"] = os.environ["ANARCHON_TEST_DJANGO_NAME"]

SECRET_KEY = "anarchon-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
TIME_ZONE = os.environ.get("ANARCHON_TEST_TIME_ZONE", "UTC")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "django_project.urls"
STATIC_URL = "static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "anarchon_django",
    "django_project.shop",
    # The rows that `manage.py anarchon import-celery-beat` reads (tests/django/
    # test_celery_beat_import.py); a test dependency, in the dev extra.
    *(["django_celery_beat"] if find_spec("django_celery_beat") else []),
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

ANARCHON = {
    "HEARTBEAT_MS": int(os.environ.get("ANARCHON_TEST_HEARTBEAT_MS", "200")),
    "JITTER_MS": 0,
    **(
        {"BACKEND": os.environ["ANARCHON_TEST_BACKEND"]}
        if "ANARCHON_TEST_BACKEND" in os.environ
        else {}
    ),
    **json.loads(os.environ.get("ANARCHON_TEST_SETTINGS", "{}")),
}
