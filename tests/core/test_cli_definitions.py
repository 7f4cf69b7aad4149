"""``anarchon jobs add|apply|export|remove|next`` on a real SQLite store: the definitions
of a YAML file converge, the changes are printed before they are made, a stale edit is
refused, and a question without a terminal needs --yes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from anarchon_core.backends import backend_from_url
from anarchon_core.cli import main
from anarchon_core.definitions import Definition
from anarchon_core.schedules import Every

FILE = """
namespace: billing
definitions:
  - name: nightly
    schedule: {cron: "0 3 * * *", tz: Europe/Athens}
    target: reports.send
    args: [42]
  - name: hourly
    schedule: {every: 1h, offset: 5m}
    target: reports.send
"""


def stored(url: str) -> dict[str, Definition]:
    async def read() -> dict[str, Definition]:
        backend = backend_from_url(url)
        await backend.open()
        try:
            return {
                d.job: Definition.from_body(d.body, d.version)
                for d in await backend.definitions_since(0)
                if d.body is not None
            }
        finally:
            await backend.close()

    return asyncio.run(read())


def test_apply_converges_the_store_to_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    path = tmp_path / "definitions.yaml"
    path.write_text(FILE)
    assert main(["jobs", "apply", str(path), "--backend", url]) == 2  # no terminal, no --yes
    assert "--yes" in capsys.readouterr().err
    assert main(["jobs", "apply", str(path), "--yes", "--backend", url]) == 0
    out = capsys.readouterr().out
    assert '+ nightly: cron "0 3 * * *" (Europe/Athens) -> reports.send' in out
    assert "2 added, 0 changed, 0 removed" in out
    assert sorted(stored(url)) == ["billing:hourly", "billing:nightly"]
    assert main(["jobs", "apply", str(path), "--yes", "--backend", url]) == 0
    assert "nothing to change" in capsys.readouterr().out
    path.write_text(
        "namespace: billing\ndefinitions:\n  - name: hourly\n"
        "    schedule: {every: 2h, offset: 5m}\n    target: reports.send\n"
    )
    assert main(["jobs", "apply", str(path), "--yes", "--backend", url]) == 0
    out = capsys.readouterr().out
    assert "~ hourly: every 2h offset 5m" in out and "- nightly" in out
    assert sorted(stored(url)) == ["billing:hourly"]
    assert main(["jobs", "export", "--namespace", "billing", "--backend", url]) == 0
    exported = capsys.readouterr().out
    assert "namespace: billing" in exported and "every: 2h" in exported
    (tmp_path / "again.yaml").write_text(exported)
    assert main(["jobs", "apply", str(tmp_path / "again.yaml"), "--yes", "--backend", url]) == 0
    assert "nothing to change" in capsys.readouterr().out


def test_add_next_and_remove(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    path = tmp_path / "one.json"
    path.write_text(
        '[{"name": "once", "schedule": {"at": "2030-03-31T02:30:00+02:00"}, "target": "t"},'
        ' {"name": "dst", "schedule": {"cron": "30 2 * * *", "tz": "Europe/Athens"},'
        ' "target": "t", "start_at": "2030-03-29T00:00:00Z"}]'
    )
    assert main(["jobs", "add", str(path), "--backend", url]) == 0
    assert "added once (version 1)" in capsys.readouterr().out
    assert main(["jobs", "add", str(path), "--backend", url]) == 1  # exists already
    assert "exists already" in capsys.readouterr().err
    assert main(["jobs", "next", "dst", "-n", "4", "--backend", url]) == 0
    out = capsys.readouterr().out
    assert "no live instance holds target 't'" in out
    assert out.count("DST change") == 1  # 2030-03-31 03:00: Athens moves to +03
    assert main(["jobs", "next", "once", "--backend", url]) == 0
    assert "(no further slot)" in capsys.readouterr().out
    assert main(["jobs", "remove", "once", "--version", "7", "--backend", url]) == 1
    assert "changed since it was read" in capsys.readouterr().err
    assert main(["jobs", "remove", "once", "--version", "1", "--backend", url]) == 0
    assert sorted(stored(url)) == ["dst"]
    assert main(["jobs", "remove", "dst", "--backend", url]) == 2  # asks: no terminal
    assert main(["jobs", "remove", "dst", "--yes", "--backend", url]) == 0
    assert stored(url) == {}


def test_bad_words_and_options_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "remove", "--backend", "memory://"]) == 2
    assert "usage: jobs remove NAME" in capsys.readouterr().err
    assert main(["jobs", "export", "--yes", "--backend", "memory://"]) == 2
    assert "jobs export takes no --yes" in capsys.readouterr().err
    assert Every("1h")  # the module's own imports are used
