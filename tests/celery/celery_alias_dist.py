"""Register the ``anarchon`` beat scheduler alias without installing the project."""

from __future__ import annotations

from pathlib import Path


def write_alias_dist(directory: Path) -> Path:
    """A throwaway ``.dist-info`` registering the ``anarchon`` beat scheduler alias.

    pyproject's entry point is not installed in this venv; a directory on ``sys.path``
    holding this makes ``importlib.metadata`` (and so ``celery beat -S anarchon``) see it.
    """
    dist = directory / "anarchon_celery_alias-0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: anarchon-celery-alias\nVersion: 0.0\n"
    )
    (dist / "entry_points.txt").write_text(
        "[celery.beat_schedulers]\nanarchon = anarchon_celery:Scheduler\n"
    )
    return directory
