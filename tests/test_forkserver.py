"""Pool instances forked from the fork server: what they inherit, how they end, and the fresh
interpreter where the server cannot fork one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from packrat.serving.pool import forkserver
from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request
from packrat.serving.pool.instance_pool import InstancePool
from packrat.machine.topology import detect
from packrat.settings import FORK_INSTANCES_ENV

TINY = ModelConfig("tiny", graph_mode="script")
CORE = detect().cores[0]
pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds: nothing is forked here")


def answers(pool: InstancePool) -> list[int]:
    body = torch.ones(3, 32, 32).numpy().tobytes()
    return [a.status for a in pool.infer([Request(body, "application/octet-stream")] * 2)]


def parent_name(pid: int) -> str:
    return psutil.Process(psutil.Process(pid).ppid()).name()


def wait_until(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.slow
def test_instances_fork_from_one_server_end_with_their_codes_and_start_afresh_without_it(monkeypatch):
    monkeypatch.setenv(FORK_INSTANCES_ENV.name, "1")
    with InstancePool(TINY, [InstanceConfig(1, 2, (CORE,))]) as pool:
        assert answers(pool) == [200, 200]
        (first,) = pool.supervisor.instances
        assert parent_name(first.pid) == forkserver.NAME
        server = psutil.Process(first.pid).ppid()
        first.kill()  # as the watchdog kills a stuck instance
        assert first.process.wait(30) == -signal.SIGKILL and first.process.poll() == -signal.SIGKILL
        wait_until(lambda: pool.health().ready == 1 and pool.pids() != [first.pid], "no respawn")
        assert psutil.Process(pool.pids()[0]).ppid() == server  # the same server forked the respawn
        assert answers(pool) == [200, 200]

        os.kill(server, signal.SIGKILL)  # the server gone: the next instance is a fresh interpreter
        psutil.Process(server).wait(10)
        (second,) = pool.supervisor.instances
        second.kill()
        wait_until(lambda: pool.health().ready == 1 and pool.pids() != [second.pid], "no respawn")
        assert psutil.Process(pool.pids()[0]).ppid() == os.getpid()
        assert answers(pool) == [200, 200]
    with InstancePool(TINY, [InstanceConfig(1, 2, (CORE,))]) as again:  # and a new server after that
        assert parent_name(again.pids()[0]) == forkserver.NAME and answers(again) == [200, 200]


@pytest.mark.slow
def test_off_or_for_an_environment_of_its_own_an_instance_is_a_fresh_interpreter(monkeypatch):
    monkeypatch.setenv(FORK_INSTANCES_ENV.name, "0")
    with InstancePool(TINY, [InstanceConfig(1, 2, (CORE,))]) as pool:
        assert psutil.Process(pool.pids()[0]).ppid() == os.getpid() and answers(pool) == [200, 200]


def test_a_variable_libraries_read_as_they_load_gets_a_server_of_its_own(monkeypatch):
    """OpenMP reads OMP_* once, as it loads: a child of a server started under other values could
    not follow them, so each set of such values has its server; other variables follow each request."""
    started = []
    monkeypatch.setattr(forkserver.ForkServer, "spawn", lambda self, fd, parent: started.append(self))
    monkeypatch.setattr(forkserver, "_servers", {})
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    forkserver.spawn(0, 1)
    monkeypatch.setenv("SOMETHING_ELSE", "else")
    forkserver.spawn(0, 1)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    forkserver.spawn(0, 1)
    assert started[0] is started[1] is not started[2] and len(forkserver._servers) == 2


def test_a_child_takes_the_callers_directory_and_environment(tmp_path):
    """What the server had when it started is not what the caller has now: the directory, every
    variable (one set since, one unset) and the temporary folder tempfile had already found."""
    code = ("import json, os, sys, tempfile\n"
            "tempfile.gettempdir()\n"
            "from packrat.serving.pool.forkserver import become\n"
            f"become({str(tmp_path)!r}, {{'TMPDIR': {str(tmp_path)!r}, 'PATH': os.environ['PATH'], 'NEW': '1'}})\n"
            "print(json.dumps([os.getcwd(), tempfile.gettempdir(), dict(os.environ)]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OLD": "1", "TMPDIR": "/tmp"})
    assert done.returncode == 0, done.stderr
    cwd, temp, environ = json.loads(done.stdout)
    assert cwd == temp == str(tmp_path)
    assert environ.get("NEW") == "1" and "OLD" not in environ
