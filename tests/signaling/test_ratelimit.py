"""Token buckets per client address: the arithmetic, Retry-After, and bounded memory."""

from __future__ import annotations

import pytest

from server.http.clients import client_key
from server.http.ratelimit import AddressLimiter
from server.sessions.token_bucket import TokenBucket
from signaling.errors import ApiError
from tests.clock import FakeClock


def test_bucket_spends_its_burst_then_refills_at_its_rate():
    clock = FakeClock(1000.0)
    bucket = TokenBucket(capacity=3, rate=0.5, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    assert bucket.seconds_until_token() == pytest.approx(2.0)
    clock.now += 1.0
    assert bucket.take() is False
    clock.now += 1.0
    assert bucket.take() is True
    clock.now += 3600  # never more than the capacity
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]


def test_limit_is_per_address_with_retry_after_until_the_next_token():
    clock = FakeClock(1000.0)
    limiter = AddressLimiter(per_minute=2, clock=clock)
    limiter.check("192.0.2.1")
    limiter.check("192.0.2.1")
    with pytest.raises(ApiError) as refused:
        limiter.check("192.0.2.1")
    assert (refused.value.status, refused.value.code) == (429, "rate_limited")
    assert refused.value.headers == {"Retry-After": "30"}
    limiter.check("192.0.2.2")  # another client is not affected
    clock.now += 29.5
    with pytest.raises(ApiError) as again:
        limiter.check("192.0.2.1")
    assert again.value.headers == {"Retry-After": "1"}  # rounded up, never 0
    clock.now += 0.5
    limiter.check("192.0.2.1")


def test_ipv6_clients_are_counted_per_64_and_mapped_ipv4_as_ipv4():
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9")
    assert client_key("2001:db8:1:2::1") != client_key("2001:db8:1:3::1")
    assert client_key("::ffff:192.0.2.7") == client_key("192.0.2.7") == "192.0.2.7"
    limiter = AddressLimiter(per_minute=1, clock=FakeClock(1000.0))
    limiter.check("2001:db8::1")
    with pytest.raises(ApiError):
        limiter.check("2001:db8::2")


def test_memory_is_bounded_idle_buckets_first():
    """A client seen once a minute ago is as good as new: its bucket is dropped."""
    clock = FakeClock(1000.0)
    limiter = AddressLimiter(per_minute=10, clock=clock, max_addresses=100)
    for index in range(50):
        limiter.check(f"198.51.100.{index}")
    clock.now += 61
    limiter.check("203.0.113.1")
    assert len(limiter) == 1
    for index in range(250):  # a spray of addresses within the same minute
        limiter.check(f"10.0.{index // 250}.{index % 250}")
    assert len(limiter) == 100
