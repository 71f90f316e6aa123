"""Threads on chosen cores: pinning the calling thread, a worker thread pinned to a core set, and
what the kernel says each thread of this process may run on.

On Linux ``sched_setaffinity(0, …)`` pins the calling thread alone, and a thread inherits the
affinity of the thread that starts it: a worker pinned before it starts a runtime's threads has
them start on its cores.
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Sequence


def pin_thread(cores: Sequence[int]) -> None:
    """Pin the calling thread (not the process) to `cores`."""
    os.sched_setaffinity(0, list(cores))


def parse_cpu_list(text: str) -> set[int]:
    """A kernel CPU list ("0-3,8,10-11") as a set of CPU ids."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def task_affinities(pid: int | str = "self") -> dict[int, tuple[str, set[int]]]:
    """Each thread of a process: its id -> (its name, the CPUs it may run on), from
    /proc/PID/task/*/status (threads that end while they are read are left out)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue
        found[int(task.name)] = (fields["Name"].strip(), parse_cpu_list(fields["Cpus_allowed_list"]))
    return found


class PinnedWorker:
    """A thread pinned to `cores` that runs the callables handed to it, one at a time, in order.
    Handing one over is one wake of the thread (a SimpleQueue: it waits without the GIL); there is
    no polling. `call` gives a future of the callable's result; `post` runs it for its effects."""

    def __init__(self, cores: Sequence[int], name: str):
        self.cores = tuple(cores)
        self.native_id: int | None = None  # the kernel's id of the thread, once it runs
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True, name=name)
        self.thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        pin_thread(self.cores)  # before anything it runs starts threads of its own: they inherit this
        self.native_id = threading.get_native_id()
        started.set()
        while True:
            work = self._inbox.get()
            if work is None:
                return
            work()

    def post(self, work: Callable[[], None]) -> None:
        """Run `work()` on the thread, after what was handed over before (it must not raise)."""
        self._inbox.put(work)

    def call(self, work: Callable[[], object]) -> Future:
        """Run `work()` on the thread; its result (or exception) in the future."""
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(work())
            except BaseException as exc:  # the caller's to see
                future.set_exception(exc)
        self.post(run)
        return future

    def stop(self) -> None:
        """The thread ends once what was handed over before has run."""
        self._inbox.put(None)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()
