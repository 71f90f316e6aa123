"""The instance pool: real pinned processes running the tiny model."""

from __future__ import annotations

import os
import threading
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch
from hypothesis import given, strategies as st

from packrat.models import prepare, resolve
from packrat.pool import InstanceConfig, InstancePool, ModelConfig, PoolError, split_sizes
from packrat.topology import detect

TINY = ModelConfig("tiny")
CORES = detect().cores


def shm_segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir()}


@pytest.fixture(scope="module")
def reference():
    """The tiny model's own outputs for 20 distinct samples."""
    module, _, _ = prepare(resolve("tiny"), 4)
    inputs = torch.randn(20, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        return inputs, module(inputs)


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
def test_outputs_equal_the_models_in_order(configs, reference):
    inputs, expected = reference
    with InstancePool(TINY, configs) as pool:
        assert pool.mode == "script"
        for n in (1, 2, 5, 6, 13, 20):  # smaller, equal and larger than the plan's batch
            torch.testing.assert_close(pool.run(inputs[:n]), expected[:n], rtol=1e-4, atol=1e-5)


def test_instances_are_pinned_with_their_threads():
    configs = two_instances((2, 2))
    with InstancePool(TINY, configs) as pool:
        for pid, config in zip(pool.pids(), configs):
            process = psutil.Process(pid)
            assert process.cpu_affinity() == list(config.cores)
            assert process.num_threads() >= config.threads


def test_killed_instance_loses_no_request_and_is_respawned(reference):
    inputs, expected = reference
    with InstancePool(TINY, two_instances((4, 2))) as pool:
        victim = pool.pids()[0]
        os.kill(victim, signal.SIGKILL)
        torch.testing.assert_close(pool.run(inputs[:12]), expected[:12], rtol=1e-4, atol=1e-5)
        assert pool.respawns == 1
        deadline = time.monotonic() + 60
        while victim in pool.pids() or not all(i.ready for i in pool._instances):
            assert time.monotonic() < deadline, "instance was not respawned"
            time.sleep(0.05)
        torch.testing.assert_close(pool.run(inputs), expected, rtol=1e-4, atol=1e-5)


def test_kill_during_a_stream_of_batches(reference):
    inputs, expected = reference
    with InstancePool(TINY, two_instances((4, 2))) as pool:
        for round_ in range(30):
            if round_ in (5, 15):
                os.kill(pool.pids()[-1], signal.SIGKILL)
            torch.testing.assert_close(pool.run(inputs[:6]), expected[:6], rtol=1e-4, atol=1e-5)
        assert pool.respawns >= 1


def test_close_leaves_no_process_or_shared_memory():
    before = shm_segments()
    pool = InstancePool(TINY, two_instances((2, 2)))
    pids = pool.pids()
    assert len(shm_segments() - before) == 2 * len(pids)  # input + output segment per instance
    pool.close()
    pool.close()  # idempotent
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    assert shm_segments() - before == set()
    with pytest.raises(PoolError, match="closed"):
        pool.run(torch.zeros(1, 3, 32, 32))


def test_instance_that_cannot_start_fails_the_pool_cleanly():
    before = shm_segments()
    with pytest.raises(PoolError, match="instance 0 failed to start: .*"):
        InstancePool(ModelConfig("tiny", input_shape=(5, 32, 32)), [InstanceConfig(1, 2, (CORES[0],))])
    assert shm_segments() - before == set()


def test_rejects_wrong_inputs_and_overlapping_cores():
    with pytest.raises(ValueError, match="share cores"):
        InstancePool(TINY, [InstanceConfig(1, 1, (0,)), InstanceConfig(1, 1, (0,))])
    with InstancePool(TINY, [InstanceConfig(1, 2, (CORES[0],))]) as pool:
        with pytest.raises(ValueError, match="float32 of shape"):
            pool.run(torch.zeros(2, 3, 16, 16))


def test_reconfigure_under_load_keeps_answers_right_and_reuses_instances(reference):
    inputs, expected = reference
    core = CORES[0]
    fat = [InstanceConfig(len(CORES), 4, tuple(CORES), capacity=8)]
    split = [InstanceConfig(1, 2, (c,), capacity=8) for c in CORES]
    with InstancePool(TINY, fat) as pool:
        errors, stop = [], threading.Event()

        def stream():
            while not stop.is_set():
                try:
                    torch.testing.assert_close(pool.run(inputs[:8]), expected[:8], rtol=1e-4, atol=1e-5)
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
        everyone = pool.pids() + [inst.process.pid for inst in pool._parked]
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in everyone + first)  # close() stops the parked instances too


def test_failed_reconfigure_leaves_the_pool_serving(reference):
    inputs, expected = reference
    with InstancePool(TINY, [InstanceConfig(1, 2, (CORES[0],))]) as pool:
        before = pool.pids()
        with pytest.raises(PoolError, match="exited while starting|failed to start"):
            pool.reconfigure([InstanceConfig(1, 2, (4096,))])  # no such core: the instance cannot pin
        assert pool.pids() == before
        torch.testing.assert_close(pool.run(inputs[:4]), expected[:4], rtol=1e-4, atol=1e-5)


def test_batches_above_the_plan_use_the_capacity_in_one_round():
    assert split_sizes(8, [2, 2], [8, 8]) == [4, 4]
    assert split_sizes(10, [4, 2], [8, 8]) == [7, 3]
    assert split_sizes(12, [4, 2], [8, 4]) == [8, 4]
