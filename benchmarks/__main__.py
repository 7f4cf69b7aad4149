"""``python -m benchmarks [NAME ...]``: run the core benchmarks in sequence.

Each benchmark runs in a fresh interpreter (``python -m benchmarks.NAME``), so that
one's memory, threads and files cannot colour the next one's figures.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence

from . import APP_BENCHMARKS, BENCHMARKS, SERVER_BENCHMARKS


def main(argv: Sequence[str] | None = None) -> int:
    names = list(sys.argv[1:] if argv is None else argv) or list(BENCHMARKS)
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
        code = subprocess.call([sys.executable, "-m", f"benchmarks.{name}"])
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
