"""The Celery app of the real-process test: ``celery -A celery_beat_app beat -S ...``.

Configured from the environment by the test: broker, queue, anarchon store, record key
(and ``ANARCHON_TEST_TWO_SECONDS=1`` adds an every-2-s entry with ``expires``,
``ANARCHON_TEST_TWENTY_SECONDS=1`` an every-20-s one). ``ANARCHON_TEST_STALL_AFTER_PUBLISH``
(a job's store name) makes this beat stall for good right after it published that job's
task, before the run is recorded: a runner that dies between publish and finish.
``ANARCHON_TEST_BAD_CONFIG=1`` adds three configuration problems (a settings typo, an
``anarchon_entries`` name that is no entry, an unknown per-entry key): beat must not start.
The ``record`` task appends (job, slot, task id, attempt, worker pid, its arguments, the
routing key and priority it was delivered with, its ``tenant`` header) to a Redis list.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery
from celery.schedules import crontab

app = Celery("anarchontest")
app.conf.update(
    broker_url=os.environ.get("ANARCHON_TEST_BROKER", "redis://127.0.0.1:6379/15"),
    task_default_queue=os.environ.get("ANARCHON_TEST_QUEUE", "anarchon-test"),
    broker_connection_retry_on_startup=True,
    enable_utc=True,
    timezone="UTC",
    anarchon_backend=os.environ.get("ANARCHON_TEST_STORE", "memory://"),
    anarchon_namespace="anarchontest",
    anarchon_jitter_ms=200,
    anarchon_grace_ms=2000,
    beat_schedule={
        "every second": {"task": "celery_beat_app.record", "schedule": 1.0},
        "each-minute": {"task": "celery_beat_app.record", "schedule": crontab(minute="*")},
    },
)
if os.environ.get("ANARCHON_TEST_TWO_SECONDS"):  # a second interval, with task options
    app.conf.beat_schedule["every-two-seconds"] = {
        "task": "celery_beat_app.record",
        "schedule": 2.0,
        "options": {"expires": 30},
    }

if os.environ.get("ANARCHON_TEST_TWENTY_SECONDS"):  # a horizon long enough for a takeover
    app.conf.beat_schedule["every-twenty-seconds"] = {
        "task": "celery_beat_app.record",
        "schedule": 20.0,
    }

if os.environ.get("ANARCHON_TEST_BAD_CONFIG"):  # three problems: a start must fail
    app.conf.anarchon_jiter_ms = 200
    app.conf.anarchon_entries = {"nosuch": {}, "every second": {"jitter": 3}}

_STALL = os.environ.get("ANARCHON_TEST_STALL_AFTER_PUBLISH")
if _STALL:
    from celery.signals import after_task_publish

    @after_task_publish.connect
    def _stall(headers: dict[str, Any] | None = None, **_: Any) -> None:
        sent = headers or {}
        if sent.get("anarchon_job") == _STALL:
            print(f"published {sent['anarchon_slot']}; stalling", flush=True)
            time.sleep(3600)


_RECORDS = os.environ.get("ANARCHON_TEST_RECORDS", "redis://127.0.0.1:6379/14")
_KEY = os.environ.get("ANARCHON_TEST_RECORD_KEY", "anarchon-test-records")


@app.task(bind=True)
def record(self, *args: Any, **kwargs: Any) -> None:
    request = self.request
    headers = request.headers or {}
    delivery = request.delivery_info or {}

    def header(name: str) -> object:
        return getattr(request, name, None) or headers.get(name)

    row = {
        "job": header("anarchon_job"),
        "slot": header("anarchon_slot"),
        "attempt": header("anarchon_attempt"),
        "task_id": request.id,
        "pid": os.getpid(),
        "args": list(args),
        "kwargs": kwargs,
        "routing_key": delivery.get("routing_key"),
        "priority": delivery.get("priority"),
        "tenant": header("tenant"),
    }
    redis.Redis.from_url(_RECORDS).rpush(_KEY, json.dumps(row))
