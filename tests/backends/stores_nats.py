"""NATS JetStream for the shared suites, and throwaway servers for the resilience tests.

The shared server is ``$ANARCHON_TEST_NATS`` (default ``nats://127.0.0.1:4222``); when it
does not answer, the tests skip (or fail under ``ANARCHON_REQUIRE_SERVICES=1``). Every
store gets its own random bucket, deleted when the test ends. Tests that restart a
server or need authentication start their own :class:`NatsServer` (own port, own data
directory, JetStream on) and never touch the shared one. The NATS backend is
claim-only, so it does not join the conformance suite (written for lease stores); it
joins the claim suite and the definitions suite.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path

import nats
import nats.js.errors
import registry
from nats.aio.client import Client
from services import free_port, require_answer, run_sync, service_unreachable

from anarchon_core.backend import Backend
from anarchon_core.backends.nats import DEFINITIONS_SUFFIX, NatsBackend

NATS_URL = os.environ.get("ANARCHON_TEST_NATS", "nats://127.0.0.1:4222")


async def _connect(url: str) -> Client:
    async def quiet(exc: Exception) -> None:
        pass

    return await nats.connect(
        url, connect_timeout=3, max_reconnect_attempts=1, reconnect_time_wait=0, error_cb=quiet
    )


def require_nats() -> str:
    """The shared server's URL, or skip (fail under CI) when it does not answer."""

    async def probe() -> None:
        nc = await _connect(NATS_URL)
        try:
            await nc.jetstream().account_info()
        finally:
            await nc.close()

    return require_answer("NATS JetStream", NATS_URL, probe)


def fresh_bucket() -> str:
    return f"anarchon_t{secrets.token_hex(5)}"


def delete_bucket(bucket: str, url: str = NATS_URL) -> None:
    """Delete a test's bucket and its definitions bucket (and their streams); a missing
    one is fine."""

    async def delete() -> None:
        nc = await _connect(url)
        try:
            for name in (bucket, f"{bucket}{DEFINITIONS_SUFFIX}"):
                with suppress(nats.js.errors.NotFoundError):
                    await nc.jetstream().delete_key_value(name)
        finally:
            await nc.close()

    run_sync(delete)


def nats_server_binary() -> str | None:
    return shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/bin")


class NatsServer:
    """A throwaway ``nats-server`` of one test: own port and data directory."""

    def __init__(
        self,
        directory: Path,
        *,
        jetstream: bool = True,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        binary = nats_server_binary()
        if binary is None:
            service_unreachable("nats-server", "the binary is not installed")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.jetstream = jetstream
        self.user, self.password = user, password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsServer:
        args = [self.binary, "-a", "127.0.0.1", "-p", str(self.port)]
        if self.jetstream:
            args += ["-js", "-sd", str(self.directory / "jetstream")]
        if self.user is not None:
            args += ["--user", self.user, "--pass", self.password or ""]
        log = open(self.directory / "nats-server.log", "ab")  # noqa: SIM115 - closed below
        try:
            self.proc = subprocess.Popen(args, stdout=log, stderr=log)
        finally:
            log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    if not self.jetstream or "Server is ready" in self.log():
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"nats-server did not start: {self.log()}")

    def stop(self) -> None:
        """Stop gracefully (SIGTERM: JetStream flushes its files), or kill after 10 s."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """Kill the server process at once (``SIGKILL``): nothing is flushed."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def log(self) -> str:
        path = self.directory / "nats-server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


@contextmanager
def nats_server(directory: Path, **options: str | bool | None) -> Iterator[NatsServer]:
    """A started throwaway server, stopped at the end."""
    server = NatsServer(directory, **options)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


@registry.claim_only_url_factory("nats")
@contextmanager
def _nats_url(tmp_path: Path) -> Iterator[str]:
    url = require_nats()
    bucket = fresh_bucket()
    try:
        yield f"{url}/?bucket={bucket}"
    finally:
        delete_bucket(bucket, url)


@registry.claim_only_backend_factory("nats")
@asynccontextmanager
async def _nats(tmp_path: Path) -> AsyncIterator[Backend]:
    url = require_nats()
    bucket = fresh_bucket()
    backend = NatsBackend(f"{url}/?bucket={bucket}")
    try:
        await backend.open()
        yield backend
    finally:
        await backend.close()
        delete_bucket(bucket, url)
