"""Faults injected into a running server: its pool instances found under its process and killed
(SIGKILL) one at a time, round robin, every few seconds; the machine made slower than its profile
(CPU-bound processes pinned to the server's cores)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import contextmanager
from pathlib import Path

import psutil

from packrat.bench.harness import Periodic
from packrat.serving.pool.forkserver import NAME as FORK_SERVER

POOL_MARKER = "packrat.serving.pool"  # instances run as `python -m packrat.serving.pool FD`, or forked from the fork server
# A CPU-bound loop that ends when its parent does: a benchmark killed with -9 leaves no spinning orphan.
HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(1_000_000):\n        pass\n"


def torchserve_pid(run_dir: Path) -> int | None:
    """The TorchServe (Java) process of the server in run_dir, from the pid file it writes."""
    try:
        return int((Path(run_dir) / "tmp" / ".model_server.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def pool_instances(root_pid: int, marker: str = POOL_MARKER) -> list[psutil.Process]:
    """Live descendants of root_pid whose command line names `marker`, longest-lived first."""
    try:
        descendants = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for proc in descendants:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and any(marker in arg for arg in proc.cmdline()) \
                    and proc.name() != FORK_SERVER:  # its children, the instances, share its command line
                found.append((proc.create_time(), proc.pid, proc))
        except psutil.Error:  # gone meanwhile, or not ours to inspect
            continue
    return [proc for _, _, proc in sorted(found, key=lambda item: item[:2])]


def kill_one(root_pid: int, marker: str = POOL_MARKER, skip: Collection[int] = ()) -> int | None:
    """SIGKILL the oldest pool instance under root_pid but `skip`'s (respawns make it round robin): its pid."""
    for proc in pool_instances(root_pid, marker):
        if proc.pid in skip:
            continue
        try:
            proc.kill()
            return proc.pid
        except psutil.Error:
            continue
    return None


class InstanceKiller(Periodic):
    """While active, kills a pool instance under `root_pid` (or what a function of it gives) every `every_s`."""

    def __init__(self, root_pid: int | Callable[[], int | None], every_s: float, marker: str = POOL_MARKER):
        if every_s <= 0:
            raise ValueError(f"kill interval must be > 0 s, got {every_s}")
        super().__init__(every_s, "instance-killer")
        self._root = root_pid if callable(root_pid) else (lambda: root_pid)
        self.marker = marker
        self.killed: list[tuple[float, int]] = []  # (unix time, pid)
        self.misses = 0  # ticks that found no instance to kill

    @property
    def kills(self) -> int:
        return len(self.killed)

    def tick(self) -> None:
        root = self._root()
        pid = kill_one(root, self.marker, {pid for _, pid in self.killed}) if root is not None else None
        if pid is None:
            self.misses += 1
        else:
            self.killed.append((time.time(), pid))


@contextmanager
def cpu_hogs(cores: Sequence[int]):
    """One CPU-bound process pinned to each of `cores` while the block runs; killed on any exit."""
    procs: list[subprocess.Popen] = []
    try:
        for core in cores:
            procs.append(subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            os.sched_setaffinity(procs[-1].pid, {core})
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
