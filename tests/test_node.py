"""Several models on one machine: engines that find each other through the node directory, share
its cores by one plan, hand over ownership, and take turns under per-core locks."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from packrat.codec.payloads import build_payload
from packrat.errors import MoveFailed
from packrat.machine.topology import Topology, detect
from packrat.serving.engine import Engine
from packrat.serving.node import LoadMeter, NodeMember, NodeOwner, read_state
from packrat.serving.pool.api import Request
from packrat.serving.pool.core_locks import holding, lock_path
from packrat.settings import NODE_DIR_ENV, Settings

CORES = detect().num_cores
# A fixed cost per batch: one core each (10 ms at B = 4) beats taking turns on both (2 × 6 ms).
PROFILE = "threads,batch,latency_ms\n" + "".join(
    f"{t},{b},{(1 + b) * 2.0 / t ** 0.5}\n" for t in range(1, CORES + 1) for b in (1, 2, 4))


def engine(tmp_path, name: str) -> Engine:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "profile.csv").write_text(PROFILE)
    settings = Settings(model="tiny", profiles=("profile.csv",), max_batch=4)
    return Engine(settings, folder, name, max_batch=4, asynchronous=False)


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def cores_of(e: Engine) -> set[int]:
    return {c for inst in e.controller.plan.instances for c in inst.cores}


@pytest.mark.skipif(CORES < 2, reason="needs two cores")
@pytest.mark.slow
def test_two_models_split_the_cores_and_one_grows_when_the_other_leaves(tmp_path, monkeypatch):
    monkeypatch.setenv(NODE_DIR_ENV.name, str(tmp_path / "node"))
    first = engine(tmp_path, "a")
    try:
        assert cores_of(first) == set(detect().cores)  # alone on the node: every core
        first.node.meter.rate = lambda: None  # both saturated (closed loops at capacity): a split beats turns
        first.node.owner.dwell_s = 0.0
        second = engine(tmp_path, "b")
        second.node.meter.rate = lambda: None
        try:
            wait_for(lambda: first.node.share is not None and second.node.share is not None
                     and not (cores_of(first) & cores_of(second)) and not first.pool.runs_unlocked())
            node = first.status()["node"]
            assert node["owner"] and len(node["members"]) == 2 and node["plan"]["models"]
            assert any("members changed" in move["reason"] for move in node["moves"])
            answers = [first.submit(_request()).result(30) for _ in range(3)] + \
                      [second.submit(_request()).result(30) for _ in range(3)]
            assert all(a.ok for a in answers)
        finally:
            second.close()
        wait_for(lambda: cores_of(first) == set(detect().cores))  # it grows back onto the freed cores
        assert first.submit(_request()).result(30).ok
    finally:
        first.close()


def _request() -> Request:
    return Request(*build_payload("tiny"))


def test_ownership_passes_on_when_the_owner_leaves(tmp_path):
    topology = Topology.virtual(2)
    items = [[t, b, 10.0 * b / t] for t in (1, 2) for b in (1, 2)]
    applied: dict[str, list] = {"x": [], "y": []}

    def member(name: str) -> NodeMember:
        return NodeMember(tmp_path, name, topology, lambda cores, turns: applied[name].append((cores, turns)),
                          lambda: {"items": items, "batch": 2, "in_hand": 1})

    x, y = member("x"), member("y")
    assert x.join(5) is not None and x.is_owner
    y.step()  # its heartbeat; the owner plans for it at its next step
    assert not y.is_owner
    for _ in range(8):  # the owner moves the node through its steps; each member applies its part
        x.step(), y.step()
    assert set(x.share[0]).isdisjoint(y.share[0]) and not x.share[1] and not y.share[1]
    x.leave()
    for _ in range(8):
        y.step()
    assert y.is_owner and y.share == ((0, 1), False)
    assert "members changed: now y" in y.status()["moves"][-1]["reason"]
    y.leave()


def test_members_in_turns_learn_the_longest_request_on_their_cores(tmp_path):
    """One core, two saturated models: they take turns, each told the longest request there (y's
    40 ms), which the engine makes its turns' length at least."""
    def member(name: str, request_ms: float) -> NodeMember:
        return NodeMember(tmp_path, name, Topology.virtual(1), lambda *_: None,
                          lambda: {"items": [[1, 1, request_ms]], "batch": 1, "in_hand": 1})

    x, y = member("x", 10.0), member("y", 40.0)
    x.step(), y.step()
    for _ in range(6):
        x.step(), y.step()
    assert x.share == y.share == ((0,), True)
    assert x.longest_request_ms == y.longest_request_ms == 40.0
    x.leave(), y.leave()


def test_a_member_that_stops_beating_is_dropped(tmp_path):
    def member(name: str) -> NodeMember:
        return NodeMember(tmp_path, name, Topology.virtual(1), lambda *_: None,
                          lambda: {"items": [[1, 1, 5.0]], "batch": 1, "in_hand": 0})

    quiet = member("quiet")
    quiet.step(apply=False)
    lapse(quiet)  # as if it hung: its lease and its heartbeat grow old
    path = next((tmp_path / "members").glob("quiet-*.json"))
    path.write_text(_stale(path.read_text()))
    other = member("other")
    other.step()
    assert other.is_owner and not path.exists()
    other.leave()


def lapse(member: NodeMember) -> None:
    """Its lease unrenewed for an hour (as if the owner hung)."""
    os.utime(member.root / "owner" / f"epoch-{member.lease.epoch}.json", (0, 0))


def _stale(text: str) -> str:
    import json

    member = json.loads(text)
    member["heartbeat"] -= 3600
    return json.dumps(member)


def test_load_meter_tells_idle_light_and_saturated():
    now = [0.0]
    meter = LoadMeter(window_s=10, clock=lambda: now[0])
    now[0] = 10.0
    assert meter.rate() == 0.0
    for _ in range(20):
        now[0] += 0.5
        meter.arrive(2)
        meter.sample(0)
    assert meter.rate() == pytest.approx(4.0)
    for _ in range(20):
        now[0] += 0.5
        meter.sample(3)
    assert meter.rate() is None


def test_load_meter_reads_mostly_full_batches_as_saturated():
    """A closed loop behind TorchServe: the pool is idle between batches (its queue is Java's), but
    the batches come full."""
    now = [10.0]
    meter = LoadMeter(window_s=10, clock=lambda: now[0])
    for i in range(20):  # 1 batch in 5 full, over 5 s: light, at its rate
        now[0] += 0.25
        meter.arrive(4 if i % 5 == 0 else 2, full=i % 5 == 0)
        meter.sample(0)
    assert meter.rate() == pytest.approx((4 * 4 + 16 * 2) / 5)
    for i in range(40):  # then half of them full for the whole window
        now[0] += 0.25
        meter.arrive(4 if i % 2 else 3, full=bool(i % 2))
        meter.sample(0)
    assert meter.rate() is None
    few = LoadMeter(window_s=10, clock=lambda: now[0])
    for _ in range(7):  # too few batches to tell, all full
        now[0] += 1
        few.arrive(4, full=True)
    assert few.rate() == pytest.approx(28 / 7)


HOLDER = """
import sys, time
from packrat.serving.pool.core_locks import holding
with holding(sys.argv[1], [0, 1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_core_locks_exclude_another_process_and_die_with_it(tmp_path):
    import fcntl

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        fd = os.open(lock_path(tmp_path, 1), os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.kill()
        holder.wait()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the kernel let go with the process
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    finally:
        holder.kill()
    with holding(tmp_path, [1, 0]):  # taken in core order, given back after
        pass
    with holding(None, [0]):
        pass


def test_load_shifts_move_the_node_only_past_the_hysteresis(tmp_path):
    """A better plan waits for the dwell time since the last move, and must lower the worst score
    by `improvement`; a member joining moves the node at once."""
    import json

    now = [1000.0]
    owner = NodeOwner(tmp_path, Topology.virtual(2), improvement=0.15, dwell_s=20.0, clock=lambda: now[0])
    resnet = ((1, 4, 384.0), (2, 4, 198.0), (1, 2, 190.0), (2, 2, 100.0), (1, 1, 95.0), (2, 1, 52.0))
    squeeze = ((1, 4, 95.0), (2, 4, 52.0), (1, 2, 48.0), (2, 2, 27.0), (1, 1, 25.0), (2, 1, 14.0))

    def beat(name: str, items, rate) -> None:
        state = read_state(tmp_path) or {}
        applied = [state["generation"], state["step"]] if state.get("steps") else None
        (tmp_path / "members" / f"{name}.json").write_text(json.dumps({
            "id": name, "model": name, "pid": os.getpid(), "heartbeat": now[0], "items": items, "batch": 4,
            "rate": rate, "slo_ms": None, "applied": applied}))

    def settle(rates: dict) -> dict:
        for _ in range(6):  # every member applies each step, the owner goes on to the next
            for name, items in (("r", resnet), ("s", squeeze)):
                beat(name, items, rates[name])
            owner.tick()
        return read_state(tmp_path)

    state = settle({"r": None, "s": None})  # both saturated: one core each
    assert state["target"]["allocation"] == {"r": [[0], False], "s": [[1], False]} or \
        state["target"]["allocation"] == {"r": [[1], False], "s": [[0], False]}
    generation = state["generation"]
    now[0] += 5
    state = settle({"r": None, "s": 0.0})  # s goes idle: a better plan, but the last move is 5 s old
    assert state["generation"] == generation
    now[0] += 20
    state = settle({"r": None, "s": 0.0})  # past the dwell: r gets both cores
    assert state["generation"] > generation and state["target"]["allocation"]["r"][0] == [0, 1]
    assert state["moves"][-1]["reason"].startswith("load shifted") and state["moves"][-1]["seconds"] == 0
    generation = state["generation"]
    now[0] += 30
    assert settle({"r": None, "s": 0.0})["generation"] == generation  # the same loads: no move
    owner.improvement = 0.99  # a trickle to s: better, but not by 99 % of the worst score
    assert settle({"r": None, "s": 0.2})["generation"] == generation
    owner.improvement = 0.15  # by 15 % it is
    state = settle({"r": None, "s": 0.2})
    assert state["generation"] > generation and state["moves"][-1]["reason"].startswith("load shifted")


def test_a_member_beats_but_moves_nothing_until_its_engine_serves(tmp_path):
    """While its pool starts, a member keeps its heartbeat (so it is not dropped as stale) and
    applies no step; once applying, it catches up with the plan."""

    moves = []
    member = NodeMember(tmp_path, "m", Topology.virtual(2), lambda cores, turns: moves.append((cores, turns)),
                        lambda: {"items": [[1, 1, 5.0], [2, 1, 3.0]], "batch": 1, "in_hand": 0})
    assert member.join()[0] == (0, 1)
    member.applying = False
    other = NodeMember(tmp_path, "o", Topology.virtual(2), lambda *_: None,
                       lambda: {"items": [[1, 1, 5.0], [2, 1, 3.0]], "batch": 1, "in_hand": 0})
    other.step(apply=False)  # its heartbeat: a member joins
    beat, applied = next((tmp_path / "members").glob("m-*.json")).stat().st_mtime_ns, member.applied
    for _ in range(3):  # it owns the node: it publishes the plan with `o`, but applies none of it
        member.step()
    state = read_state(tmp_path)
    assert state["generation"] > applied[0] and member.applied == applied and moves == []
    assert next((tmp_path / "members").glob("m-*.json")).stat().st_mtime_ns > beat
    member.applying = True
    member.step()
    state = read_state(tmp_path)
    assert member.applied == [state["generation"], state["step"]]
    other.leave()
    member.leave()


@pytest.mark.skipif(CORES < 2, reason="needs two cores")
@pytest.mark.slow
def test_a_move_whose_switch_fails_leaves_the_model_serving_where_it_was(tmp_path, monkeypatch):
    monkeypatch.setenv(NODE_DIR_ENV.name, str(tmp_path / "node"))
    alone = engine(tmp_path, "a")
    try:
        before, cores = alone.topology.cores, cores_of(alone)
        monkeypatch.setattr(alone.pool, "reconfigure", _no_compiler)
        with pytest.raises(MoveFailed, match="no compiler here"):
            alone._move((before[0],), False)
        assert alone.topology.cores == before and cores_of(alone) == cores  # not moved, not said to be
        assert alone.submit(_request()).result(30).ok
        monkeypatch.undo()
        monkeypatch.setenv(NODE_DIR_ENV.name, str(tmp_path / "node"))
        alone._move((before[0],), False)  # the same move, once the switch works
        assert list(alone.topology.cores) == [before[0]] and cores_of(alone) == {before[0]}
    finally:
        alone.close()


def _no_compiler(configs):
    raise RuntimeError("no compiler here")
