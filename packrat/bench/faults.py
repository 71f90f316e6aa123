"""Faults injected into a running server, and a clock to inject them by: its pool instances found
under TorchServe's process and killed (SIGKILL) one at a time, round robin, every few seconds.

`Periodic` runs any tick every few seconds in a thread (the killer; the benchmarks' samplers)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

import psutil

POOL_MARKER = "packrat.serving.pool"  # instances run as `python -m packrat.serving.pool FD`


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
            if proc.status() != psutil.STATUS_ZOMBIE and any(marker in arg for arg in proc.cmdline()):
                found.append((proc.create_time(), proc.pid, proc))
        except psutil.Error:  # gone meanwhile, or not ours to inspect
            continue
    return [proc for _, _, proc in sorted(found, key=lambda item: item[:2])]


def kill_one(root_pid: int, marker: str = POOL_MARKER, skip: Collection[int] = ()) -> int | None:
    """SIGKILL the longest-lived pool instance under root_pid (pids in `skip` aside: killed
    already, maybe not dead yet); its pid, or None when none is left.

    Killed instances are respawned as new processes, so taking the oldest each time goes
    round robin over the pool's slots."""
    for proc in pool_instances(root_pid, marker):
        if proc.pid in skip:
            continue
        try:
            proc.kill()
            return proc.pid
        except psutil.Error:
            continue
    return None


class Periodic:
    """While active (a with block), calls self.tick() every `every_s` seconds in a daemon thread."""

    def __init__(self, every_s: float, name: str):
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.tick()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class InstanceKiller(Periodic):
    """While active, kills one pool instance under the root process every `every_s` seconds.

    `root_pid` is a pid or a function returning one (None: nothing to kill this time)."""

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

