"""Running real TorchServe with a packrat archive: config, start, readiness, restart, stop.

TorchServe facts this relies on: `torchserve --start` returns at once with Java in the
background; `/ping` is not readiness, so we wait until the management API lists every
worker READY; TEMP holds the pid file and worker sockets, so each server gets its own (and
TMPDIR and TMP with it: the pid file's place is `tempfile.gettempdir()`, which reads TMPDIR first);
token authorisation writes key_file.json into the directory TorchServe starts in.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import secrets
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from packrat.errors import ServeError
from packrat.frontends.torchserve_control import CONTROL_DIR, control_file
from packrat.settings import CONTROL_DIR_ENV, SERVED_DIR_ENV, TS_KEY_FILE_ENV, TS_MANAGEMENT_ENV

LOG_CONFIG = Path(__file__).parent / "log4j2.xml"
STATE_FILE = "server.json"
JAVA_CLASS = "org.pytorch.serve.ModelServer"  # in Java's command line, as `torchserve --stop` checks
OIP_ENV = "TS_OPEN_INFERENCE_PROTOCOL"  # "oip": TorchServe serves the KServe v2 / Open Inference Protocol paths
TEMP_ENVS = ("TEMP", "TMPDIR", "TMP")  # Java's temp dir reads TEMP; Python's tempfile reads TMPDIR first
SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path on Linux (sun_path, less its NUL)
WORKER_SOCKET = "/.ts.sock.65535"  # the longest name TorchServe gives a worker's socket in TEMP
SHORT_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # where a short link to a long TEMP may go


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports: each socket is held until all are chosen, since a port
    just released may be handed out again (a server once got its metrics and gRPC ports the same)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


@dataclass
class Ports:
    inference: int = 8080
    management: int = 8081
    metrics: int = 8082
    grpc_inference: int = 7070
    grpc_management: int = 7071

    @classmethod
    def free(cls) -> "Ports":
        return cls(*free_ports(5))


@dataclass
class Server:
    """A running (or stopped) TorchServe started by packrat, as recorded in its run dir."""

    run_dir: Path
    model: str  # the first model: the one commands ask about when they name none
    ports: Ports = field(default_factory=Ports)
    token_auth: bool = True
    oip: bool = False  # the Open Inference Protocol (KServe v2: /v2/..., tritonclient) on as well
    models: tuple[str, ...] = ()  # every model it serves, `model` first
    model_api: bool = False  # registering and unregistering models through the management API
    # Where its handlers keep served latencies (settings.SERVED_DIR_ENV); None: the user's. A benchmark
    # gives each configuration its own, so that one's corrections do not plan another's.
    served_dir: Path | None = None
    # A short link to run_dir/tmp where that path is too long for a worker's socket; None: not needed.
    temp_link: Path | None = None

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir).resolve()  # TorchServe rejects a relative TEMP
        self.models = tuple(dict.fromkeys((self.model, *self.models)))
        self.temp_link = Path(self.temp_link) if self.temp_link else None

    @property
    def temp_dir(self) -> Path:
        """TorchServe's TEMP: its pid file, worker sockets and unpacked models (run_dir/tmp, or the
        short link to it)."""
        return self.temp_link or self.run_dir / "tmp"

    @property
    def inference_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.inference}"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.management}"

    @property
    def key_file(self) -> Path:
        return self.run_dir / "key_file.json"

    @property
    def control_dir(self) -> Path:
        return self.run_dir / CONTROL_DIR

    def key(self, api: str) -> str | None:
        """The bearer token for 'inference' or 'management' (None without token auth)."""
        if not self.token_auth:
            return None
        return json.loads(self.key_file.read_text())[api]["key"]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(dict.fromkeys(TEMP_ENVS, str(self.temp_dir)))
        env.update(LOG_LOCATION=str(self.run_dir / "logs"), METRICS_LOCATION=str(self.run_dir / "logs"))
        env[CONTROL_DIR_ENV.name] = str(self.control_dir)
        env[TS_MANAGEMENT_ENV.name] = self.management_url  # the handlers look at TorchServe's queue there
        env[TS_KEY_FILE_ENV.name] = str(self.key_file) if self.token_auth else ""
        if self.served_dir is not None:
            env[SERVED_DIR_ENV.name] = str(self.served_dir)
        if self.oip:
            env[OIP_ENV] = "oip"
        return env

    def save(self) -> None:
        state = {"model": self.model, "models": list(self.models), "ports": asdict(self.ports),
                 "token_auth": self.token_auth, "oip": self.oip, "model_api": self.model_api,
                 "temp_link": self.temp_link and str(self.temp_link)}
        (self.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> "Server":
        path = Path(run_dir) / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            raise ServeError(f"no packrat server recorded in {run_dir} ({path} missing or unreadable)") from None
        return cls(Path(run_dir), state["model"], Ports(**state["ports"]), state["token_auth"], state.get("oip", False),
                   tuple(state.get("models", ())), state.get("model_api", False), temp_link=state.get("temp_link"))


# ---- TEMP: short enough for the worker sockets ------------------------------------------------------

def fits_sockets(temp: Path) -> bool:
    """Whether a worker socket in `temp` is a path a Unix socket can have."""
    return len(os.fsencode(str(temp)) + WORKER_SOCKET.encode()) <= SOCKET_PATH_MAX


def short_temp(server: Server) -> Path | None:
    """None where run_dir/tmp fits the worker sockets; else a link to it in a short directory (the
    one an earlier start made, if it still leads there)."""
    real = server.run_dir / "tmp"
    if fits_sockets(real):
        return None
    if server.temp_link is not None and server.temp_link.is_symlink() and server.temp_link.resolve() == real.resolve():
        return server.temp_link
    for base in SHORT_DIRS:
        link = _link_in(base, real)
        if link is not None:
            return link
    raise ServeError(f"TorchServe's worker sockets go in its TEMP ({real}), a path too long for a Unix socket "
                     f"({SOCKET_PATH_MAX} bytes), and no short link to it could be made in {', '.join(SHORT_DIRS)}")


def _link_in(base: str, target: Path) -> Path | None:
    """A new symlink to `target` under a fresh name in `base` (None if it cannot be made there)."""
    for _ in range(10):  # a name taken by someone else: draw another
        link = Path(base) / f"packrat-ts-{secrets.token_hex(6)}"
        if not fits_sockets(link):
            return None
        try:
            os.symlink(target, link)
            return link
        except FileExistsError:
            continue
        except OSError:
            return None
    return None


def drop_temp_link(server: Server) -> None:
    """Remove the short link, if the server has one (its target stays)."""
    if server.temp_link is not None and server.temp_link.is_symlink():
        server.temp_link.unlink(missing_ok=True)


# ---- archive -------------------------------------------------------------------------------

MAX_REQUEST_SIZE = 100 * 2**20  # TorchServe's own limit: larger bodies never reach the handler


# ---- config and start/stop ---------------------------------------------------------------------

def config_properties(ports: Ports, model_store: Path, token_auth: bool, extra: dict[str, str] | None = None,
                      model_api: bool = False) -> str:
    lines = {
        "inference_address": f"http://127.0.0.1:{ports.inference}",
        "management_address": f"http://127.0.0.1:{ports.management}",
        "metrics_address": f"http://127.0.0.1:{ports.metrics}",
        "grpc_inference_address": "127.0.0.1",
        "grpc_management_address": "127.0.0.1",
        "grpc_inference_port": str(ports.grpc_inference),
        "grpc_management_port": str(ports.grpc_management),
        "model_store": str(model_store),
        "disable_token_authorization": "false" if token_auth else "true",
        # Registering and unregistering models (POST/DELETE /models) only when asked for.
        "enable_model_api": "true" if model_api else "false",
        "default_response_timeout": "300",
        # Bodies up to this reach the handler, which answers those over its own limit with 413
        # and the reason (TorchServe's default, 6.5 MB, resets the connection instead).
        "max_request_size": str(MAX_REQUEST_SIZE),
        # Hand the handler raw bytes: it ships them to the instances as they are, so parsing
        # JSON in the worker (which TorchServe otherwise does) would be wasted work.
        "decode_input_request": "false",
        **(extra or {}),
    }
    return "".join(f"{k}={v}\n" for k, v in lines.items())


def start(server: Server, mars: Path | Sequence[Path], *, timeout: float = 300.0) -> Server:
    """torchserve --start in server.run_dir serving each archive in `mars` as the model of
    server.models in the same place (one archive: server.model), then wait until every worker of
    every model is READY."""
    run_dir = server.run_dir
    mars = [mars] if isinstance(mars, (str, Path)) else list(mars)
    if len(mars) != len(server.models):
        raise ValueError(f"{len(mars)} archive(s) for {len(server.models)} model(s): {', '.join(server.models)}")
    for sub in ("tmp", "logs", "model_store", CONTROL_DIR):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    store = run_dir / "model_store"
    for model, mar in zip(server.models, mars):
        control_file(server.control_dir, model).unlink(missing_ok=True)  # left by an earlier run
        if Path(mar).resolve().parent != store.resolve():
            shutil.copy(mar, store / Path(mar).name)
    config = run_dir / "config.properties"
    config.write_text(config_properties(server.ports, store, server.token_auth, model_api=server.model_api))
    server.key_file.unlink(missing_ok=True)
    server.temp_link = short_temp(server)
    cmd = [str(Path(sys.executable).parent / "torchserve"), "--start", "--ncs", "--ts-config", str(config),
           "--model-store", str(store), "--models",
           *(f"{model}={Path(mar).name}" for model, mar in zip(server.models, mars)),
           "--log-config", str(LOG_CONFIG)]
    if not server.token_auth:
        cmd.append("--disable-token-auth")
    server.save()
    # A session of its own: a Ctrl-C meant for the caller must not reach Java.
    # Output to a file, not a pipe: Java inherits it and would hold a pipe open forever.
    start_log = run_dir / "logs" / "torchserve-start.log"
    with start_log.open("w") as out:
        done = subprocess.run(cmd, cwd=run_dir, env=server.env(), stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    if done.returncode != 0:
        raise ServeError(f"torchserve --start failed: {start_log.read_text().strip()[-500:]}")
    try:
        deadline = time.monotonic() + timeout
        for model in server.models:
            wait_ready(server, max(1.0, deadline - time.monotonic()), model)
    except BaseException:
        stop(server)
        raise
    return server


def _management(server: Server, path: str, method: str = "GET", timeout: float = 5.0) -> bytes:
    request = urllib.request.Request(server.management_url + path, method=method)
    if server.token_auth and server.key_file.exists():
        request.add_header("Authorization", f"Bearer {server.key('management')}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def _get(server: Server, path: str, timeout: float = 5.0):
    return json.loads(_management(server, path, timeout=timeout))


def register(server: Server, mar: Path, model: str, timeout: float = 300.0) -> None:
    """Add `model` from the archive `mar` to the running server (POST /models, one worker) and wait
    until it is READY; needs the model API (Server.model_api)."""
    store = server.run_dir / "model_store"
    if Path(mar).resolve().parent != store.resolve():
        shutil.copy(mar, store / Path(mar).name)
    query = urllib.parse.urlencode({"url": Path(mar).name, "model_name": model, "initial_workers": 1,
                                    "synchronous": "true"})
    _management(server, f"/models?{query}", "POST", timeout)
    server.models = (*server.models, model) if model not in server.models else server.models
    server.save()
    wait_ready(server, timeout, model)


def unregister(server: Server, model: str, timeout: float = 120.0) -> None:
    """Remove `model` from the running server (DELETE /models/NAME); needs the model API."""
    _management(server, f"/models/{model}", "DELETE", timeout)
    server.models = tuple(m for m in server.models if m != model)
    server.save()


def worker_status(server: Server, model: str | None = None) -> list[str]:
    """Status of each worker of the model (server.model unless named; [] while it is not registered)."""
    try:
        return _worker_statuses(server, model)
    except (urllib.error.URLError, OSError, ValueError):
        return []


def _worker_statuses(server: Server, model: str | None = None) -> list[str]:
    described = _get(server, f"/models/{model or server.model}")
    return [w.get("status", "?") for entry in described for w in entry.get("workers", [])]


def model_ready(server: Server, model: str | None = None) -> bool:
    """Some worker of the model READY (the readiness check of `packrat ready`, a pod's probe).

    TorchServe 0.12's keys expire (`token_expiration_min`, 60 minutes by default) and it answers an
    expired or wrong key with 400 InvalidKeyException: then the management key is renewed through
    the token API (which rewrites key_file.json) and the question asked once more."""
    try:
        statuses = _worker_statuses(server, model)
    except urllib.error.HTTPError as exc:  # before URLError: it is one
        if exc.code != 400 or not server.token_auth:
            return False
        try:
            renew_key(server, "management")
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return False
        statuses = worker_status(server, model)
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return "READY" in statuses


def renew_key(server: Server, api: str) -> None:
    """Have TorchServe replace the key of `api` ('management' or 'inference') in key_file.json,
    through its token API on the management address, authorised by the file's "API" key (which
    never expires). Renewing the inference key invalidates the one clients hold."""
    request = urllib.request.Request(f"{server.management_url}/token?type={api}")
    request.add_header("Authorization", f"Bearer {server.key('API')}")
    with urllib.request.urlopen(request, timeout=5.0) as response:
        response.read()


def handler_status(server: Server, model: str | None = None) -> dict:
    """The packrat handler's own status (plan, reconfigurations) of the model (server.model unless
    named) through the management API's customized describe, which TorchServe forwards to the handler."""
    model = model or server.model
    try:
        described = _get(server, f"/models/{model}?customized=true", timeout=30)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ServeError(f"cannot reach TorchServe's management API at {server.management_url}: {exc}") from None
    metadata = described[0].get("customizedMetadata") if described else None
    if metadata is None:
        raise ServeError(f"model {model} gave no packrat status (is it served by the packrat handler?)")
    return json.loads(metadata) if isinstance(metadata, str) else metadata


def wait_ready(server: Server, timeout: float, model: str | None = None) -> None:
    """Until the management API shows every worker of the model (server.model unless named) READY
    (not /ping: it says Healthy while workers crash in a loop)."""
    model = model or server.model
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = worker_status(server, model)
        if statuses and all(s == "READY" for s in statuses):
            return
        if not java_running(server):
            raise ServeError(f"TorchServe exited while starting; see {server.run_dir / 'logs'}: {log_tail(server)}")
        time.sleep(0.2)
    raise ServeError(f"model {model} not READY after {timeout:.0f} s (workers: {worker_status(server, model)}); "
                     f"see {server.run_dir / 'logs'}: {log_tail(server)}")


def java_running(server: Server) -> bool:
    try:
        os.kill(int(_pid_file(server).read_text().strip()), 0)
        return True
    except (OSError, ValueError):
        return False


def _pid_file(server: Server) -> Path:
    return server.run_dir / "tmp" / ".model_server.pid"  # in temp_dir: the same file, through the link if any


def log_tail(server: Server, lines: int = 3) -> str:
    """The last error lines of the model log, to say why a worker did not come up."""
    log = server.run_dir / "logs" / "model_log.log"
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no model log)"
    errors = [line for line in text if "Error" in line or "error" in line]
    return " | ".join((errors or text)[-lines:])


def stop(server: Server, timeout: float = 60.0) -> None:
    """torchserve --stop, then wait for Java (and so the workers and their pools) to exit. Not
    `--foreground`'s wait: it lasts until the exited Java has been reaped as well, which the
    orphan's new parent (init) may leave for seconds."""
    java = _java(server)
    cmd = [str(Path(sys.executable).parent / "torchserve"), "--stop"]
    subprocess.run(cmd, cwd=server.run_dir, env=server.env(), capture_output=True, text=True, timeout=timeout)
    deadline = time.monotonic() + timeout
    while java is not None and not _exited(java) and time.monotonic() < deadline:
        time.sleep(0.05)
    if java is None or _exited(java):
        drop_temp_link(server)


def _java(server: Server) -> psutil.Process | None:
    """The server's Java process, as its pid file names it (None if there is none)."""
    try:
        java = psutil.Process(int(_pid_file(server).read_text().strip()))
        return java if JAVA_CLASS in java.cmdline() else None
    except (OSError, ValueError, psutil.Error):
        return None


def _exited(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ---- requests to the running handler ------------------------------------------------------------


