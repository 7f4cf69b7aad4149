"""``anarchon dashboard``: serve the dashboard and JSON API over a store URL.

The token comes from ``$ANARCHON_DASHBOARD_TOKEN`` or ``--token-file PATH``, never from
the command line (every user of the host can read a process's arguments in ``ps``), and
no message prints it.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..backends import mask_url
from ..errors import ConfigurationError
from ..web.http_guard import allowed_hosts, check_token

__all__ = ["add_dashboard_command"]

TOKEN_ENV = "ANARCHON_DASHBOARD_TOKEN"
_TOKEN_WAYS = f"set {TOKEN_ENV} or pass --token-file PATH"


def add_dashboard_command(
    add: Callable[..., argparse.ArgumentParser],
    store: argparse.ArgumentParser,
    backend_url: Callable[[argparse.Namespace], str],
    fail: Callable[[str], Exception],
) -> None:
    """Register ``dashboard`` on the main parser."""

    def dashboard(args: argparse.Namespace) -> int:
        if args.token is not None:
            raise fail(
                "--token is not accepted: a token on the command line is visible to every "
                f"user of this host in ps; {_TOKEN_WAYS}"
            )
        try:
            token, source = _token(args.token_file)
            hosts = allowed_hosts(args.host, args.allow_host or ())
        except ConfigurationError as exc:
            raise fail(str(exc)) from exc
        refusal = _refusal(args.host, args.allow_actions, token)
        if refusal:
            raise fail(refusal)
        try:
            import uvicorn

            from ..web import create_app
        except ImportError as exc:
            raise fail(
                f"the dashboard needs the web extra ({exc.name} is missing): "
                "pip install 'anarchon[web]'"
            ) from exc
        url = backend_url(args)
        app = create_app(url, allow_actions=args.allow_actions, token=token, allow_hosts=hosts)
        print(_banner(args, url, source, hosts), flush=True)
        config: Any = uvicorn.Config(
            app, host=args.host, port=args.port, log_level="warning", lifespan="on"
        )
        uvicorn.Server(config).run()
        return 0

    p = add("dashboard", dashboard, "serve the dashboard and JSON API of a store", [store])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port to bind (default: 8765)")
    p.add_argument(
        "--allow-actions",
        action="store_true",
        help="enable pause/resume/trigger/cancel (needs a token)",
    )
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help=f"read the token every API request must carry from PATH (default: ${TOKEN_ENV}); "
        "needed with --allow-actions and for a non-loopback --host",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="also answer to this Host name (repeatable; '.example.com' for a domain and its "
        "subdomains); the bind address, localhost, 127.0.0.1 and [::1] always are",
    )
    p.add_argument("--token", help=argparse.SUPPRESS)  # refused with the ways to give one


def _token(path: str | None) -> tuple[str | None, str]:
    """The token and where it came from: ``--token-file`` first, then the environment."""
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"--token-file {path}: cannot read it ({exc})") from exc
        token = text.strip()
        if not token:
            raise ConfigurationError(f"--token-file {path} is empty: put a random token in it")
        return check_token(token), f"--token-file {path}"
    value = os.environ.get(TOKEN_ENV)
    if value:
        return check_token(value.strip()), f"${TOKEN_ENV}"
    return None, ""


def _banner(args: argparse.Namespace, url: str, source: str, hosts: tuple[str, ...]) -> str:
    """The start-up lines: where, which store, where the token came from (never the
    token), and the ``Host`` names served."""
    host = f"[{args.host}]" if ":" in args.host else args.host
    mode = "actions enabled" if args.allow_actions else "read-only"
    token = (
        f"from {source} (open the page with #token=<token>, or enter it when asked)"
        if source
        else "none"
    )
    return (
        f"anarchon dashboard on http://{host}:{args.port}/ ({mode}), store {mask_url(url)}\n"
        f"  token: {token}\n"
        f"  hosts: {', '.join(hosts)} (add names with --allow-host)"
    )


def _refusal(host: str, allow_actions: bool, token: str | None) -> str | None:
    """Why this combination must not be served, or ``None``."""
    if token is not None:
        return None
    if allow_actions:
        return (
            f"--allow-actions needs a token: {_TOKEN_WAYS} "
            f"(for example {secrets.token_urlsafe(32)})"
        )
    if not _loopback(host):
        return (
            f"--host {host} is not a loopback address: the dashboard shows the whole "
            f"cluster, so a token is needed there ({_TOKEN_WAYS})"
        )
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
