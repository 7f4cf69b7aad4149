"""Job definitions kept in the store, proved identically on every store that keeps them.

The contract is :meth:`~anarchon_core.backend.Backend.write_definition`,
:meth:`~anarchon_core.backend.Backend.definitions_since`,
:meth:`~anarchon_core.backend.Backend.read_definition`,
:meth:`~anarchon_core.backend.Backend.definitions_version` and the ``version`` of a
claim. A store that keeps no definitions must refuse them with a
:class:`~anarchon_core.errors.CapabilityError` naming the stores that do; every
other test is then skipped. ``from anarchon_core.conformance.definitions import *``
brings exactly the tests (``__all__``).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from anarchon_core.backend import DEFINITION_BACKENDS, Backend, StoredDefinition
from anarchon_core.conformance.contract import JOB, claim_request, records
from anarchon_core.errors import CapabilityError, ConflictError
from anarchon_core.records import Outcome

__all__ = [
    "test_a_claim_of_another_version_is_stale_and_writes_nothing",
    "test_a_claim_without_a_version_is_not_checked",
    "test_a_removal_leaves_a_tombstone_and_the_name_can_be_created_again",
    "test_a_stale_edit_is_refused_and_writes_nothing",
    "test_a_watcher_hears_of_every_change",
    "test_batched_claims_check_each_version",
    "test_concurrent_edits_of_one_version_let_exactly_one_through",
    "test_concurrent_writers_get_distinct_versions_in_commit_order",
    "test_definitions_since_reads_the_changes_after_a_version",
    "test_every_change_gets_a_higher_version_from_one_counter",
    "test_one_definition_is_read_by_its_name",
    "test_the_body_comes_back_byte_for_byte",
]

BODY = json.dumps({"schedule": {"every": "10s"}, "target": "reports.send"})


async def _keeps_definitions(backend: Backend) -> None:
    """Skip the test on a claim-only store that refuses definitions (checking the
    refusal); a lease store must keep them."""
    try:
        await backend.definitions_version()
    except CapabilityError as exc:
        assert DEFINITION_BACKENDS in str(exc), exc
        if backend.capabilities.lease:
            pytest.fail(f"{backend.name} is a lease store but keeps no job definitions")
        pytest.skip(f"{backend.name} keeps no job definitions")


def _body(n: int) -> str:
    return json.dumps({"schedule": {"every": f"{n}s"}, "target": "reports.send"})


async def test_every_change_gets_a_higher_version_from_one_counter(backend: Backend) -> None:
    await _keeps_definitions(backend)
    assert await backend.definitions_version() == 0
    assert await backend.definitions_since(0) == []
    a1 = await backend.write_definition("a", _body(1), expected=0)
    b1 = await backend.write_definition("b", _body(2), expected=0)
    a2 = await backend.write_definition("a", _body(3), expected=a1)
    assert 0 < a1 < b1 < a2
    assert await backend.definitions_version() == a2
    assert await backend.definitions_since(0) == [
        StoredDefinition("b", b1, _body(2)),
        StoredDefinition("a", a2, _body(3)),
    ]


async def test_definitions_since_reads_the_changes_after_a_version(backend: Backend) -> None:
    await _keeps_definitions(backend)
    a = await backend.write_definition("a", _body(1), expected=0)
    seen = await backend.definitions_version()
    b = await backend.write_definition("b", _body(2), expected=0)
    c = await backend.write_definition("c", _body(3), expected=None)
    assert [d.job for d in await backend.definitions_since(seen)] == ["b", "c"]
    assert await backend.definitions_since(c) == []
    assert [(d.job, d.version) for d in await backend.definitions_since(a - 1)] == [
        ("a", a),
        ("b", b),
        ("c", c),
    ]


async def test_a_stale_edit_is_refused_and_writes_nothing(backend: Backend) -> None:
    await _keeps_definitions(backend)
    v1 = await backend.write_definition(JOB, _body(1), expected=0)
    with pytest.raises(ConflictError) as exists:
        await backend.write_definition(JOB, _body(2), expected=0)  # create: it exists
    assert exists.value.current == v1
    v2 = await backend.write_definition(JOB, _body(3), expected=v1)
    with pytest.raises(ConflictError) as stale:
        await backend.write_definition(JOB, _body(4), expected=v1)  # read before v2
    assert stale.value.current == v2
    with pytest.raises(ConflictError):
        await backend.write_definition(JOB, None, expected=v1)  # a stale removal
    with pytest.raises(ConflictError) as missing:
        await backend.write_definition("nobody", _body(5), expected=7)
    assert missing.value.current == 0
    assert await backend.definitions_version() == v2
    assert await backend.definitions_since(0) == [StoredDefinition(JOB, v2, _body(3))]


async def test_a_removal_leaves_a_tombstone_and_the_name_can_be_created_again(
    backend: Backend,
) -> None:
    await _keeps_definitions(backend)
    v1 = await backend.write_definition(JOB, _body(1), expected=0)
    gone = await backend.write_definition(JOB, None, expected=v1)
    assert gone > v1
    assert await backend.definitions_since(v1) == [StoredDefinition(JOB, gone, None)]
    assert await backend.write_definition(JOB, None, expected=None) == 0  # nothing to remove
    assert await backend.write_definition("never", None, expected=0) == 0
    assert await backend.definitions_version() == gone
    again = await backend.write_definition(JOB, _body(2), expected=0)
    assert again > gone
    assert await backend.definitions_since(v1) == [StoredDefinition(JOB, again, _body(2))]


async def test_one_definition_is_read_by_its_name(backend: Backend) -> None:
    await _keeps_definitions(backend)
    assert await backend.read_definition(JOB) is None
    v1 = await backend.write_definition(JOB, _body(1), expected=0)
    await backend.write_definition("other", _body(9), expected=0)
    assert await backend.read_definition(JOB) == StoredDefinition(JOB, v1, _body(1))
    v2 = await backend.write_definition(JOB, _body(2), expected=v1)
    assert await backend.read_definition(JOB) == StoredDefinition(JOB, v2, _body(2))
    await backend.write_definition(JOB, None, expected=v2)
    assert await backend.read_definition(JOB) is None  # removed: a tombstone is none
    assert await backend.read_definition("never") is None


async def test_the_body_comes_back_byte_for_byte(backend: Backend) -> None:
    await _keeps_definitions(backend)
    body = json.dumps(
        {"description": "Ünïcode ✓ 'quotes' \"double\" \\ % _ \t", "args": ["x" * 20_000]},
        ensure_ascii=False,
    )
    version = await backend.write_definition("ns:job.name-1", body, expected=0)
    assert await backend.definitions_since(0) == [StoredDefinition("ns:job.name-1", version, body)]
    assert await backend.read_definition("ns:job.name-1") == StoredDefinition(
        "ns:job.name-1", version, body
    )


async def test_concurrent_writers_get_distinct_versions_in_commit_order(backend: Backend) -> None:
    await _keeps_definitions(backend)
    names = [f"job-{i}" for i in range(20)]
    versions = await asyncio.gather(
        *(backend.write_definition(name, _body(i + 1), expected=0) for i, name in enumerate(names))
    )
    assert len(set(versions)) == len(names)
    stored = await backend.definitions_since(0)
    assert sorted(d.job for d in stored) == sorted(names)
    assert [d.version for d in stored] == sorted(versions)
    assert await backend.definitions_version() == max(versions)


async def test_concurrent_edits_of_one_version_let_exactly_one_through(backend: Backend) -> None:
    await _keeps_definitions(backend)
    v1 = await backend.write_definition(JOB, _body(1), expected=0)
    answers = await asyncio.gather(
        *(backend.write_definition(JOB, _body(i + 2), expected=v1) for i in range(8)),
        return_exceptions=True,
    )
    won = [a for a in answers if isinstance(a, int)]
    assert len(won) == 1, answers
    assert all(isinstance(a, ConflictError) for a in answers if not isinstance(a, int))
    (stored,) = await backend.definitions_since(0)
    assert stored.version == won[0]


async def test_a_claim_of_another_version_is_stale_and_writes_nothing(backend: Backend) -> None:
    await _keeps_definitions(backend)
    now = await backend.now_ms()
    v1 = await backend.write_definition(JOB, _body(1), expected=0)
    v2 = await backend.write_definition(JOB, _body(2), expected=v1)
    stale = await backend.claim(claim_request(now, version=v1))
    assert stale.outcome == Outcome.STALE
    assert await records(backend) == []
    won = await backend.claim(claim_request(now, version=v2))
    assert won.outcome == Outcome.WON
    later = await backend.claim(claim_request(now, version=v1))
    assert later.outcome == Outcome.TAKEN  # a decided run is reported as such
    await backend.write_definition(JOB, None, expected=v2)
    removed = await backend.claim(claim_request(now + 1, version=v2))
    assert removed.outcome == Outcome.STALE
    never = await backend.claim(claim_request(now, job="never-stored", version=1))
    assert never.outcome == Outcome.STALE
    assert [(r.slot, r.attempt) for r in await records(backend)] == [(now, 1)]


async def test_a_claim_without_a_version_is_not_checked(backend: Backend) -> None:
    await _keeps_definitions(backend)
    now = await backend.now_ms()
    await backend.write_definition(JOB, _body(1), expected=0)
    assert (await backend.claim(claim_request(now))).outcome == Outcome.WON


async def test_batched_claims_check_each_version(backend: Backend) -> None:
    await _keeps_definitions(backend)
    now = await backend.now_ms()
    va = await backend.write_definition("a", _body(1), expected=0)
    vb = await backend.write_definition("b", _body(2), expected=0)
    answers = await backend.claim_many(
        [
            claim_request(now, job="a", version=va),
            claim_request(now, job="b", version=vb - 100),
            claim_request(now, job="b", version=vb, skip_overlap=False),
            claim_request(now, job="c", version=1),
        ]
    )
    assert [a.outcome for a in answers] == [
        Outcome.WON,
        Outcome.STALE,
        Outcome.WON,
        Outcome.STALE,
    ]


async def test_a_watcher_hears_of_every_change(backend: Backend) -> None:
    """Where the store notifies changes, a watcher hears of each write soon after it
    (it reads the changes itself: a notification is a hint)."""
    await _keeps_definitions(backend)
    heard = asyncio.Event()
    watcher = asyncio.ensure_future(backend.watch_definitions(heard.set))
    try:
        await asyncio.sleep(0.2)  # subscribed (a store may say so with a first call)
        if watcher.done() and isinstance(watcher.exception(), CapabilityError):
            pytest.skip(f"{backend.name} sends no notifications: replicas poll")
        for n in range(3):
            heard.clear()
            await backend.write_definition(f"job-{n}", _body(n + 1), expected=0)
            await asyncio.wait_for(heard.wait(), timeout=5)
        heard.clear()
        await backend.write_definition("job-0", None, expected=None)
        await asyncio.wait_for(heard.wait(), timeout=5)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
