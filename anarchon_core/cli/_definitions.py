"""``anarchon jobs add|remove|export|apply|next``: stored definitions from the command line.

``apply FILE`` makes the store-owned definitions of a namespace those of a YAML or JSON
file, so that definitions can live in git: it prints the changes first and asks
(``--yes`` skips the question; without a terminal it must be given). ``export``
writes the file form. Every change names the version it read, so an edit made
meanwhile by someone else is refused, never overwritten.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .. import stored_jobs
from ..backend import Backend, wall_clock_ms
from ..definitions import Definition
from ..errors import CapabilityError, ConfigurationError
from ..records import iso_utc
from ..schedules import Schedule, zoned_slots
from ._errors import CliError
from ._store import store_call

__all__ = ["ACTIONS", "USAGE", "add_definition_options", "next_slot_lines", "run_action"]

#: The words after ``anarchon jobs`` that name an action (anything else is a target).
ACTIONS = ("add", "remove", "export", "apply", "next")


#: The options each action takes (besides --backend and --debug).
_OPTIONS = {
    "add": {"namespace"},
    "remove": {"namespace", "version", "yes"},
    "export": {"namespace", "format", "code"},
    "apply": {"namespace", "yes", "keep"},
    "next": {"namespace", "count"},
}
#: The positional arguments each action takes.
_POSITIONAL = {"add": "FILE", "remove": "NAME", "export": None, "apply": "FILE", "next": "NAME"}

USAGE = (
    "jobs [MODULE:ATTR] lists a scheduler's jobs; jobs add FILE | apply FILE [--yes] [--keep] "
    "| export [--format yaml|json] [--code] | remove NAME [--version N] [--yes] | next NAME "
    "[--count N] act on the definitions kept in the store (each with --namespace NS)"
)


def add_definition_options(p: argparse.ArgumentParser) -> None:
    """The options of the actions, on the ``jobs`` parser (each checked per action)."""
    p.add_argument("--namespace", metavar="NS", help="definitions: their namespace (default: none)")
    p.add_argument(
        "--version", type=int, metavar="N", help="remove: the version you read (else asked)"
    )
    p.add_argument("--yes", action="store_true", help="remove, apply: do not ask")
    p.add_argument("--format", choices=["yaml", "json"], help="export: the file form (yaml)")
    p.add_argument("--code", action="store_true", help="export: include synced code jobs")
    p.add_argument(
        "--keep",
        action="store_true",
        help="apply: keep stored definitions that the file does not name",
    )


def run_action(action: str, words: list[str], args: argparse.Namespace) -> int:
    """Run ``anarchon jobs ACTION WORDS…`` with the parsed options ``args``."""
    wanted = _POSITIONAL[action]
    if len(words) != (0 if wanted is None else 1):
        form = f"jobs {action}" + (f" {wanted}" if wanted else "")
        raise CliError(f"usage: {form} (got {' '.join([action, *words])!r})", code=2)
    for option in ("namespace", "version", "yes", "format", "code", "keep"):
        if getattr(args, option, None) not in (None, False) and option not in _OPTIONS[action]:
            raise CliError(f"jobs {action} takes no --{option}", code=2)
    args.file = args.name = words[0] if words else None
    return {
        "add": _add,
        "remove": _remove,
        "export": _export,
        "apply": _apply,
        "next": _next,
    }[action](args)


def _read_file(path: str) -> Any:
    text = sys.stdin.read() if path == "-" else _text_of(path)
    if path.endswith(".json") or text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise CliError(f"{path} is not valid JSON: {exc}") from None
    try:
        import yaml
    except ImportError:
        raise CliError(
            f"{path}: reading YAML needs PyYAML: pip install 'anarchon[yaml]' (or give JSON)"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(f"{path} is not valid YAML: {exc}") from None


def _text_of(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None


def _file(args: argparse.Namespace) -> tuple[str | None, list[Definition]]:
    namespace, definitions = stored_jobs.read_file_definitions(_read_file(args.file))
    if args.namespace is not None and namespace is not None and args.namespace != namespace:
        raise CliError(
            f"the file's namespace {namespace!r} differs from --namespace {args.namespace!r}"
        )
    return args.namespace or namespace, definitions


def _add(args: argparse.Namespace) -> int:
    namespace, definitions = _file(args)

    async def add(backend: Backend) -> list[Definition]:
        return [await stored_jobs.add_definition(backend, d, namespace) for d in definitions]

    for added in store_call(args, add):
        print(
            f"added {added.name} (version {added.version}): {added.effective_schedule.describe()}"
        )
    return 0


def _confirm(question: str, yes: bool) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise CliError(f"{question} needs an answer: run it in a terminal or pass --yes")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _remove(args: argparse.Namespace) -> int:
    version = args.version
    if version is None:
        current = store_call(
            args, lambda backend: stored_jobs.get_definition(backend, args.name, args.namespace)
        )
        if current is None:
            raise CliError(f"no stored definition {args.name!r}", code=1)
        if not _confirm(f"remove {args.name} (version {current.version})?", args.yes):
            print("nothing removed")
            return 1
        version = current.version
    store_call(
        args,
        lambda backend: stored_jobs.remove_definition(backend, args.name, version, args.namespace),
    )
    print(f"removed {args.name}: no slot of it runs from now on")
    return 0


def _export(args: argparse.Namespace) -> int:
    found = store_call(args, lambda backend: stored_jobs.definitions(backend, args.namespace))
    if not args.code:
        found = [d for d in found if d.owner == "store"]
    data = stored_jobs.export_file(found, args.namespace)
    if args.format == "json":  # yaml by default
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return 0
    try:
        import yaml
    except ImportError:
        raise CliError("--format yaml needs PyYAML: pip install 'anarchon[yaml]'") from None
    print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    return 0


def _apply(args: argparse.Namespace) -> int:
    namespace, wanted = _file(args)
    current = store_call(args, lambda backend: stored_jobs.definitions(backend, namespace))
    plan = stored_jobs.plan_apply(current, wanted, prune=not args.keep)
    where = f"namespace {namespace!r}" if namespace else "no namespace"
    if plan.empty:
        print(f"the store already holds these definitions ({where}): nothing to change")
        return 0
    print(f"changes to the stored definitions ({where}):")
    for line in plan.lines():
        print(f"  {line}")
    if not _confirm("apply these changes?", args.yes):
        print("nothing changed")
        return 1
    store_call(args, lambda backend: stored_jobs.apply_plan(backend, plan, namespace))
    print(
        f"applied: {len(plan.create)} added, {len(plan.update)} changed, "
        f"{len(plan.remove)} removed; every instance follows within one heartbeat"
    )
    return 0


def _next(args: argparse.Namespace) -> int:
    if args.count < 1 or args.count > 1000:
        raise ConfigurationError(f"-n {args.count} is not valid: give 1 to 1000")

    async def read(backend: Backend) -> tuple[Definition | None, int | None]:
        definition = await stored_jobs.get_definition(backend, args.name, args.namespace)
        try:
            live = await backend.instances()
        except CapabilityError:  # no registry: the store cannot say who holds it
            return definition, None
        held = [i for i in live if definition is not None and definition.target in i.targets]
        return definition, len(held)

    found, holders = store_call(args, read)
    if found is None:
        raise CliError(f"no stored definition {args.name!r}", code=1)
    schedule = found.effective_schedule
    print(f"{found.name} (version {found.version}): {schedule.describe()}, zone {schedule.tz}")
    if found.owner == "store" and holders == 0:
        print(f"  no live instance holds target {found.target!r}: its slots run nowhere")
    elif found.owner == "store" and holders is not None:
        print(f"  target {found.target!r}: held by {holders} live instance(s)")
    if not found.enabled:
        print(f"  disabled{': ' + found.reason if found.reason else ''}: no slot runs")
    for line in next_slot_lines(schedule, wall_clock_ms(), args.count):
        print(f"  {line}")
    return 0


def next_slot_lines(schedule: Schedule, after: int, count: int) -> list[str]:
    """The next ``count`` slots as lines: UTC, the zone's wall time, and a mark where the
    zone's UTC offset differs from the previous slot's (a daylight-saving change)."""
    slots = zoned_slots(schedule, after, count)
    lines = [
        f"{iso_utc(z.slot)}  {z.local:%Y-%m-%d %H:%M:%S %Z (%z)}"
        + ("  DST change" if z.offset_changed else "")
        for z in slots
    ]
    if len(slots) < count:
        lines.append("(no further slot)")
    return lines
