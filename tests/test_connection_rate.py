"""New connections per client address: a burst, then the rate; each address its own."""

from __future__ import annotations

from duplex_server.transport import ConnectionRate


def test_a_burst_then_the_rate_per_address():
    rate = ConnectionRate(per_s=10.0)  # a burst of 20
    assert all(rate.admit("a", 0.0) for _ in range(20))
    assert not rate.admit("a", 0.0)
    assert rate.admit("b", 0.0)  # another address is untouched
    assert rate.admit("a", 0.1)  # one more earned in 0.1 s
    assert not rate.admit("a", 0.1)


def test_no_bound_at_zero():
    rate = ConnectionRate(per_s=0.0)
    assert all(rate.admit("a", 0.0) for _ in range(10_000))


def test_refilled_addresses_are_forgotten_once_there_are_many():
    rate = ConnectionRate(per_s=1.0)
    for n in range(ConnectionRate.FORGET_ABOVE + 1):
        rate.admit(f"10.0.{n // 256}.{n % 256}", 0.0)
    rate.admit("busy", 100.0)  # long after: every other bucket has refilled
    assert len(rate._buckets) == 1
