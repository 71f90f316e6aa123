"""The node under faults: a move that fails is held where everyone serves, a slow move keeps its
member's heartbeat, and an owner that stops renewing its lease is replaced and fenced off."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from packrat.cli import status as cli_status
from packrat.machine.topology import Topology
from packrat.serving.node import NodeMember, read_state
from packrat.serving.node import owner as owner_module
from packrat.serving.node.files import LEASE_S

ITEMS = [[t, b, 10.0 * b / t] for t in (1, 2) for b in (1, 2)]
SATURATED = {"items": ITEMS, "batch": 2, "in_hand": 1}


class Engine:
    """What a member moves: its cores, and a switch that fails while `failing` says so."""

    def __init__(self) -> None:
        self.cores: tuple[int, ...] | None = None
        self.failing: str | None = None
        self.release = threading.Event()
        self.release.set()

    def apply(self, cores: tuple[int, ...], turns: bool) -> None:
        if self.cores is not None and cores != self.cores:
            self.release.wait(30)
            if self.failing:
                raise RuntimeError(self.failing)
        self.cores = cores


def member(root, name: str, engine: Engine, **kwargs) -> NodeMember:
    return NodeMember(root, name, Topology.virtual(2), engine.apply, lambda: SATURATED, **kwargs)


def joined(node: NodeMember, engine: Engine, others: list[NodeMember] = ()) -> None:
    """As an engine joins: its first share, taken without a move."""
    for _ in range(100):
        node.step(apply=False)
        for other in others:
            other.step()
        time.sleep(0.02)  # for members stepping in their own thread
        if node.share is not None:
            engine.cores = node.share[0]
            break
    else:
        raise AssertionError("no share came")
    for _ in range(6):  # the rest of the plan's steps
        node.step()
        for other in others:
            other.step()


def test_a_failed_move_is_reported_and_the_node_holds_where_everyone_serves(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(owner_module, "RETRY_S", (0.3, 0.3))
    first, second = Engine(), Engine()
    x = member(tmp_path, "x", first)
    joined(x, first)
    assert x.is_owner and x.share == ((0, 1), False)
    first.failing = "no compiled package for 1 core"
    y = member(tmp_path, "y", second)
    joined(y, second, [x])
    for _ in range(10):
        x.step(), y.step()
    state = read_state(tmp_path)
    failed, held = state["moves"][-2], state["moves"][-1]
    assert "x could not move: RuntimeError: no compiled package" in failed["failed"] and failed["seconds"] is not None
    assert held["kind"] == "hold" and "every model stays where it serves" in held["reason"]
    assert x.share == ((0, 1), True) and first.cores == (0, 1)  # where it was, now in turns
    allocation = state["target"]["allocation"]
    assert allocation[x.id] == [[0, 1], True] and allocation[y.id][1] is True  # overlapping: both take turns
    assert x.status()["holding"].startswith("x could not move")
    cli_status.print_node(cli_status.node_view({"x": {"node": x.status()}}), last=5)
    shown = capsys.readouterr().out
    assert "holding every model where it serves after a failed move: x could not move" in shown
    assert "FAILED: x could not move: RuntimeError" in shown and "by x, epoch 1" in shown
    first.failing = None  # the next try, after the back-off, succeeds
    time.sleep(0.4)
    for _ in range(10):
        x.step(), y.step()
    state = read_state(tmp_path)
    assert state["moves"][-1]["reason"].startswith("trying again after a failed move")
    assert state["moves"][-1]["seconds"] is not None and state.get("failures") == 0
    assert set(first.cores).isdisjoint(second.cores) and not x.share[1] and not y.share[1]
    x.leave(), y.leave()


def test_heartbeats_and_planning_go_on_while_a_move_is_slow(tmp_path):
    slow, other_engine = Engine(), Engine()
    x = member(tmp_path, "x", slow, period_s=0.05)
    joined(x, slow)
    slow.release.clear()  # its next move blocks until released
    x.start()
    y = member(tmp_path, "y", other_engine)
    try:
        joined(y, other_engine)
        beat_path = tmp_path / "members" / f"{x.id}.json"
        lease_path = tmp_path / "owner" / f"epoch-{x.lease.epoch}.json"
        deadline = time.monotonic() + 10
        while x.moving is None:
            assert time.monotonic() < deadline, "the move did not start"
            time.sleep(0.02)
        beat, lease = beat_path.stat().st_mtime_ns, lease_path.stat().st_mtime_ns
        time.sleep(0.5)
        heartbeat = json.loads(beat_path.read_text())
        assert heartbeat["moving"] is not None and beat_path.stat().st_mtime_ns > beat
        assert lease_path.stat().st_mtime_ns > lease and x.is_owner  # it still plans while it moves
        assert x.share == ((0, 1), True)  # its cores change only once its pool has moved
        slow.release.set()
        for _ in range(200):
            y.step()
            if x.share is not None and len(x.share[0]) == 1 and y.share is not None and not x.share[1]:
                break
            time.sleep(0.05)
        assert len(x.share[0]) == 1 and set(x.share[0]).isdisjoint(y.share[0])
    finally:
        slow.release.set()
        x.leave(), y.leave()


def lapse(node: NodeMember) -> None:
    os.utime(node.root / "owner" / f"epoch-{node.lease.epoch}.json", (0, 0))


def test_a_lapsed_owner_is_replaced_and_its_late_writes_are_ignored(tmp_path):
    first, second = Engine(), Engine()
    x = member(tmp_path, "x", first)
    joined(x, first)
    y = member(tmp_path, "y", second)
    joined(y, second, [x])
    lapse(x)  # as if it had stopped renewing
    y.step()
    assert y.is_owner and y.lease.epoch == 2
    planned = read_state(tmp_path)
    x.owner.epoch = 1
    x.owner._save({**planned, "generation": 999})  # a late write by the old owner
    assert read_state(tmp_path)["generation"] == planned["generation"]  # nobody reads it
    x.step()
    assert not x.is_owner and y.is_owner  # it stepped down on its next round
    x.leave(), y.leave()


OWNER = """
import sys, time
from pathlib import Path
from packrat.cli import status as cli_status
from packrat.machine.topology import Topology
from packrat.serving.node import NodeMember
node = NodeMember(Path(sys.argv[1]), "stopped", Topology.virtual(2), lambda cores, turns: None,
                  lambda: {"items": [[1, 1, 5.0], [2, 1, 3.0]], "batch": 1, "in_hand": 1}, period_s=0.1)
node.join(10)
node.start()
print(node.is_owner, flush=True)
time.sleep(120)
"""


def owner_and_member(tmp_path) -> tuple[subprocess.Popen, NodeMember]:
    """A process that owns the node (in its own thread), and a member here that has joined it."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    engine = Engine()
    y = member(tmp_path, "y", engine)
    assert owner.stdout.readline().strip() == "True"
    joined(y, engine)
    return owner, y


@pytest.mark.slow
def test_a_stopped_owner_loses_its_lease_but_not_its_place(tmp_path):
    stopped, y = owner_and_member(tmp_path)
    try:
        assert not y.is_owner
        os.kill(stopped.pid, signal.SIGSTOP)
        deadline = time.monotonic() + LEASE_S + 5
        while not y.is_owner:
            assert time.monotonic() < deadline, "the lease was not taken over"
            y.step()
            time.sleep(0.1)
        for _ in range(20):
            y.step()
        members = y.status()["members"]
        assert any(m["model"] == "stopped" for m in members.values())  # stopped is not gone: it keeps its cores
        os.kill(stopped.pid, signal.SIGCONT)
        time.sleep(1.0)
        y.step()
        assert y.is_owner and y.status()["planned_by"] == y.id
    finally:
        stopped.kill()
        stopped.wait()
        y.leave()


def test_a_killed_owner_is_replaced_at_once_and_leaves_the_plan(tmp_path):
    owner, y = owner_and_member(tmp_path)
    try:
        owner.kill()
        owner.wait()
        y.step()  # its pid is gone: no need to wait out the lease
        assert y.is_owner
        for _ in range(10):
            y.step()
        assert list(y.status()["members"]) == [y.id] and y.share == ((0, 1), False)
        assert "members changed: now y" in read_state(tmp_path)["moves"][-1]["reason"]
    finally:
        owner.kill()
        y.leave()


def test_a_chaos_run_can_make_a_models_moves_fail(tmp_path):
    """The injected fault benchmarks/node_chaos.py uses: faults/move-MODEL.json fails that model's moves."""
    first, second = Engine(), Engine()
    x = member(tmp_path, "x", first)
    joined(x, first)
    (tmp_path / "faults").mkdir()
    (tmp_path / "faults" / "move-x.json").write_text(json.dumps({"fail": "asked to"}))
    y = member(tmp_path, "y", second)
    joined(y, second, [x])
    for _ in range(10):
        x.step(), y.step()
    assert "x could not move: RuntimeError: injected fault: asked to" in read_state(tmp_path)["moves"][-2]["failed"]
    assert first.cores == (0, 1)
    x.leave(), y.leave()
