"""Jobs the check tests add through ``ANARCHON["IMPORT_PATHS"]`` (not loaded otherwise).

``naive.report`` is a cron job without ``tz`` (warning ``anarchon.W001`` when
``TIME_ZONE`` is not UTC); ``$ANARCHON_TEST_DUPLICATE`` also defines ``shop.sync``
again, which the shop app's ``jobs.py`` defines (error ``anarchon.E016``).
"""

from __future__ import annotations

import os

from anarchon_django import scheduler

scheduler.cron("naive.report", "0 6 * * *", lambda ctx: None)

if os.environ.get("ANARCHON_TEST_DUPLICATE"):
    scheduler.every("shop.sync", "5m", lambda ctx: None)
