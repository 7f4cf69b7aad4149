"""Real processes under signals, ``worker -B``, RabbitMQ, a claim-only store, and SIGTERM.

Every test runs a window of every-1-s (and every-2-s) slots and checks, from what the
``record`` task wrote, that each slot executed exactly once with its deterministic
task id; a second record is tolerated only as a takeover re-send (same task id,
attempt >= 2) and is counted separately.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery_cluster import (
    EACH_MINUTE,
    EVERY_SECOND,
    EVERY_TWO,
    celery_cluster,
    check_exactly_once,
    grid,
    in_window,
    next_second,
    sleep_until,
    task_ids,
    wait_until,
)
from registry import CLAIM_ONLY_URLS, load_store_modules
from services import require_tcp

load_store_modules()

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _redis() -> None:
    require_tcp("Redis", "127.0.0.1", 6379)  # the records (and the default broker)


def test_four_beats_survive_sigterm_sigkill_and_sigstop(tmp_path: Path) -> None:
    with celery_cluster(tmp_path, two_seconds=True) as c:
        c.worker("worker", "-l", "warning")
        beats = [c.beat(f"beat{i}") for i in range(4)]
        c.wait_started([f"beat{i}" for i in range(4)])
        start = next_second()
        end = start + 6000
        sleep_until(start + 3600)  # mid-second: between sends
        beats[0].send_signal(signal.SIGTERM)
        beats[1].send_signal(signal.SIGKILL)
        beats[2].send_signal(signal.SIGSTOP)
        sleep_until(end + 1500)
        beats[2].send_signal(signal.SIGCONT)
        wanted = grid(EVERY_SECOND, start, end, 1000) | grid(EVERY_TWO, start, end, 2000)
        wanted |= grid(EACH_MINUTE, start, end, 60_000)
        verdict = check_exactly_once(c.wait_executed(wanted), wanted)
        assert beats[0].wait(5) == 0
        assert beats[1].wait(5) == -signal.SIGKILL
        assert beats[2].poll() is None and beats[3].poll() is None  # the stopped one resumed
        assert "Traceback" not in c.log("beat0") + c.log("beat2") + c.log("beat3")
        sent = in_window(c.sends(), wanted)
        per_beat = [sum(in_window(c.sends(f"beat{i}"), wanted).values()) for i in range(4)]
    assert verdict.once + 2 * len(verdict.takeovers) == verdict.executions
    assert set(sent) == task_ids(wanted) and max(sent.values()) <= 2, sent
    resent = sum(1 for n in sent.values() if n == 2)
    print(
        f"four beats, TERM/KILL/STOP: {verdict.summary()}; window sends per beat {per_beat}, "
        f"{resent} run(s) sent twice"
    )


def test_three_workers_with_embedded_beat(tmp_path: Path) -> None:
    with celery_cluster(tmp_path, two_seconds=True) as c:
        names = [f"w{i}" for i in range(3)]
        for name in names:
            c.embedded(name)
        c.wait_started(names)
        start = next_second()
        end = start + 5000
        sleep_until(end + 1500)
        wanted = grid(EVERY_SECOND, start, end, 1000) | grid(EVERY_TWO, start, end, 2000)
        wanted |= grid(EACH_MINUTE, start, end, 60_000)
        rows = c.wait_executed(wanted)
        verdict = check_exactly_once(rows, wanted)
        executors = Counter(r["pid"] for r in rows if (r["job"], r["slot"]) in wanted)
        sent = in_window(c.sends(), wanted)
        senders = [sum(in_window(c.sends(n), wanted).values()) for n in names]
    assert not verdict.takeovers  # nothing was interrupted
    assert verdict.once == verdict.runs == verdict.executions
    assert sent == Counter(dict.fromkeys(task_ids(wanted), 1)), sent
    print(
        f"three worker -B: {verdict.summary()}; window sends per worker {senders}; "
        f"executions per worker pid {sorted(executors.values())}"
    )


def test_rabbitmq_broker(tmp_path: Path) -> None:
    require_tcp("RabbitMQ", "127.0.0.1", 5672)
    with celery_cluster(tmp_path, broker="amqp://guest:guest@127.0.0.1:5672//") as c:
        c.worker("worker", "-l", "warning")
        names = [f"beat{i}" for i in range(3)]
        beats = [c.beat(n) for n in names]
        c.wait_started(names)
        start = next_second()
        end = start + 5000
        sleep_until(start + 2600)
        beats[0].send_signal(signal.SIGKILL)
        sleep_until(end + 1500)
        wanted = grid(EVERY_SECOND, start, end, 1000) | grid(EACH_MINUTE, start, end, 60_000)
        verdict = check_exactly_once(c.wait_executed(wanted), wanted)
        assert beats[0].wait(5) == -signal.SIGKILL
        sent = in_window(c.sends(), wanted)
    assert set(sent) == task_ids(wanted) and max(sent.values()) <= 2, sent
    print(f"RabbitMQ broker, one beat SIGKILLed: {verdict.summary()}")


def test_claim_only_store_sends_at_most_once_per_slot(tmp_path: Path) -> None:
    with (
        CLAIM_ONLY_URLS["redis-stream-id"](tmp_path) as store,
        celery_cluster(tmp_path, store=store, two_seconds=True) as c,
    ):
        c.worker("worker", "-l", "warning")
        names = [f"beat{i}" for i in range(3)]
        for name in names:
            c.beat(name)
        c.wait_started(names)
        start = next_second()
        end = start + 5000
        sleep_until(end + 1500)
        wanted = grid(EVERY_SECOND, start, end, 1000) | grid(EVERY_TWO, start, end, 2000)
        wanted |= grid(EACH_MINUTE, start, end, 60_000)
        rows = c.wait_executed(wanted)
        verdict = check_exactly_once(rows, wanted)
        sends = c.sends()
    assert "strategy=stream-id" in store
    assert not verdict.takeovers and verdict.once == verdict.runs
    assert all(row["attempt"] == 1 for row in rows)
    twice = {task_id: n for task_id, n in sends.items() if n > 1}
    assert not twice, f"sent more than once: {twice}"  # over the whole life, not only the window
    assert in_window(sends, wanted) == Counter(dict.fromkeys(task_ids(wanted), 1))
    print(
        f"claim-only (redis stream-id): {verdict.summary()}; {sum(sends.values())} sends "
        f"in all ({len(sends)} distinct task ids), none twice"
    )


def test_sigterm_mid_tick_exits_cleanly_within_the_grace_period(tmp_path: Path) -> None:
    with celery_cluster(tmp_path) as c:  # no worker: the sends only queue up
        beat = c.beat("beat")
        c.wait_started(["beat"])
        slot = next_second()
        sleep_until(slot + 100)  # inside the jitter window (200 ms): claiming or sending
        began = time.monotonic()
        beat.send_signal(signal.SIGTERM)
        code = beat.wait(10)
        took = time.monotonic() - began
        log = c.log("beat")
    assert code == 0, log
    assert took < 2.0 + 1.5, f"took {took:.2f} s (grace 2 s)"  # anarchon_grace_ms=2000
    assert "Traceback" not in log
    print(f"SIGTERM mid-tick: exit {code} after {took:.2f} s")


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """A Redis URL whose server accepts connections and never answers: sends hang."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    done.set()
    thread.join(5)
    server.close()
    for conn in accepted:
        conn.close()


def test_sigterm_with_a_send_in_flight_exits_after_the_grace_period(
    tmp_path: Path, silent_broker: str
) -> None:
    with celery_cluster(tmp_path, broker=silent_broker, clean_broker=False) as c:
        beat = c.beat("beat")
        c.wait_started(["beat"])
        # The first send hangs the sender thread: the every-second entry's, or the
        # each-minute one's when the beat started just before a minute boundary.
        sending = ("sending every second (", "sending each-minute (")
        wait_until(lambda: any(s in c.log("beat") for s in sending), 10, "a send to start")
        time.sleep(0.2)  # the send hangs on the silent broker
        began = time.monotonic()
        beat.send_signal(signal.SIGTERM)
        code = beat.wait(10)
        took = time.monotonic() - began
        log = c.log("beat")
    assert code == 0, log
    assert 1.5 < took < 2.0 + 1.5, f"took {took:.2f} s (grace 2 s)"
    assert "handed over at stop" in log
    assert "Traceback" not in log
    print(f"SIGTERM with a hung send: exit {code} after {took:.2f} s, run handed over")
