"""Threads on chosen cores: pinning the calling thread, a worker thread pinned to a core set, and
what the kernel says of each thread of this process: the CPUs it may run on, its name, its CPU time.

On Linux ``sched_setaffinity(0, …)`` pins the calling thread alone, and a thread inherits the
affinity of the thread that starts it: a worker pinned before it starts a runtime's threads has
them start on its cores.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Sequence


def pin_thread(cores: Sequence[int]) -> None:
    """Pin the calling thread (not the process) to `cores`."""
    os.sched_setaffinity(0, list(cores))


def name_thread(name: str) -> None:
    """Give the calling thread `name` in the kernel's eyes (/proc/self/task/TID/comm, 15 bytes at
    most): the threads it starts from then on inherit it, a runtime's own threads included."""
    try:
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(name[:15])
    except OSError:  # no /proc: the thread keeps its name
        pass


def thread_cpu_s(tids) -> float:
    """CPU seconds (user + system) so far of threads `tids` of this process, from each one's own CPU
    clock (the kernel's per-thread clock, as pthread_getcpuclockid makes it); threads gone are left out."""
    total = 0.0
    for tid in tids:
        try:
            total += time.clock_gettime((~tid << 3) | 6)  # CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED
        except OSError:
            continue
    return total


def task_cpu(pid: int | str = "self") -> dict[int, tuple[str, float]]:
    """Each thread of a process: its id -> (its name, its CPU seconds so far, user + system), from
    /proc/PID/task/*/stat (threads that end while they are read are left out)."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        found[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / tick)  # utime, stime
    return found


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
    no polling. `call` gives a future of the callable's result; `post` runs it for its effects.
    `kernel_name`: the thread's name in the kernel (name_thread), which the threads it starts inherit."""

    def __init__(self, cores: Sequence[int], name: str, kernel_name: str | None = None):
        self.cores, self.kernel_name = tuple(cores), kernel_name
        self.native_id: int | None = None  # the kernel's id of the thread, once it runs
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True, name=name)
        self.thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        pin_thread(self.cores)  # before anything it runs starts threads of its own: they inherit this
        if self.kernel_name:
            name_thread(self.kernel_name)  # and this
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


def pin_process(cores: Sequence[int]) -> None:
    """Pin every thread of this process to `cores` (sched_setaffinity(0, …) pins the calling thread
    alone, and threads an import started keep the affinity they had); threads started from then on
    inherit it."""
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), list(cores))
        except (ProcessLookupError, FileNotFoundError):  # a thread that ended meanwhile
            continue
