"""A test app whose jobs.py the autodiscovery imports."""
