"""An instance's turns on cores time-shared with other models (the node gave them to several).

A turn is up to `turn_ms` of this instance's work with its cores' locks held (core_locks.py). A
batch longer than that runs in several turns (its requests split in near-equal parts), so a heavy
model cannot hold a light one off for a whole batch; a shorter batch is one turn, ended when the
batch is answered. A turn used to go on across batches that followed within 3 ms, to give a light
model the quantum's time too; through TorchServe its next batch comes only once the server has had
this one's answers (one batch at a time per worker; a closed loop sends again when answered), later
than a turn can wait with the cores idle; and the cores so held were out of the parent's sight: an
instance stopped then held them with no batch for its watchdog to time, and the other models
waited for ever (test_turns.py's stopped holder timed out so). The node planner counts a light
model's turn as one batch (planning/node.py, turn_length).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Sequence

from packrat.serving.pool.core_locks import holding


def turn_sizes(requests: int, request_ms: float, turn_ms: float | None) -> list[int]:
    """The requests of each turn: all in one, unless a turn of them would run past `turn_ms`: then
    near-equal turns that fit it, one request at least."""
    if not turn_ms or request_ms <= 0 or requests * request_ms <= turn_ms:
        return [requests]
    per_turn = max(1, int(turn_ms // request_ms))
    turns = -(-requests // per_turn)
    return [requests // turns + (i < requests % turns) for i in range(turns)]


class Turn:
    """The cores' locks, held from `begin` while the turn lasts."""

    def __init__(self, cores: Sequence[int]):
        self.cores = cores
        self.locks: str | None = None
        self.quantum: float | None = None  # the longest turn (ms), while the cores are time-shared
        self.began = 0.0
        self._held: ExitStack | None = None

    @property
    def held(self) -> bool:
        return self._held is not None

    def used_ms(self) -> float:
        return (time.monotonic() - self.began) * 1e3 if self.held else 0.0

    def begin(self, locks: str | None) -> None:
        """Hold the locks in `locks` (None: the cores are this model's alone), unless a turn holds them."""
        if self.held and locks == self.locks:
            return
        self.end()
        if locks is None:
            return
        self._held = ExitStack()
        self._held.enter_context(holding(locks, self.cores))
        self.locks, self.began = locks, time.monotonic()

    def end(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None

    def spent(self, turn_ms: float | None) -> bool:
        """Whether the turn has run its time (always, without a quantum: a turn per batch)."""
        return not turn_ms or self.used_ms() >= turn_ms
