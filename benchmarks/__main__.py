"""``python -m benchmarks [NAME ...] [-- OPTIONS]``: run the core benchmarks in sequence.

Options (the arguments from the first one that starts with ``-``) go to a single named
benchmark: ``python -m benchmarks scale --procs 8``. Each benchmark runs in a fresh
interpreter (``python -m benchmarks.NAME``), so that one's memory, threads and files
cannot colour the next one's figures.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence

from . import APP_BENCHMARKS, BENCHMARKS, SERVER_BENCHMARKS


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    first_option = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    names, options = args[:first_option] or list(BENCHMARKS), args[first_option:]
    if options and options[0] == "--":
        options = options[1:]
    if options and len(names) != 1:
        print(f"options {options} need exactly one benchmark named before them")
        return 2
    if names == ["servers"]:
        names = list(SERVER_BENCHMARKS)
    known = (*BENCHMARKS, *SERVER_BENCHMARKS, *APP_BENCHMARKS)
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"unknown benchmark(s) {unknown}: choose from {', '.join(known)} or 'servers'")
        return 2
    print(f"anarchon benchmarks: {', '.join(names)}", flush=True)
    failed = []
    start = time.perf_counter()
    for name in names:
        print(flush=True)
        t0 = time.perf_counter()
        code = subprocess.call([sys.executable, "-m", f"benchmarks.{name}", *options])
        print(f"[{name}: {time.perf_counter() - t0:.1f} s, exit {code}]", flush=True)
        if code != 0:
            failed.append(name)
    print(
        f"\nall benchmarks: {time.perf_counter() - start:.1f} s"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
