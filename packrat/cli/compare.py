"""Fat vs planned (and stock TorchServe), compared: through real TorchServe with locust, or the pool alone.

Server mode starts, side by side, (a) stock TorchServe with the stock handler and
TorchServe's default workers, (b) the packrat handler with the fat plan ⟨1, T, B⟩ and
(c) the packrat handler with the planned ⟨i, t, b⟩; each server is started once per batch
size and warmed up, then, round after round, each is loaded by locust once per users pattern
(exact counts from its JSON output), in an order rotated every round; a configuration's
rounds are pooled. With a kill interval, one pool instance of the packrat servers is killed
(SIGKILL) every few seconds during each measured run, to measure serving through crashes.

Pool-only mode needs neither Java nor locust: the model called in this process, the same
with the codec's decode/encode around it, the fat pool and the planned pool answering raw
requests, measured in interleaved rounds so machine noise hits them alike; medians and
ratios are reported.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import threading
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from packrat.deploy import archive, torchserve
from packrat.machine.budget import cpu_budget
from packrat.planning.planner import Plan, serving_plan
from packrat.profiling.profiles import load
from packrat.settings import Settings

if TYPE_CHECKING:
    from loadtest import LoadResult
    from packrat.serving.pool.instance_pool import InstancePool

SERVER_CONFIGS = (  # name, handler, plan mode (fixed plans: no reconfiguration)
    ("stock", "stock", "auto"),
    ("packrat-fat", "packrat", "fat"),
    ("packrat-plan", "packrat", "auto"),
)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _codec_path(codec, module, bodies: list[tuple[bytes, str]]) -> None:
    """The work the packrat path adds to the model, done in this process: decode each request,
    run the batch, encode each answer."""
    from packrat.serving.inference import batched

    decoded = [codec.decode(body, kind) for body, kind in bodies]
    outputs = module(*batched([d.samples for d in decoded]))
    [codec.encode(row.unsqueeze(0), d) for row, d in zip(outputs, decoded)]


def _answered(pool: InstancePool, requests: list) -> None:
    answers = pool.infer(requests)
    bad = [a for a in answers if not a.ok]
    if bad:
        raise RuntimeError(f"the pool refused {len(bad)} of {len(answers)} requests: {bad[0].status} {bad[0].reason}")


def pool_bench(model: str, batch: int, profile_path: Path, rounds: int = 20, progress=None) -> dict:
    """Median latency (ms) of each configuration at batch `batch` on this machine's cores:
    the model in this process, plus the codec (decode/encode), the fat pool and the planned
    pool (both answering `batch` raw-tensor requests, codec inside the instances)."""
    import torch

    from packrat.codec.codec import Codec
    from packrat.codec.config import CodecConfig
    from packrat.codec.forms import sample_request
    from packrat.models.modes import served
    from packrat.models.zoo import prepare, resolve
    from packrat.serving.pool.api import ModelConfig, Request
    from packrat.serving.pool.instance_pool import InstancePool

    topology = cpu_budget().topology
    threads = topology.num_cores
    profile = load(profile_path)
    items, mode = profile.items(), served(profile.metadata.get("mode"))
    fat_plan, _ = serving_plan(items, threads, batch, topology, "fat")
    plan, fallback = serving_plan(items, threads, batch, topology, "auto")
    spec = resolve(model)
    inputs = spec.example_inputs(batch)
    bodies = [sample_request(spec.inputs, sample) for sample in zip(*inputs)]
    requests = [Request(body, kind) for body, kind in bodies]
    torch.set_num_threads(threads)
    module, _, _ = prepare(spec, batch, mode)
    codec = Codec(CodecConfig.for_model(spec))
    config = ModelConfig(model, graph_mode=mode)  # as the profile measured it, like the server
    samples: dict[str, list[float]] = {"in-process": [], "in-process-codec": [], "pool-fat": [], "pool-plan": []}
    overhead: list[float] = []
    with InstancePool.from_plan(config, fat_plan) as fat, InstancePool.from_plan(config, plan) as planned:
        with torch.inference_mode():
            runs = {
                "in-process": lambda: module(*inputs),
                "in-process-codec": lambda: _codec_path(codec, module, bodies),
                "pool-fat": lambda: _answered(fat, requests),
                "pool-plan": lambda: _answered(planned, requests),
            }
            for fn in runs.values():  # warm-up
                fn()
            for _ in range(rounds):
                for name, fn in runs.items():
                    samples[name].append(_timed(fn))
                    if name == "pool-fat":
                        overhead.append(samples[name][-1] - fat.last_compute_ms)
                if progress:
                    progress()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "model": model, "batch": batch, "threads": threads, "rounds": rounds,
        "plan": plan.describe(), "fallback": fallback, "predicted_plan_ms": plan.expected_latency_ms,
        "predicted_fat_ms": fat_plan.expected_latency_ms,
        "median_ms": medians,
        "transport_overhead_ms": statistics.median(overhead),
        "codec_overhead": medians["in-process-codec"] / medians["in-process"] - 1,
        "plan_speedup_over_fat": medians["pool-fat"] / medians["pool-plan"],
    }


def format_pool_results(results: list[dict]) -> str:
    head = (f"{'B':>4}  {'in-process':>10}  {'+codec':>8}  {'pool fat':>9}  {'pool plan':>9}  "
            f"{'codec ovh':>9}  {'transport':>9}  {'plan/fat':>8}  plan")
    lines = [head]
    for r in results:
        m = r["median_ms"]
        lines.append(f"{r['batch']:>4}  {m['in-process']:>10.1f}  {m['in-process-codec']:>8.1f}  {m['pool-fat']:>9.1f}  "
                     f"{m['pool-plan']:>9.1f}  {r['codec_overhead']:>+9.1%}  {r['transport_overhead_ms']:>7.2f}ms"
                     f"  {r['plan_speedup_over_fat']:>7.2f}×  {r['plan']}")
    return "\n".join(lines)


@dataclass(frozen=True)
class UsersPattern:
    """Locust users as a multiple of TorchServe's batch size B ("B", "2B") or a fixed count ("4")."""

    count: int
    per_batch: bool

    def users(self, batch: int) -> int:
        return self.count * batch if self.per_batch else self.count

    def __str__(self) -> str:
        if not self.per_batch:
            return str(self.count)
        return "B" if self.count == 1 else f"{self.count}B"


BATCH_USERS = UsersPattern(1, True)  # the default: enough requests in flight to fill each batch
WARMUP_S = 8.0  # locust load on each server before it is measured: the first requests after a start are slower
_USERS_RE = re.compile(r"^(\d*)([bB]?)$")


def parse_users(text: str) -> list[UsersPattern]:
    """"B,2B,4" -> patterns, in order, duplicates dropped; ValueError on anything else."""
    patterns: list[UsersPattern] = []
    for part in text.split(","):
        match = _USERS_RE.match(part.strip())
        if not match or not (match[1] or match[2]):
            raise ValueError(f"{part.strip()!r} is not a users pattern like 4, B or 2B")
        count = int(match[1] or 1)
        if count < 1:
            raise ValueError(f"{part.strip()!r}: users must be >= 1")
        pattern = UsersPattern(count, bool(match[2]))
        if pattern not in patterns:
            patterns.append(pattern)
    return patterns


def users_for_batch(patterns: Sequence[UsersPattern | int], batch: int) -> list[tuple[int, str]]:
    """(users, pattern text) per pattern for this batch size; a count reached twice runs once."""
    runs: list[tuple[int, str]] = []
    for pattern in patterns:
        if isinstance(pattern, int):
            pattern = UsersPattern(pattern, False)
        if pattern.users(batch) not in [users for users, _ in runs]:
            runs.append((pattern.users(batch), str(pattern)))
    return runs


POOL_MARKER = "packrat.serving.pool"  # instances run as `python -m packrat.serving.pool FD`


def torchserve_pid(run_dir: Path) -> int | None:
    """The TorchServe (Java) process of the server in run_dir, from the pid file it writes."""
    try:
        return int((Path(run_dir) / "tmp" / ".model_server.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def pool_instances(root_pid: int, marker: str = POOL_MARKER) -> list[psutil.Process]:
    """Live descendants of root_pid whose command line names `marker`, longest-lived first."""
    try:
        descendants = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for proc in descendants:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and any(marker in arg for arg in proc.cmdline()):
                found.append((proc.create_time(), proc.pid, proc))
        except psutil.Error:  # gone meanwhile, or not ours to inspect
            continue
    return [proc for _, _, proc in sorted(found, key=lambda item: item[:2])]


def kill_one(root_pid: int, marker: str = POOL_MARKER, skip: Collection[int] = ()) -> int | None:
    """SIGKILL the longest-lived pool instance under root_pid (pids in `skip` aside: killed
    already, maybe not dead yet); its pid, or None when none is left.

    Killed instances are respawned as new processes, so taking the oldest each time goes
    round robin over the pool's slots."""
    for proc in pool_instances(root_pid, marker):
        if proc.pid in skip:
            continue
        try:
            proc.kill()
            return proc.pid
        except psutil.Error:
            continue
    return None


class Periodic:
    """While active (a with block), calls self.tick() every `every_s` seconds in a daemon thread."""

    def __init__(self, every_s: float, name: str):
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.tick()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class InstanceKiller(Periodic):
    """While active, kills one pool instance under the root process every `every_s` seconds.

    `root_pid` is a pid or a function returning one (None: nothing to kill this time)."""

    def __init__(self, root_pid: int | Callable[[], int | None], every_s: float, marker: str = POOL_MARKER):
        if every_s <= 0:
            raise ValueError(f"kill interval must be > 0 s, got {every_s}")
        super().__init__(every_s, "instance-killer")
        self._root = root_pid if callable(root_pid) else (lambda: root_pid)
        self.marker = marker
        self.killed: list[tuple[float, int]] = []  # (unix time, pid)
        self.misses = 0  # ticks that found no instance to kill

    @property
    def kills(self) -> int:
        return len(self.killed)

    def tick(self) -> None:
        root = self._root()
        pid = kill_one(root, self.marker, {pid for _, pid in self.killed}) if root is not None else None
        if pid is None:
            self.misses += 1
        else:
            self.killed.append((time.time(), pid))


@dataclass
class ServerRun:
    """One configuration at one users count, measured by locust: one run, or several pooled (rounds)."""

    batch: int
    config: str
    users: int
    users_pattern: str
    payload: str
    kills: int | None  # pool instances killed during the runs; None: no pool (stock)
    load: LoadResult
    rounds: int = 1  # locust runs pooled into `load`


def pooled(results: Sequence[LoadResult], run_s: float) -> LoadResult:
    """Runs of one configuration, each `run_s` s of load, as one: their requests together (percentiles
    from the summed histograms, the mean weighted by the requests timed) and the requests answered per
    second of load. Locust's own rate, from the first answer to the last, overstates a run that holds
    a few batches only (answers come a batch at a time), and by how much depends on the configuration."""
    from loadtest import LoadResult, percentile

    histogram: dict[float, int] = {}
    for result in results:
        for latency, count in result.response_times.items():
            histogram[latency] = histogram.get(latency, 0) + count
    timed = [sum(r.response_times.values()) for r in results]
    requests = sum(r.requests for r in results)
    seconds = len(results) * max(1, math.ceil(run_s))  # locust runs whole seconds
    return LoadResult(
        requests=requests, failures=sum(r.failures for r in results),
        p50_ms=percentile(histogram, 0.50), p95_ms=percentile(histogram, 0.95), p99_ms=percentile(histogram, 0.99),
        mean_ms=sum(r.mean_ms * n for r, n in zip(results, timed) if n) / sum(timed) if sum(timed) else math.nan,
        throughput_rps=requests / seconds, duration_s=seconds,
        start_time=min((r.start_time for r in results if r.start_time is not None), default=None),
        response_times=dict(sorted(histogram.items())), history=[row for r in results for row in r.history])


def rotated(items: Sequence, by: int) -> list:
    """`items` started at index `by` (mod their count): over len(items) rounds each takes every place once."""
    shift = by % len(items) if items else 0
    return list(items[shift:]) + list(items[:shift])


def server_bench(model: str, batch: int, profile_path: Path, out_dir: Path, *, duration_s: float = 30.0,
                 users: Sequence[UsersPattern | int] = (BATCH_USERS,), payload: str | None = None,
                 tokenizer: Path | None = None, kill_every_s: float | None = None, warmup_s: float = WARMUP_S,
                 max_batch_delay_ms: int = 100, rounds: int = 1, graph_mode: str | None = None,
                 configs=SERVER_CONFIGS, log=print) -> list[ServerRun]:
    """Every configuration's server is started and warmed up, side by side (an idle server takes no
    CPU; each plans for the whole machine, as if alone). Then, `rounds` times, each is loaded by
    locust once per users pattern (ints are fixed counts), the configurations in an order rotated
    every round, so that the machine's drift on a shared VM hits them alike; one ServerRun per
    configuration and users count pools its rounds. payload None: the model's natural one.
    graph_mode: how the stock handler runs the model (None: the default mode); give the profile's,
    so that stock and packrat differ only in how they use the cores. With kill_every_s, pool
    instances of the packrat configurations are killed during the measured runs."""
    from packrat.codec.payloads import build_payload, natural_payload

    payload = payload or natural_payload(model)
    body = build_payload(model, payload)
    counts = users_for_batch(users, batch)
    handlers = {name: handler for name, handler, *_ in configs}
    measured: dict[tuple[str, int], list[tuple[LoadResult, int]]] = {}  # (config, users) -> (result, kills) per round
    with ExitStack() as stack:
        servers = {}
        for config in configs:
            mar = _archive(config, model, batch, profile_path, out_dir / config[0] / "model_store",
                           tokenizer=tokenizer, graph_mode=graph_mode, max_batch_delay_ms=max_batch_delay_ms)
            servers[config[0]] = stack.enter_context(warmed_server(config[0], model, mar, out_dir / config[0],
                                                                   max(n for n, _ in counts), warmup_s, log,
                                                                   payload=body))
        for round_ in range(rounds):
            for name in rotated(list(servers), round_):
                kill_every = kill_every_s if handlers[name] == "packrat" else None
                for n, pattern in counts:
                    log(f"-- {name}: {n} users ({pattern}) for {duration_s:.0f} s, payload {payload}"
                        + (f", round {round_ + 1}/{rounds}" if rounds > 1 else "")
                        + (f", kill -9 one pool instance every {kill_every:g} s" if kill_every else ""))
                    where = out_dir / name / (f"load-u{n}" if rounds == 1 else f"load-u{n}-r{round_ + 1}")
                    measured.setdefault((name, n), []).append(
                        _loaded(servers[name], model, n, duration_s, where, body, kill_every, log))
    patterns = dict(counts)
    return [ServerRun(batch, name, n, patterns[n], payload,
                      sum(kills for _, kills in runs) if handlers[name] == "packrat" else None,
                      pooled([result for result, _ in runs], duration_s), rounds)
            for (name, n), runs in measured.items()]


def _archive(config: tuple, model: str, batch: int, profile_path: Path, store: Path, *, tokenizer: Path | None,
             graph_mode: str | None, max_batch_delay_ms: int) -> Path:
    """The archive of one configuration (name, handler, plan mode[, more settings or async_worker]),
    built into `store`: fixed plans, no node sharing (the servers stand side by side, each measured
    alone); the stock handler runs the model in `graph_mode`."""
    _, handler, plan_mode, *more = config
    extra = dict(more[0]) if more else {}
    async_worker = extra.pop("async_worker", False)
    if handler == "stock" and graph_mode is not None:
        extra.setdefault("graph_mode", graph_mode)
    settings = Settings(model, profiles=[profile_path] if handler == "packrat" else [], max_batch=batch,
                        plan=plan_mode, reconfigure=False, tokenizer=tokenizer, share_node=False, **extra)
    return archive.build(settings, store, name=model, handler=handler, max_batch_delay_ms=max_batch_delay_ms,
                         async_worker=async_worker)


def _loaded(server_and_token, model: str, users: int, duration_s: float, where: Path, body, kill_every_s, log):
    """One locust run against a warmed server, killing pool instances every kill_every_s s if given:
    (the result, the instances killed)."""
    from loadtest import run_locust

    server, token = server_and_token
    killer = InstanceKiller(lambda: torchserve_pid(server.run_dir), kill_every_s) if kill_every_s else None
    with killer or nullcontext():
        result = run_locust(server.inference_url, model, users, duration_s, where, token=token, payload=body)
    if killer and killer.misses and not killer.kills:
        log(f"-- no pool instance found to kill under TorchServe (pid {torchserve_pid(server.run_dir)})")
    return result, killer.kills if killer else 0


def latency_rows(runs: Sequence[ServerRun]) -> dict[str, LoadResult]:
    """{label: result} for plot_latency_distributions: the config, plus the users when they vary."""
    several = len({r.users for r in runs}) > 1
    return {(f"{r.config}, {r.users} users" if several else r.config): r.load for r in runs}


def format_server_results(runs: Sequence[ServerRun], kills: bool = False) -> str:
    """One line per run: config, users, requests, failures, p50/p95/p99, req/s (and kills: "-" without a pool)."""
    from loadtest import align, load_cells

    head = ["config", "users", "requests", "failures", "p50 ms", "p95 ms", "p99 ms", "req/s"]
    lines = [head + (["kills"] if kills else [])]
    for r in runs:
        users = f"{r.users} ({r.users_pattern})" if r.users_pattern != str(r.users) else str(r.users)
        line = [r.config, users] + load_cells(r.load)
        if kills:
            line.append("-" if r.kills is None else str(r.kills))
        lines.append(line)
    return align(lines)


@contextmanager
def warmed_server(name: str, model: str, mar: Path, run_dir: Path, users: int, warmup_s: float, log,
                  payload: tuple[bytes, str]):
    """TorchServe started on free loopback ports and warmed up by locust sending `payload`
    (body, content type); stopped on exit."""
    from loadtest import run_locust

    log(f"-- {name}: starting TorchServe")
    server = torchserve.start(torchserve.Server(run_dir, model, torchserve.Ports.free(), token_auth=True), mar)
    try:
        token = server.key("inference")
        run_locust(server.inference_url, model, users, warmup_s, run_dir / "warmup", token=token, payload=payload)
        yield server, token
    finally:
        torchserve.stop(server)


def save_json(path: Path, payload) -> None:
    def default(value):
        if isinstance(value, Plan):
            return value.to_json()
        if hasattr(value, "__dataclass_fields__"):
            return asdict(value)
        return str(value)

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=default))


def step_bench(model: str, batch: int, profile_path: Path, out_dir: Path, *, low: int = 1, cycles: int = 10,
               step_s: float = 12.0, warmup_s: float = 6.0, max_batch_delay_ms: int = 50,
               payload: str | None = None, tokenizer: Path | None = None, log=print) -> dict:
    """A low → high → low … locust load against the packrat handler with reconfiguration on,
    and with the plan fixed for the high and for the low batch size."""
    from loadtest import plot_timeline, run_locust
    from packrat.codec.payloads import build_payload

    body = build_payload(model, payload)
    users = ",".join([str(low), str(batch)] * cycles + [str(low)])
    configs = (("reconfigure-on", True, batch), ("fixed-plan-B%d" % batch, False, batch),
               ("fixed-plan-B%d" % low, False, low))
    results = {}
    for name, reconfigure, plan_batch in configs:
        run_dir = out_dir / name
        settings = Settings(model, profiles=[profile_path], max_batch=batch, reconfigure=reconfigure,
                            plan_batch=plan_batch, tokenizer=tokenizer)
        mar = archive.build(settings, run_dir / "model_store", name=model, max_batch_delay_ms=max_batch_delay_ms)
        with warmed_server(name, model, mar, run_dir, batch, warmup_s, log, payload=body) as (server, token):
            log(f"-- {name}: step load {users} users, {step_s:.0f} s per step")
            result = run_locust(server.inference_url, model, batch, step_s * (2 * cycles + 1), run_dir / "load",
                                token=token, payload=body, shape="step",
                                env={"PACKRAT_STEP_USERS": users, "PACKRAT_STEP_SECONDS": str(step_s)})
            status = torchserve.handler_status(server)
        switches = [r for r in status["reconfigurations"] if r["started_at"] >= (result.start_time or 0)]
        markers = [(r["started_at"] + r["seconds"], f"B={r['to_batch']}") for r in switches]
        png = plot_timeline(result.history, out_dir / f"timeline-{name}.png", markers)
        results[name] = {"load": result, "reconfigurations": switches, "timeline": str(png),
                         **switch_figures(result, switches)}
    return results


def switch_figures(result, switches: list[dict]) -> dict:
    """Switch durations, and p99 in the seconds of each switch against the new plan's
    steady p99 (the rest of its step), from locust's per-second history."""
    ok = [r for r in switches if not r.get("error")]
    ratios = []
    for r, following in zip(ok, ok[1:] + [None]):
        begin, end = r["started_at"], r["started_at"] + r["seconds"] + 1.0
        during = [h.p99_ms for h in result.history if begin <= h.timestamp <= end and h.p99_ms == h.p99_ms]
        settle_end = following["started_at"] if following else float("inf")
        steady = [h.p99_ms for h in result.history if end + 2 <= h.timestamp < settle_end and h.p99_ms == h.p99_ms]
        if during and steady:
            ratios.append(max(during) / statistics.median(steady))
    return {
        "switches": len(ok),
        "failed_switches": len(switches) - len(ok),
        "failed_requests": result.failures,
        "switch_seconds_median": statistics.median([r["seconds"] for r in ok]) if ok else None,
        "switch_seconds_max": max((r["seconds"] for r in ok), default=None),
        "switch_p99_ratio_median": statistics.median(ratios) if ratios else None,
        "switch_p99_ratio_max": max(ratios, default=None),
    }


def format_step_results(results: dict) -> str:
    lines = [f"{'config':<18} {'requests':>8} {'failures':>8} {'p50 ms':>7} {'p99 ms':>7} {'req/s':>6} "
             f"{'switches':>8} {'switch s (med/max)':>18} {'p99 in switch / steady (med/max)':>33}"]
    for name, r in results.items():
        load = r["load"]
        secs = (f"{r['switch_seconds_median']:.2f}/{r['switch_seconds_max']:.2f}"
                if r["switch_seconds_median"] is not None else "-")
        ratio = (f"{r['switch_p99_ratio_median']:.2f}/{r['switch_p99_ratio_max']:.2f}"
                 if r["switch_p99_ratio_median"] is not None else "-")
        lines.append(f"{name:<18} {load.requests:>8} {load.failures:>8} {load.p50_ms:>7.1f} {load.p99_ms:>7.1f} "
                     f"{load.throughput_rps:>6.1f} {r['switches']:>8} {secs:>18} {ratio:>33}")
    return "\n".join(lines)
