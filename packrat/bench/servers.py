"""Servers under test: archives, TorchServe and packrat's KServe server started on free loopback ports
(alone, warmed up, or side by side), a started one as its load reaches it, its bodies, counters and probes."""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable, Collection, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import astuple, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from packrat.bench.harness import Periodic
from packrat.deploy import archive, torchserve
from packrat.settings import Settings

ENGINES = ("kserve", "torchserve")
V2_PAYLOADS = ("v2-json", "v2-binary")  # KServe v2 inference requests: /v2/models/NAME/infer on KServe
HEALTH_EVERY_S = 0.5  # between one probe's answer and the next, per path
HEALTH_TIMEOUT_S = 5.0  # a probe waits this long: a late answer is measured, not cut at the limit


# ---- archives and servers ----------------------------------------------------------------------

def config_archive(config: tuple, model: str, batch: int, profile_path: Path | None, store: Path, *,
                   tokenizer: Path | None = None, graph_mode: str | None = None, stock_runtime: str | None = None,
                   max_batch_delay_ms: int = 100) -> Path:
    """One configuration's (name, handler, plan mode[, settings]) archive in `store`: no node sharing
    (each server measured alone), fixed plans unless the settings say `reconfigure`; the stock handler
    runs `graph_mode` with `stock_runtime`."""
    _, handler, plan_mode, *more = config
    extra = dict(more[0]) if more else {}
    if handler == "stock" and graph_mode is not None:
        extra.setdefault("graph_mode", graph_mode)
    if handler == "stock" and stock_runtime is not None:
        extra.setdefault("runtime", stock_runtime)
    settings = Settings(model, profiles=[profile_path] if handler == "packrat" else [], max_batch=batch,
                        plan=plan_mode, reconfigure=extra.pop("reconfigure", False), tokenizer=tokenizer, share_node=False, **extra)
    return archive.build(settings, store, name=model, handler=handler, max_batch_delay_ms=max_batch_delay_ms)


def zoo_archives(models: list[str], store: Path, batch: int, *, handler: str = "packrat", tokenizer: Path | None = None,
                 max_batch_delay_ms: int = 50, **settings) -> list[Path]:
    """An archive per zoo model in `store`: packrat planning on its default profile (stock on none), BERT's `tokenizer`."""
    from packrat.profiling.profiles import default_path

    return [archive.build(Settings(m, profiles=[default_path(m)] if handler == "packrat" else [], max_batch=batch,
                                   tokenizer=tokenizer if m == "bert_base" else None, **settings),
                          store, handler=handler, max_batch_delay_ms=max_batch_delay_ms) for m in models]


def bert_tokenizer(models: list[str], out: Path) -> Path | None:
    """A demo tokenizer for BERT's text in OUT/tokenizer/, where bert_base is among `models`."""
    from packrat.codec.demo_tokenizers import build_demo_tokenizer, demo_tokenizer_kind

    return build_demo_tokenizer(out / "tokenizer", demo_tokenizer_kind("bert_base")) if "bert_base" in models else None


def torchserve_of(run_dir: Path, models: list[str], mars: list[Path], **server) -> torchserve.Server:
    """TorchServe serving several archives on free loopback ports, its served figures in run_dir/served."""
    return torchserve.start(torchserve.Server(run_dir, models[0], torchserve.Ports.free(), models=tuple(models),
                                              served_dir=run_dir / "served", **server), mars, timeout=900)


@contextmanager
def torchserve_serving(model: str, mar: Path, run_dir: Path, log=print, name: str = "torchserve"):
    """TorchServe serving the archive on free ports with tokens, its served figures in run_dir/served (not the user's)."""
    log(f"-- {name}: starting TorchServe")
    server = torchserve.start(torchserve.Server(run_dir, model, torchserve.Ports.free(), token_auth=True,
                                                served_dir=run_dir / "served"), mar)
    try:
        yield server
    finally:
        torchserve.stop(server)


@contextmanager
def kserve_serving(model: str, mar: Path, run_dir: Path, log=print, *, cores=None, front_ends: int | str = 1):
    """packrat's KServe server (REST and gRPC) serving the archive on free ports, its served figures in
    run_dir/served (not the user's), on `cores` through `front_ends` processes; stopped on exit."""
    from packrat.deploy import kserve

    log(f"-- kserve: starting the KServe model server ({front_ends} front end(s)"
        + (f", cores {list(cores)})" if cores else ")"))
    server = kserve.start(kserve.KServeServer(run_dir, (model,), http_port=torchserve.free_port(),
                                              grpc_port=torchserve.free_port(), served_dir=run_dir / "served",
                                              cores=tuple(cores) if cores else None, front_ends=str(front_ends)),
                          [mar])
    try:
        yield server
    finally:
        kserve.stop(server)


def warm_up(server_and_token, model: str, run_dir: Path, users: int, warmup_s: float, payload) -> None:
    """Locust load on a started server for warmup_s: the first requests after a start are slower."""
    from packrat.loadtest import run_locust

    server, token = server_and_token
    run_locust(server.inference_url, model, users, warmup_s, run_dir / "warmup", token=token, payload=payload)


@contextmanager
def warmed_server(name: str, model: str, mar: Path, run_dir: Path, users: int, warmup_s: float, log,
                  payload: tuple[bytes, str]):
    """TorchServe started and warmed up by locust sending `payload` (body, content type): (server, inference key)."""
    with torchserve_serving(model, mar, run_dir, log, name) as server:
        token = server.key("inference")
        warm_up((server, token), model, run_dir, users, warmup_s, payload)
        yield server, token


def started_side_by_side(archives: dict[str, Path], model: str, out_dir: Path, stack: ExitStack, log,
                         alone: Collection[str] = ()) -> dict:
    """{name: (server, token)}: TorchServe per archive, stopped with `stack`; started at once (JVMs boot
    in parallel), but those named in `alone` one at a time after the others are up: a packrat server
    times its near-ties as it starts, and timings beside a JVM's boot are wrong, not noisy."""
    from concurrent.futures import ThreadPoolExecutor

    ports = dict(zip(archives, distinct_ports(len(archives))))

    def start(name: str):
        log(f"-- {name}: starting TorchServe")
        run_dir = out_dir / name
        server = torchserve.Server(run_dir, model, ports[name], token_auth=True, served_dir=run_dir / "served")
        return torchserve.start(server, archives[name])

    started, failed = {}, None
    waves = [[name for name in archives if name not in alone], *([name] for name in archives if name in alone)]
    for wave in filter(None, waves):
        with ThreadPoolExecutor(len(wave)) as threads:
            futures = {name: threads.submit(start, name) for name in wave}
        for name, future in futures.items():
            try:
                started[name] = future.result()
            except Exception as exc:  # the others are stopped with the stack
                failed = failed or exc
        if failed is not None:
            break
    stack.callback(stopped_side_by_side, list(started.values()))
    if failed is not None:
        raise failed
    return {name: (started[name], started[name].key("inference")) for name in archives}


def stopped_side_by_side(servers: list) -> None:
    """Every server stopped at once (each stop waits for its JVM to exit)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(len(servers), 1)) as threads:
        list(threads.map(torchserve.stop, servers))


def distinct_ports(count: int) -> list:
    """`count` sets of free loopback ports, no port in two of them (the servers bind them only later)."""
    while True:
        sets = [torchserve.Ports.free() for _ in range(count)]
        numbers = [port for ports in sets for port in astuple(ports)]
        if len(set(numbers)) == len(numbers):
            return sets


# ---- a started server, as the load reaches it ----------------------------------------------------

@dataclass
class Target:
    """A started server, as the phases reach it."""
    url: str
    token: str | None
    status: Callable[[], dict]  # the model's engine status (plan, health, ...)
    logs: Path
    root_pid: Callable[[], int | None]  # the process all of the server's run under
    health_paths: tuple[str, ...]  # liveness and readiness, on url


def health_paths(engine: str, model: str) -> tuple[str, ...]:
    """Where a kubelet would probe: KServe's v2 liveness, readiness and the model's readiness; TorchServe's /ping."""
    return (("/v2/health/live", "/v2/health/ready", f"/v2/models/{model}/ready") if engine == "kserve"
            else ("/ping",))


@contextmanager
def serving(engine: str, model: str, mar: Path, run_dir: Path):
    """The archive served by `engine` on free ports, its latencies kept in the run dir (a slowed run must not teach the user's)."""
    from packrat.bench.faults import torchserve_pid
    from packrat.deploy import kserve

    quiet = lambda *_: None  # noqa: E731 - the scenario says what it starts
    if engine == "kserve":
        import importlib.util

        if importlib.util.find_spec("kserve") is None:
            raise SystemExit("--engine kserve needs the KServe SDK: pip install 'packrat-serve[kserve]'")
        with kserve_serving(model, mar, run_dir, quiet) as server:
            yield Target(server.url, None, lambda: kserve.status(server)[model], server.log, lambda: server.pid,
                         health_paths(engine, model))
    else:
        with torchserve_serving(model, mar, run_dir, quiet) as server:
            yield Target(server.inference_url, server.key("inference"),
                         lambda: torchserve.handler_status(server, model), run_dir / "logs",
                         lambda: torchserve_pid(run_dir), health_paths(engine, model))


@dataclass(frozen=True)
class Body:
    """What every request sends, and where."""
    payload: tuple[bytes, str]  # body, content type
    path: str | None  # None: /predictions/NAME
    header_length: int | None  # a KServe v2 binary body's JSON header length


def request_body(model: str, payload: str, input_shape, engine: str) -> Body:
    """The body of `payload`; KServe v2 ones to /v2/models/NAME/infer on KServe (TorchServe's go to /predictions/NAME)."""
    from packrat.codec.payloads import build_payload, v2_binary_payload, v2_json_payload
    from packrat.models.zoo import resolve

    if payload not in V2_PAYLOADS:
        return Body(build_payload(model, payload, input_shape), None, None)
    path = f"/v2/models/{model}/infer" if engine == "kserve" else None
    spec = resolve(model, input_shape)
    if payload == "v2-json":
        return Body(v2_json_payload(spec), path, None)
    body, content_type, length = v2_binary_payload(spec)
    return Body((body, content_type), path, length)


# ---- its status ----------------------------------------------------------------------------------

def status_or_none(target: Target, notes: list[str], when: str) -> dict | None:
    try:
        return target.status()
    except Exception as exc:  # noqa: BLE001 - the figures go on without the server's counters
        notes.append(f"no server status {when}: {exc}")
        return None


def counters(status: Mapping | None) -> dict:
    """The scalar fields of an engine status's health (answered, refused, expired, ...); {} without one."""
    health = (status or {}).get("health") or {}
    return {key: value for key, value in health.items() if value is None or isinstance(value, (int, float, str))}


def counter_delta(before: Mapping, after: Mapping) -> dict[str, int]:
    """How the whole-number counters present in both moved (gauges and flags left out)."""
    return {key: after[key] - before[key] for key in before
            if key in after and all(isinstance(v, int) and not isinstance(v, bool) for v in (before[key], after[key]))}


def instance_cores(status: Mapping | None) -> list[int]:
    """The cores the status's plan pins its instances to, sorted."""
    plan = (status or {}).get("plan") or {}
    return sorted({core for instance in plan.get("instances", []) for core in instance.get("cores", [])})


# ---- its health, probed --------------------------------------------------------------------------

def probe(url: str, path: str, token: str | None, timeout_s: float = HEALTH_TIMEOUT_S) -> dict:
    """One GET of `path` on a new connection, as a kubelet probes: status (0: none, with its error class) and ms."""
    from packrat.loadtest.requestlog import error_class

    parts = urlsplit(url)
    started, status, error = time.perf_counter(), 0, ""
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        response.read()
        status = response.status
    except (OSError, http.client.HTTPException) as exc:
        error = error_class(exc)
    finally:
        conn.close()
    return {"time": time.time(), "path": path, "status": status, "ms": (time.perf_counter() - started) * 1e3,
            "error": error}


class HealthProbes(ExitStack):
    """In a with block, each health path probed every HEALTH_EVERY_S after its last answer, into `probes`."""

    def __init__(self, target: Target, every_s: float = HEALTH_EVERY_S):
        super().__init__()
        self.probes: list[dict] = []
        self._probers = [Periodic(every_s, f"probe {path}", at_once=True,
                                  tick=lambda path=path: self.probes.append(probe(target.url, path, target.token)))
                         for path in target.health_paths]

    def __enter__(self) -> HealthProbes:
        super().__enter__()
        for prober in self._probers:
            self.enter_context(prober)
        return self
