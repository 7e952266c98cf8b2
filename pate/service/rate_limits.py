"""Per-client rate limits of the aggregation service: requests per second and labels per minute,
each a token bucket per client (Turner 1986; a bucket of ``rate * window`` tokens refilled at
``rate`` per window). Per process: N replicas allow N times the rate (docs/design.md, "The
aggregation service")."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from pate.errors import RateLimited


@dataclass
class _Bucket:
    capacity: float
    per_s: float
    tokens: float = field(init=False)
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.capacity

    def take(self, n: float, now: float) -> float:
        """Take ``n`` tokens (0 returned) or none (the seconds until they would be there)."""
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.per_s)
        self.stamp = now
        if n <= self.tokens:
            self.tokens -= n
            return 0.0
        return (min(n, self.capacity) - self.tokens) / self.per_s


class RateLimits:
    """Token buckets per client: ``requests_per_s`` (a burst of one second's worth) and
    ``labels_per_min`` (a burst of one minute's worth); None switches a limit off. A batch
    larger than a minute's labels waits for a full bucket and empties it."""

    def __init__(self, requests_per_s: float | None, labels_per_min: float | None) -> None:
        self.requests_per_s, self.labels_per_min = requests_per_s, labels_per_min
        self._requests: dict[str, _Bucket] = {}
        self._labels: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def admit_request(self, client: str) -> None:
        """Count one request of ``client``; ``RateLimited`` (with ``retry_after``) if over."""
        if self.requests_per_s is not None:
            self._take(self._requests, client, 1, self.requests_per_s, self.requests_per_s,
                       "requests per second")

    def admit_labels(self, client: str, n: int) -> None:
        """Count ``n`` labels asked by ``client``; ``RateLimited`` if over."""
        if self.labels_per_min is not None:
            self._take(self._labels, client, min(n, self.labels_per_min), self.labels_per_min,
                       self.labels_per_min / 60.0, "labels per minute")

    def _take(self, buckets: dict[str, _Bucket], client: str, n: float, capacity: float,
              per_s: float, what: str) -> None:
        with self._lock:
            bucket = buckets.get(client)
            if bucket is None:
                bucket = buckets[client] = _Bucket(capacity, per_s)
            wait = bucket.take(n, time.monotonic())
        if wait > 0:
            raise RateLimited(f"over this client's limit of {capacity:g} {what}",
                              retry_after=wait)
