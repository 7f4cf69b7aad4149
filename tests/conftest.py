"""The Django suite (``tests/django``) runs only with ``DJANGO_SETTINGS_MODULE`` set.

``make test`` runs it separately, once per database::

    DJANGO_SETTINGS_MODULE=django_project.settings ANARCHON_TEST_DJANGO_DB=sqlite \\
        python -m pytest tests/django
"""

from __future__ import annotations

import os

collect_ignore = [] if os.environ.get("DJANGO_SETTINGS_MODULE") else ["django", "django_project"]
