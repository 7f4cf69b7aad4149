"""A Django project for the anarchon_django tests (run with DJANGO_SETTINGS_MODULE set)."""
