"""The node directory: where its files live, how they are written whole, and the owner's lease.

    members/ID.json        each engine's heartbeat (member.py)
    owner/epoch-N.json     the lease of the N-th owner: created once, exclusively (O_EXCL), so two
                           engines can never both become the N-th owner; renewed by touching it
    plans/plan-N.json      the node plan as the N-th owner keeps it (owner.py); readers take the
                           newest N, so a late owner N, stopped and resumed after N + 1 took over,
                           writes only a file nobody reads any more (fencing by epoch)
    cores/                 the per-core locks of models that take turns (pool/core_locks.py)
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import psutil

from packrat.settings import NODE_DIR_ENV

log = logging.getLogger("packrat.serving.node")

PERIOD_S = 0.5  # a member's round: heartbeat, lease, planning, its own part of the plan
STALE_S = 10.0  # a heartbeat older than this (of a process not stopped on purpose) is a member that left
LEASE_S = 3.0  # an owner's lease not renewed for this long is taken over
KEPT_EPOCHS = 2  # plan and lease files of older owners are deleted on a takeover


def node_dir(cores: list[int], base: str | Path | None = None) -> Path:
    """The node directory of engines whose budget is `cores`."""
    base = Path(base or NODE_DIR_ENV.get())
    return base / ("cores-" + "_".join(map(str, sorted(cores))))


def write_json(path: Path, value: dict) -> None:
    """Whole or not at all: readers never see half a file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    partial.write_text(json.dumps(value))
    partial.replace(path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stopped(pid: int) -> bool:
    """Stopped by a signal (SIGSTOP, a debugger): silent, but it will go on where it was."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def _numbered(folder: Path, prefix: str) -> list[tuple[int, Path]]:
    """Files PREFIX-N.json of `folder`, by N."""
    found = []
    for path in folder.glob(f"{prefix}-*.json"):
        try:
            found.append((int(path.stem[len(prefix) + 1:]), path))
        except ValueError:
            continue
    return sorted(found)


def plan_path(root: Path, epoch: int) -> Path:
    return root / "plans" / f"plan-{epoch}.json"


def read_state(root: Path) -> dict | None:
    """The node plan as its newest owner wrote it (None before any)."""
    for _, path in reversed(_numbered(root / "plans", "plan")):
        state = read_json(path)
        if state is not None:
            return state
    return None


class Lease:
    """Who plans for the node: the holder of the newest owner/epoch-N.json, while it renews it.

    An owner that dies, or is alive but does not renew (stopped, stuck), loses the lease after
    LEASE_S; a member then creates epoch N + 1 (only one can) and copies the plan into its own
    plans/plan-(N+1).json. The old owner, if it comes back, finds a newer epoch and steps down."""

    def __init__(self, root: Path, holder: str, lease_s: float = LEASE_S):
        self.root, self.holder, self.lease_s = root, holder, lease_s
        self.epoch: int | None = None
        for folder in ("owner", "plans"):
            (root / folder).mkdir(parents=True, exist_ok=True)

    def newest(self) -> tuple[int, Path | None]:
        numbered = _numbered(self.root / "owner", "epoch")
        return numbered[-1] if numbered else (0, None)

    def holder_of(self, path: Path | None) -> dict | None:
        return read_json(path) if path is not None else None

    def live(self, path: Path | None) -> bool:
        if path is None:
            return False
        try:
            renewed = path.stat().st_mtime
        except OSError:
            return False
        holder = self.holder_of(path)
        if holder is not None and not alive(holder["pid"]):
            return False
        return time.time() - renewed <= self.lease_s  # unreadable: being written, judged by its age

    def hold(self) -> bool:
        """Renew this member's lease or take over a lapsed one; whether it plans for the node now."""
        epoch, path = self.newest()
        if self.epoch is not None:
            if epoch == self.epoch:
                os.utime(path)
                return True
            holder = self.holder_of(path) or {}
            log.warning("the node's planning passed to %s (epoch %d) while this member (epoch %d) was silent: "
                        "stepping down", holder.get("id", "another member"), epoch, self.epoch)
            self.epoch = None
        if self.live(path):
            return False
        return self._take_over(epoch + 1, self.holder_of(path))

    def _take_over(self, epoch: int, previous: dict | None) -> bool:
        path = self.root / "owner" / f"epoch-{epoch}.json"
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another member took it first
            return False
        with os.fdopen(descriptor, "w") as file:
            json.dump({"id": self.holder, "pid": os.getpid(), "epoch": epoch, "since": time.time()}, file)
        state = read_state(self.root)
        if state is not None:
            write_json(plan_path(self.root, epoch), state)
        self.epoch = epoch
        self._forget_before(epoch - KEPT_EPOCHS + 1)
        log.info("this process (pid %d) now plans the node's cores (epoch %d%s)", os.getpid(), epoch,
                 f", after {previous['id']}" if previous else "")
        return True

    def _forget_before(self, epoch: int) -> None:
        for folder, prefix in (("owner", "epoch"), ("plans", "plan")):
            for number, path in _numbered(self.root / folder, prefix):
                if number < epoch:
                    path.unlink(missing_ok=True)

    def release(self) -> None:
        """Give the lease up at once (the next member to look takes over)."""
        if self.epoch is None:
            return
        path = self.root / "owner" / f"epoch-{self.epoch}.json"
        self.epoch = None
        try:
            os.utime(path, (0, 0))  # lapsed long ago
        except OSError:
            pass
