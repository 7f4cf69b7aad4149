"""anarchon's core benchmarks: claim throughput, run lateness and idle cost.

Run all of them with ``python -m benchmarks`` (``make bench``) or one with
``python -m benchmarks.claims``, ``python -m benchmarks.lateness`` or
``python -m benchmarks.idle``. Every figure is measured when the benchmark runs;
nothing is hard-coded. See ``docs/benchmarks.md`` for what each one measures.
"""

from __future__ import annotations

__all__ = ["BENCHMARKS"]

#: The benchmark modules ``python -m benchmarks`` runs, in order.
BENCHMARKS: tuple[str, ...] = ("claims", "lateness", "idle")
