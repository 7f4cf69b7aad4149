"""Claims per second and claim latency: the Django ORM backend, the core backend, raw SQL.

One process, one run, per database (``--db sqlite``, ``postgres``, ``mysql``, ``both``:
SQLite and PostgreSQL, or ``all``): Django is configured here (``settings.configure``,
``INSTALLED_APPS = ["anarchon_django"]``) on a throwaway SQLite file, a fresh PostgreSQL
database and a fresh MariaDB/MySQL database, and ``migrate`` creates the tables. In the
same run, interleaved every ``--chunk`` claims in rotating order:

* ``django backend``: ``DjangoBackend.claim`` (``django://ALIAS``), ``skip_overlap=True``,
  Django's default settings (on PostgreSQL the backend binds its statements server-side
  whatever Django's ``server_side_binding``, and prepares none: Django's default
  ``prepare_threshold`` is ``None``);
* ``django, prepared`` (PostgreSQL only): the same on a second alias of the same
  database with ``OPTIONS = {"prepare_threshold": 5}`` (the statements prepared after
  5 executions, as the core backend's);
* ``core backend``: ``SqliteBackend`` (a file beside Django's) / ``PostgresBackend`` (a
  schema of the same database, a pool of one connection); MySQL has none;
* ``raw, thread``: ``INSERT … ON CONFLICT (job, slot) DO NOTHING`` (MySQL: ``INSERT
  IGNORE``) with the row count, on a plain driver connection (``sqlite3`` / sync
  ``psycopg`` / ``MySQLdb``) held by one worker thread and called through
  ``run_in_executor``, as the Django backend runs its SQL;
* ``raw, inline``: the same statement without the thread hop (``sqlite3`` or
  ``MySQLdb`` called on the event loop's thread / the core backend's
  ``AsyncConnection``, as in ``benchmarks.postgres_claims``).

Every variant claims its own jobs; a warm-up gives each job its run row, and the runs
are finished (untimed) before each repeat's wins, as in ``benchmarks.postgres_claims``.
Each repeat runs the *win* path (a new slot per job: must answer won) then the *lose*
path (the same runs with other tokens: must answer taken). The ratio to a raw variant
is the time per claim per repeat, reported as median (min-max, n).

Run alone: ``python -m benchmarks.django_claims [--db both --n 1000 --repeats 7]``; the
PostgreSQL server is ``$ANARCHON_BENCH_POSTGRES`` (else the test server) and the MySQL
one ``--mysql-url`` / ``$ANARCHON_BENCH_MYSQL`` (else ``mysql://root@127.0.0.1:3306``),
where a database ``anarchon_bench_…`` is created and dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import secrets
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from anarchon_core.backends.sqlite import SqliteBackend

from ._util import filesystem, machine, print_table, ratio_summary, summary_ns

# Private helpers of the sibling benchmarks, imported rather than copied.
from .claims import RawStore, _backend_call, _raw_claim, _raw_connect
from .claims import _request as _sqlite_request
from .postgres_claims import DEFAULT_URL, Bench, Phase, _claim_backend, _claim_raw, server_line

US = 1_000.0
DJANGO, DJANGO_PREPARED, CORE = "django backend", "django, prepared", "core backend"
RAW_THREAD, RAW_INLINE = "raw, thread", "raw, inline"
#: Django's psycopg options of the ``django, prepared`` variant.
PREPARED = {"prepare_threshold": 5}
PATHS = ("win", "lose")
#: WAL and synchronous=NORMAL on Django's SQLite connection, as the core backend sets.
SQLITE_INIT = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"
FINISH_RUNS = "UPDATE {} SET state = 'success', lease_expires = 0 WHERE state = 'running'"

Row = tuple[str, int, str]  # job, slot, token
Runner = Callable[[Sequence[Row], bool], Awaitable[list[int]]]


async def _timed(
    call: Callable[[Any], Awaitable[bool]], items: Sequence[Any], win: bool
) -> list[int]:
    """Per-claim latencies of ``call`` over ``items``; each must answer won == ``win``."""
    lat: list[int] = []
    clock = time.perf_counter_ns
    for item in items:
        t0 = clock()
        won = await call(item)
        lat.append(clock() - t0)
        if won is not win:
            raise AssertionError(f"claim {item} gave won={won}, expected {win}")
    return lat


async def interleave(
    runners: Mapping[str, Runner],
    settle: Callable[[], Awaitable[None]],
    base: int,
    n: int,
    repeats: int,
    chunk: int,
) -> dict[tuple[str, str], Phase]:
    """The loop of ``postgres_claims.run_bench``, over any runners (duplicated: that one
    is bound to its variants): warm-up, then per repeat the win and the lose path, the
    variants taking turns every ``chunk`` claims in rotating order."""
    labels = tuple(runners)
    phases = {(v, p): Phase() for v in labels for p in PATHS}
    jobs = {v: [f"bench.{i}.v{k}" for i in range(n)] for k, v in enumerate(labels)}
    for v in labels:  # untimed: every job gets its row, statements are prepared
        await runners[v]([(j, base, secrets.token_hex(16)) for j in jobs[v]], True)
    await settle()
    for rep in range(repeats):
        wins = {v: [(j, base + 1 + rep, secrets.token_hex(16)) for j in jobs[v]] for v in labels}
        loses = {v: [(j, s, secrets.token_hex(16)) for j, s, _ in wins[v]] for v in labels}
        for path, batches in (("win", wins), ("lose", loses)):
            gc.collect()
            spent = dict.fromkeys(labels, 0)
            for k, start in enumerate(range(0, n, chunk)):
                shift = (k + rep) % len(labels)
                for v in labels[shift:] + labels[:shift]:
                    lat = await runners[v](batches[v][start : start + chunk], path == "win")
                    phases[(v, path)].latencies_ns += lat
                    spent[v] += sum(lat)
            for v in labels:
                phases[(v, path)].elapsed_ns.append(spent[v])
                phases[(v, path)].rates.append(n / (spent[v] / 1e9))
        await settle()
    return phases


# -- Django ------------------------------------------------------------------------------
def configure_django(databases: dict[str, dict[str, Any]]) -> None:
    """``settings.configure`` with only ``anarchon_django``; ``migrate`` every alias."""
    import django
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    settings.configure(
        DATABASES=databases,
        INSTALLED_APPS=["anarchon_django"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        SECRET_KEY="anarchon-benchmarks-only",
    )
    django.setup()
    for alias in databases:
        call_command("migrate", database=alias, verbosity=0, interactive=False)
    connections.close_all()  # the backend's thread opens its own


def _django(alias: str) -> Any:
    from anarchon_django.backend import DjangoBackend

    return DjangoBackend(alias)


# -- SQLite ------------------------------------------------------------------------------
def sqlite_settings(tmp: Path) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(tmp / "django.db"),
        "OPTIONS": {"init_command": SQLITE_INIT},
    }


async def bench_sqlite(
    tmp: Path, alias: str, n: int, repeats: int, chunk: int
) -> dict[tuple[str, str], Phase]:
    django_file = str(tmp / "django.db")
    async with AsyncExitStack() as stack:
        django_backend = _django(alias)
        await django_backend.open()
        stack.push_async_callback(django_backend.close)
        core = SqliteBackend(tmp / "core.db")
        await core.open()
        stack.push_async_callback(core.close)
        raw = RawStore(str(tmp / "raw-thread.db"))
        await raw.open()
        stack.push_async_callback(raw.close)
        direct = _raw_connect(str(tmp / "raw-inline.db"))
        stack.callback(direct.close)

        def backend_runner(backend: Any) -> Runner:
            call = _backend_call(backend)

            async def run(rows: Sequence[Row], win: bool) -> list[int]:
                return await _timed(call, [_sqlite_request(r) for r in rows], win)

            return run

        async def raw_thread(rows: Sequence[Row], win: bool) -> list[int]:
            return await _timed(raw.claim, rows, win)

        async def raw_inline(rows: Sequence[Row], win: bool) -> list[int]:
            async def call(row: Row) -> bool:
                return _raw_claim(direct, row)

            return await _timed(call, rows, win)

        async def settle() -> None:
            for path in (django_file, str(tmp / "core.db")):
                conn = sqlite3.connect(path, timeout=5.0, isolation_level=None)
                try:
                    conn.execute(FINISH_RUNS.format("anarchon_runs"))
                finally:
                    conn.close()

        runners = {
            DJANGO: backend_runner(django_backend),
            CORE: backend_runner(core),
            RAW_THREAD: raw_thread,
            RAW_INLINE: raw_inline,
        }
        base = await core.now_ms() - 60_000
        return await interleave(runners, settle, base, n, repeats, chunk)
    raise AssertionError("unreachable")  # pragma: no cover


# -- PostgreSQL --------------------------------------------------------------------------
class ThreadedRaw:
    """The raw statement on a sync psycopg connection behind one worker thread."""

    def __init__(self, url: str, query: str) -> None:
        self.url, self.query = url, query
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raw-psycopg")
        self.conn: psycopg.Connection[Any] | None = None
        self.cur: psycopg.Cursor[Any] | None = None

    def _open(self) -> None:
        self.conn = psycopg.connect(self.url, autocommit=True)
        self.cur = self.conn.cursor()

    def _claim(self, row: Row) -> bool:
        assert self.cur is not None
        job, slot, token = row
        self.cur.execute(self.query, (job, slot, token, "bench:1:abcdef", slot + 6_000))
        return self.cur.rowcount == 1

    async def open(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self.executor, self._open)

    async def claim(self, row: Row) -> bool:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._claim, row)

    async def close(self) -> None:
        if self.conn is not None:
            await asyncio.get_running_loop().run_in_executor(self.executor, self.conn.close)
        self.executor.shutdown(wait=True)


def postgres_settings(url: str) -> dict[str, Any]:
    info = conninfo_to_dict(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": info["dbname"],
        "USER": info.get("user", "postgres"),
        "PASSWORD": info.get("password", ""),
        "HOST": info.get("host", "127.0.0.1"),
        "PORT": info.get("port", "5432"),
    }


def create_database(server_url: str) -> str:
    """A fresh database on the server of ``server_url``; its URL."""
    name = f"anarchon_bench_{secrets.token_hex(4)}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(server_url, dbname=name)


def drop_database(server_url: str, url: str) -> None:
    name = str(conninfo_to_dict(url)["dbname"])
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


async def bench_postgres(
    url: str, aliases: tuple[str, str], n: int, repeats: int, chunk: int
) -> dict[tuple[str, str], Phase]:
    async with AsyncExitStack() as stack:
        bench = await stack.enter_async_context(Bench(url))  # core schema + raw table
        threaded = ThreadedRaw(url, bench.raw_claim)
        await threaded.open()
        stack.push_async_callback(threaded.close)

        async def django_runner(alias: str) -> Runner:
            backend = _django(alias)
            await backend.open()
            stack.push_async_callback(backend.close)
            as_bench = SimpleNamespace(backend=backend)  # what _claim_backend reads

            async def run(rows: Sequence[Row], win: bool) -> list[int]:
                return await _claim_backend(as_bench, rows, True, win)  # type: ignore[arg-type]

            return run

        async def core_runner(rows: Sequence[Row], win: bool) -> list[int]:
            return await _claim_backend(bench, rows, True, win)

        async def raw_thread(rows: Sequence[Row], win: bool) -> list[int]:
            return await _timed(threaded.claim, rows, win)

        async def raw_inline(rows: Sequence[Row], win: bool) -> list[int]:
            return await _claim_raw(bench, rows, win)

        finish_django = sql.SQL(FINISH_RUNS).format(sql.Identifier("public", "anarchon_runs"))

        async def settle() -> None:
            await bench.finish_all()
            await bench.on_conn(lambda conn: conn.execute(finish_django))

        runners = {
            DJANGO: await django_runner(aliases[0]),
            DJANGO_PREPARED: await django_runner(aliases[1]),
            CORE: core_runner,
            RAW_THREAD: raw_thread,
            RAW_INLINE: raw_inline,
        }
        base = await bench.backend.now_ms() - 60_000
        return await interleave(runners, settle, base, n, repeats, chunk)
    raise AssertionError("unreachable")  # pragma: no cover


# -- MySQL/MariaDB -----------------------------------------------------------------------
DEFAULT_MYSQL = os.environ.get("ANARCHON_BENCH_MYSQL", "mysql://root@127.0.0.1:3306")
#: The raw table, keyed as the ORM store's runs: (job, slot), job binary-collated.
MYSQL_RAW_SCHEMA = """
CREATE TABLE raw_runs (
    job           varchar(255) COLLATE utf8mb4_nopad_bin NOT NULL,
    slot          bigint       NOT NULL,
    token         varchar(255) NOT NULL,
    instance_id   varchar(255) NOT NULL,
    lease_expires bigint       NOT NULL,
    PRIMARY KEY (job, slot)
)
"""
MYSQL_RAW_CLAIM = """
INSERT IGNORE INTO raw_runs (job, slot, token, instance_id, lease_expires)
VALUES (%s, %s, %s, %s, %s)
"""


def mysql_server(url: str) -> dict[str, Any]:
    """MySQLdb's connection keywords of ``mysql://USER[:PASSWORD]@HOST[:PORT]``."""
    parts = urlsplit(url)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": unquote(parts.username or "root"),
        "password": unquote(parts.password or ""),
    }


def _mysql_connect(server: dict[str, Any], database: str | None = None) -> Any:
    import MySQLdb

    extra = {"database": database} if database else {}
    conn = MySQLdb.connect(**server, **extra, charset="utf8mb4", autocommit=True)
    return conn


def mysql_create_database(server: dict[str, Any]) -> str:
    """A fresh database on the server (its tables made by ``migrate``); its name."""
    name = f"anarchon_bench_{secrets.token_hex(4)}"
    conn = _mysql_connect(server)
    try:
        conn.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()
    return name


def mysql_drop_database(server: dict[str, Any], name: str) -> None:
    conn = _mysql_connect(server)
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


def mysql_settings(server: dict[str, Any], name: str) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.mysql",
        "NAME": name,
        "USER": server["user"],
        "PASSWORD": server["password"],
        "HOST": server["host"],
        "PORT": str(server["port"]),
        "OPTIONS": {"charset": "utf8mb4"},
    }


class MysqlRaw:
    """The raw statement on a plain MySQLdb connection (autocommit: one round trip),
    behind one worker thread (as the Django backend) or called inline."""

    def __init__(self, server: dict[str, Any], database: str, *, threaded: bool) -> None:
        self.conn = _mysql_connect(server, database)
        self.cursor = self.conn.cursor()
        self.executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="raw-mysql") if threaded else None
        )

    def _claim(self, row: Row) -> bool:
        job, slot, token = row
        self.cursor.execute(MYSQL_RAW_CLAIM, (job, slot, token, "bench:1:abcdef", slot + 6_000))
        return int(self.cursor.rowcount) == 1

    async def claim(self, row: Row) -> bool:
        if self.executor is None:
            return self._claim(row)
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._claim, row)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True)
        self.conn.close()


async def bench_mysql(
    server: dict[str, Any], name: str, alias: str, n: int, repeats: int, chunk: int
) -> dict[tuple[str, str], Phase]:
    setup = _mysql_connect(server, name)
    setup.cursor().execute(MYSQL_RAW_SCHEMA)
    async with AsyncExitStack() as stack:
        stack.callback(setup.close)
        django_backend = _django(alias)
        await django_backend.open()
        stack.push_async_callback(django_backend.close)
        threaded = MysqlRaw(server, name, threaded=True)
        stack.callback(threaded.close)
        inline = MysqlRaw(server, name, threaded=False)
        stack.callback(inline.close)
        call = _backend_call(django_backend)

        async def django_runner(rows: Sequence[Row], win: bool) -> list[int]:
            return await _timed(call, [_sqlite_request(r) for r in rows], win)

        async def raw_thread(rows: Sequence[Row], win: bool) -> list[int]:
            return await _timed(threaded.claim, rows, win)

        async def raw_inline(rows: Sequence[Row], win: bool) -> list[int]:
            return await _timed(inline.claim, rows, win)

        async def settle() -> None:
            setup.cursor().execute(FINISH_RUNS.format("anarchon_runs"))

        runners = {DJANGO: django_runner, RAW_THREAD: raw_thread, RAW_INLINE: raw_inline}
        base = await django_backend.now_ms() - 60_000
        return await interleave(runners, settle, base, n, repeats, chunk)
    raise AssertionError("unreachable")  # pragma: no cover


def mysql_server_line(server: dict[str, Any], name: str) -> str:
    conn = _mysql_connect(server, name)
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT VERSION(), @@innodb_flush_log_at_trx_commit")
        version, flush = cursor.fetchone()
    finally:
        conn.close()
    import MySQLdb

    return (
        f"MySQL/MariaDB {version} on {server['host']}:{server['port']}, "
        f"innodb_flush_log_at_trx_commit={flush}, mysqlclient "
        f"{'.'.join(map(str, MySQLdb.version_info[:3]))}"
    )


# -- reporting ---------------------------------------------------------------------------
def _ratios(a: Phase, b: Phase) -> list[float]:
    return [x / y for x, y in zip(a.elapsed_ns, b.elapsed_ns, strict=True)]


def _ratio_cell(ratios: list[float]) -> str:
    """``median (min-max)``: ``_util.ratio_summary`` without the ``n``, which the title gives."""
    return ratio_summary(ratios).split(", n=")[0] + ")"


def report(db: str, phases: dict[tuple[str, str], Phase], n: int, repeats: int) -> list[str]:
    """Print the table of ``db``; return one goal line per Django variant."""
    rows = []
    for variant in dict.fromkeys(v for v, _ in phases):
        for path in PATHS:
            phase = phases[(variant, path)]
            p50, p99, _ = summary_ns(phase.latencies_ns, US)
            rows.append(
                (
                    variant,
                    path,
                    statistics.median(phase.rates),
                    p50,
                    p99,
                    *(
                        _ratio_cell(_ratios(phase, phases[(b, path)]))
                        if (b, path) in phases
                        else "-"  # no such variant on this database (MySQL: no core store)
                        for b in (RAW_THREAD, RAW_INLINE, CORE)
                    ),
                )
            )
    print_table(
        f"{db}: claims, one process ({n} claims x {repeats} interleaved repeats; time per "
        f"claim ratio per repeat, median (min-max, n={repeats}), >1: slower)",
        (
            "variant",
            "path",
            "claims/s",
            "p50 us",
            "p99 us",
            "/ raw, thread",
            "/ raw, inline",
            "/ core",
        ),
        rows,
    )
    goal = []
    for variant in (DJANGO, DJANGO_PREPARED):
        if (variant, "win") not in phases:
            continue
        parts, met = [], True
        for raw in (RAW_THREAD, RAW_INLINE):
            meds = {
                path: statistics.median(_ratios(phases[(variant, path)], phases[(raw, path)]))
                for path in PATHS
            }
            met = met and all(m <= 1.5 for m in meds.values())
            parts.append(f"/ {raw}: win {meds['win']:.2f}x, lose {meds['lose']:.2f}x")
        verdict = "met" if met else "not met"
        goal.append(f"{db}, {variant} {'; '.join(parts)}: 1.5x goal {verdict}")
    return goal


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.django_claims", description=__doc__)
    parser.add_argument(
        "--db", choices=("sqlite", "postgres", "mysql", "both", "all"), default="both"
    )
    parser.add_argument(
        "--url", default=DEFAULT_URL, help="a PostgreSQL URL (a scratch database is created)"
    )
    parser.add_argument(
        "--mysql-url",
        default=DEFAULT_MYSQL,
        help="mysql://USER[:PASSWORD]@HOST[:PORT] of a MariaDB/MySQL server (a scratch "
        "database is created)",
    )
    parser.add_argument("--n", type=int, default=1000, help="claims per variant, path and repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--chunk", type=int, default=50, help="claims per turn of a variant")
    args = parser.parse_args(argv)
    groups = {"both": ("sqlite", "postgres"), "all": ("sqlite", "postgres", "mysql")}
    dbs = groups.get(args.db, (args.db,))
    import django

    print(f"== django claims ==\n{machine()}\nDjango {django.get_version()}")
    with tempfile.TemporaryDirectory(prefix="anarchon-bench-") as name:
        tmp = Path(name)
        pg_url = create_database(args.url) if "postgres" in dbs else ""
        server = mysql_server(args.mysql_url)
        my_name = mysql_create_database(server) if "mysql" in dbs else ""
        try:
            aliases = {db: "default" if i == 0 else db for i, db in enumerate(dbs)}
            settings_of = {
                "sqlite": lambda: sqlite_settings(tmp),
                "postgres": lambda: postgres_settings(pg_url),
                "mysql": lambda: mysql_settings(server, my_name),
            }
            databases = {aliases[db]: settings_of[db]() for db in dbs}
            if pg_url:
                prepared = {**postgres_settings(pg_url), "OPTIONS": PREPARED}
                databases[aliases["postgres"] + "_prepared"] = prepared
            configure_django(databases)
            goal: list[str] = []
            for db in dbs:
                if db == "sqlite":
                    print(f"SQLite files on {filesystem(str(tmp))}, WAL, synchronous=NORMAL")
                    phases = asyncio.run(
                        bench_sqlite(tmp, aliases[db], args.n, args.repeats, args.chunk)
                    )
                elif db == "mysql":
                    print(mysql_server_line(server, my_name))
                    phases = asyncio.run(
                        bench_mysql(server, my_name, aliases[db], args.n, args.repeats, args.chunk)
                    )
                else:
                    print(asyncio.run(server_line(pg_url)))
                    phases = asyncio.run(
                        bench_postgres(
                            pg_url,
                            (aliases[db], aliases[db] + "_prepared"),
                            args.n,
                            args.repeats,
                            args.chunk,
                        )
                    )
                goal += report(db, phases, args.n, args.repeats)
            print()
            print("\n".join(goal))
        finally:
            from django.db import connections

            if pg_url or my_name:
                connections.close_all()
            if pg_url:
                drop_database(args.url, pg_url)
            if my_name:
                mysql_drop_database(server, my_name)


if __name__ == "__main__":
    main()
