"""Token-bucket pacing: hold a producer to a target rate without drifting over long runs."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """Admits `rate` records per second on average, with bursts of at most `burst` records.

    Tokens accrue continuously up to `burst`, so a producer that falls behind (a slow flush, a
    GC pause) catches up with one short burst instead of losing the time for good, and the long
    run average stays at `rate`. `rate` of 0 means unlimited.
    """

    def __init__(self, rate: float, burst: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if rate < 0:
            raise ValueError(f"rate must be >= 0 records/s (0 = unlimited), got {rate}")
        self.rate = rate
        # A tenth of a second's worth by default: smooth at high rates, one record at low ones.
        self.burst = max(1.0, burst if burst is not None else rate / 10)
        self._clock = clock
        self._sleep = sleep
        self._tokens = 1.0
        self._last = clock()

    def delay(self, n: float = 1.0) -> float:
        """Take `n` tokens if there are enough and return 0, else return the seconds to wait
        before asking again (nothing is taken)."""
        if self.rate == 0:
            return 0.0
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        # The tolerance absorbs float rounding: refill after sleeping exactly the advised wait
        # can fall a hair short of n, and a wait that small may not even advance the clock.
        if self._tokens >= n - 1e-9:
            self._tokens -= n
            return 0.0
        return (n - self._tokens) / self.rate

    def acquire(self, n: float = 1.0) -> None:
        """Block until `n` tokens are taken."""
        while (wait := self.delay(n)) > 0:
            self._sleep(wait)
