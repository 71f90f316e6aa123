"""The instance pool: real pinned processes running the tiny model."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import psutil
import pytest
import torch
from hypothesis import given, strategies as st

from packrat.codec.codec import Codec

from packrat.codec.config import CodecConfig
from packrat.codec.payloads import build_payload
from packrat.codec.batch import answer_batch
from packrat.models.zoo import prepare, resolve
from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request
from packrat.serving.pool.instance_pool import InstancePool
from packrat.errors import PoolError
from packrat.serving.pool import supervisor
from packrat.serving.pool.supervisor import Watchdog
from packrat.serving.pool.dispatch import split_sizes
from packrat.serving.pool.stages import STAGES
from packrat.machine.topology import detect

TINY = ModelConfig("tiny", graph_mode="script")  # pool logic: the quickest graph mode to start
CORES = detect().cores
RAW = "application/octet-stream"


def shm_segments(pid: int | None = None) -> set[str]:
    """The segments of the pools in process `pid` (this one's by default; named packrat-PID-…):
    not those of another test run beside this one."""
    return {p.name for p in Path("/dev/shm").glob(f"packrat-{pid or os.getpid()}-*")}


def raw(sample: torch.Tensor) -> Request:
    return Request(sample.numpy().tobytes(), RAW)


@pytest.fixture(scope="module")
def reference():
    """20 distinct requests for the tiny model, and the answers the model gives in this process."""
    module, _, _ = prepare(resolve("tiny"), 4, "eager")  # the model itself: nothing compiled for the reference
    inputs = torch.randn(20, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    requests = [raw(x) for x in inputs]
    codec = Codec(CodecConfig.for_model(resolve("tiny")))
    answers = answer_batch(module, codec, [(r.body, r.content_type) for r in requests])
    return requests, [json.loads(answer.body) for answer in answers]


def wait_until(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def whole(pool: InstancePool) -> bool:
    """Every instance serving, none being respawned."""
    health = pool.health()
    return health.ready == len(pool.pids()) and not health.respawning


@pytest.fixture(scope="module")
def shared():
    """shared(configs, **settings): a pool of the tiny model started once for the module and
    handed, whole (an earlier test may have killed an instance), to every test that asks for the
    same instances and settings. Each instance is a fresh Python importing torch, so tests that
    only send requests to a pool, or kill an instance and see it respawned, share it; tests of how
    a pool starts, fails or closes make their own."""
    pools: dict = {}

    def pool(configs: list[InstanceConfig], **settings) -> InstancePool:
        key = (tuple(configs), tuple(sorted(settings.items())))
        if key not in pools:
            pools[key] = InstancePool(TINY, configs, **settings)
        wait_until(lambda: whole(pools[key]), "a shared pool did not get whole again")
        return pools[key]

    yield pool
    for started in pools.values():
        started.close()


def assert_same(answers, expected) -> None:
    """Same classes in the same order, scores equal up to float noise (thread counts differ)."""
    assert [a.status for a in answers] == [200] * len(expected)
    for answer, want in zip(answers, expected):
        got = json.loads(answer.body)["predictions"]
        assert [p["class"] for p in got] == [p["class"] for p in want["predictions"]]
        assert [p["score"] for p in got] == pytest.approx([p["score"] for p in want["predictions"]], abs=1e-4)


@given(n=st.integers(0, 40), planned=st.lists(st.integers(1, 8), min_size=1, max_size=6))
def test_split_sizes(n, planned):
    sizes = split_sizes(n, planned)
    assert sum(sizes) == n
    if n <= sum(planned):
        assert all(0 <= s <= p for s, p in zip(sizes, planned))  # never beyond the plan
    else:
        assert all(s >= p for s, p in zip(sizes, planned))  # the excess shared in proportion
    if len(planned) <= n:
        assert all(s >= 1 for s in sizes)  # no idle instance while there is work


@given(n=st.integers(0, 40), planned=st.lists(st.integers(1, 8), min_size=1, max_size=6), data=st.data())
def test_split_sizes_respects_capacities(n, planned, data):
    capacities = [p + data.draw(st.integers(0, 8)) for p in planned]
    n = min(n, sum(capacities))
    sizes = split_sizes(n, planned, capacities)
    assert sum(sizes) == n and all(s <= c for s, c in zip(sizes, capacities))


def test_split_sizes_is_proportional():
    assert split_sizes(8, [8, 4, 4]) == [4, 2, 2]
    assert split_sizes(3, [8, 4, 4]) == [1, 1, 1]
    assert split_sizes(12, [8, 4, 4]) == [6, 3, 3]
    assert split_sizes(20, [8, 4, 4]) == [10, 5, 5]


def two_instances(batches=(4, 2)) -> list[InstanceConfig]:
    return [InstanceConfig(1, b, (CORES[i % len(CORES)],)) for i, b in enumerate(batches)] if len(CORES) > 1 \
        else [InstanceConfig(1, sum(batches), (CORES[0],))]


@pytest.mark.parametrize("configs", [
    pytest.param([InstanceConfig(len(CORES), 6, tuple(CORES))], id="fat"),
    pytest.param(two_instances((3, 3)), id="homogeneous"),
    pytest.param(two_instances((4, 2)), id="heterogeneous"),
])
@pytest.mark.slow
def test_answers_equal_the_models_in_order(configs, reference, shared):
    requests, expected = reference
    pool = shared(configs)
    assert pool.mode == "script"
    for n in (1, 2, 5, 6, 13, 20):  # smaller, equal and larger than the plan's batch
        assert_same(pool.infer(requests[:n]), expected[:n])


@pytest.mark.integration
def test_compiled_instances_answer_like_the_model_at_every_count(reference):
    """Instances in compile mode (the default) load the packages of their batch ladder (4, 2, 1)
    and answer any number of requests: padded to a package's size, or in chunks."""
    requests, expected = reference
    with InstancePool(ModelConfig("tiny"), [InstanceConfig(len(CORES), 4, tuple(CORES))]) as pool:
        assert pool.mode == "compile"
        for n in (1, 3, 4, 9):
            assert_same(pool.infer(requests[:n]), expected[:n])


@pytest.mark.slow
def test_a_batch_taken_whole_by_idle_instances_wakes_no_dispatch_thread(reference, shared, monkeypatch):
    """A wake-up of the pool's dispatch thread is a thread taking a core from the instances while
    their batch runs: a together() batch the idle instances take whole needs none; one they cannot
    take whole leaves the rest to the dispatch thread, which is woken for it."""
    requests, expected = reference
    pool = shared(two_instances((2, 2)))
    woken, wake = [], pool._wake
    monkeypatch.setattr(pool, "_wake", lambda: woken.append(1) or wake())
    assert_same(pool.infer(requests[:4]), expected[:4])
    assert woken == []
    assert_same(pool.infer(requests[:7]), expected[:7])  # 3 left for the loop to hand out
    assert woken


@pytest.mark.slow
def test_requests_from_many_threads_each_get_their_own_answer(reference, shared):
    requests, expected = reference
    pool = shared(two_instances((2, 2)))
    answered = pool.health().answered
    futures = [pool.submit(r) for r in requests]  # all queued at once, dispatched as instances free up
    assert_same([f.result(timeout=60) for f in futures], expected)
    assert pool.health().answered - answered == len(requests) and pool.outstanding == 0


@pytest.mark.slow
def test_bad_requests_are_answered_alone(reference, shared):
    requests, expected = reference
    bad = [Request(b"not a tensor", RAW), Request(b"[" * 100_000 + b"]" * 100_000, "application/json"),
           Request(b'{"inputs": NaN}', "application/json"), Request(b"", None), Request(b"x" * 100, "image/jpeg")]
    pool = shared(two_instances((2, 2)))
    pool.take_bodies()
    answers = pool.infer([requests[0], *bad, requests[1]])
    assert pool.take_bodies() == (2, len(bad))  # raw tensors against bodies to decode (payloads.py)
    assert_same([answers[0], answers[-1]], expected[:2])
    for answer in answers[1:-1]:
        assert 400 <= answer.status < 500, answer
        assert json.loads(answer.body) == {"error": answer.reason} and "\n" not in answer.reason


@pytest.mark.slow
def test_oversized_body_is_refused_before_it_is_shipped():
    with InstancePool(TINY, [InstanceConfig(1, 1, (CORES[0],))],
                      codec=CodecConfig.for_model(resolve("tiny"), max_body_bytes=1000)) as pool:
        answer = pool.infer([Request(b"\0" * 1001, RAW)])[0]
    assert answer.status == 413 and "1001 bytes" in answer.reason


@pytest.mark.slow
def test_instances_are_pinned_with_their_threads(shared):
    configs = two_instances((2, 2))
    pool = shared(configs)
    for pid, config in zip(pool.pids(), configs):
        process = psutil.Process(pid)
        assert process.cpu_affinity() == list(config.cores)
        assert process.num_threads() >= config.threads


@pytest.mark.slow
def test_killed_instance_loses_no_request_and_is_respawned(reference, shared):
    requests, expected = reference
    pool = shared(two_instances((4, 2)))
    respawns, victim = pool.respawns, pool.pids()[0]
    os.kill(victim, signal.SIGKILL)
    assert_same(pool.infer(requests[:12]), expected[:12])
    wait_until(lambda: victim not in pool.pids() and pool.health().ready == len(pool.pids()),
               "instance was not respawned")
    assert pool.respawns - respawns == 1
    assert_same(pool.infer(requests), expected)


@pytest.mark.slow
def test_kill_during_a_stream_of_requests(reference, shared):
    requests, expected = reference
    pool = shared(two_instances((4, 2)))
    respawns = pool.respawns
    for round_ in range(30):
        if round_ in (5, 15):
            os.kill(pool.pids()[-1], signal.SIGKILL)
        assert_same(pool.infer(requests[:6]), expected[:6])
    assert pool.respawns - respawns >= 1


@pytest.mark.slow
def test_double_kill_keeps_requests_waiting_and_answers_them_all(reference, shared, monkeypatch):
    """kill -9 of the only instance, then of its replacement while it loads: a fault that heals in
    seconds costs no request. Requests wait for the next respawn instead of being refused."""
    requests, expected = reference
    monkeypatch.setattr(supervisor, "BACKOFF_S", (0.2, 1.0))  # the same attempts, sooner
    pool = shared([InstanceConfig(1, 2, (CORES[0],))])
    before, first = pool.health(), pool.pids()[0]
    os.kill(first, signal.SIGKILL)  # noticed at once: the pool watches every instance's socket
    wait_until(lambda: pool.pids()[0] != first, "no replacement was started", timeout=10)
    os.kill(pool.pids()[0], signal.SIGKILL)  # the replacement, while it loads
    waiting = [pool.submit(r) for r in requests[:6]]
    wait_until(lambda: pool.health().respawn_failures > before.respawn_failures, "the failed respawn was not noticed")
    assert pool.health().unavailable is None  # killed from outside: the next attempt has a fair chance
    assert_same([f.result(timeout=60) for f in waiting], expected[:6])
    assert pool.health().ready == 1 and pool.health().refused == before.refused


@pytest.mark.slow
def test_stopped_instance_is_killed_by_the_watchdog_and_its_requests_rerun(reference):
    """SIGSTOP (what a deadlock or a stuck OpenMP barrier looks like): the batch it holds passes its
    deadline, the watchdog kills the instance, its requests run elsewhere, and it is respawned."""
    requests, expected = reference
    with InstancePool(TINY, two_instances((2, 2)), watchdog=Watchdog(floor_s=1.0)) as pool:
        victim = pool.pids()[0]
        os.kill(victim, signal.SIGSTOP)
        try:
            assert_same(pool.infer(requests[:8]), expected[:8])
        finally:
            with contextlib.suppress(ProcessLookupError):  # gone once the watchdog killed it
                os.kill(victim, signal.SIGCONT)
        health = pool.health()
        assert health.watchdog_kills == 1 and health.requeued >= 1 and health.expired == 0
        wait_until(lambda: victim not in pool.pids() and pool.health().ready == len(pool.pids()),
                   "the hung instance was not respawned")
        assert_same(pool.infer(requests), expected)


@pytest.mark.slow
def test_model_that_no_longer_loads_fails_fast_with_the_load_error(reference, tmp_path, monkeypatch):
    """An instance dies and its model file is gone: after a few attempts that fail while loading,
    waiting requests and new ones are answered 503 with the error at once; when the file is back,
    service resumes by itself."""
    requests, expected = reference
    monkeypatch.setattr(supervisor, "BACKOFF_S", (0.05, 0.5))  # the same attempts, without seconds between them
    module, example, _ = prepare(resolve("tiny"), 1, graph_mode=False)
    path = tmp_path / "tiny.pt"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript
        torch.jit.trace(module, example).save(str(path))
    with InstancePool(ModelConfig(str(path), (3, 32, 32)), [InstanceConfig(1, 2, (CORES[0],))]) as pool:
        path.rename(tmp_path / "elsewhere.pt")
        os.kill(pool.pids()[0], signal.SIGKILL)
        waiting = pool.submit(requests[0])
        answer = waiting.result(timeout=90)  # answered once the model counts as unloadable, not at the deadline
        assert answer.status == 503 and "cannot be loaded" in answer.reason and "tiny.pt" in answer.reason
        started = time.monotonic()
        refused = pool.infer([requests[1]])[0]
        assert refused.status == 503 and time.monotonic() - started < 1 and pool.health().unavailable
        (tmp_path / "elsewhere.pt").rename(path)
        wait_until(lambda: pool.health().ready == 1, "service did not resume", timeout=90)
        assert_same(pool.infer(requests[:2]), expected[:2])


@pytest.mark.slow
def test_pool_process_killed_leaves_no_instance_and_no_segment_behind(reference):
    """The TorchServe worker killed with -9: its instances exit on their own, and the next pool
    (the restarted worker's) starts with no segment of the dead one left in /dev/shm."""
    code = ("import sys, torch; from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request; "
            "from packrat.serving.pool.instance_pool import InstancePool; "
            f"pool = InstancePool(ModelConfig('tiny', graph_mode='script'), [InstanceConfig(1, 2, ({CORES[0]},))]); "
            "pool.infer([Request(torch.zeros(3, 32, 32).numpy().tobytes(), 'application/octet-stream')]); "
            "print(*pool.pids(), flush=True); sys.stdin.read()")
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        instances = [psutil.Process(int(pid)) for pid in parent.stdout.readline().split()]
        assert any(name.startswith(f"packrat-{parent.pid}-") for name in shm_segments(parent.pid))
    finally:
        parent.kill()
        parent.wait()
    for instance in instances:
        wait_until(lambda: not instance.is_running() or instance.status() == psutil.STATUS_ZOMBIE,
                   "an instance outlived its pool's process", timeout=10)
    with InstancePool(TINY, [InstanceConfig(1, 1, (CORES[0],))]):
        assert not any(name.startswith(f"packrat-{parent.pid}-") for name in shm_segments(parent.pid))


@pytest.mark.slow
def test_close_leaves_no_process_or_shared_memory(reference):
    requests, _ = reference
    before = shm_segments()
    pool = InstancePool(TINY, two_instances((2, 2)))
    pids = pool.pids()
    pool.infer(requests[:4])
    assert 1 <= len(shm_segments() - before) <= len(pids)  # one input segment per instance that ran
    pool.close()
    pool.close()  # idempotent
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    assert shm_segments() - before == set()
    with pytest.raises(PoolError, match="closed"):
        pool.submit(requests[0])


@pytest.mark.slow
def test_instance_that_cannot_start_fails_the_pool_cleanly():
    before = shm_segments()
    with pytest.raises(PoolError, match="instance 0 failed to start: .*"):
        InstancePool(ModelConfig("tiny", input_shape=(5, 32, 32), graph_mode="script"),
                     [InstanceConfig(1, 2, (CORES[0],))])
    assert shm_segments() - before == set()


def test_rejects_overlapping_cores():
    with pytest.raises(ValueError, match="share cores"):
        InstancePool(TINY, [InstanceConfig(1, 1, (0,)), InstanceConfig(1, 1, (0,))])


@pytest.mark.slow
def test_reconfigure_under_load_keeps_answers_right_and_reuses_instances(reference):
    requests, expected = reference
    core = CORES[0]
    fat = [InstanceConfig(len(CORES), 4, tuple(CORES), capacity=8)]
    split = [InstanceConfig(1, 2, (c,), capacity=8) for c in CORES]
    with InstancePool(TINY, fat) as pool:
        errors, stop = [], threading.Event()

        def stream():
            while not stop.is_set():
                try:
                    assert_same(pool.infer(requests[:8]), expected[:8])
                except Exception as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

        worker = threading.Thread(target=stream)
        worker.start()
        try:
            first = pool.pids()
            assert pool.reconfigure(split) == {"kept": 0, "started": len(split), "parked": 1, "stopped": 0}
            assert not set(first) & set(pool.pids())
            # back to the fat plan: the parked instance is reused at once
            assert pool.reconfigure(fat) == {"kept": 1, "started": 0, "parked": len(split), "stopped": 0}
            assert pool.pids() == first
            assert pool.reconfigure(split)["started"] == 0
            # same threads and cores, other batch shares: kept, nothing started
            assert pool.reconfigure([InstanceConfig(1, 4, (c,), capacity=8) for c in CORES])["started"] == 0
            if len(CORES) > 1:  # one identical instance fewer: parked, not rebuilt; the fat one stops
                assert pool.reconfigure([InstanceConfig(1, 4, (core,), capacity=8)]) == \
                    {"kept": 1, "started": 0, "parked": len(CORES) - 1, "stopped": 1}
        finally:
            stop.set()
            worker.join()
        assert errors == []
        everyone = pool.pids() + [inst.pid for inst in pool.supervisor.parked]
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in everyone + first)  # close() stops the parked instances too


@pytest.mark.slow
def test_failed_reconfigure_leaves_the_pool_serving(reference, shared):
    requests, expected = reference
    pool = shared([InstanceConfig(1, 2, (CORES[0],))])
    before = pool.pids()
    with pytest.raises(PoolError, match="exited while starting|failed to start"):
        pool.reconfigure([InstanceConfig(1, 2, (4096,))])  # no such core: the instance cannot pin
    assert pool.pids() == before
    assert_same(pool.infer(requests[:4]), expected[:4])


@pytest.mark.slow
@pytest.mark.skipif(len(CORES) < 2, reason="a switch to new instances needs a second core")
def test_a_pool_closed_during_a_switch_stops_its_new_instances_and_answers_what_is_handed_back(reference):
    """An unload under load: the engine closes its pool while a switch starts new instances. The
    switch fails, its new instance stops, and requests a lost or retired instance hands back after
    the close (nothing hands out the queue any more) are answered 503, not queued unanswered."""
    from concurrent.futures import Future

    from packrat.serving.pool.dispatch import Job

    requests, _ = reference
    pool = InstancePool(TINY, [InstanceConfig(1, 2, (CORES[0],))])
    spawning, spawned = threading.Event(), []
    real_spawn = pool.supervisor.spawn

    def spawn(*args, **kwargs):
        spawning.set()
        spawned.append(real_spawn(*args, **kwargs))
        return spawned[-1]

    pool.supervisor.spawn = spawn
    outcome = {}

    def switch():
        try:
            outcome["counts"] = pool.reconfigure([InstanceConfig(1, 2, (CORES[1],))])
        except PoolError as exc:
            outcome["error"] = str(exc)

    switching = threading.Thread(target=switch)
    switching.start()
    assert spawning.wait(60)
    pool.close()
    switching.join(120)
    assert outcome == {"error": "the pool was closed during the switch"}
    assert pool.supervisor.instances == [] and spawned
    assert not any(psutil.pid_exists(i.pid) and psutil.Process(i.pid).status() != psutil.STATUS_ZOMBIE
                   for i in spawned)
    handed_back = Job(requests[0], Future(), time.monotonic(), time.monotonic() + 60)
    with pool._lock:  # as a lost instance's requests come back: under the pool's lock
        pool.supervisor._requeue([handed_back], "instance 0 died with exit code -9")
    answer = handed_back.future.result(timeout=0)
    assert (answer.status, answer.reason) == (503, "the model is being unloaded")
    assert not pool.dispatcher.queue


def test_batches_above_the_plan_use_the_capacity_in_one_round():
    assert split_sizes(8, [2, 2], [8, 8]) == [4, 4]
    assert split_sizes(10, [4, 2], [8, 8]) == [7, 3]
    assert split_sizes(12, [4, 2], [8, 4]) == [8, 4]


@pytest.mark.slow
def test_an_instance_exits_when_its_pool_process_dies_while_it_loads():
    code = ("from packrat.serving.pool.instance_pool import InstancePool; "
            "from packrat.serving.pool.api import InstanceConfig, ModelConfig; "
            f"InstancePool(ModelConfig('resnet50', graph_mode='script'), [InstanceConfig(1, 1, ({CORES[0]},))])")
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_until(lambda: instances_of(parent.pid), "no instance was started", timeout=30)
        (instance,) = instances_of(parent.pid)
        descendants = psutil.Process(parent.pid).children(recursive=True)  # the fork server too, if any
    finally:
        parent.kill()
        parent.wait()
    for process in [instance, *descendants]:
        wait_until(lambda: not process.is_running() or process.status() == psutil.STATUS_ZOMBIE,
                   f"{process.pid} outlived its pool's process", timeout=10)


def instances_of(pid: int) -> list[psutil.Process]:
    """The pool instances under process `pid`, forked or not (not the fork server)."""
    from packrat.bench.faults import pool_instances

    return pool_instances(pid)


@pytest.mark.slow
def test_an_instance_sees_its_pool_process_gone_even_if_it_died_before_the_instance_looked():
    """The instance is told its pool process's pid: a pool process that died before the instance
    could read os.getppid() (which by then names whoever adopted it) is noticed all the same."""
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    code = ("import time; from packrat.serving.pool.child import exit_with_parent; "
            f"exit_with_parent(parent={gone.pid}); time.sleep(60)")
    orphan = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert orphan.wait(timeout=30) == 0
    finally:
        orphan.kill()
        orphan.wait()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds on this platform: the watcher polls")
def test_the_parent_watcher_sleeps_until_the_parent_exits():
    """The watcher waits on a pidfd and never wakes while the parent lives: a woken thread wants
    the GIL, which a compiled model holds through its batch (it used to poll twice a second, and
    then fought the model for a core every 5 ms until the batch ended)."""
    code = ("import threading, time\n"
            "from packrat.serving.pool.child import exit_with_parent\n"
            "exit_with_parent()\n"
            "time.sleep(0.3)\n"
            "tid = next(t.native_id for t in threading.enumerate() if t.name == 'packrat-parent-watch')\n"
            "def switches():\n"
            "    with open(f'/proc/self/task/{tid}/status') as status:\n"
            "        return sum(int(line.split()[1]) for line in status if 'ctxt_switches' in line)\n"
            "before = switches()\n"
            "time.sleep(1.6)\n"
            "print(switches() - before)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "0", done.stdout + done.stderr


def test_warm_up_time_leaves_out_waiting_for_a_core():
    """The watchdog's yardstick: a warm-up that waits (here it sleeps, as one at low priority
    beside busy instances waits for a core) counts only the time it computed."""
    from packrat.serving.pool.child import warm_up

    def computing(batch):
        until = time.process_time() + 0.02
        while time.process_time() < until:
            pass

    def waiting(batch):
        time.sleep(0.05)

    examples = (torch.zeros(4, 1),)
    assert 15 < warm_up(computing, examples, threads=1) < 200
    assert warm_up(waiting, examples, threads=1) < 10


@pytest.mark.slow
def fat_pool(shared) -> InstancePool:
    """One instance on every core, batch 4, gather 0 ms (as TorchServe's ordinary worker has it):
    stage figures from now on only (the count since start stays: compare it before and after)."""
    pool = shared([InstanceConfig(len(CORES), 4, tuple(CORES))], gather_ms=0)
    pool.stages.clear()
    return pool


@pytest.mark.slow
def test_a_fat_instance_decodes_photos_on_its_threads_and_reports_its_stages(shared):
    """Photos decoded on the instance's threads answer as in this process, a bad one alone; every
    sub-batch's stages are kept: all there, none negative, adding up to the total."""
    photo, kind = build_payload("tiny", "jpeg")
    requests = [Request(photo, kind), Request(photo[:500], kind), Request(bytearray(photo), kind),
                Request(memoryview(photo), kind)]
    module, _, _ = prepare(resolve("tiny"), 4, graph_mode="script")
    expected = answer_batch(module, Codec(CodecConfig.for_model(resolve("tiny"))), [(r.body, kind) for r in requests])
    pool = fat_pool(shared)
    sub_batches = pool.stages.sub_batches
    for _ in range(3):
        answers = pool.infer(requests)
        assert [(a.status, json.loads(a.body)) for a in answers] == [(e.status, json.loads(e.body)) for e in expected]
    health = pool.health()
    assert [a.status for a in answers] == [200, 400, 200, 200]
    assert list(health.stage_ms) == [*STAGES, "total"] and all(ms >= 0 for ms in health.stage_ms.values())
    assert sum(health.stage_ms[stage] for stage in STAGES) == pytest.approx(health.stage_ms["total"])
    assert health.stage_ms["model"] > 0 and health.stage_ms["decode"] > 0
    assert health.sub_batches - sub_batches == 3 and health.requests_per_sub_batch == 4


@pytest.mark.slow
def test_requests_submitted_together_reach_the_instance_as_one_batch(shared):
    """As TorchServe's ordinary worker hands a batch to the handler: one by one, but together;
    gather 0 ms, so without together() the first could go out alone."""
    rows = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    pool = fat_pool(shared)
    sub_batches = pool.stages.sub_batches
    for _ in range(20):
        with pool.together():
            futures = []
            for row in rows:
                futures.append(pool.submit(raw(row)))
                time.sleep(0.001)  # the dispatch thread has every chance to run between two submits
        assert all(f.result(timeout=60).ok for f in futures)
    health = pool.health()
    assert (health.sub_batches - sub_batches, health.requests_per_sub_batch) == (20, 4)


@pytest.mark.slow
def test_a_batch_submitted_at_once_is_looked_at_once_and_reaches_the_instance_whole(shared, monkeypatch):
    """submit_all (the TorchServe handler's, infer's): one look at the pool's outlook for the whole
    batch, not one a request (a third of a request's submit), and one sub-batch."""
    rows = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    pool = fat_pool(shared)
    looks, outlook = [], pool._outlook
    monkeypatch.setattr(pool, "_outlook", lambda: looks.append(1) or outlook())
    sub_batches = pool.stages.sub_batches
    futures = pool.submit_all([raw(row) for row in rows])
    assert all(f.result(timeout=60).ok for f in futures)
    assert len(looks) == 1
    health = pool.health()
    assert (health.sub_batches - sub_batches, health.requests_per_sub_batch) == (1, 4)


@pytest.mark.slow
def test_admission_refuses_what_it_predicts_late_and_learns_from_what_is_served(reference):
    """A plan predicting 300 ms a batch of one, a 1 s deadline: of 10 requests at once, 2 fit (two
    rounds, a third slower: 0.8 s); the rest are refused at once with when to retry. The tiny model takes about a
    millisecond: as its batches are served the prediction follows (a fifth of the way a batch, down
    to a twentieth of the plan), and the same burst is taken whole."""
    requests, expected = reference
    with InstancePool(TINY, [InstanceConfig(1, 1, (CORES[0],), expected_ms=300.0)], request_timeout_s=1.0) as pool:
        first = pool.infer(requests[:10])
        assert [a.status for a in first] == [200, 200] + [503] * 8
        assert all(a.retry_after_s >= 1 and "would be answered in" in a.reason for a in first[2:])
        health = pool.health()
        assert (health.admitted, health.refused, health.refused_late) == (2, 8, 8)
        assert health.refusals["late"] == 8
        for request in requests:  # full batches of the plan's one: served far faster than predicted
            pool.infer([request])
        assert pool.health().served_ratio < 0.5 and pool.health().predicted_wait_ms < 200
        assert [a.status for a in pool.infer(requests[:10])] == [200] * 10
        assert pool.refusal() is None
        with pool._lock:
            pool.rounds.ratio = 20.0  # as if the machine had been 20× slow: a miss predicted for one request alone
        assert pool.health().predicted_wait_ms > 1000
        assert pool.refusal() is None and pool.infer([requests[0]])[0].ok  # an idle pool admits it: a probe
        assert pool.health().served_ratio < 20.0  # ...whose time corrects the ratio
