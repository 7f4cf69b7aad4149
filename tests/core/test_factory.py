"""The URL factory and credential masking."""

from __future__ import annotations

import pytest

from anarchon_core import ConfigurationError, MemoryBackend, backend_from_url
from anarchon_core.backends import mask_url


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://app:s3cret@db:5432/prod", "postgresql://app:***@db:5432/prod"),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("amqp://guest:guest@127.0.0.1/", "amqp://guest:***@127.0.0.1/"),
        ("nats://s3cr3ttoken@127.0.0.1:4222", "nats://***@127.0.0.1:4222"),
        ("postgresql://postgres@127.0.0.1/test", "postgresql://postgres@127.0.0.1/test"),
        ("sqlite:///anarchon.sqlite3", "sqlite:///anarchon.sqlite3"),
        ("redis://cache/0?password=s3cret&prefix=p", "redis://cache/0?password=***&prefix=p"),
        ("redis://:s3#cret@cache/0", "redis://***"),
        ("postgresql://app:s3/cret@db/prod", "postgresql://***@db/prod"),
        ("postgresql://app@db/prod?sslpassword=s3cret", "postgresql://app@db/prod?sslpassword=***"),
        ("amqps://u:p%40ss@broker/?heartbeat=5", "amqps://u:***@broker/?heartbeat=5"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_factory_builds_memory_and_rejects_unknown() -> None:
    assert isinstance(backend_from_url("memory://"), MemoryBackend)
    with pytest.raises(ConfigurationError, match=r"use one of .*sqlite://"):
        backend_from_url("mongodb://x")
    with pytest.raises(ConfigurationError, match="memory backend URL 'memory://x:\\*\\*\\*@h'"):
        backend_from_url("memory://x:pw@h")
    with pytest.raises(ConfigurationError, match="give a Backend or a URL string"):
        backend_from_url(42)  # type: ignore[arg-type]


def test_factory_quotes_bad_values_briefly_and_redacted() -> None:
    with pytest.raises(ConfigurationError) as caught:
        backend_from_url("x" * 10_000 + "://u:s3cret@h")
    assert len(str(caught.value)) < 300 and "(10000 characters)" in str(caught.value)
    with pytest.raises(ConfigurationError) as caught:
        backend_from_url("not a url, u:s3cret@h")
    assert "s3cret" not in str(caught.value)
    with pytest.raises(ConfigurationError) as caught:
        backend_from_url(["redis://:s3cret@h"])  # type: ignore[arg-type]
    assert "s3cret" not in str(caught.value) and "give a Backend or a URL string" in str(
        caught.value
    )
