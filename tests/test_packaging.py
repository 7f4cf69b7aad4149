"""The distributions: built as a user's installer builds them, checked by twine, and
holding every package, the dashboard's files, the type markers, the license and the
entry points."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("anarchon_core", "anarchon_django", "anarchon_fastapi", "anarchon_celery")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel",
         "--outdir", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return out


def test_twine_accepts_both_distributions(dist: Path) -> None:
    files = sorted(str(p) for p in dist.iterdir())
    assert len(files) == 2, files
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_wheel_holds_everything_a_user_imports(dist: Path) -> None:
    from anarchon_core import __version__

    [wheel] = dist.glob("*.whl")
    assert f"anarchon-{__version__}-" in wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PACKAGES:
        source = {
            str(p.relative_to(ROOT))
            for p in (ROOT / package).rglob("*.py")
            if "__pycache__" not in p.parts
        }
        assert source <= names, sorted(source - names)
        assert f"{package}/py.typed" in names
    for asset in ("index.html", "dashboard.js", "dashboard.css"):
        assert f"anarchon_core/web/dashboard/{asset}" in names
    assert any(n.startswith("anarchon_django/templates/") for n in names)
    info = f"anarchon-{__version__}.dist-info"
    assert f"{info}/licenses/LICENSE" in names
    entry_points = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    for line in (
        "anarchon = anarchon_core.cli:main",
        "django = anarchon_django.backend:DjangoBackend.from_url",
        "anarchon = anarchon_celery:Scheduler",
    ):
        assert line in entry_points, entry_points
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
