"""Servers under test, as the load reaches them: one started on free loopback ports (packrat's KServe
server or real TorchServe) as a Target, the bodies its users send, its status's counters, and its
liveness and readiness probed as a kubelet would."""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from packrat.bench.harness import Periodic

ENGINES = ("kserve", "torchserve")
V2_PAYLOADS = ("v2-json", "v2-binary")  # KServe v2 inference requests: /v2/models/NAME/infer on KServe
HEALTH_EVERY_S = 0.5  # between one probe's answer and the next, per path
HEALTH_TIMEOUT_S = 5.0  # a probe waits this long: a late answer is measured, not cut at the limit


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
    """Where a kubelet would probe the server: KServe's v2 liveness, readiness and the model's
    readiness; TorchServe's /ping on its inference port."""
    return (("/v2/health/live", "/v2/health/ready", f"/v2/models/{model}/ready") if engine == "kserve"
            else ("/ping",))


@contextmanager
def serving(engine: str, model: str, mar: Path, run_dir: Path):
    """The archive served by `engine` on free loopback ports, its served latencies kept in the run
    dir (a slowed run must not teach the user's); stopped on exit."""
    from packrat.bench.faults import torchserve_pid
    from packrat.deploy import kserve, torchserve

    served_dir = run_dir / "served"
    if engine == "kserve":
        import importlib.util

        if importlib.util.find_spec("kserve") is None:
            raise SystemExit("--engine kserve needs the KServe SDK: pip install 'packrat-serve[kserve]'")
        server = kserve.KServeServer(run_dir, (model,), http_port=torchserve.free_port(),
                                     grpc_port=torchserve.free_port(), served_dir=served_dir)
        kserve.start(server, [mar])
        try:
            yield Target(server.url, None, lambda: kserve.status(server)[model], server.log, lambda: server.pid,
                         health_paths(engine, model))
        finally:
            kserve.stop(server)
    else:
        server = torchserve.start(torchserve.Server(run_dir, model, torchserve.Ports.free(), token_auth=True,
                                                    served_dir=served_dir), mar)
        try:
            yield Target(server.inference_url, server.key("inference"),
                         lambda: torchserve.handler_status(server, model), run_dir / "logs",
                         lambda: torchserve_pid(run_dir), health_paths(engine, model))
        finally:
            torchserve.stop(server)


@dataclass(frozen=True)
class Body:
    """What every request sends, and where."""
    payload: tuple[bytes, str]  # body, content type
    path: str | None  # None: /predictions/NAME
    header_length: int | None  # a KServe v2 binary body's JSON header length


def request_body(model: str, payload: str, input_shape, engine: str) -> Body:
    """The body of `payload` for the model; KServe v2 ones to /v2/models/NAME/infer on the KServe
    server (TorchServe's users POST to /predictions/NAME, which the packrat handler reads them on)."""
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
    """The scalar fields of an engine status's health (answered, refused, expired, admitted, ...:
    whichever it has); {} without one."""
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
    """One GET of `path` on a new connection, as a kubelet's probe: its status (0: no answer, with
    its client error class) and how long it took."""
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
    """While active (a with block), each of the target's health paths probed every HEALTH_EVERY_S
    (after the last answer) from a thread of its own; `probes` collects them."""

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
