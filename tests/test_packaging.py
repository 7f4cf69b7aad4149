"""The distributions: built as a user's installer builds them, checked by twine,
holding every package, the dashboard's files, the type markers, the license and the
entry points, and installed as a user's first ``pip install`` installs them."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from services import service_unreachable

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("anarchon_core", "anarchon_django", "anarchon_fastapi", "anarchon_celery")
#: The extras a user names in the install check, and the newest Django a Python gets.
EXTRAS = "django,celery,fastapi,redis,postgres"
DJANGO_MAJOR = 6 if sys.version_info >= (3, 12) else 5


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, and the wheel built from it (as an installer builds one): a ``build/``
    left in the checkout by an earlier build cannot slip stale files into the wheel."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
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


def _run(argv: list[str | Path], cwd: Path, env: dict[str, str], timeout: int) -> str:
    result = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"{' '.join(map(str, argv))} exited {result.returncode}:\n{output}"
    )
    return output


def test_a_users_first_install_runs_a_new_django_project(dist: Path, tmp_path: Path) -> None:
    """The wheel with the extras a user names, into a clean venv of this Python, takes the
    newest Django (6.x from Python 3.12 on), Celery, FastAPI and redis-py that install
    there; then a new Django project with the app passes ``manage.py check`` and
    ``migrate``, and ``anarchon demo --help`` answers, each with
    ``-W error::DeprecationWarning``: a deprecation that Django or Python warns about at
    start-up fails it."""
    [wheel] = dist.glob("*.whl")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "VIRTUAL_ENV", "DJANGO_", "ANARCHON_"))
    }
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)  # this Python, not the dev venv
    _run([base, "-m", "venv", venv], tmp_path, env, 120)
    python, bindir = venv / "bin" / "python", venv / "bin"
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    index = subprocess.run(
        [*pip, "index", "versions", "croniter"], env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    if index.returncode != 0:
        service_unreachable("The package index", f"pip index failed: {index.stderr.strip()}")
    requirement = f"anarchon[{EXTRAS}] @ {wheel.as_uri()}"
    _run([*pip, "install", requirement, f"django>={DJANGO_MAJOR}"], tmp_path, env, 600)
    versions = _run(
        [python, "-c", "import celery, django, fastapi, redis; "
         "print(django.__version__, celery.__version__, fastapi.__version__, redis.__version__)"],
        tmp_path, env, 60,
    ).split()  # fmt: skip
    assert int(versions[0].split(".")[0]) == DJANGO_MAJOR, versions

    env["PYTHONWARNINGS"] = "error::DeprecationWarning"  # the project's commands, not pip's
    site = tmp_path / "site"
    site.mkdir()
    _run([bindir / "django-admin", "startproject", "mysite", site], tmp_path, env, 60)
    settings = site / "mysite" / "settings.py"
    text = settings.read_text()
    assert "INSTALLED_APPS = [\n" in text
    settings.write_text(
        text.replace("INSTALLED_APPS = [\n", 'INSTALLED_APPS = [\n    "anarchon_django",\n')
    )
    checked = _run([python, "manage.py", "check"], site, env, 120)
    assert "System check identified no issues" in checked, checked
    migrated = _run([python, "manage.py", "migrate"], site, env, 120)
    assert "Applying anarchon_django.0001_squashed_0005_core_layout" in migrated, migrated
    assert "usage: anarchon demo" in _run([bindir / "anarchon", "demo", "--help"], site, env, 60)
