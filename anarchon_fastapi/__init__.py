"""FastAPI adapter: one line in the lifespan, safe under ``uvicorn --workers N``.

.. code-block:: python

    from fastapi import FastAPI
    from anarchon_core import Scheduler
    from anarchon_fastapi import lifespan, router

    scheduler = Scheduler()  # $ANARCHON_BACKEND, else the embedded SQLite default

    app = FastAPI(lifespan=lifespan(scheduler))
    app.include_router(router(), prefix="/anarchon")

Each worker process is one instance; the shared store decides which one runs each
slot. See ``docs/fastapi.md``. This package imports nothing of another adapter.
"""

from __future__ import annotations

from ._lifespan import STATE_KEY, SchedulerDep, get_scheduler, lifespan
from ._router import router

__all__ = ["STATE_KEY", "SchedulerDep", "get_scheduler", "lifespan", "router"]
