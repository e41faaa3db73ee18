import pytest

from streamtrain.producers.pacing import TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_long_run_rate_is_the_target():
    clock = FakeClock()
    bucket = TokenBucket(200.0, clock=clock, sleep=clock.sleep)
    for _ in range(2001):
        bucket.acquire()
    assert clock.now == pytest.approx(10.0, rel=0.01)


def test_a_producer_that_fell_behind_catches_up_with_at_most_one_burst():
    clock = FakeClock()
    bucket = TokenBucket(100.0, burst=20, clock=clock, sleep=clock.sleep)
    clock.now = 5.0  # stalled for 5 s: only `burst` records may go at once
    free = 0
    while bucket.delay() == 0:
        free += 1
    assert free == 20


def test_delay_says_how_long_to_wait_and_takes_nothing_meanwhile():
    clock = FakeClock()
    bucket = TokenBucket(10.0, clock=clock, sleep=clock.sleep)
    assert bucket.delay() == 0
    assert bucket.delay() == pytest.approx(0.1)
    clock.now = 0.05
    assert bucket.delay() == pytest.approx(0.05)
    clock.now = 0.1
    assert bucket.delay() == 0


def test_zero_rate_is_unlimited_and_a_negative_one_is_refused():
    assert TokenBucket(0).delay(1e9) == 0
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(-1)
