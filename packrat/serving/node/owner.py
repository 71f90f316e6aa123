"""The node's planning, done by whichever member holds the lease (files.Lease).

The owner re-plans when a member joins or leaves at once, and when the load shifts only if the new
plan lowers the worst score by `improvement` and the last move is `dwell_s` old (hysteresis, so
bursts that alternate do not thrash); it moves to a step's successor once every member has applied
it. A member that could not apply its part says so in its heartbeat: the owner then *holds* the
node (every member stays on the cores it serves on, taking turns wherever they overlap) and tries
again after a back-off. Every move is kept with its reason, duration and outcome.

Cores fenced off. A member whose stuck thread instances hold cores says so in its heartbeat
(`fenced`, engine.py); the owner plans every model on the node's other cores, so no model (that one
included) is given a core a stuck thread may still run on, and re-plans at once when they change
(all of them again once the threads returned, or their process ended and its heartbeat went).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
import time

from packrat.errors import NoPlanError
from packrat.machine.topology import Topology
from packrat.planning.node import Allocation, ModelLoad, NodePlan, NodePlanner, topology_of, transition
from packrat.serving.node.files import STALE_S, alive, plan_path, read_json, read_state, stopped, write_json

log = logging.getLogger("packrat.serving.node")

STEP_TIMEOUT_S = 120.0  # a member that has not applied a step by then (nor said it failed) is judged stuck
RETRY_S = (10.0, 300.0)  # after a failed move: the first wait before trying again, and the longest
HISTORY = 50  # moves kept in the plan


@dataclass
class Move:
    generation: int
    reason: str
    plan: str
    started_at: float  # unix time
    seconds: float | None = None  # until every member applied the last step
    failed: str | None = None  # why a member could not apply it
    kind: str = "move"  # or "hold": every member stays where it serves, after a failed move


def _empty() -> dict:
    return {"generation": 0, "steps": [], "step": 0, "moves": []}


def shares(members: dict) -> Allocation:
    """Where each member serves now, as its heartbeat says."""
    return {k: (tuple(m["share"][0]), bool(m["share"][1])) for k, m in members.items() if m.get("share")}


def holding(actual: Allocation) -> Allocation:
    """Every member on the cores it serves on, taking turns where its cores meet another's: safe to
    apply in one step (no core changes hands, turns are only added)."""
    return {k: (cores, locked or any(set(cores) & set(other) for j, (other, _) in actual.items() if j != k))
            for k, (cores, locked) in actual.items()}


def _serialised(allocation: Allocation) -> dict:
    return {k: [list(cores), locked] for k, (cores, locked) in allocation.items()}


def _parsed(allocation: dict) -> Allocation:
    return {k: (tuple(v[0]), bool(v[1])) for k, v in allocation.items()}


class NodeOwner:
    """The plan for the node. Its state lives in the plan file of the owner's epoch."""

    def __init__(self, root: Path, topology: Topology, *, improvement: float = 0.15, dwell_s: float = 20.0,
                 clock: Callable[[], float] = time.time, step_timeout_s: float = STEP_TIMEOUT_S):
        self.root, self.topology = root, topology
        self.improvement, self.dwell_s, self.clock = improvement, dwell_s, clock
        self.step_timeout_s = step_timeout_s
        self.epoch = 1
        for folder in ("members", "plans"):
            (root / folder).mkdir(parents=True, exist_ok=True)

    def members(self) -> dict[str, dict]:
        found = {}
        for path in (self.root / "members").glob("*.json"):
            member = read_json(path)
            if member is None:
                continue
            silent = self.clock() - member["heartbeat"] > STALE_S
            if not alive(member["pid"]) or (silent and not stopped(member["pid"])):
                path.unlink(missing_ok=True)
                log.warning("node member %s (pid %d) is gone", member["id"], member["pid"])
                continue
            found[member["id"]] = member
        return found

    def _save(self, state: dict) -> None:
        write_json(plan_path(self.root, self.epoch), state)

    def tick(self, epoch: int | None = None) -> None:
        """One round of planning, as the owner of `epoch` (its writes go to that epoch's plan file)."""
        self.epoch = epoch if epoch is not None else self.epoch
        members = self.members()
        state = read_state(self.root) or _empty()
        failed = {k: m["failed"]["reason"] for k, m in members.items()
                  if (m.get("failed") or {}).get("step") == [state["generation"], state["step"]]}
        if failed:
            self._hold(state, members, failed)
            return
        if members and state["steps"] and self._step_done(state, members):
            if state["step"] + 1 < len(state["steps"]):
                state["step"] += 1
                self._save(state)
                return
            self._finish(state)
        if not members:
            return
        in_motion = state["step"] + 1 < len(state["steps"]) or not self._step_done(state, members)
        joined_or_left = set(members) != set(state.get("target", {}).get("allocation", {}))
        fenced = fenced_cores(members, self.topology)
        refenced = fenced != set(state.get("target", {}).get("fenced", []))
        if in_motion and not joined_or_left and not refenced:
            return
        left = planned_cores(self.topology, fenced)
        try:
            if not left.cores:
                raise NoPlanError(f"every core is fenced off ({sorted(fenced)}): stuck thread instances hold them")
            planner = NodePlanner([_load(m) for m in members.values()], left.num_cores)
            plan = planner.plan(left)
        except (NoPlanError, ValueError) as exc:
            log.error("no node plan: %s", exc)
            return
        reason = self._why(state, members, plan, planner, joined_or_left, fenced)
        if reason is not None:
            self._publish(state, plan, members, reason, fenced)

    def _why(self, state: dict, members: dict, plan: NodePlan, planner: NodePlanner, joined_or_left: bool,
             fenced: set[int]) -> str | None:
        """Why the node should move to `plan`, or None to stay."""
        current = state.get("target")
        if current is None or joined_or_left:
            names = sorted(m["model"] for m in members.values())
            return f"members {', '.join(names)}" if current is None else f"members changed: now {', '.join(names)}"
        if fenced != set(current.get("fenced", [])):  # at once: a model may be serving on a stuck thread's cores
            return (f"cores {sorted(fenced)} fenced off: stuck thread instances hold them" if fenced
                    else "the fenced cores came back: their stuck threads returned")
        if _allocation(plan, members) == _parsed(current["allocation"]):
            return None
        if self.clock() < state.get("retry_at", 0):  # a move failed: not again before the back-off
            return None
        if current.get("holding"):
            return f"trying again after a failed move ({current['holding']})"
        if self.clock() - state.get("changed_at", 0) < self.dwell_s:
            return None
        now_worst = planner.evaluate(current["allocation"])
        if plan.worst >= now_worst * (1 - self.improvement):
            return None
        return f"load shifted: worst score {now_worst:.2f} → {plan.worst:.2f}"

    def _publish(self, state: dict, plan: NodePlan, members: dict, reason: str, fenced: set[int]) -> None:
        new = _allocation(plan, members)
        old = _parsed(state["steps"][state["step"]]) if state["steps"] else {}
        old.update({k: v for k, v in shares(members).items() if k in old or k in new})  # where they really are
        text = plan.describe()
        for member_id, member in members.items():  # model names read better than member ids
            text = text.replace(member_id, member["model"])
        self._record(state, Move(state["generation"] + 1, reason, text, self.clock()), transition(old, new) or [new],
                     {"allocation": _serialised(new), "plan": plan.to_json(), "names": _names(members),
                      "fenced": sorted(fenced)})
        log.info("node plan %d (%s): %s", state["generation"], reason, text)

    def _hold(self, state: dict, members: dict, failed: dict[str, str]) -> None:
        """A member could not apply its part of the step: stop the move where everyone serves now,
        and try again after a back-off that doubles with each failure in a row."""
        why = "; ".join(f"{members[k]['model']} could not move: {reason}" for k, reason in failed.items())
        moves = state.get("moves", [])
        if moves and moves[-1]["seconds"] is None:
            moves[-1].update(failed=why, seconds=round(self.clock() - moves[-1]["started_at"], 3))
        failures = state.get("failures", 0) + 1
        wait = min(RETRY_S[0] * 2 ** (failures - 1), RETRY_S[1])
        hold = holding(shares(members))
        target = {**state.get("target", {}), "allocation": _serialised(hold), "names": _names(members), "holding": why}
        self._record(state, Move(state["generation"] + 1, f"{why}: every model stays where it serves",
                                 "as it serves", self.clock(), kind="hold"), [hold], target)
        state.update(failures=failures, retry_at=self.clock() + wait)
        self._save(state)
        log.error("node move %d failed (%s): every model stays where it serves; trying again in %.0f s",
                  state["generation"] - 1, why, wait)

    def _record(self, state: dict, move: Move, steps: list[Allocation], target: dict) -> None:
        state.update(generation=move.generation, step=0, changed_at=self.clock(),
                     steps=[_serialised(s) for s in steps], target=target,
                     moves=(state.get("moves", []) + [move.__dict__])[-HISTORY:])
        self._save(state)

    def _step_done(self, state: dict, members: dict) -> bool:
        if not state["steps"]:
            return True
        want = [state["generation"], state["step"]]
        late = [m for m in members.values() if m.get("applied") != want]
        if late and self.clock() - state.get("changed_at", 0) > self.step_timeout_s:
            log.error("node members %s have not applied step %s in %.0f s: going on", [m["id"] for m in late],
                      want, self.step_timeout_s)
            return True
        return not late

    def _finish(self, state: dict) -> None:
        moves = state.get("moves", [])
        if moves and moves[-1]["seconds"] is None:
            moves[-1]["seconds"] = round(self.clock() - moves[-1]["started_at"], 3)
            if moves[-1].get("kind", "move") == "move":
                state["failures"] = 0
            log.info("node plan %d in place in %.2f s", moves[-1]["generation"], moves[-1]["seconds"])
            self._save(state)


def fenced_cores(members: dict, topology: Topology) -> set[int]:
    """The node's cores that some member's stuck thread instances hold (its heartbeat's `fenced`)."""
    return {core for m in members.values() for core in m.get("fenced") or []} & set(topology.cores)


def planned_cores(topology: Topology, fenced: set[int]) -> Topology:
    """The node's cores that models may be given: all but the fenced ones."""
    return topology_of(topology, [core for core in topology.cores if core not in fenced])


def _load(member: dict) -> ModelLoad:
    return ModelLoad(member["id"], tuple(tuple(item) for item in member["items"]), member["batch"],
                     rate=member["rate"], slo_ms=member.get("slo_ms"))


def _allocation(plan: NodePlan, members: dict) -> Allocation:
    return {share.model: (tuple(share.cores), share.locked) for share in plan.shares if share.model in members}


def _names(members: dict) -> dict:
    return {k: m["model"] for k, m in members.items()}
