"""Issue 64, part 3: a thread instance that does not return is fenced off (supervisor.py), the
engine re-plans on the cores left or, with none left, restarts (engine.py and the front ends), and
a thread instance changes nothing process-wide. Plain data and fake instances; the real thread
instances are in test_thread_instances.py."""

from __future__ import annotations

import shutil
import threading
import time
from types import SimpleNamespace

import pytest

from packrat.errors import PoolError
from packrat.machine.threads import PinnedWorker, task_affinities, task_cpu, thread_cpu_s
from packrat.machine.topology import Topology
from packrat.serving.pool.api import InstanceConfig
from packrat.serving.pool.supervisor import Slot, Supervisor, Watchdog
from packrat.serving.pool.thread_instance import THREAD_NAME, own_threads


def wait_until(condition, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


class FakeWorker:
    def __init__(self, release: threading.Event):
        self.thread = threading.Thread(target=release.wait, args=(30,), daemon=True)
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()


class FakeThreadInstance:
    """A thread instance whose thread runs until `release` is set."""

    kind = "thread"

    def __init__(self, cores: tuple[int, ...], release: threading.Event | None = None):
        self.config = InstanceConfig(1, 1, cores, expected_ms=1.0)
        self.index, self.warm_ms, self.mode = 0, 1.0, "onnxruntime-thread"
        self.hung = self.abandoned = False
        self.ready, self.jobs, self.waiting_turn, self.busy_since = True, [], False, 0.0
        self.locks, self.slot, self.pid, self.tid, self.fallback = None, Slot(), 1, 2, None
        self.worker = FakeWorker(release or threading.Event())

    @property
    def stuck(self) -> bool:
        return self.hung and self.worker.alive

    def close(self, timeout: float = 0) -> None:
        pass

    def wait_ready(self, timeout: float) -> str:
        return self.mode


def supervisor_of(instances: list, fences: list, spawned: list) -> Supervisor:
    requeued = []
    sup = Supervisor(None, None, threading.RLock(), threading.Event(), lambda jobs, why: requeued.extend(jobs),
                     lambda: None, watchdog=Watchdog(batch_timeout_s=0.05), on_fence=fences.append)
    sup.requeued = requeued

    def spawn(config, index, nice=0, slot=None):
        fresh = FakeThreadInstance(config.cores)
        spawned.append(config)
        return fresh

    sup.spawn = spawn
    sup.instances = list(instances)
    return sup


def test_a_hung_thread_that_does_not_return_is_fenced_and_its_slot_respawned_once_it_does():
    release = threading.Event()
    stuck, other = FakeThreadInstance((0,), release), FakeThreadInstance((1,))
    stuck.jobs, stuck.hung = ["a", "b"], True
    fences, spawned = [], []
    sup = supervisor_of([stuck, other], fences, spawned)
    try:
        with sup._lock:
            sup.lost(stuck)
        assert sup.requeued == ["a", "b"]  # at once: before the allowance to return has run out
        wait_until(lambda: fences, "not fenced")
        assert fences == [frozenset({0})] and sup.fenced_cores() == {0} and stuck.abandoned
        assert sup.abandoned == 1 and sup.respawning == 0 and not spawned  # nothing started on its cores
        assert sup.unavailable() is None  # the other instance serves
        with pytest.raises(PoolError, match="fenced off"):  # a plan made before the fence
            sup.reconfigure([InstanceConfig(1, 1, (0,))])
        release.set()
        wait_until(lambda: spawned and sup.respawning == 0, "its slot was not respawned")
        assert fences[-1] == frozenset() and not sup.fenced_cores()
        assert spawned == [stuck.config] and sup.instances[0] is not stuck
    finally:
        release.set()
        sup._closed.set()


def test_a_thread_that_returns_in_its_allowance_is_respawned_unfenced():
    returned = threading.Event()
    returned.set()
    quick = FakeThreadInstance((0,), returned)
    quick.hung = True
    fences, spawned = [], []
    sup = supervisor_of([quick], fences, spawned)
    with sup._lock:
        sup.lost(quick)
    wait_until(lambda: spawned and sup.respawning == 0, "not respawned")
    assert not fences and sup.abandoned == 0


def test_with_every_instance_fenced_no_cores_are_left_and_the_reason_says_so():
    release = threading.Event()
    fat = FakeThreadInstance((0, 1), release)
    fat.hung = True
    fences, spawned = [], []
    sup = supervisor_of([fat], fences, spawned)
    try:
        with sup._lock:
            sup.lost(fat)
        assert sup.unavailable() is None  # its allowance to return is still running: requests wait
        wait_until(lambda: fences, "not fenced")
        assert "no cores left" in sup.unavailable() and "[0, 1]" in sup.unavailable()
    finally:
        release.set()
        sup._closed.set()


def test_a_hung_parked_thread_is_fenced_too():
    release = threading.Event()
    parked = FakeThreadInstance((0,), release)
    parked.hung = True
    fences, spawned = [], []
    sup = supervisor_of([FakeThreadInstance((1,))], fences, spawned)
    sup.parked = [parked]
    try:
        with sup._lock:
            sup.lost(parked)
        wait_until(lambda: fences, "not fenced")
        assert fences == [frozenset({0})] and not spawned and sup.respawning == 0
    finally:
        release.set()
        sup._closed.set()


class FakeLoadingInstance(FakeThreadInstance):
    """A thread instance whose load fails: raises at once, or (`release` given) has not returned
    when wait_ready gives up on it, its thread still loading until `release` is set."""

    def __init__(self, cores: tuple[int, ...], release: threading.Event | None = None):
        super().__init__(cores, release)
        self.config = InstanceConfig(1, 1, cores, expected_ms=1.0, runtime="onnxruntime-thread")
        self.ready, self.stuck_loading = False, release is not None
        self.closed = False

    @property
    def loading(self) -> bool:
        return self.stuck_loading and self.worker.alive

    def close(self, timeout: float = 0) -> None:
        self.closed = True

    def wait_ready(self, timeout: float) -> str:
        from packrat.serving.pool.instance import StartFailed

        raise StartFailed("instance 0 did not start within 1 s" if self.stuck_loading else "instance 0 failed to start")


def test_a_thread_stuck_loading_is_fenced_not_covered_by_a_process_and_one_that_failed_falls_back():
    from packrat.serving.pool.supervisor import StuckLoading

    release = threading.Event()
    fences, spawned = [], []
    sup = supervisor_of([], fences, spawned)
    try:
        stuck = FakeLoadingInstance((0,), release)
        with pytest.raises(StuckLoading, match="still loading"):  # a switch's new instance: the switch fails
            sup.ready(stuck)
        assert fences == [frozenset({0})] and sup.fenced_cores() == {0} and stuck.abandoned and stuck.closed
        assert not spawned  # no process pinned on top of a thread that may still run there
        release.set()
        wait_until(lambda: len(fences) == 2, "not unfenced once its thread returned")
        assert fences[-1] == frozenset() and not spawned  # retired (never planned): nothing respawned

        failed = FakeLoadingInstance((1,))  # its load raised: a process instance on its cores, as before
        assert sup.ready(failed) is not failed and spawned[-1].runtime == "onnxruntime" and len(fences) == 2
    finally:
        release.set()
        sup._closed.set()


def test_a_thread_stuck_loading_at_the_start_keeps_its_place_fenced_and_is_respawned_once_it_returns():
    release = threading.Event()
    fences, spawned = [], []
    sup = supervisor_of([], fences, spawned)
    made = iter([FakeLoadingInstance((0,), release), FakeThreadInstance((1,))])
    sup.spawn = lambda config, index, nice=0, slot=None: spawned.append(config) or next(made, None) \
        or FakeThreadInstance(config.cores)
    try:
        mode = sup.start([InstanceConfig(1, 1, (0,), runtime="onnxruntime-thread"),
                          InstanceConfig(1, 1, (1,), runtime="onnxruntime-thread")])
        stuck = sup.instances[0]
        assert mode == "onnxruntime-thread" and not stuck.ready and sup.instances[1].ready
        assert fences == [frozenset({0})] and len(spawned) == 2  # the other serves; no process on core 0
        assert sup.unavailable() is None
        release.set()
        wait_until(lambda: len(spawned) == 3 and sup.respawning == 0, "its slot was not respawned")
        assert fences[-1] == frozenset() and sup.instances[0] is not stuck and sup.instances[0].ready
    finally:
        release.set()
        sup._closed.set()


def test_the_silent_hold_check_never_judges_a_thread_instance():
    """/proc/locks names the process, which every thread instance shares: the check is for processes."""
    sup = supervisor_of([], [], [])
    inst = FakeThreadInstance((0,))
    inst.locks, inst.waiting_turn = "/nonexistent", True
    assert sup.silent_hold_since(inst) is None


def test_an_instances_threads_are_those_of_its_name():
    tasks = {10: ("python", {0, 1}), 11: (f"{THREAD_NAME}3", {0}), 12: (f"{THREAD_NAME}3", {1}),
             13: (f"{THREAD_NAME}4", {2})}
    assert own_threads(tasks, f"{THREAD_NAME}3") == {11, 12}


def test_a_named_worker_s_threads_inherit_its_name_and_their_cpu_is_their_own():
    worker = PinnedWorker(sorted(task_affinities()[threading.get_native_id()][1])[:1], "t", f"{THREAD_NAME}900")

    def spin_and_start_one() -> tuple[int, int]:
        child = threading.Thread(target=lambda: None)
        child.start()
        ident = child.native_id
        child.join()
        end = time.thread_time() + 0.05  # 50 ms of this thread's CPU, however busy the machine
        while time.thread_time() < end:
            pass
        return threading.get_native_id(), ident

    own, started = worker.call(spin_and_start_one).result(10)
    try:
        assert task_affinities()[own][0] == f"{THREAD_NAME}900" and task_cpu()[own][0] == f"{THREAD_NAME}900"
        assert 0.03 < thread_cpu_s([own]) < 1.0  # its own CPU, not the process's
        assert thread_cpu_s([started]) == 0.0  # gone: left out
    finally:
        worker.stop()


# ---- the engine: plans without the fenced cores, a re-plan when they change, a restart with none left --

def engine_with(fenced: set, restarts: list, replans: list):
    from packrat.profiling.profiles import Profile
    from packrat.serving.engine import Engine
    from packrat.serving.settling import SettledPlans

    profile = Profile(latency={})
    for t, b, ms in ((1, 2, 1.0), (1, 4, 2.0), (2, 4, 1.6)):
        profile.add("onnxruntime-thread", t, b, ms, ms)
    engine = Engine.__new__(Engine)
    engine.topology, engine._plan_mode = Topology(((0, 1),)), "auto"
    engine.corrector, engine.settled = SimpleNamespace(profile=profile, corrections={}), SettledPlans()
    engine.pool = SimpleNamespace(fenced_cores=lambda: frozenset(fenced))
    engine.controller = SimpleNamespace(replan=lambda reason: replans.append((reason, engine.plan_for(4))))
    engine._restart, engine._restart_asked = restarts.append, threading.Event()
    return engine


def test_the_engine_plans_without_the_fenced_cores_and_re_plans_when_they_change():
    fenced, restarts, replans = set(), [], []
    engine = engine_with(fenced, restarts, replans)
    assert sorted(c for i in engine.plan_for(4).instances for c in i.cores) == [0, 1]
    fenced.add(1)
    engine._fences_changed(frozenset(fenced))
    wait_until(lambda: replans, "no re-plan")
    reason, plan = replans[0]
    assert "fenced off" in reason and [tuple(i.cores) for i in plan.instances] == [(0,)]
    fenced.clear()
    engine._fences_changed(frozenset())
    wait_until(lambda: len(replans) == 2, "no re-plan once the cores came back")
    assert "came back" in replans[1][0] and sorted(c for i in replans[1][1].instances for c in i.cores) == [0, 1]
    assert not restarts


def test_with_no_cores_left_the_engine_restarts_once_and_plans_nothing():
    fenced, restarts, replans = {0, 1}, [], []
    engine = engine_with(fenced, restarts, replans)
    with pytest.raises(PoolError, match="no cores left"):
        engine.plan_for(4)
    engine._fences_changed(frozenset(fenced))
    engine._fences_changed(frozenset(fenced))
    wait_until(lambda: restarts, "no restart")
    time.sleep(0.05)
    assert len(restarts) == 1 and "no cores left" in restarts[0] and not replans


# ---- what "restarts itself" is, per front end ------------------------------------------------------

def test_the_torchserve_worker_closes_its_engine_and_exits_to_be_started_again():
    pytest.importorskip("ts")
    from packrat.handlers.packrat_handler import RESTART_EXIT, restart_worker

    closed, exits = [], []
    restart_worker(SimpleNamespace(close=lambda: closed.append(True)), "no cores left", grace_s=0, exit=exits.append)
    assert closed == [True] and exits == [RESTART_EXIT]


def test_the_kserve_server_closes_every_model_and_re_executes_itself(tmp_path):
    pytest.importorskip("kserve")
    import sys

    from packrat.frontends.kserve_server import PackratModel, PackratRepository

    repository = PackratRepository(tmp_path)
    closed, executed = [], []
    for name in ("a", "b"):
        model = PackratModel.__new__(PackratModel)
        model.name, model.ready, model.closed = name, True, threading.Event()
        model.serving = SimpleNamespace(close=lambda name=name: closed.append(name))
        repository.update(model)
    repository.restart("no cores left", grace_s=0, execv=lambda *args: executed.append(args))
    shutil.rmtree(repository._unpacked, ignore_errors=True)
    assert sorted(closed) == ["a", "b"] and executed == [(sys.executable, sys.orig_argv)]
    assert all(m.closed.is_set() and not m.ready for m in repository.get_models().values())


# ---- the node: fenced cores are given to no model --------------------------------------------------

def test_the_node_plans_no_model_on_cores_a_member_has_fenced(tmp_path):
    """A member's heartbeat says which cores its stuck threads hold: the owner re-plans at once on
    the others, for every model (that one included), and gives them back once they are unfenced."""
    import json
    import os

    from packrat.serving.node import NodeOwner, read_state

    owner = NodeOwner(tmp_path, Topology.virtual(4), clock=lambda: 1000.0)
    items = [[t, 4, 400.0 / t] for t in (1, 2, 3, 4)]

    def settle(fenced: dict) -> dict:
        for _ in range(6):  # every member applies each step, the owner goes on to the next
            state = read_state(tmp_path) or {}
            applied = [state["generation"], state["step"]] if state.get("steps") else None
            for name in ("r", "s"):
                (tmp_path / "members" / f"{name}.json").write_text(json.dumps({
                    "id": name, "model": name, "pid": os.getpid(), "heartbeat": 1000.0, "items": items, "batch": 4,
                    "rate": None, "slo_ms": None, "applied": applied, "fenced": fenced.get(name, [])}))
            owner.tick()
        return read_state(tmp_path)

    def given(state: dict) -> set:
        return {core for cores, _ in state["target"]["allocation"].values() for core in cores}

    assert given(settle({})) == {0, 1, 2, 3}
    r_core = settle({})["target"]["allocation"]["r"][0][0]
    state = settle({"r": [r_core]})
    assert r_core not in given(state) and given(state) == {0, 1, 2, 3} - {r_core}
    assert state["target"]["fenced"] == [r_core] and "fenced off" in state["moves"][-1]["reason"]
    assert all(r_core not in cores for cores, _ in state["steps"][-1].values())  # where the move ends
    state = settle({})
    assert given(state) == {0, 1, 2, 3} and "came back" in state["moves"][-1]["reason"]


def test_the_engine_tells_the_node_its_fenced_cores():
    from packrat.serving.engine import Engine

    engine = Engine.__new__(Engine)
    engine.controller, engine._batch_now, engine._node_items_for = None, 4, (None, None, [])
    engine.corrector = SimpleNamespace(profile=SimpleNamespace(
        items=lambda: [(1, 4, 2.0)], points=lambda: {(1, 4, "onnxruntime"): 2.0}, threads=[1], batches=[4]))
    engine.pool = SimpleNamespace(outstanding=0, fenced_cores=lambda: frozenset({3, 1}))
    assert engine._describe()["fenced"] == [1, 3]
    assert engine._describe()["items"] == [[1, 4, 2.0]]  # nothing to fill: one thread, one batch
