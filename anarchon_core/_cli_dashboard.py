"""``anarchon dashboard``: serve the dashboard and JSON API over a store URL."""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
from collections.abc import Callable
from typing import Any

from .backends import mask_url

__all__ = ["add_dashboard_command"]

TOKEN_ENV = "ANARCHON_DASHBOARD_TOKEN"


def add_dashboard_command(
    add: Callable[..., argparse.ArgumentParser],
    store: argparse.ArgumentParser,
    backend_url: Callable[[argparse.Namespace], str],
    fail: Callable[[str], Exception],
) -> None:
    """Register ``dashboard`` on the main parser."""

    def dashboard(args: argparse.Namespace) -> int:
        token = args.token or os.environ.get(TOKEN_ENV) or None
        refusal = _refusal(args.host, args.allow_actions, token)
        if refusal:
            raise fail(refusal)
        try:
            import uvicorn

            from .web import create_app
        except ImportError as exc:
            raise fail(
                f"the dashboard needs the web extra ({exc.name} is missing): "
                "pip install 'anarchon[web]'"
            ) from exc
        url = backend_url(args)
        app = create_app(url, allow_actions=args.allow_actions, token=token)
        host = f"[{args.host}]" if ":" in args.host else args.host
        where = f"http://{host}:{args.port}/" + (f"#token={token}" if token else "")
        mode = "actions enabled" if args.allow_actions else "read-only"
        print(f"anarchon dashboard on {where} ({mode}), store {mask_url(url)}", flush=True)
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
        "--token",
        help=f"the token every API request must carry (default: ${TOKEN_ENV}); "
        "needed with --allow-actions and for a non-loopback --host",
    )


def _refusal(host: str, allow_actions: bool, token: str | None) -> str | None:
    """Why this combination must not be served, or ``None``."""
    if token is not None:
        return None
    if allow_actions:
        return (
            f"--allow-actions needs a token: pass --token or set {TOKEN_ENV} "
            f"(for example {secrets.token_urlsafe(16)})"
        )
    if not _loopback(host):
        return (
            f"--host {host} is not a loopback address: the dashboard shows the whole "
            f"cluster, so a token is needed there (--token or {TOKEN_ENV})"
        )
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
