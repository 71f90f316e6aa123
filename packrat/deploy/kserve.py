"""Running the KServe front end (packrat/frontends/kserve_server.py) as a server process: started in
a session of its own from a run dir, checked READY through the Open Inference Protocol's model
ready route, asked for its status, and stopped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packrat.errors import ServeError
from packrat.frontends.torchserve_control import CONTROL_DIR, control_file
from packrat.settings import CONTROL_DIR_ENV, SERVED_DIR_ENV

STATE_FILE = "kserve.json"  # in the run dir: what `packrat stop/status --engine kserve` read
LOG_FILE = "kserve.log"
FRONT_END_DIR = "front-ends"  # in the run dir: where the front ends say where they are (frontends/front_ends.py)


@dataclass
class KServeServer:
    """A KServe server started by packrat, as recorded in its run dir."""

    run_dir: Path
    models: tuple[str, ...]
    host: str = "127.0.0.1"
    http_port: int = 8080
    grpc_port: int | None = 8081  # None: REST only
    pid: int | None = None
    served_dir: Path | None = None  # where its engines keep served latencies (SERVED_DIR_ENV); None: the user's
    extra_env: dict = field(default_factory=dict)
    front_ends: str = "1"  # front-end processes sharing the ports: a count, or auto (frontends/front_ends.py)
    cores: tuple[int, ...] | None = None  # the CPUs it runs on; None: this process's affinity

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir).resolve()
        self.models = tuple(self.models)
        self.cores = tuple(self.cores) if self.cores else None

    @property
    def reach_host(self) -> str:
        """Where to reach it from this machine: loopback when it listens on every address."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    @property
    def url(self) -> str:
        return f"http://{self.reach_host}:{self.http_port}"

    @property
    def grpc_address(self) -> str | None:
        return None if self.grpc_port is None else f"{self.reach_host}:{self.grpc_port}"

    @property
    def store(self) -> Path:
        return self.run_dir / "model_store"

    @property
    def control_dir(self) -> Path:
        return self.run_dir / CONTROL_DIR

    @property
    def log(self) -> Path:
        return self.run_dir / "logs" / LOG_FILE

    @property
    def front_end_dir(self) -> Path:
        return self.run_dir / FRONT_END_DIR

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "packrat.frontends.kserve_server", "--model-store", str(self.store),
               "--host", self.host, "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port or 0),
               "--front-ends", str(self.front_ends), "--front-end-dir", str(self.front_end_dir)]
        cmd += ["--cores", ",".join(map(str, self.cores))] if self.cores else []
        return cmd + [arg for name in self.models for arg in ("--model", name)]

    def env(self) -> dict[str, str]:
        env = {**os.environ, CONTROL_DIR_ENV.name: str(self.control_dir), **self.extra_env}
        if self.served_dir is not None:
            env[SERVED_DIR_ENV.name] = str(self.served_dir)
        return env

    def save(self) -> None:
        state = {**asdict(self), "run_dir": str(self.run_dir), "served_dir": self.served_dir and str(self.served_dir)}
        (self.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> "KServeServer":
        try:
            state = json.loads((Path(run_dir) / STATE_FILE).read_text())
        except (OSError, ValueError):
            raise ServeError(f"no packrat KServe server recorded in {run_dir}") from None
        return cls(**{**state, "run_dir": Path(run_dir),
                      "served_dir": Path(state["served_dir"]) if state.get("served_dir") else None})


def start(server: KServeServer, mars: Sequence[Path], *, timeout: float = 300.0) -> KServeServer:
    """The server on server.run_dir's model store (the archives are copied there), in a session of
    its own (a Ctrl-C meant for the caller must not reach it), its output in logs/kserve.log; then
    wait until every model is ready."""
    for sub in ("logs", "model_store", CONTROL_DIR):
        (server.run_dir / sub).mkdir(parents=True, exist_ok=True)
    shutil.rmtree(server.front_end_dir, ignore_errors=True)  # an earlier run's
    for model, mar in zip(server.models, mars):
        control_file(server.control_dir, model).unlink(missing_ok=True)  # left by an earlier run
        if Path(mar).resolve() != (server.store / f"{model}.mar").resolve():
            shutil.copy(mar, server.store / f"{model}.mar")
    with server.log.open("w") as out:
        process = subprocess.Popen(server.command(), cwd=server.run_dir, env=server.env(), stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    server.pid = process.pid
    server.save()
    try:
        wait_ready(server, timeout)
    except BaseException:
        stop(server)
        raise
    return server


def running(server: KServeServer) -> bool:
    if server.pid is None:
        return False
    try:
        os.kill(server.pid, 0)
    except OSError:
        return False
    try:  # reaped is gone; a zombie of ours is gone too
        return os.waitpid(server.pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:  # not our child: the kill above is the answer
        return True


def model_ready(server: KServeServer, model: str, url: str | None = None) -> bool:
    """GET /v2/models/NAME/ready says 200 (at `url`: one front end's own address): the model's pool can serve."""
    try:
        with urllib.request.urlopen(f"{url or server.url}/v2/models/{model}/ready", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def front_ends(server: KServeServer) -> tuple[dict | None, list[dict]]:
    """The server's choice of front ends ({"count", "why", "blocks", ...}; None before it made one)
    and the entries of those that started ({"index", "pid", "cores", "url"})."""
    choice = _read(server.front_end_dir / "front-ends.json")
    count = (choice or {}).get("count", 0)
    entries = [_read(server.front_end_dir / f"front-end-{i}.json") for i in range(count)]
    return choice, [entry for entry in entries if entry]


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def every_front_end_ready(server: KServeServer, model: str) -> bool:
    """Every front end the server chose has started and says `model` is ready (the port alone reaches one)."""
    choice, entries = front_ends(server)
    if choice is None or len(entries) < choice["count"]:
        return False
    return all(model_ready(server, model, entry["url"]) for entry in entries)


def wait_ready(server: KServeServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for model in server.models:
        while not every_front_end_ready(server, model):
            if not running(server):
                raise ServeError(f"the KServe server exited while starting; see {server.log}: {log_tail(server)}")
            if time.monotonic() > deadline:
                raise ServeError(f"model {model} not ready after {timeout:.0f} s; see {server.log}: {log_tail(server)}")
            time.sleep(0.2)


def log_tail(server: KServeServer, lines: int = 3) -> str:
    try:
        text = server.log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    errors = [line for line in text if "Error" in line or "error" in line]
    return " | ".join((errors or text)[-lines:])


def status(server: KServeServer, timeout: float = 10.0) -> dict:
    """Every model's engine status (plan, health, reconfigurations, served figures, node), by name."""
    try:
        with urllib.request.urlopen(f"{server.url}/status", timeout=timeout) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ServeError(f"the KServe server at {server.url} did not report its status: {exc}") from None


def stop(server: KServeServer, timeout: float = 60.0) -> None:
    """SIGTERM (KServe's shutdown: the servers stop, every engine closes and its instances exit),
    then SIGKILL of its session if it is still there after `timeout`."""
    if not running(server):
        return
    os.kill(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while running(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    if running(server):
        os.killpg(server.pid, signal.SIGKILL)  # its session: started with start_new_session
