"""Turns on time-shared cores: granted in order, cut to a quantum, and a wait for one is not running
(the watchdog leaves a waiting instance alone, unless it holds its cores without having said so)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, strategies as st

from packrat.codec.payloads import build_payload
from packrat.machine.topology import detect
from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request
from packrat.serving.pool.core_locks import holders, holding
from packrat.serving.pool.instance_pool import InstancePool
from packrat.serving.pool.supervisor import Watchdog
from packrat.serving.pool.turns import turn_sizes

CORE = detect().cores[0]


@given(st.integers(1, 64), st.floats(0.1, 500), st.one_of(st.none(), st.floats(1, 1000)))
def test_turns_fit_the_quantum_and_answer_every_request(requests, request_ms, turn_ms):
    sizes = turn_sizes(requests, request_ms, turn_ms)
    assert sum(sizes) == requests and min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    if turn_ms is None or requests * request_ms <= turn_ms:
        assert sizes == [requests]
    elif request_ms <= turn_ms:
        assert max(sizes) * request_ms <= turn_ms  # every turn fits
    else:
        assert sizes == [1] * requests  # one request each, the least a turn can run


WAITER = """
import sys, time
from packrat.serving.pool.core_locks import holders, holding
print("asking", flush=True)
with holding(sys.argv[1], [0]):
    print(time.monotonic(), flush=True)
"""


def test_turns_are_granted_in_the_order_they_were_asked_for(tmp_path):
    """Three processes ask, one after another, for a core this one holds: they get it in that order
    (what core_locks relies on: Linux wakes a freed flock's waiters in the order they blocked)."""
    waiters = []
    with holding(tmp_path, [0]):
        for number in range(1, 4):
            waiters.append(subprocess.Popen([sys.executable, "-c", WAITER, str(tmp_path)], stdout=subprocess.PIPE,
                                            text=True))
            assert waiters[-1].stdout.readline().strip() == "asking"
            time.sleep(0.3)  # blocked on the lock
    granted = [float(waiter.communicate(timeout=30)[0]) for waiter in waiters]
    assert granted == sorted(granted)


STOPPED = """
import fcntl, os, sys
descriptor = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
print("asking", flush=True)
fcntl.flock(descriptor, fcntl.LOCK_EX)
"""


def test_a_stopped_waiter_holds_nobody_up(tmp_path):
    stopped = subprocess.Popen([sys.executable, "-c", STOPPED, str(tmp_path / "core-0.lock")],
                               stdout=subprocess.PIPE, text=True)
    try:
        with holding(tmp_path, [0]):
            assert stopped.stdout.readline().strip() == "asking"
            time.sleep(0.3)  # blocked on the lock
            os.kill(stopped.pid, signal.SIGSTOP)
            waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
            time.sleep(0.5)
        assert len(waiter.communicate(timeout=10)[0].split()) == 2  # asked, and got the core past the stopped one
    finally:
        stopped.kill()
        stopped.wait()


@pytest.mark.slow
def test_an_instance_waiting_for_its_turn_is_not_killed_nor_counted_as_working(tmp_path):
    """Another model holds the core far longer than the watchdog allows a batch: the instance waits,
    is not killed, and its batch runs (and is answered) once the turn comes."""
    request = Request(*build_payload("tiny"))
    with InstancePool(ModelConfig("tiny", graph_mode="script"), [InstanceConfig(1, 2, (CORE,))],
                      watchdog=Watchdog(factor=1.0, floor_s=0.3)) as pool:
        pool.take_turns(str(tmp_path), turn_ms=1e-3)  # every request a turn of its own
        with holding(tmp_path, [CORE]):  # another model's batch, running long
            with pool.together():
                futures = [pool.submit(request), pool.submit(request)]
            time.sleep(2.0)
            assert not any(f.done() for f in futures)
            assert pool.outstanding == 2 and pool.working == 0
            assert pool.health().watchdog_kills == 0
        answers = [f.result(30) for f in futures]
        assert [a.status for a in answers] == [200, 200]
        assert pool.health().watchdog_kills == 0 and pool.working == 0


@pytest.mark.slow
def test_a_batch_cut_into_turns_gives_the_same_answers(tmp_path):
    requests = [Request(*build_payload("tiny")) for _ in range(3)]
    with InstancePool(ModelConfig("tiny", graph_mode="script"), [InstanceConfig(1, 3, (CORE,))]) as pool:
        whole = [json.loads(a.body)["predictions"] for a in pool.infer(requests)]
        pool.take_turns(str(tmp_path), turn_ms=1e-3)  # three turns of one
        cut = [json.loads(a.body)["predictions"] for a in pool.infer(requests)]
    assert [[p["class"] for p in a] for a in cut] == [[p["class"] for p in a] for a in whole]
    assert [[p["score"] for p in a] for a in cut] == [pytest.approx([p["score"] for p in a], abs=1e-4) for a in whole]


def test_a_turn_holds_its_cores_until_it_ends(tmp_path):
    import fcntl

    from packrat.serving.pool.core_locks import lock_path
    from packrat.serving.pool.turns import Turn

    turn = Turn([0])
    turn.begin(str(tmp_path))
    other = os.open(lock_path(tmp_path, 0), os.O_RDWR)  # another open file: as another process sees it
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert holders(tmp_path) == {0: os.getpid()} and holders(tmp_path, [1]) == {}  # the kernel's word
        turn.begin(str(tmp_path))  # the same turn goes on
        assert turn.held and not turn.spent(60_000) and turn.spent(None)
        time.sleep(0.02)
        assert turn.spent(10)  # its 10 ms are up
        turn.end()
        assert holders(tmp_path) == {}
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(other, fcntl.LOCK_UN)
        turn.begin(None)
        assert not turn.held
    finally:
        os.close(other)


@pytest.mark.slow
def test_an_instance_stopped_while_holding_the_cores_is_killed_and_the_other_model_goes_on(tmp_path):
    """Two models in turns on one core; one's instance is stopped (SIGSTOP) in the middle of its turn:
    its own watchdog kills it (its requests run again on the respawned instance), and the other
    model's requests, which waited meanwhile, are all answered."""
    request = Request(*build_payload("tiny"))
    model = ModelConfig("tiny", graph_mode="script")
    with InstancePool(model, [InstanceConfig(1, 1, (CORE,))], watchdog=Watchdog(factor=1.0, floor_s=1.0)) as first, \
            InstancePool(model, [InstanceConfig(1, 1, (CORE,))], watchdog=Watchdog(factor=1.0, floor_s=1.0)) as second:
        for pool in (first, second):
            pool.take_turns(str(tmp_path), turn_ms=50)
        victim = first.pids()[0]
        stopped = False
        futures = {"first": [], "second": []}
        deadline = time.monotonic() + 60
        while not stopped:
            assert time.monotonic() < deadline, "the first model's instance never held the core"
            for name, pool in (("first", first), ("second", second)):
                if pool.outstanding < 3:  # both kept busy, neither flooded
                    futures[name].append(pool.submit(request))
            if victim in holders(tmp_path).values():
                os.kill(victim, signal.SIGSTOP)
                stopped = True
            time.sleep(0.001)
        for _ in range(5):  # more requests while it is stopped
            futures["second"].append(second.submit(request))
        answers = {name: [f.result(60) for f in batch] for name, batch in futures.items()}
        assert all(a.status == 200 for batch in answers.values() for a in batch)
        assert first.health().watchdog_kills >= 1 and second.health().watchdog_kills == 0
