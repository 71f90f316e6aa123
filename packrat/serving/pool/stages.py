"""Where a sub-batch's time goes on its way through the pool, stage by stage: always on, a dozen
clock reads per sub-batch.

A sub-batch is stamped at each step, in order, on ``time.monotonic`` (CLOCK_MONOTONIC on Linux:
one clock for every process on the machine, so the parent's stamps and its instance's compare):

    parent    queued (its first request) → dispatched → copied (bodies in shared memory) → sent
    instance  received → locked (core locks held) → decoded → run → encoded
    parent    received (answers unpickled) → handed out (every future answered)

Each stage is the time from one stamp to the next, so a sub-batch's stages add up to its time from
its first request's arrival to its answers' hand-out:

    queue     waiting for an idle instance (or for the rest of the planned share: the gather window)
    copy      request bodies into the instance's shared-memory segment
    send      pickling the message to the instance (where its bodies are)
    wake      writing it to the instance's socket, the instance waking up and reading it
    locks     waiting for the core locks (cores taken in turns with another model; else nothing)
    decode    request bodies to input samples
    model     the model's run
    encode    outputs to answers
    reply     the answers pickled, sent, and read by the parent's dispatch thread
    hand_out  answers resolved into the requests' futures

The parent stamps "sent" just before its write: once written, the instance may run on the core
the parent's thread needs, and a stamp after the write would take the instance's time for the
send. Stamps of two processes may still be a hair out of order: a stamp earlier than the one
before it counts as that one, so no stage is negative and the sum still holds.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Sequence

STAGES = ("queue", "copy", "send", "wake", "locks", "decode", "model", "encode", "reply", "hand_out")
PARENT_SENT = 4  # stamps the parent takes up to the send: queued, dispatched, copied, sent
INSTANCE_STAMPS = 5  # received, locked, decoded, run, encoded
WINDOW = 200  # sub-batches the figures are taken over: the recent past, not the whole life


def stage_ms(stamps: Sequence[float]) -> tuple[float, ...]:
    """Each stage's ms from the sub-batch's len(STAGES) + 1 stamps (seconds), in order."""
    _check(stamps)
    ordered = [stamps[0]]
    for stamp in stamps[1:]:
        ordered.append(max(stamp, ordered[-1]))
    return tuple((later - earlier) * 1e3 for earlier, later in zip(ordered, ordered[1:]))


def _check(stamps: Sequence[float]) -> None:
    if len(stamps) != len(STAGES) + 1:
        raise ValueError(f"{len(stamps)} stamps; a sub-batch has {len(STAGES) + 1}")


class StageTimes:
    """The stages of the last `window` sub-batches. Not thread-safe: the pool updates and reads it
    under its lock."""

    def __init__(self, window: int = WINDOW):
        self._recent: deque[tuple[Sequence[float], int]] = deque(maxlen=window)  # (stamps, requests)
        self.sub_batches = 0  # since the pool started

    def add(self, stamps: Sequence[float], requests: int) -> None:
        """One answered sub-batch of `requests` requests, from its stamps (checked now, turned
        into stages when the figures are read: every sub-batch adds, few are read)."""
        _check(stamps)
        self._recent.append((stamps, requests))
        self.sub_batches += 1

    def clear(self) -> None:
        """Forget the window (a benchmark measuring from now on); the count since start stays."""
        self._recent.clear()

    def means(self) -> dict[str, float]:
        """Mean ms per stage over the window, and "total": the mean sub-batch's whole time (as
        each sub-batch's stages add up to it, so do their means). Empty before the first sub-batch."""
        return self._summary(statistics.fmean)

    def medians(self) -> dict[str, float]:
        """Median ms per stage over the window, and "total": the median sub-batch's whole time
        (medians of the stages need not add up to it)."""
        return self._summary(statistics.median)

    def sums(self, stages: Sequence[str]) -> list[float]:
        """Each recent sub-batch's ms in `stages` together, oldest first."""
        columns = [STAGES.index(stage) for stage in stages]
        return [sum(times[c] for c in columns) for times in self._stages()]

    def requests_per_sub_batch(self) -> float:
        """Mean requests per sub-batch over the window (0 before the first): against the plan's
        batch per instance, whether batches reach the instances whole."""
        return statistics.fmean(n for _, n in self._recent) if self._recent else 0.0

    def _summary(self, statistic) -> dict[str, float]:
        if not self._recent:
            return {}
        stages = self._stages()
        figures = {stage: statistic(column) for stage, column in zip(STAGES, zip(*stages))}
        figures["total"] = statistic([sum(times) for times in stages])
        return figures

    def _stages(self) -> list[tuple[float, ...]]:
        return [stage_ms(stamps) for stamps, _ in self._recent]
