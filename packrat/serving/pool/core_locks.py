"""Exclusive use of cores across processes, for models that take turns on a shared core set.

One lock file per core in the node's directory (`core-N.lock`); an instance whose cores are
time-shared takes the locks of all its cores, in core order (so two instances never wait on each
other in a circle), for each batch it runs, and gives them back after. They are flock(2) locks:
the kernel releases them when the process holding them dies, so a killed instance never leaves a
core locked.

Turns come in the order they were asked for: Linux wakes the processes blocked on a freed flock in
the order they blocked, and the first to run takes it. Measured on this VM (kernel 6.18, tests/
test_turns.py): three processes asking one after another got the core in that order in 8 runs of
8, also with three busy loops on its two cores; a process that gives the core back and asks again
at once does not get it before one already waiting; a waiter stopped by SIGSTOP does not hold the
others up. A ticket queue in files was built and measured against flock alone and changed none of
this, so it was left out (BENCHMARKS.md, issue 33).
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

_open: dict[str, int] = {}  # lock file path -> descriptor, kept open for the process's life


def lock_path(directory: str | Path, core: int) -> Path:
    return Path(directory) / f"core-{core}.lock"


def _descriptor(path: Path) -> int:
    key = str(path)
    if key not in _open:
        path.parent.mkdir(parents=True, exist_ok=True)
        _open[key] = os.open(key, os.O_RDWR | os.O_CREAT, 0o600)
    return _open[key]


def holders(directory: str | Path, cores: Sequence[int] | None = None) -> dict[int, int]:
    """Which process holds each core's lock now (core -> pid; a free core is left out), every core
    with a lock file in `directory` unless `cores` are named. Read from /proc/locks, which names
    the files by inode: the parent sees a holder that cannot say it holds (stopped, say)."""
    files = {}
    if cores is None:
        cores = [int(path.stem.split("-")[1]) for path in Path(directory).glob("core-*.lock")]
    for core in cores:
        try:
            stat = lock_path(directory, core).stat()
        except FileNotFoundError:  # never locked: nobody holds it
            continue
        files[f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"] = core
    found = {}
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()  # "1: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE 0 EOF"; a waiter's has "->"
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] in files:
            found[files[fields[5]]] = int(fields[4])
    return found


@contextmanager
def holding(directory: str | Path | None, cores: Sequence[int]) -> Iterator[None]:
    """Hold the locks of `cores` (none when `directory` is None) for the body of the block."""
    if directory is None:
        yield
        return
    taken = []
    try:
        for core in sorted(set(cores)):
            descriptor = _descriptor(lock_path(directory, core))
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            taken.append(descriptor)
        yield
    finally:
        for descriptor in reversed(taken):
            fcntl.flock(descriptor, fcntl.LOCK_UN)
