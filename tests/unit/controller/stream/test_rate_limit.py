"""The per-connection token bucket."""

from __future__ import annotations

from gpuhealth.controller.stream.session import TokenBucket


def test_token_bucket() -> None:
    b = TokenBucket(rate_per_s=2.0, burst=3.0, now=0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert b.take(0.5) is True  # refilled one token
    assert b.take(0.5) is False
    assert [b.take(100.0) for _ in range(4)] == [True, True, True, False]  # capped at burst
