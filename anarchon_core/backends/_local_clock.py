"""What the claim-only brokers share (NATS JetStream, RabbitMQ): they have no clock of
their own, so the instances' clocks judge a claim's time, and their connections and
options follow one set of rules.

A claim past its horizon or too early by the local clock is answered without being
sent (:func:`judge_locally`), and ``store_now`` in every answer is the local clock: the
engine's skew sampling then reads zero. A lost connection is re-made with the same
backoff (:data:`RECONNECT_MIN_S` doubling to :data:`RECONNECT_MAX_S`), and a duration
option is given in the URL (``?timeout=2s``) or as a keyword in ms (:func:`duration_option`).
"""

from __future__ import annotations

from ..backend import EARLY_TOLERANCE_MS, Claim, ClaimRequest
from ..durations import parse_duration_ms
from ..errors import ConfigurationError
from ..records import Outcome
from ..redact import brief

__all__ = ["RECONNECT_MAX_S", "RECONNECT_MIN_S", "duration_option", "judge_locally"]

#: The first and the longest wait before connecting again after a lost connection.
RECONNECT_MIN_S, RECONNECT_MAX_S = 0.1, 5.0


def judge_locally(request: ClaimRequest, now: int, horizon_ms: int) -> Claim | None:
    """``EXPIRED`` or ``EARLY`` by the local clock ``now`` (nothing is sent), or ``None``:
    send it. ``horizon_ms`` is the request's horizon as the store bounds it."""
    if request.slot < now - horizon_ms:
        return Claim(Outcome.EXPIRED, store_now=now)
    if request.slot > now + EARLY_TOLERANCE_MS:
        return Claim(Outcome.EARLY, store_now=now)
    return None


def duration_option(
    store: str, key: str, text: str | None, value: int | None, default: int, *, low: int, high: int
) -> int:
    """Option ``key``: ``value`` (ms, a keyword argument) wins over ``text`` (the URL's
    ``?key=``, a duration such as ``2s``); ``default`` when neither is given."""
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigurationError(
                f"{store} option {key}_ms={brief(value)} is not valid: give milliseconds as an "
                f"int from {low} to {high}"
            )
        return value
    if text is None:
        return default
    return parse_duration_ms(
        text, what=f"{store} URL option {key}", allow_zero=low == 0, maximum=high
    )
