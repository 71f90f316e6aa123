"""A process's share of a core: its CPU time per second of wall time over the last seconds, for the
whole process and for its main thread (a server's event loop), beside the requests it answered.

`CpuMeter.sample()` takes one reading; `shares()` compares the newest with the oldest kept (at most
`window_s` old). The readings are the process's CPU clock (every thread: the loop, thread instances,
their runtimes' threads) and the main thread's own clock (pthread_getcpuclockid).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 10.0


def main_thread_cpu_s() -> float:
    """CPU seconds so far of this process's main thread, read from any thread."""
    return time.clock_gettime(time.pthread_getcpuclockid(threading.main_thread().ident))


@dataclass(frozen=True)
class Reading:
    at: float  # time.monotonic()
    process_s: float
    loop_s: float
    answered: int


class CpuMeter:
    """Readings of this process's CPU time and of `answered()` (requests answered so far)."""

    def __init__(self, answered: Callable[[], int] = lambda: 0, *, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, process_s: Callable[[], float] = time.process_time,
                 loop_s: Callable[[], float] = main_thread_cpu_s):
        self.answered, self.window_s = answered, window_s
        self.clock, self.process_s, self.loop_s = clock, process_s, loop_s
        self.readings: deque[Reading] = deque()
        self.sample()

    def sample(self) -> None:
        now = self.clock()
        self.readings.append(Reading(now, self.process_s(), self.loop_s(), self.answered()))
        while len(self.readings) > 2 and now - self.readings[1].at >= self.window_s:
            self.readings.popleft()

    def shares(self) -> dict:
        """Over the window: "cpu_share" (the process's CPU seconds per second: 1.0 is a whole core),
        "loop_share" (its main thread's), "answered_rps", "rps_per_core" (answered per CPU second of
        the process; None before any CPU time) and "seconds" (the window's length)."""
        first, last = self.readings[0], self.readings[-1]
        span = last.at - first.at
        if span <= 0:
            return {"cpu_share": None, "loop_share": None, "answered_rps": None, "rps_per_core": None, "seconds": 0.0}
        cpu = last.process_s - first.process_s
        answered = last.answered - first.answered
        return {"cpu_share": cpu / span, "loop_share": (last.loop_s - first.loop_s) / span,
                "answered_rps": answered / span, "rps_per_core": answered / cpu if cpu > 0 else None,
                "seconds": span}


class Sampling:
    """A daemon thread that samples `meter` every `period_s` and calls `also()` after each (say, a
    check that the parent process is still there)."""

    def __init__(self, meter: CpuMeter, period_s: float = 1.0, also: Callable[[], None] = lambda: None):
        self.meter, self.period_s, self.also = meter, period_s, also
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="packrat-cpu-meter")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.meter.sample()
            self.also()

    def stop(self) -> None:
        self._stop.set()
