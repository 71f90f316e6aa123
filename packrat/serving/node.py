"""Several models on one machine: their engines agree on one plan of cores, with no service to run.

Every engine whose CPU budget is the same set of cores shares a *node directory* (under
NODE_DIR_ENV, default /tmp/packrat-node-UID, one folder per core set):

    members/ID.json   each engine's heartbeat: model, pid, profile, batch, observed load, SLO, the
                      step of the node plan it has applied
    plan.json         the node plan and the steps towards it (planning/node.transition), written
                      whole (rename) by the owner
    owner.lock        flock'd by the engine that plans for the node: when it dies the kernel frees
                      the lock and the next engine to look takes over from plan.json
    cores/            the per-core locks of models that take turns (pool/core_locks.py)

Each engine runs a NodeMember thread: once a period it writes its heartbeat, tries to become the
owner (planning if it is), and applies its own part of the current step, then says so. The owner
re-plans when a member joins or leaves at once, and when the load shifts only if the new plan
lowers the worst score by `improvement` and the last move is `dwell_s` old (hysteresis, so bursts
that alternate do not thrash); it moves to a step's successor once every member has applied it.
Every move is kept with its reason and duration.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from packrat.errors import NoPlanError
from packrat.machine.topology import Topology
from packrat.planning.node import Allocation, ModelLoad, NodePlan, NodePlanner, transition
from packrat.settings import NODE_DIR_ENV

log = logging.getLogger(__name__)
PERIOD_S = 0.5
STALE_S = 10.0  # a heartbeat older than this (or a dead pid) is a member that left
BUSY_SATURATED = 0.85  # a pool busy this share of the time takes whatever it gets: saturated
LOAD_WINDOW_S = 10.0
STEP_TIMEOUT_S = 120.0  # a member that has not applied a step by then is judged stuck


def node_dir(cores: list[int], base: str | Path | None = None) -> Path:
    """The node directory of engines whose budget is `cores`."""
    base = Path(base or NODE_DIR_ENV.get())
    return base / ("cores-" + "_".join(map(str, sorted(cores))))


def _write_json(path: Path, value: dict) -> None:
    """Whole or not at all: readers never see half a file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    partial.write_text(json.dumps(value))
    partial.replace(path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@dataclass
class LoadMeter:
    """Arrivals and busy time over a sliding window: the load a member reports."""

    window_s: float = LOAD_WINDOW_S
    clock: Callable[[], float] = time.monotonic
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    busy: list[tuple[float, bool]] = field(default_factory=list)
    started: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def arrive(self, count: int) -> None:
        self.arrivals.append((self.clock(), count))

    def sample(self, outstanding: int) -> None:
        self.busy.append((self.clock(), outstanding > 0))

    def rate(self) -> float | None:
        """Requests a second, 0 when idle, None when saturated (busy nearly all the window)."""
        now = self.clock()
        self.arrivals = [a for a in self.arrivals if a[0] > now - self.window_s]
        self.busy = [b for b in self.busy if b[0] > now - self.window_s]
        span = min(self.window_s, max(now - self.started, 1e-3))
        if self.busy and sum(b for _, b in self.busy) / len(self.busy) >= BUSY_SATURATED:
            return None
        return sum(n for _, n in self.arrivals) / span


@dataclass
class Move:
    generation: int
    reason: str
    plan: str
    started_at: float  # unix time
    seconds: float | None = None  # until every member applied the last step


class NodeOwner:
    """The plan for the node, made by whichever member holds owner.lock. Its state lives in plan.json."""

    def __init__(self, root: Path, topology: Topology, *, improvement: float = 0.15, dwell_s: float = 20.0,
                 clock: Callable[[], float] = time.time):
        self.root, self.topology = root, topology
        self.improvement, self.dwell_s, self.clock = improvement, dwell_s, clock

    def members(self) -> dict[str, dict]:
        found = {}
        for path in (self.root / "members").glob("*.json"):
            member = _read_json(path)
            if member is None:
                continue
            if not _alive(member["pid"]) or self.clock() - member["heartbeat"] > STALE_S:
                path.unlink(missing_ok=True)
                log.warning("node member %s (pid %d) is gone", member["id"], member["pid"])
                continue
            found[member["id"]] = member
        return found

    def tick(self) -> None:
        members = self.members()
        state = _read_json(self.root / "plan.json") or {"generation": 0, "steps": [], "step": 0, "moves": []}
        if members and state["steps"] and self._step_done(state, members):
            if state["step"] + 1 < len(state["steps"]):
                state["step"] += 1
                _write_json(self.root / "plan.json", state)
                return
            self._finish(state)
        if not members:
            return
        in_motion = state["step"] + 1 < len(state["steps"]) or not self._step_done(state, members)
        joined_or_left = set(members) != set(state.get("target", {}).get("allocation", {}))
        if in_motion and not joined_or_left:
            return
        try:
            planner = NodePlanner([_load(m) for m in members.values()], self.topology.num_cores)
            plan = planner.plan(self.topology)
        except (NoPlanError, ValueError) as exc:
            log.error("no node plan: %s", exc)
            return
        reason = self._why(state, members, plan, planner, joined_or_left)
        if reason is not None:
            self._publish(state, plan, members, reason)

    def _why(self, state: dict, members: dict, plan: NodePlan, planner: NodePlanner, joined_or_left: bool) -> str | None:
        """Why the node should move to `plan`, or None to stay."""
        current = state.get("target")
        if current is None or joined_or_left:
            names = sorted(m["model"] for m in members.values())
            return f"members {', '.join(names)}" if current is None else f"members changed: now {', '.join(names)}"
        new = _allocation(plan, members)
        if new == {k: (tuple(v[0]), v[1]) for k, v in current["allocation"].items()}:
            return None
        if self.clock() - state.get("changed_at", 0) < self.dwell_s:
            return None
        now_worst = planner.evaluate(current["allocation"])
        if plan.worst >= now_worst * (1 - self.improvement):
            return None
        return f"load shifted: worst score {now_worst:.2f} → {plan.worst:.2f}"

    def _publish(self, state: dict, plan: NodePlan, members: dict, reason: str) -> None:
        new = _allocation(plan, members)
        old = {k: (tuple(v[0]), v[1]) for k, v in state["steps"][state["step"]].items()} if state["steps"] else {}
        steps = transition(old, new) or [new]
        generation = state["generation"] + 1
        text = plan.describe()
        for member_id, member in members.items():  # model names read better than member ids
            text = text.replace(member_id, member["model"])
        move = Move(generation, reason, text, self.clock())
        state.update(generation=generation, step=0, changed_at=self.clock(),
                     steps=[{k: [list(c), locked] for k, (c, locked) in s.items()} for s in steps],
                     target={"allocation": {k: [list(c), locked] for k, (c, locked) in new.items()},
                             "plan": plan.to_json(), "names": {k: members[k]["model"] for k in members}},
                     moves=(state.get("moves", []) + [move.__dict__])[-50:])
        log.info("node plan %d (%s): %s", generation, reason, text)
        _write_json(self.root / "plan.json", state)

    def _step_done(self, state: dict, members: dict) -> bool:
        if not state["steps"]:
            return True
        want = [state["generation"], state["step"]]
        late = [m for m in members.values() if m.get("applied") != want]
        if late and self.clock() - state.get("changed_at", 0) > STEP_TIMEOUT_S:
            log.error("node members %s have not applied step %s in %.0f s: going on", [m["id"] for m in late],
                      want, STEP_TIMEOUT_S)
            return True
        return not late

    def _finish(self, state: dict) -> None:
        moves = state.get("moves", [])
        if moves and moves[-1]["seconds"] is None:
            moves[-1]["seconds"] = round(self.clock() - moves[-1]["started_at"], 3)
            log.info("node plan %d in place in %.2f s", moves[-1]["generation"], moves[-1]["seconds"])
            _write_json(self.root / "plan.json", state)


def _load(member: dict) -> ModelLoad:
    return ModelLoad(member["id"], tuple(tuple(item) for item in member["items"]), member["batch"],
                     rate=member["rate"], slo_ms=member.get("slo_ms"))


def _allocation(plan: NodePlan, members: dict) -> Allocation:
    return {share.model: (tuple(share.cores), share.locked) for share in plan.shares if share.model in members}


class NodeMember:
    """One engine's part in the node: heartbeat, ownership, and applying its own share.

    `apply(cores, locked)` moves the engine to its share (blocking until it serves there);
    `describe()` gives what the heartbeat reports: {"batch", "items", "outstanding"}."""

    def __init__(self, root: Path, model: str, topology: Topology, apply: Callable[[tuple[int, ...], bool], None],
                 describe: Callable[[], dict], *, slo_ms: float | None = None, period_s: float = PERIOD_S,
                 owner: NodeOwner | None = None):
        self.root, self.model, self.slo_ms = root, model, slo_ms
        self.id = f"{model}-{os.getpid()}-{id(self) % 10000}"
        self.apply, self.describe, self.period_s = apply, describe, period_s
        self.meter = LoadMeter()
        self.owner = owner or NodeOwner(root, topology)
        self.applied: list[int] | None = None
        self.share: tuple[tuple[int, ...], bool] | None = None
        # False while the engine builds its pool: the thread only beats (a member silent for
        # STALE_S would be dropped and rejoin, a needless move) and applies steps once it is True.
        self.applying = True
        self._owner_fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for folder in ("members", "cores"):
            (root / folder).mkdir(parents=True, exist_ok=True)

    @property
    def lock_dir(self) -> str:
        return str(self.root / "cores")

    @property
    def is_owner(self) -> bool:
        return self._owner_fd is not None

    def join(self, timeout_s: float = 30.0) -> tuple[tuple[int, ...], bool] | None:
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
                self.step()
            except Exception as exc:  # the node's plan must never cost this model its service
                log.warning("node step failed: %s: %s", type(exc).__name__, exc)

    def step(self, apply: bool = True) -> None:
        """One round: heartbeat, ownership, and this member's part of the current step."""
        self._heartbeat()
        if self._try_own():
            self.owner.tick()
        if apply and not self.applying:
            return
        state = _read_json(self.root / "plan.json")
        if not state or not state.get("steps"):
            return
        want = [state["generation"], state["step"]]
        if self.applied == want:
            return
        mine = state["steps"][state["step"]].get(self.id)
        if mine is not None:
            share = (tuple(mine[0]), bool(mine[1]))
            if share != self.share and apply:
                self.apply(*share)
            self.share = share
        self.applied = want
        self._heartbeat()

    def _heartbeat(self) -> None:
        described = self.describe()
        self.meter.sample(described.get("outstanding", 0))
        _write_json(self.root / "members" / f"{self.id}.json", {
            "id": self.id, "model": self.model, "pid": os.getpid(), "heartbeat": time.time(),
            "items": described["items"], "batch": described["batch"], "rate": self.meter.rate(),
            "slo_ms": self.slo_ms, "applied": self.applied})

    def _try_own(self) -> bool:
        if self._owner_fd is not None:
            return True
        fd = os.open(self.root / "owner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._owner_fd = fd
        log.info("this process (pid %d) now plans the node's cores", os.getpid())
        return True

    def status(self) -> dict:
        state = _read_json(self.root / "plan.json") or {}
        members = {m["id"]: m for m in (_read_json(p) for p in (self.root / "members").glob("*.json")) if m}
        target = state.get("target", {})
        return {"directory": str(self.root), "member": self.id, "owner": self.is_owner,
                "share": {"cores": list(self.share[0]), "takes_turns": self.share[1]} if self.share else None,
                "plan": target.get("plan"), "generation": state.get("generation"), "step": state.get("step"),
                "members": {k: {"model": m["model"], "pid": m["pid"], "rate_rps": m["rate"], "batch": m["batch"],
                                "slo_ms": m.get("slo_ms")} for k, m in members.items()},
                "moves": state.get("moves", [])}

    def leave(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        (self.root / "members" / f"{self.id}.json").unlink(missing_ok=True)
        if self._owner_fd is not None:
            os.close(self._owner_fd)  # frees the lock: another member takes over
            self._owner_fd = None
