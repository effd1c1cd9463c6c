"""Noise control: de-duplication, rate limits and retry backoff. Pure, clock passed in."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable


class Deduper:
    """Lets one alert per key through inside ``window_s``; a resolve re-opens the key."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: dict[Hashable, float] = {}
        self.dropped = 0

    def admit(self, key: Hashable, now: float) -> bool:
        last = self._last.get(key)
        if last is not None and now - last < self.window_s:
            self.dropped += 1
            return False
        self._last[key] = now
        return True

    def forget(self, key: Hashable) -> None:
        """The condition cleared: the next raise of this key alerts again at once."""
        self._last.pop(key, None)


class RateLimiter:
    """At most ``per_hour`` sends in any sliding hour; critical alerts may borrow 50% more.

    Held-back alerts are counted, so the next one through can say how many were lost.
    """

    WINDOW_S = 3600.0

    def __init__(self, per_hour: int) -> None:
        self.per_hour = per_hour
        self._sent: deque[float] = deque()
        self.held_back = 0

    def admit(self, now: float, severity: str = "warning") -> bool:
        while self._sent and now - self._sent[0] >= self.WINDOW_S:
            self._sent.popleft()
        limit = self.per_hour * 3 // 2 if severity == "critical" else self.per_hour
        if len(self._sent) >= limit:
            self.held_back += 1
            return False
        self._sent.append(now)
        return True

    def take_held_back(self) -> int:
        n, self.held_back = self.held_back, 0
        return n


def backoff_delay(attempt: int, base_s: float, max_s: float) -> float:
    """Delay before retry number ``attempt`` (1-based): base, 2×base, 4×base, … capped."""
    return min(max_s, base_s * (2 ** max(0, attempt - 1)))
