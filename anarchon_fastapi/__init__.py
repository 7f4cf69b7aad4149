"""FastAPI adapter: one line in the lifespan, safe under ``uvicorn --workers N``.

.. code-block:: python

    from fastapi import Depends, FastAPI
    from anarchon_core import Scheduler
    from anarchon_fastapi import lifespan, router

    scheduler = Scheduler()  # $ANARCHON_BACKEND, else the embedded SQLite default

    app = FastAPI(lifespan=lifespan(scheduler))
    app.include_router(router(dependencies=[Depends(require_operator)]), prefix="/anarchon")

Each worker process is one instance; the shared store decides which one runs each
slot. The router needs ``dependencies`` that authenticate (``require_operator`` is
yours), or ``public=True`` for an unauthenticated read-only API. See
``docs/fastapi.md`` and ``docs/security.md``. This package imports nothing of another
adapter.
"""

from __future__ import annotations

from ._lifespan import STATE_KEY, SchedulerDep, get_scheduler, lifespan
from ._router import router

__all__ = ["STATE_KEY", "SchedulerDep", "get_scheduler", "lifespan", "router"]
