"""Running real TorchServe with the packrat handler: archive, config, start, readiness, stop.

TorchServe facts this relies on: `torchserve --start` returns at once with Java in the
background; `/ping` is not readiness, so we wait until the management API lists every
worker READY; TEMP holds the pid file and worker sockets, so each server gets its own;
token authorisation writes key_file.json into the directory TorchServe starts in.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import handlers

from .graph import DEFAULT_MODE

HANDLERS = Path(handlers.__file__).parent
LOG_CONFIG = Path(__file__).parent / "log4j2.xml"
STATE_FILE = "server.json"
CONTROL_DIR = "control"  # in the run dir: requests to the running handler, one JSON file per model
CONTROL_ENV = "PACKRAT_CONTROL_DIR"  # tells the handler where to look
OIP_ENV = "TS_OPEN_INFERENCE_PROTOCOL"  # "oip": TorchServe serves the KServe v2 / Open Inference Protocol paths
DEFAULT_IOS_CACHE = Path("profiles/ios-schedules")  # where `packrat profile --ios` keeps schedules
HF_ARCHIVE_DIR = "hf-model"  # where an archive keeps a Hugging Face model's directory


class ServeError(RuntimeError):
    """TorchServe could not be started, or did not become ready."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Ports:
    inference: int = 8080
    management: int = 8081
    metrics: int = 8082
    grpc_inference: int = 7070
    grpc_management: int = 7071

    @classmethod
    def free(cls) -> "Ports":
        return cls(*(free_port() for _ in range(5)))


@dataclass
class Server:
    """A running (or stopped) TorchServe started by packrat, as recorded in its run dir."""

    run_dir: Path
    model: str
    ports: Ports = field(default_factory=Ports)
    token_auth: bool = True
    oip: bool = False  # the Open Inference Protocol (KServe v2: /v2/..., tritonclient) on as well

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir).resolve()  # TorchServe rejects a relative TEMP

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
        env.update(TEMP=str(self.run_dir / "tmp"), LOG_LOCATION=str(self.run_dir / "logs"),
                   METRICS_LOCATION=str(self.run_dir / "logs"))
        env[CONTROL_ENV] = str(self.control_dir)
        if self.oip:
            env[OIP_ENV] = "oip"
        return env

    def save(self) -> None:
        state = {"model": self.model, "ports": asdict(self.ports), "token_auth": self.token_auth, "oip": self.oip}
        (self.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> "Server":
        path = Path(run_dir) / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            raise ServeError(f"no packrat server recorded in {run_dir} ({path} missing or unreadable)") from None
        return cls(Path(run_dir), state["model"], Ports(**state["ports"]), state["token_auth"], state.get("oip", False))


# ---- archive -------------------------------------------------------------------------------

MAX_REQUEST_SIZE = 100 * 2**20  # TorchServe's own limit: larger bodies never reach the handler


@dataclass(frozen=True)
class RequestSettings:
    """How the handler reads requests (the `packrat:` section's codec keys)."""

    tokenizer: Path | None = None  # a Hugging Face tokenizer.json, or a directory holding one
    labels: Path | None = None  # TorchServe's index_to_name.json
    max_body_bytes: int = 16 * 2**20  # larger bodies: 413 with the reason
    truncate_text: bool = False  # text longer than the model takes: truncated instead of 413

    def files(self) -> list[Path]:
        """The files the archive must carry (their names in it are tokenizer.json and index_to_name.json)."""
        found = []
        if self.tokenizer is not None:
            path = Path(self.tokenizer)
            path = path / "tokenizer.json" if path.is_dir() else path
            if not path.is_file():
                raise ServeError(f"no tokenizer at {path}: pass a directory holding a Hugging Face tokenizer.json")
            found.append(path)
        if self.labels is not None:
            if not Path(self.labels).is_file():
                raise ServeError(f"no labels file at {self.labels}: pass TorchServe's index_to_name.json")
            found.append(Path(self.labels))
        return found

    def yaml(self, shipped: list[Path]) -> str:
        names = {"tokenizer": self.tokenizer, "labels": self.labels}
        lines = [f"  {key}: {json.dumps(path.name)}\n" for key, path in zip(
            [k for k, v in names.items() if v is not None], shipped)]
        return "".join(lines) + (f"  max_body_bytes: {self.max_body_bytes}\n"
                                 f"  truncate_text: {str(self.truncate_text).lower()}\n")


# How the pool recovers requests (the `packrat:` section's keys); each is written only when given,
# so that the pool's own default applies otherwise.
RECOVERY_KEYS = (
    "request_timeout_s",  # a request waiting and running longer is answered 504 (pool default: 120 s)
    "max_queue",  # requests waiting beyond this are answered 503 at once (pool default: 1000)
    "batch_timeout_s",  # a batch running longer marks its instance hung (default: derived from the profile)
    "hang_factor",  # that derivation: hang_factor × the profiled latency of the batch ...
    "hang_floor_s",  # ... and at least this
)


def recovery_yaml(recovery: dict | None) -> str:
    """The `packrat:` lines for the recovery settings given (not None), in RECOVERY_KEYS order."""
    recovery = recovery or {}
    unknown = set(recovery) - set(RECOVERY_KEYS)
    if unknown:
        raise ValueError(f"unknown recovery setting(s) {sorted(unknown)}: expected some of {list(RECOVERY_KEYS)}")
    return "".join(f"  {key}: {json.dumps(recovery[key])}\n" for key in RECOVERY_KEYS
                   if recovery.get(key) is not None)


def profiles_yaml(names: str | list[str]) -> str:
    """`profile: NAME` for one profile (or none: the stock handler), `profiles: [NAME, ...]` for several."""
    names = [names] if isinstance(names, str) else list(names)
    if len(names) > 1:
        return f"  profiles: {json.dumps(names)}\n"
    return f"  profile: {json.dumps(names[0] if names else '')}\n"


def model_config_yaml(model: str, profile_name: str | list[str], batch_size: int, max_batch_delay_ms: int,
                      plan: str, handler: str, input_shape: tuple[int, ...] | None, reconfigure: bool = True,
                      plan_batch: int | None = None, estimator: dict | None = None, ios: bool = False,
                      requests: str = "", async_worker: bool = False, gather_ms: float | None = None,
                      recovery: dict | None = None, cores: int | None = None) -> str:
    """TorchServe's per-model config; packrat's own settings live under `packrat:`, the recovery
    settings (RECOVERY_KEYS) only those given. Several profile names (one per machine type) are
    written as `profiles:`, one as `profile:`; `cores`, the CPU budget asked for, only when given.

    The packrat handler gets one worker (the pool uses every core) in TorchServe's ordinary mode:
    TorchServe gathers batches of up to batch_size within max_batch_delay_ms and the pool splits
    each among its instances. With async_worker (for comparison only: TorchServe 0.12's
    asynchronous mode strands requests under load, see handlers/packrat_handler.py) batches go to
    the pool one request at a time, as they arrive, and the pool batches for its instances."""
    workers, torchserve_batch = "", batch_size
    if handler == "packrat":
        workers = "minWorkers: 1\nmaxWorkers: 1\n"
        if async_worker:
            # TorchServe 0.12's asynchronous batch aggregator fails on batches of more than one
            # request (ConcurrentModificationException, then a worker restart loop), so TorchServe
            # hands over single requests; the pool batches them (up to max_batch).
            workers += "asyncCommunication: true\n"
            torchserve_batch = 1
            max_batch_delay_ms = 1  # TorchServe reads 0 as "unset" and waits its default 100 ms
    shape = f"[{', '.join(map(str, input_shape))}]" if input_shape else "null"
    return (f"batchSize: {torchserve_batch}\nmaxBatchDelay: {max_batch_delay_ms}\nresponseTimeout: 300\n"
            f"startupTimeout: 600\n{workers}"
            f"packrat:\n  model: {json.dumps(model)}\n{profiles_yaml(profile_name)}"
            + (f"  cores: {cores}\n" if cores is not None else "") +
            f"  plan: {plan}\n  input_shape: {shape}\n  reconfigure: {str(reconfigure).lower()}\n"
            f"  plan_batch: {plan_batch or batch_size}\n  max_batch: {batch_size}\n  ios: {str(ios).lower()}\n"
            + requests + recovery_yaml(recovery)
            + (f"  gather_ms: {gather_ms}\n" if gather_ms is not None else "")
            + (f"  estimator: {json.dumps(estimator)}\n" if estimator else ""))


def archive(model: str, profile: Path | list[Path] | None, out_dir: Path, *, name: str | None = None,
            batch_size: int = 8, max_batch_delay_ms: int = 50, plan: str = "auto", handler: str = "packrat",
            input_shape: tuple[int, ...] | None = None, reconfigure: bool = True,
            plan_batch: int | None = None, estimator: dict | None = None,
            ios_cache: Path = DEFAULT_IOS_CACHE, tokenizer: Path | None = None, labels: Path | None = None,
            max_body_bytes: int = RequestSettings.max_body_bytes, truncate_text: bool = False,
            async_worker: bool = False, gather_ms: float | None = None, request_timeout_s: float | None = None,
            max_queue: int | None = None, batch_timeout_s: float | None = None, hang_factor: float | None = None,
            hang_floor_s: float | None = None, cores: int | None = None) -> Path:
    """Build NAME.mar with torch-model-archiver: handler, profile(s), settings, the tokenizer and
    labels the requests are read and answered with (and the model file for a TorchScript or
    torch.export model, the directory of a Hugging Face one). Zoo models are rebuilt from code in
    the worker. A model served compiled (the profile's mode, or the stock handler's default) gets
    its compiled package built here, once per machine type, and shipped (see compiled_files). A profile taken with IOS-compiled instances is
    served by them: the archive carries the model's cached schedules from `ios_cache` (the pool
    searches any that are missing). The recovery settings (request_timeout_s ... hang_floor_s, see
    RECOVERY_KEYS) are written only when given: the pool's defaults apply to the others.

    `profile` may be several profiles, one per machine type (shipped as profile-0.csv, ...): each
    server plans with the one chosen for its CPU and budget (profile.choose), and what is built here
    (compiled packages, IOS schedules) follows the one chosen for this machine. `cores` caps the
    servers' CPU budget (packrat/budget.py) and is written only when given."""
    from .budget import cpu_budget
    from .models import HF_PREFIX, resolve
    from .profile import chosen as profile_for_machine

    spec = resolve(model, input_shape)  # fail here on an unknown model, not in a worker
    name = name or Path(model.removeprefix(HF_PREFIX).rstrip("/")).stem.replace(":", "_").replace(".", "_")
    requests = RequestSettings(tokenizer, labels, max_body_bytes, truncate_text)
    recovery = {"request_timeout_s": request_timeout_s, "max_queue": max_queue, "batch_timeout_s": batch_timeout_s,
                "hang_factor": hang_factor, "hang_floor_s": hang_floor_s}
    shipped = requests.files()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as staging:
        staging = Path(staging)
        extra = [HANDLERS / "common.py", *shipped]
        model_ref = model
        if Path(model).is_file():
            model_ref = Path(model).name
            extra.append(Path(model))
        elif model.startswith(HF_PREFIX):  # the archiver copies a folder's contents: wrap the directory in one
            bundle = staging / "bundle"
            shutil.copytree(model[len(HF_PREFIX):], bundle / HF_ARCHIVE_DIR)
            model_ref = HF_PREFIX + HF_ARCHIVE_DIR
            extra.append(bundle)
        budget = cpu_budget(cores, "--cores")
        profile_names, chosen, mode = [], None, DEFAULT_MODE
        if handler == "packrat":
            paths = [profile] if isinstance(profile, (str, Path)) else list(profile or [])
            if not paths:
                raise ServeError("the packrat handler needs a profile: run `packrat profile` first or pass --profile")
            chosen = profile_for_machine(paths, budget.cores)[0]  # also rejects a bad profile, with its own message
            mode = chosen.metadata["mode"]
            profile_names = ["profile.csv"] if len(paths) == 1 else [f"profile-{i}.csv" for i in range(len(paths))]
            for path, shipped_name in zip(paths, profile_names):
                shutil.copy(path, staging / shipped_name)
                extra.append(staging / shipped_name)
        ios = mode == "ios"
        if ios:  # the archiver flattens folders: schedules sit beside the profile, named by model
            extra += cached_schedules(spec.name, Path(ios_cache))
        if mode == "compile":
            extra += compiled_files(spec, batch_size, planned_instances(chosen, batch_size, handler, budget.cores))
        config = staging / "model-config.yaml"
        config.write_text(model_config_yaml(model_ref, profile_names, batch_size, max_batch_delay_ms, plan,
                                            handler, input_shape, reconfigure, plan_batch, estimator, ios,
                                            requests.yaml(shipped), async_worker, gather_ms, recovery, cores))
        cmd = ["torch-model-archiver", "--model-name", name, "--version", "1.0",
               "--handler", str(HANDLERS / f"{handler}_handler.py"), "--config-file", str(config),
               "--extra-files", ",".join(map(str, extra)), "--export-path", str(out_dir), "--force"]
        _run_tool(cmd)
    return out_dir / f"{name}.mar"


def planned_instances(profile, batch_size: int, handler: str, cores: int) -> set[tuple[int, int]] | None:
    """The ⟨threads, batch⟩ of the instances the server will start first on a machine like this
    one, with `cores` cores budgeted: the plan of `profile` (a loaded Profile) for its batch size and
    the fat instance (the stock handler: the fat one alone); None when the profile cannot plan it
    (then every size up to the batch is shipped)."""
    from .planner import NoPlanError, plan

    if handler != "packrat":
        return {(cores, batch_size)}
    try:
        chosen = plan(profile.items(), cores, batch_size)
    except (NoPlanError, ValueError):
        return None
    return {(i.threads, i.batch) for i in chosen.instances} | {(cores, batch_size)}


def compiled_files(spec, batch_size: int, instances: set[tuple[int, int]] | None = None) -> list[Path]:
    """The model's compiled packages in this machine's cache (those its profile built) for the
    archive to ship: those of `instances` (⟨threads, batch⟩, each with its batch ladder), or if
    None every one up to `batch_size`. The instances load them instead of compiling; one whose
    package is missing (a plan the archive did not foresee, another CPU type or torch version)
    builds it on first start, once per machine. A package holds the model's weights, so shipping
    only what the first plan needs keeps a many-core archive small."""
    from .compiled import ladder
    from .models import compiled_packages

    found = compiled_packages(spec, batch_size)
    if instances is not None:
        wanted = {(threads, size) for threads, batch in instances for size in ladder(batch)}
        found = [path for path in found if package_shape(path) in wanted]
    if not found:
        print(f"archive: no compiled packages of {spec.name} in this machine's cache (profile it first): "
              f"the first instances will compile them", file=sys.stderr, flush=True)
    return found


def package_shape(path: Path) -> tuple[int, int]:
    """⟨threads, batch⟩ of a compiled package, from its name (NAME-KEY-tT-bB.aoti.pt2)."""
    threads, batch = path.name.split(".")[0].rsplit("-", 2)[1:]
    return int(threads[1:]), int(batch[1:])


def cached_schedules(model: str, cache: Path) -> list[Path]:
    """The model's IOS schedules in `cache`, one per threads and batch."""
    from ios_scheduler.cache import schedule_path

    return sorted(cache.glob(schedule_path(cache, model, 0, 0).name.replace("-t0-b0", "-t*-b*")))


def _run_tool(cmd: list[str]) -> None:
    exe = Path(sys.executable).parent / cmd[0]
    cmd = [str(exe) if exe.exists() else cmd[0], *cmd[1:]]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ServeError(f"{Path(cmd[0]).name} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")


# ---- config and start/stop ---------------------------------------------------------------------

def config_properties(ports: Ports, model_store: Path, token_auth: bool, extra: dict[str, str] | None = None) -> str:
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
        "enable_model_api": "false",
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


def start(server: Server, mar: Path, *, timeout: float = 300.0) -> Server:
    """torchserve --start in server.run_dir, then wait until every worker is READY."""
    run_dir = server.run_dir
    for sub in ("tmp", "logs", "model_store", CONTROL_DIR):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    for left in (control_file(server.control_dir, server.model), worker_file(server.control_dir, server.model)):
        left.unlink(missing_ok=True)  # left by an earlier run
    store = run_dir / "model_store"
    if mar.resolve().parent != store.resolve():
        shutil.copy(mar, store / mar.name)
    config = run_dir / "config.properties"
    config.write_text(config_properties(server.ports, store, server.token_auth))
    server.key_file.unlink(missing_ok=True)
    cmd = [str(Path(sys.executable).parent / "torchserve"), "--start", "--ncs", "--ts-config", str(config),
           "--model-store", str(store), "--models", f"{server.model}={mar.name}",
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
        wait_ready(server, timeout)
    except BaseException:
        stop(server)
        raise
    return server


def _get(server: Server, path: str, timeout: float = 5.0):
    request = urllib.request.Request(server.management_url + path)
    if server.token_auth and server.key_file.exists():
        request.add_header("Authorization", f"Bearer {server.key('management')}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _put(server: Server, path: str, timeout: float = 120.0) -> None:
    request = urllib.request.Request(server.management_url + path, method="PUT")
    if server.token_auth and server.key_file.exists():
        request.add_header("Authorization", f"Bearer {server.key('management')}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        response.read()


def restart_worker(server: Server, timeout: float = 600.0) -> None:
    """Scale the model to no worker and back to one: a fresh worker thread on TorchServe's side.

    TorchServe 0.12 restarts a Python worker that died, but in its asynchronous mode the restarted
    worker is never put back in service (its AsyncWorkerThread keeps `loadingFinished` from the first
    load, so the new load's answer never marks the worker loaded, and it waits forever for work meant
    for it alone). Scaling through the management API replaces the thread, which does load right.
    TorchServe may fail the scale-down itself after stopping the worker (IllegalStateException
    "Deque full" while it re-queues the dead worker's jobs), so both steps are retried until one
    worker is READY or `timeout` runs out."""
    deadline = time.monotonic() + timeout
    while True:
        for workers in (0, 1):
            try:
                _put(server, f"/models/{server.model}?min_worker={workers}&max_worker={workers}&synchronous=true")
            except (urllib.error.URLError, OSError) as exc:  # HTTPError included
                print(f"scaling {server.model} to {workers} worker(s) failed: {exc}", file=sys.stderr)
        if _wait_for(lambda: worker_status(server) == ["READY"], min(60.0, max(0.0, deadline - time.monotonic()))):
            return
        if time.monotonic() > deadline:
            raise ServeError(f"no READY worker for {server.model} after restarting it for {timeout:.0f} s")


def _wait_for(condition, timeout: float, every: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def worker_file(control_dir: str | Path, model: str) -> Path:
    return Path(control_dir) / f"{model}.worker.json"


def note_worker_start(control_dir: str | Path, model: str, pid: int) -> bool:
    """Record that worker `pid` serves the model; True when it replaces a worker that died (not one
    that restart_worker stopped on purpose), i.e. when TorchServe restarted a crashed worker."""
    import psutil

    path = worker_file(control_dir, model)
    try:
        previous = json.loads(path.read_text())
        replaces_dead = not psutil.pid_exists(int(previous["pid"])) and not previous.get("restarting")
    except (OSError, ValueError, KeyError, TypeError):
        replaces_dead = False
    _write_atomically(path, {"pid": pid, "restarting": replaces_dead})
    return replaces_dead


def worker_status(server: Server) -> list[str]:
    """Status of each worker of the model ([] while it is not registered yet)."""
    try:
        return _worker_statuses(server)
    except (urllib.error.URLError, OSError, ValueError):
        return []


def _worker_statuses(server: Server) -> list[str]:
    described = _get(server, f"/models/{server.model}")
    return [w.get("status", "?") for entry in described for w in entry.get("workers", [])]


def model_ready(server: Server) -> bool:
    """Some worker of the model READY (the readiness check of `packrat ready`, a pod's probe).

    TorchServe 0.12's keys expire (`token_expiration_min`, 60 minutes by default) and it answers an
    expired or wrong key with 400 InvalidKeyException: then the management key is renewed through
    the token API (which rewrites key_file.json) and the question asked once more."""
    try:
        statuses = _worker_statuses(server)
    except urllib.error.HTTPError as exc:  # before URLError: it is one
        if exc.code != 400 or not server.token_auth:
            return False
        try:
            renew_key(server, "management")
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return False
        statuses = worker_status(server)
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


def handler_status(server: Server) -> dict:
    """The packrat handler's own status (plan, reconfigurations) through the management
    API's customized describe, which TorchServe forwards to the handler."""
    try:
        described = _get(server, f"/models/{server.model}?customized=true", timeout=30)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ServeError(f"cannot reach TorchServe's management API at {server.management_url}: {exc}") from None
    metadata = described[0].get("customizedMetadata") if described else None
    if metadata is None:
        raise ServeError(f"model {server.model} gave no packrat status (is it served by the packrat handler?)")
    return json.loads(metadata) if isinstance(metadata, str) else metadata


def wait_ready(server: Server, timeout: float) -> None:
    """Until the management API shows every worker READY (not /ping: it says Healthy
    while workers crash in a loop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = worker_status(server)
        if statuses and all(s == "READY" for s in statuses):
            return
        if not java_running(server):
            raise ServeError(f"TorchServe exited while starting; see {server.run_dir / 'logs'}: {log_tail(server)}")
        time.sleep(0.5)
    raise ServeError(f"model {server.model} not READY after {timeout:.0f} s (workers: {worker_status(server)}); "
                     f"see {server.run_dir / 'logs'}: {log_tail(server)}")


def java_running(server: Server) -> bool:
    pid_file = server.run_dir / "tmp" / ".model_server.pid"
    try:
        os.kill(int(pid_file.read_text().strip()), 0)
        return True
    except (OSError, ValueError):
        return False


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
    """torchserve --stop, waiting for Java (and so the workers and their pools) to exit."""
    cmd = [str(Path(sys.executable).parent / "torchserve"), "--stop", "--foreground"]
    subprocess.run(cmd, cwd=server.run_dir, env=server.env(), capture_output=True, text=True, timeout=timeout)


# ---- requests to the running handler ------------------------------------------------------------

def control_file(control_dir: str | Path, model: str) -> Path:
    return Path(control_dir) / f"{model}.json"


def request_reconfigure(server: Server, batch: int) -> Path:
    """Ask the running handler to switch to the plan for `batch` now: writes
    RUN_DIR/control/MODEL.json = {"batch", "requested_at"} atomically (a temporary file, then
    os.replace), which the handler polls (read_reconfigure_request). Returns the file."""
    if not _is_batch(batch):
        raise ValueError(f"the batch size to reconfigure for must be an integer >= 1, got {batch!r}")
    path = control_file(server.control_dir, server.model)
    _write_atomically(path, {"batch": batch, "requested_at": time.time()})
    return path


def _write_atomically(path: Path, content) -> None:
    """JSON into `path` through a temporary file and os.replace, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                     delete=False) as out:
        json.dump(content, out)
    os.replace(out.name, path)


def read_reconfigure_request(control_dir: str | Path, model: str) -> tuple[int, float] | None:
    """(batch, requested_at) of the model's reconfiguration request in `control_dir` (the
    handler's PACKRAT_CONTROL_DIR); None when there is none or it is unreadable."""
    try:
        request = json.loads(control_file(control_dir, model).read_text())
        batch, requested_at = request["batch"], request["requested_at"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not _is_batch(batch) or isinstance(requested_at, bool) or not isinstance(requested_at, (int, float)):
        return None
    return batch, float(requested_at)


def _is_batch(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
