"""anarchon's core benchmarks: claim throughput, run lateness and idle cost.

Run all of them with ``python -m benchmarks`` (``make bench``) or one with
``python -m benchmarks.claims``, ``python -m benchmarks.lateness`` or
``python -m benchmarks.idle`` (and ``engine_cpu``); ``python -m benchmarks servers`` runs the store
benchmarks that need the local PostgreSQL, Redis, RabbitMQ and NATS, and
``python -m benchmarks fastapi_latency`` the FastAPI latency benchmark (closed and open
loop, about 14 minutes, so not part of the default run), ``python -m benchmarks
celery_beat`` the Celery beat comparison (about 12 minutes) and ``python -m benchmarks
chaos`` the chaos run on the real stores (10 minutes per store by default). Every figure
is measured when the benchmark runs; nothing is hard-coded. See ``docs/benchmarks.md``
for what each one measures.
"""

from __future__ import annotations

__all__ = ["APP_BENCHMARKS", "BENCHMARKS", "SERVER_BENCHMARKS"]

#: The benchmark modules ``python -m benchmarks`` runs, in order.
BENCHMARKS: tuple[str, ...] = ("claims", "lateness", "idle", "engine_cpu")
#: Benchmarks that need the local servers: ``python -m benchmarks servers`` runs them.
SERVER_BENCHMARKS: tuple[str, ...] = (
    "postgres_claims",
    "postgres_batch",
    "redis_claims",
    "broker_claims",
    "django_claims",
)
#: Long benchmarks, run by name only: an app served with the scheduler inside it, and
#: the chaos run on the real stores (minutes long).
APP_BENCHMARKS: tuple[str, ...] = (
    "fastapi_latency",
    "celery_beat",
    "chaos",
    "scale",
    "definitions_follow",
    "admin_definitions",
)
