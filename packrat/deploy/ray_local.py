"""A Ray cluster of pinned nodes on this one machine, to try, test and benchmark the Ray front end.

Each node is a `ray start` pinned with `taskset` to its own cores, so the replica Ray Serve
places there sees only those cores (Ray does not pin workers; they inherit the raylet's
affinity) and plans for them, as on a cluster of small machines. The nodes share one session
directory; stop() kills the processes of that session only, never another Ray on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from packrat.deploy.torchserve import free_port


@dataclass
class LocalCluster:
    """Nodes pinned to `node_cores` (one list of CPU ids per node; the first is the head)."""

    node_cores: list[list[int]]
    port: int = 6390
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pr-ray-", dir="/tmp")))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "LocalCluster":
        head, *workers = self.node_cores
        self._ray(head, "--head", "--port", str(self.port), "--include-dashboard", "false",
                  "--temp-dir", str(self.temp_dir))
        for cores in workers:
            self.add_node(cores)
        return self

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def add_node(self, cores: list[int]) -> None:
        """Start (or restart) a worker node pinned to `cores`."""
        self._ray(cores, "--address", self.address)

    def _ray(self, cores: list[int], *args: str) -> None:
        # Each node's dashboard agent on a port of its own: on Ray's default (52365) every node after
        # the first retries the head's port for ~3 s before its raylet registers.
        ray = Path(sys.executable).with_name("ray")  # this environment's, else the PATH's
        cmd = ["taskset", "-c", ",".join(map(str, cores)), str(ray) if ray.exists() else "ray", "start", "--num-cpus",
               str(len(cores)), "--disable-usage-stats", "--dashboard-agent-listen-port", str(free_port()), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"ray start failed: {(done.stderr or done.stdout).strip().splitlines()[-3:]}")

    def raylets(self) -> list[psutil.Process]:
        """This cluster's raylets, oldest first (the head's is the first)."""
        found = [p for p in self._processes() if Path(p.info["cmdline"][0]).name == "raylet"]
        return sorted(found, key=lambda p: p.info["create_time"])

    def kill_node(self, cores: list[int]) -> int:
        """kill -9 the raylet of the node pinned to `cores` (its workers then exit); its pid."""
        raylet = next(p for p in self.raylets() if sorted(p.cpu_affinity()) == sorted(cores))
        raylet.send_signal(signal.SIGKILL)
        return raylet.pid

    def stop(self) -> None:
        """Kill every process of this cluster (its raylets, GCS and their workers), then its files."""
        roots = self._processes()
        victims = {p for root in roots for p in [root, *_children(root)]}
        for process in victims:
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        psutil.wait_procs(list(victims), timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _processes(self) -> list[psutil.Process]:
        """Processes naming this cluster's session directory, or its address (Ray's client server)."""
        markers = (str(self.temp_dir), f"--address={self._ip()}:{self.port}", f"--address=127.0.0.1:{self.port}")
        return [p for p in psutil.process_iter(["cmdline", "create_time"])
                if p.info["cmdline"] and p.pid != os.getpid()
                and any(marker in arg for arg in p.info["cmdline"] for marker in markers)]

    @staticmethod
    def _ip() -> str:
        """The address Ray's processes name (the machine's, not loopback)."""
        import ray._private.services

        return ray._private.services.get_node_ip_address()


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []

