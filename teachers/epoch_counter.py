"""The progress counter of Ray's teacher shards, in a module of its own: the Ray actor that holds
it imports this module alone, not torch (measured: the actor ready in 0.5 s with 88 MB resident,
against 2.4 s and 332 MB while it lived in ``teachers.distributed``)."""

from __future__ import annotations


class EpochCounter:
    """The teacher-epochs each shard has done, reported by its Ray task as it trains (a Ray
    actor, ``_run``): the driver's progress within shards that take minutes each. A task
    retried by Ray starts its shard's count again."""

    def __init__(self) -> None:
        self.done: dict[int, int] = {}

    def start(self, shard: int) -> None:
        self.done[shard] = 0

    def add(self, shard: int, teacher_epochs: int) -> None:
        self.done[shard] = self.done.get(shard, 0) + teacher_epochs

    def total(self) -> int:
        return sum(self.done.values())
