"""RabbitMQ for the shared suites: the claim-only multi-process suite gets a fresh prefix.

The broker is ``$ANARCHON_TEST_RABBITMQ`` (default ``amqp://guest:guest@127.0.0.1:5672/``);
when it does not answer, the tests skip (or fail under ``ANARCHON_REQUIRE_SERVICES=1``).

Every store gets its own random queue prefix and a one-second expiry margin, so that
tests never see each other's runs and every run queue a test creates is deleted by the
broker itself a second or two after its horizon (nothing is left behind); the prefix's
layout marker exchange is deleted when the test ends. The RabbitMQ backend is
claim-only, so it does not join the conformance suite (written for lease stores).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aio_pika
import registry
from services import free_port, require_answer, run_sync, service_unreachable

from anarchon_core.backend import SCHEMA_VERSION

RABBITMQ_URL = os.environ.get("ANARCHON_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")


def require_rabbitmq() -> str:
    """The broker URL, or skip (fail under CI) when it does not answer; asked once."""

    async def probe() -> None:
        connection = await aio_pika.connect(RABBITMQ_URL, timeout=3)
        await connection.close()

    return require_answer("RabbitMQ", RABBITMQ_URL, probe)


def fresh_prefix() -> str:
    return f"anarchon-t{secrets.token_hex(5)}."


def url_with(url: str = RABBITMQ_URL, **params: str) -> str:
    """``url`` with extra query parameters."""
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query), *params.items()]
    return urlunsplit(parts._replace(query=urlencode(query)))


def delete_markers(prefix: str) -> None:
    """Delete the layout marker exchanges a test created under ``prefix``."""

    async def delete() -> None:
        connection = await aio_pika.connect(RABBITMQ_URL, timeout=5)
        try:
            channel = await connection.channel()
            for version in range(1, SCHEMA_VERSION + 2):
                await channel.exchange_delete(f"{prefix}layout.v{version}")
        finally:
            await connection.close()

    run_sync(delete)


def rabbitmqctl() -> str:
    """The ``rabbitmqctl`` binary; skip (fail under CI) unless this process may use it."""
    binary = shutil.which("rabbitmqctl") or shutil.which("rabbitmqctl", path="/usr/sbin")
    if binary is None or os.geteuid() != 0:
        service_unreachable("rabbitmqctl", "it is missing or this process is not root")
    return binary


def close_connections(name: str) -> int:
    """Close, on the broker side, every connection whose client named itself ``name``."""
    binary = rabbitmqctl()
    listed = subprocess.run(
        [binary, "-q", "list_connections", "--no-table-headers", "pid", "client_properties"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    pids = [
        line.split("\t", 1)[0]
        for line in listed.stdout.splitlines()
        if f'{{"connection_name","{name}"}}' in line
    ]
    for pid in pids:
        subprocess.run(
            [binary, "-q", "close_connection", pid, "test: anarchon resilience"],
            capture_output=True,
            timeout=30,
            check=True,
        )
    return len(pids)


RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


class RabbitServer:
    """A throwaway RabbitMQ node of one test: own name, port and data directory.

    Started from the Debian package's ``rabbitmq-server`` script with every path pointed
    into ``directory`` (it needs root, like ``rabbitmqctl``); ``guest`` may log in over
    loopback. Starting takes about five seconds, a graceful stop about one.
    """

    def __init__(self, directory: Path) -> None:
        if not os.path.exists(RABBITMQ_SERVER) or os.geteuid() != 0:
            service_unreachable("a throwaway RabbitMQ node", f"{RABBITMQ_SERVER} needs root")
        self.directory = directory
        self.port = free_port()
        self.name = f"anarchon-t{secrets.token_hex(4)}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None
        (directory / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\n")
        (directory / "enabled_plugins").write_text("[].\n")
        (directory / "env.conf").write_text("")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def start(self, timeout: float = 30) -> RabbitServer:
        d = self.directory
        env = {
            "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(d),
            "RABBITMQ_CONF_ENV_FILE": str(d / "env.conf"),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(d / "expand"),
            "RABBITMQ_PID_FILE": str(d / "pid"),
        }
        log = open(d / "server.log", "ab")  # noqa: SIM115 - closed below
        try:
            self.proc = subprocess.Popen(
                [RABBITMQ_SERVER], env=env, cwd=d, stdout=log, stderr=log, start_new_session=True
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited: {self.log()}")
            if "Starting broker... completed" in self.log():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"rabbitmq-server did not start in {timeout} s: {self.log()}")

    def stop(self) -> None:
        """Stop gracefully (SIGTERM: the node syncs its queues to disk), or kill after 20 s."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # helpers (erl_child_setup) of this node only

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        path = self.directory / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


@registry.claim_only_url_factory("rabbitmq")
@contextmanager
def _rabbitmq_url(tmp_path: Path) -> Iterator[str]:
    url = require_rabbitmq()
    prefix = fresh_prefix()
    try:
        yield url_with(url, prefix=prefix, margin="1s")
    finally:
        delete_markers(prefix)
