"""``anarchon run``: a scheduler in the foreground until SIGINT or SIGTERM, logging to
stderr with UTC times and the instance's id on every line."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from ..errors import AnarchonError
from ._errors import CliError
from ._target import load_scheduler

__all__ = ["LOG_FORMAT", "cmd_run"]

LOG_FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)-7s %(name)s [%(instance)s] %(message)s"


class _InstanceFilter(logging.Filter):
    """Give every record an ``instance`` field: this process runs one scheduler."""

    def __init__(self) -> None:
        super().__init__()
        self.instance = "-"

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "instance", None):
            record.instance = self.instance
        return True


def _configure_logging(level: str) -> tuple[logging.Handler, _InstanceFilter]:
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter(LOG_FORMAT, datefmt="%Y-%m-%dT%H:%M:%S")
    formatter.converter = time.gmtime  # slots are UTC; so are the log times
    handler.setFormatter(formatter)
    instance = _InstanceFilter()
    handler.addFilter(instance)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    return handler, instance


def cmd_run(args: argparse.Namespace) -> int:
    handler, instance = _configure_logging(args.log_level)
    log = logging.getLogger("anarchon.cli")
    try:
        scheduler = load_scheduler(args.target)
        if scheduler.running:
            raise CliError(f"{args.target!r} is already running in this process")
        scheduler.configure(backend=args.backend or None, instance_id=args.instance_id)
        instance.instance = scheduler.instance_id
        grace = scheduler.grace_ms if args.grace_ms is None else args.grace_ms
        log.info(
            "running %s: %d job(s) on %s; stop with Ctrl-C or SIGTERM (grace %d ms)",
            args.target,
            len(scheduler.jobs),
            scheduler.backend.describe(),
            grace,
        )
        try:
            scheduler.run(grace_ms=args.grace_ms)
        except AnarchonError as exc:  # refused at start: the configuration must change
            raise CliError(str(exc)) from exc
        log.info("stopped")
        return 0
    finally:
        logging.getLogger().removeHandler(handler)
