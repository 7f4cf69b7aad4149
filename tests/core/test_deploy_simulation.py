"""Deployments on one store, on virtual time (see ``tests/deploy_simulation.py``): part 1.

1,000 seeds per run: the fixed seeds 0–799 and 200 more that change every day, split
over this file and ``test_deploy_simulation_2.py`` so that ``make test``'s two workers
share them (about 40 s each on a loaded two-core machine). A failure names its seeds
and the rules they broke; one replays alone,
with its whole timeline, with ``ANARCHON_DEPLOY_SEED=S``; ``ANARCHON_DEPLOY_SEEDS=N``
runs seeds 0..N-1 instead (a soak).
"""

from __future__ import annotations

import pytest
from deploy_simulation import Report, check_seeds, seeds_of_part, simulate


@pytest.mark.timeout(600)
def test_deployments_part_1() -> None:
    check_seeds(seeds_of_part(0))


def test_a_seed_replays_the_same_deployment() -> None:
    def ran(report: Report) -> list[tuple[str, int, int, str, int]]:
        return sorted((r.job, r.slot, r.attempt, r.instance, r.start) for r in report.runs)

    first, again = simulate(11), simulate(11)
    assert ran(first) == ran(again)
    assert first.timeline == again.timeline
    assert first.counts == again.counts
