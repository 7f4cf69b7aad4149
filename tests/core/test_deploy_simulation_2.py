"""Deployments on one store, on virtual time: part 2 (see ``test_deploy_simulation.py``)."""

from __future__ import annotations

import pytest
from deploy_simulation import check_seeds, seeds_of_part


@pytest.mark.timeout(600)
def test_deployments_part_2() -> None:
    check_seeds(seeds_of_part(1))
