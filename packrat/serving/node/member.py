"""One engine's part in the node: its heartbeat, the lease, and moving its own share.

Each engine runs a NodeMember thread: once a period it writes its heartbeat, holds or tries to take
the owner's lease (planning if it has it: owner.py), and starts its own part of the current step.
A move (the engine's pool switching cores) runs in a thread of its own, so the heartbeat goes on
while it runs: a long move is a long move, not a death. The heartbeat says where the engine serves
(`share`), which step it has applied, which one it is applying, and which one it could not apply
and why; a member's cores change only once its pool has moved.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from packrat.machine.topology import Topology
from packrat.serving.node.files import PERIOD_S, STALE_S, Lease, read_json, read_state, write_json
from packrat.serving.node.load import LoadMeter
from packrat.serving.node.owner import NodeOwner

log = logging.getLogger("packrat.serving.node")

Share = tuple[tuple[int, ...], bool]  # cores, whether it takes turns on them


class NodeMember:
    """`apply(cores, locked)` moves the engine to its share, blocking until it serves there; when it
    raises, the engine still serves on its old cores (taking turns if it did, or was asked to).
    `describe()` gives what the heartbeat reports: {"batch", "items", "in_hand"} and, optionally,
    "fenced": the cores its stuck thread instances hold, which the node plans for no model."""

    def __init__(self, root: Path, model: str, topology: Topology, apply: Callable[[tuple[int, ...], bool], None],
                 describe: Callable[[], dict], *, slo_ms: float | None = None, period_s: float = PERIOD_S,
                 owner: NodeOwner | None = None):
        self.root, self.model, self.slo_ms = root, model, slo_ms
        self.id = f"{model}-{os.getpid()}-{id(self) % 10000}"
        self.apply, self.describe, self.period_s = apply, describe, period_s
        # the longest request of a model this one takes turns with, in the plan: its turns may be as long
        self.longest_request_ms: float | None = None
        self.meter = LoadMeter()
        self.owner = owner or NodeOwner(root, topology)
        self.lease = Lease(root, self.id)
        self.applied: list[int] | None = None
        self.share: Share | None = None
        self.failed: dict | None = None  # {"step": [generation, step], "reason"}: the last move that failed
        self.moving: list[int] | None = None  # the step whose move runs now
        # False while the engine builds its pool: the thread only beats (a member silent for
        # STALE_S would be dropped and rejoin, a needless move) and applies steps once it is True.
        self.applying = True
        self._mover: threading.Thread | None = None
        self._last_round = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for folder in ("members", "cores"):
            (root / folder).mkdir(parents=True, exist_ok=True)

    @property
    def lock_dir(self) -> str:
        return str(self.root / "cores")

    @property
    def is_owner(self) -> bool:
        return self.lease.epoch is not None

    @property
    def _beat_path(self) -> Path:
        return self.root / "members" / f"{self.id}.json"

    def join(self, timeout_s: float = 30.0) -> Share | None:
        """Announce this engine and wait for its first share (None if none came in time)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.step(apply=False)
            if self.share is not None:
                return self.share
            time.sleep(self.period_s / 2)
        return None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="packrat-node")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.step(wait=False)
            except Exception as exc:  # the node's plan must never cost this model its service
                log.warning("node step failed: %s: %s", type(exc).__name__, exc)

    def step(self, apply: bool = True, wait: bool = True) -> None:
        """One round: heartbeat, the lease (planning if held), and this member's part of the current
        step, started in the background (`wait`: and waited for)."""
        self._after_silence()
        self._heartbeat()
        if self.lease.hold():
            self.owner.tick(self.lease.epoch)
        if apply and not self.applying:
            return
        state = read_state(self.root)
        if not state or not state.get("steps") or self.moving is not None:
            return
        want = [state["generation"], state["step"]]
        if self.applied == want or (self.failed or {}).get("step") == want:
            return
        mine = state["steps"][state["step"]].get(self.id)
        share = (tuple(mine[0]), bool(mine[1])) if mine is not None else None
        planned = (((state.get("target") or {}).get("plan") or {}).get("models") or {}).get(self.id) or {}
        self.longest_request_ms = planned.get("longest_request_ms")  # read by apply() for its turns
        if share is None or share == self.share or not apply:
            self.share, self.applied = share or self.share, want
            self._heartbeat()
            return
        self._start_move(share, want)
        if wait and self._mover is not None:
            self._mover.join()

    def _start_move(self, share: Share, want: list[int] | None) -> None:
        self.moving = want or [0, 0]
        self._mover = threading.Thread(target=self._move, args=(share, want), daemon=True, name="packrat-node-move")
        self._mover.start()

    def _move(self, share: Share, want: list[int] | None) -> None:
        try:
            self._injected(share)
            self.apply(*share)
            self.share, self.failed = share, None
            if want is not None:
                self.applied = want
        except Exception as exc:  # said to the owner, which re-plans around it
            reason = f"{type(exc).__name__}: {exc}"
            log.error("this model could not move to cores %s: %s; it serves where it was", list(share[0]), reason)
            if self.share is not None:  # turns asked for are taken before the cores change
                self.share = (self.share[0], self.share[1] or share[1])
            self.failed = {"step": want, "reason": reason}
        finally:
            self.moving = None
            self._heartbeat()

    def _injected(self, share: Share) -> None:
        """A fault a chaos run asks for (benchmarks/node_chaos.py) in a move that changes this
        model's cores: faults/move-MODEL.json in the node directory, {"delay_s": S} to make it slow,
        {"fail": REASON} to make it fail as a switch does (after the turns asked for are taken)."""
        fault = read_json(self.root / "faults" / f"move-{self.model}.json") or {}
        if self.share is None or share[0] == self.share[0]:
            return
        if fault.get("delay_s"):
            log.warning("injected fault: this move waits %.0f s", fault["delay_s"])
            time.sleep(fault["delay_s"])
        if fault.get("fail"):
            if share[1]:
                self.apply(self.share[0], True)
            raise RuntimeError(f"injected fault: {fault['fail']}")

    def _after_silence(self) -> None:
        """A member silent for STALE_S (stuck, not stopped) has been dropped and its cores given away:
        it takes turns on them at once, until the owner plans with it again."""
        now = time.monotonic()
        silent, self._last_round = now - self._last_round, now
        if silent > STALE_S and self.share and not self.share[1] and self.moving is None \
                and not self._beat_path.exists():
            log.warning("this member was silent for %.0f s and left the node: taking turns on its cores", silent)
            self._start_move((self.share[0], True), self.applied)

    def _heartbeat(self) -> None:
        described = self.describe()
        self.meter.sample(described.get("in_hand", 0))
        write_json(self._beat_path, {
            "id": self.id, "model": self.model, "pid": os.getpid(), "heartbeat": time.time(),
            "items": described["items"], "batch": described["batch"], "rate": self.meter.rate(),
            "slo_ms": self.slo_ms, "fenced": list(described.get("fenced") or []),
            "applied": self.applied, "moving": self.moving, "failed": self.failed,
            "share": [list(self.share[0]), self.share[1]] if self.share else None})

    def status(self) -> dict:
        state = read_state(self.root) or {}
        members = {m["id"]: m for m in (read_json(p) for p in (self.root / "members").glob("*.json")) if m}
        target = state.get("target", {})
        _, lease = self.lease.newest()
        return {"directory": str(self.root), "member": self.id, "owner": self.is_owner,
                "planned_by": (self.lease.holder_of(lease) or {}).get("id"), "epoch": self.lease.newest()[0],
                "share": {"cores": list(self.share[0]), "takes_turns": self.share[1]} if self.share else None,
                "plan": target.get("plan"), "holding": target.get("holding"), "generation": state.get("generation"),
                "step": state.get("step"),
                "members": {k: {"model": m["model"], "pid": m["pid"], "rate_rps": m["rate"], "batch": m["batch"],
                                "slo_ms": m.get("slo_ms"), "serves_on": m.get("share"), "moving": m.get("moving"),
                                "failed": m.get("failed"), "fenced": m.get("fenced", [])}
                            for k, m in members.items()},
                "moves": state.get("moves", [])}

    def leave(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        self._beat_path.unlink(missing_ok=True)
        self.lease.release()  # the next member to look plans for the node
