"""``anarchon_celery.Scheduler``: a ``celery.beat.Scheduler`` whose entries run exactly once.

Every beat process (or ``worker -B``) builds the same anarchon jobs from ``beat_schedule``;
the anarchon store picks one winner per (job, slot), and only the winner sends the task.

Sends run in one daemon thread per beat, in order, on beat's own publishing producer (as
stock beat publishes): a thread per send and a producer-pool acquire per send cost about
as much CPU as the send itself, and beat is bound by one core (the GIL).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import uuid
from collections.abc import Callable
from typing import Any

from celery import beat  # type: ignore[import-untyped]

from anarchon_core.backend import local_note
from anarchon_core.backends import backend_from_url, mask_url
from anarchon_core.background import BackgroundScheduler
from anarchon_core.context import RunContext
from anarchon_core.errors import ConfigurationError
from anarchon_core.scheduler import Scheduler as CoreScheduler

from ._mapping import EntryPlan, Settings, app_zone, plan_entry, read_settings

__all__ = ["TICK_SECONDS", "Scheduler", "task_id_for"]

logger = logging.getLogger("anarchon.celery")

#: The longest sleep ``tick()`` asks for, so beat notices a fatal engine error quickly.
TICK_SECONDS = 1.0
_TASK_ID_NAMESPACE = uuid.UUID("6f1c1f4e-3a5e-5a43-9d53-6e6172636860")


def task_id_for(job: str, slot: int) -> str:
    """The deterministic Celery task id of a run: uuid5 of the store job name and slot."""
    return str(uuid.uuid5(_TASK_ID_NAMESPACE, f"{job}@{slot}"))


#: Most sends answered to the engine in one wake-up of its loop.
ANSWER_BATCH = 32


class _Send:
    """One queued send: the call and the engine-loop future its run awaits."""

    __slots__ = ("call", "future")

    def __init__(self, future: asyncio.Future[None], call: Callable[[], None]) -> None:
        self.future = future
        self.call = call


class _Sender:
    """One daemon thread that runs the winners' sends, in order.

    A daemon thread, so that a send hanging on a broker that never answers cannot keep
    the process alive past the grace period; a send whose run was cancelled before it
    started (grace expired, lease lost) is dropped. Outcomes go back to the engine's
    loop in batches (one wake-up per :data:`ANSWER_BATCH` sends, or when the queue runs
    dry): a wake-up per send cost as much as the rest of the hand-off.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Send | None] | None = None

    def submit(self, call: Callable[[], None]) -> asyncio.Future[None]:
        """Queue ``call``; the returned future (of the running loop) ends with it."""
        send = _Send(asyncio.get_running_loop().create_future(), call)
        with self._lock:
            if self._queue is None:
                self._queue = queue.SimpleQueue()
                thread = threading.Thread(
                    target=self._serve,
                    args=(self._queue,),
                    name="anarchon-celery-send",
                    daemon=True,
                )
                thread.start()
            self._queue.put(send)
        return send.future

    def close(self) -> None:
        """Let the thread end after the sends already queued (never waits for it)."""
        with self._lock:
            pending, self._queue = self._queue, None
        if pending is not None:
            pending.put(None)

    @staticmethod
    def _serve(pending: queue.SimpleQueue[_Send | None]) -> None:
        answers: list[tuple[_Send, Exception | None]] = []
        while True:
            if answers and (len(answers) >= ANSWER_BATCH or pending.empty()):
                _answer(answers)
                answers = []
            send = pending.get()
            if send is None:
                break
            if send.future.cancelled():  # read across threads: at worst sent, then dropped
                continue
            try:
                send.call()
            except Exception as exc:  # delivered to the run, which records it
                answers.append((send, exc))
            except BaseException as exc:  # SystemExit & co. would end the engine's loop
                answers.append((send, RuntimeError(f"the send raised {exc!r}")))
            else:
                answers.append((send, None))
        _answer(answers)


def _answer(answers: list[tuple[_Send, Exception | None]]) -> None:
    """Hand outcomes to their loops, one ``call_soon_threadsafe`` per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Send, Exception | None]]] = {}
    for answer in answers:
        by_loop.setdefault(answer[0].future.get_loop(), []).append(answer)
    for loop, batch in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: abandoned at stop
            loop.call_soon_threadsafe(_settle, batch)


def _settle(batch: list[tuple[_Send, Exception | None]]) -> None:
    """On the loop: end each send's future (unless its run gave up waiting)."""
    for send, exc in batch:
        if send.future.done():
            continue
        if exc is None:
            send.future.set_result(None)
        else:
            send.future.set_exception(exc)


class Scheduler(beat.Scheduler):  # type: ignore[misc]
    """Run ``beat_schedule`` through anarchon: each due task is sent by exactly one beat.

    The constructor and :meth:`setup_schedule` validate only (no I/O, no threads); the
    engine starts in a background thread at the first :meth:`tick`.
    """

    def __init__(self, app: Any, *args: Any, lazy: bool = False, **kwargs: Any) -> None:
        self._settings: Settings | None = None
        self._plans: dict[str, EntryPlan] = {}
        self._core: CoreScheduler | None = None
        self._background: BackgroundScheduler | None = None
        self._lifecycle = threading.Lock()
        self._sender = _Sender()
        super().__init__(app, *args, lazy=lazy, **kwargs)

    # -- set-up (no I/O) -------------------------------------------------------------
    def setup_schedule(self) -> None:
        """Read the entries as beat does and map every one; refuse what cannot map."""
        super().setup_schedule()
        settings = read_settings(self.app)
        unknown = sorted(set(settings.entries) - set(self.schedule))
        if unknown:
            raise ConfigurationError(
                f"anarchon_entries names {unknown[0]!r}, which is not a beat_schedule entry; "
                f"entries: {', '.join(sorted(self.schedule)) or '(none)'}"
            )
        needs_zone = any(
            type(e.schedule).__name__ == "crontab" and "tz" not in settings.entries.get(n, {})
            for n, e in self.schedule.items()
        )
        zone = app_zone(self.app, settings.allow_local_tz) if needs_zone else "UTC"
        plans: dict[str, EntryPlan] = {}
        seen: dict[str, str] = {}
        for name in sorted(self.schedule):
            plan = plan_entry(self.schedule[name], settings, zone)
            if plan.name in seen:
                raise ConfigurationError(
                    f"beat entries {seen[plan.name]!r} and {name!r} map to the same job name "
                    f"{plan.name!r}: rename one"
                )
            seen[plan.name] = name
            plans[name] = plan
        self._settings, self._plans = settings, plans
        self._core = self._build_core(settings, plans)

    def _build_core(self, settings: Settings, plans: dict[str, EntryPlan]) -> CoreScheduler:
        defaults: dict[str, Any] = {}
        if settings.jitter_ms is not None:
            defaults["jitter_ms"] = settings.jitter_ms
        core = CoreScheduler(
            settings.backend,
            namespace=settings.namespace,
            instance_id=settings.instance_id,
            grace_ms=settings.grace_ms,
            candidates=settings.candidates,
            **settings.scheduler,
            **defaults,
        )
        catch_up = settings.catch_up
        if catch_up is None:
            catch_up = "latest" if core.backend.capabilities.lease else "none"
        for name, plan in plans.items():
            options = dict(plan.options)
            if settings.catch_up is not None or core.backend.capabilities.lease:
                options.setdefault("catch_up", catch_up)
            try:
                core.add_job(plan.name, plan.schedule, self._handler(name, plan), **options)
            except ConfigurationError as exc:
                raise ConfigurationError(f"beat entry {name!r}: {exc}") from None
        core.validate()  # lease-only options on a claim-only store: refuse now
        return core

    def _handler(self, entry_name: str, plan: EntryPlan) -> Any:
        async def send(ctx: RunContext) -> None:
            await self._sender.submit(lambda: self._send(entry_name, plan, ctx))

        send.__name__ = send.__qualname__ = f"send:{entry_name}"
        return send

    def _send(self, entry_name: str, plan: EntryPlan, ctx: RunContext) -> None:
        """Send the entry's task for this run (in the sender thread) on beat's producer.

        A publish error fails the attempt.
        """
        entry = self.schedule[entry_name]
        args = beat._evaluate_entry_args(entry.args)
        kwargs = beat._evaluate_entry_kwargs(entry.kwargs)
        options = dict(entry.options)
        headers = dict(options.get("headers") or {})
        headers.setdefault("celery_beat_task", True)
        assert self._settings is not None
        job = f"{self._settings.namespace}:{plan.name}"
        headers.update(anarchon_job=job, anarchon_slot=ctx.slot, anarchon_attempt=ctx.attempt)
        options["headers"] = headers
        if "task_id" not in options:
            options["task_id"] = (
                str(uuid.uuid4())
                if self._settings.task_id == "random"
                else task_id_for(job, ctx.slot)
            )
        ctx.meta["task_id"] = options["task_id"]
        ctx.logger.info("sending %s (%s) as %s", entry_name, entry.task, options["task_id"])
        self.app.send_task(entry.task, args, kwargs, producer=self.producer, **options)

    # -- beat's loop ------------------------------------------------------------------
    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Start the engine on the first call; then report how long beat may sleep.

        :raises Exception: the engine failed for good (beat then stops).
        """
        with self._lifecycle:
            if self._core is None:
                self.setup_schedule()
            core = self._core
            assert core is not None
            if self._background is None:
                background = BackgroundScheduler(core)
                background.start()
                self._background = background
        failed = core.failed
        if failed is not None:
            raise RuntimeError(f"anarchon cannot use its store: {failed}") from failed
        if not self._background.running:
            raise RuntimeError("the anarchon scheduler thread ended unexpectedly")
        return float(min(self.max_interval or TICK_SECONDS, TICK_SECONDS))

    def close(self) -> None:
        """Stop claiming, hand in-flight sends over within ``anarchon_grace_ms``.

        Idempotent and never raises.
        """
        with self._lifecycle:
            background, self._background = self._background, None
        if background is not None:
            try:
                background.stop()
            except Exception:  # pragma: no cover - BackgroundScheduler.stop never raises
                logger.exception("anarchon scheduler did not stop cleanly")
        self._sender.close()
        try:
            super().close()
        except Exception:
            logger.exception("beat: releasing the publishing connection failed")

    @property
    def info(self) -> str:
        """The banner line: store (masked), namespace and entry count. No I/O."""
        try:
            settings = self._settings or read_settings(self.app)
        except ConfigurationError as exc:
            return f"anarchon: configuration error: {exc}"
        count = len(self._plans) if self._plans else len(self.app.conf.beat_schedule or {})
        try:  # builds the store's adapter only: no connection is made
            store = self._core.backend if self._core else backend_from_url(settings.backend)
            local = local_note(store)
        except ConfigurationError:
            local = ""
        return (
            f"anarchon: store {mask_url(settings.backend)}{local}, namespace "
            f"{settings.namespace!r}, {count} entr{'y' if count == 1 else 'ies'}"
        )
