"""Fat vs planned and stock TorchServe, through real TorchServe loaded by locust (`packrat bench`, the demo).

Each server is started once per batch size and warmed up; then, round after round, loaded once per
users pattern in a rotated order, its rounds pooled; --kill-every kills a pool instance during each
run. `--shape step`: low → high → low users with reconfiguration on, against each plan fixed."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packrat.bench.faults import InstanceKiller, torchserve_pid
from packrat.bench.results import write_json
from packrat.bench.rounds import in_rounds
from packrat.bench.servers import config_archive, started_side_by_side, warm_up, warmed_server
from packrat.bench.users import BATCH_USERS, UsersPattern, pooled, users_for_batch
from packrat.deploy import archive, torchserve
from packrat.machine.budget import cpu_budget
from packrat.settings import Settings

if TYPE_CHECKING:
    from packrat.loadtest import LoadResult

SERVER_CONFIGS = (  # name, handler, plan mode (fixed plans: no reconfiguration)
    ("stock", "stock", "auto"),
    ("packrat-fat", "packrat", "fat"),
    ("packrat-plan", "packrat", "auto"),
)
WARMUP_S = 8.0  # locust load on each server before it is measured: the first requests after a start are slower


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
    round_medians: dict | None = None  # rounds > 1: the medians of the rounds' p50_ms, p99_ms, throughput_rps
    vs_stock: dict | None = None  # p50, p99 over stock's at the same users (pooled; rounds_p50, rounds_p99: medians')


def server_bench(model: str, batch: int, profile_path: Path, out_dir: Path, *, duration_s: float = 30.0,
                 users: Sequence[UsersPattern | int] = (BATCH_USERS,), payload: str | None = None,
                 tokenizer: Path | None = None, kill_every_s: float | None = None, warmup_s: float = WARMUP_S,
                 max_batch_delay_ms: int = 100, rounds: int = 1, graph_mode: str | None = None,
                 stock_runtime: str | None = None, configs=SERVER_CONFIGS, log=print) -> list[ServerRun]:
    """Every configuration's server started and warmed up side by side, then loaded once per users pattern
    a round in rotated order: a ServerRun per configuration and users count. graph_mode and stock_runtime
    (give the profile's): how the stock handler runs the model."""
    from packrat.codec.payloads import build_payload, natural_payload

    payload = payload or natural_payload(model)
    body = build_payload(model, payload)
    counts = users_for_batch(users, batch)
    handlers = {name: handler for name, handler, *_ in configs}
    measured: dict[tuple[str, int], list[tuple[LoadResult, int]]] = {}  # (config, users) -> (result, kills) per round
    with ExitStack() as stack:
        archives = {config[0]: config_archive(config, model, batch, profile_path, out_dir / config[0] / "model_store",
                                              tokenizer=tokenizer, graph_mode=graph_mode, stock_runtime=stock_runtime,
                                              max_batch_delay_ms=max_batch_delay_ms) for config in configs}
        servers = started_side_by_side(archives, model, out_dir, stack, log,
                                       alone=[name for name, handler in handlers.items() if handler == "packrat"])
        for name, server in servers.items():  # one at a time: locust and the warm-up share the cores
            warm_up(server, model, out_dir / name, max(n for n, _ in counts), warmup_s, body)
        for round_, name in in_rounds(list(servers), rounds):
            kill_every = kill_every_s if handlers[name] == "packrat" else None
            for n, pattern in counts:
                log(f"-- {name}: {n} users ({pattern}) for {duration_s:.0f} s, payload {payload}"
                    + (f", round {round_}/{rounds}" if rounds > 1 else "")
                    + (f", kill -9 one pool instance every {kill_every:g} s" if kill_every else ""))
                where = out_dir / name / (f"load-u{n}" if rounds == 1 else f"load-u{n}-r{round_}")
                measured.setdefault((name, n), []).append(
                    _loaded(servers[name], model, n, duration_s, where, body, kill_every, log))
    patterns = dict(counts)
    runs = [ServerRun(batch, name, n, patterns[n], payload,
                      sum(kills for _, kills in results) if handlers[name] == "packrat" else None,
                      pooled([result for result, _ in results], duration_s), rounds,
                      round_medians([result for result, _ in results], duration_s) if rounds > 1 else None)
            for (name, n), results in measured.items()]
    stock = {run.users: run for run in runs if run.config == "stock"}
    for run in runs:
        if run.users in stock:
            run.vs_stock = vs(run, stock[run.users])
    return runs


def round_medians(results: Sequence[LoadResult], run_s: float) -> dict[str, float]:
    """The medians of each round's p50, p99 and requests answered per second of load."""
    rounds = [pooled([result], run_s) for result in results]
    return {key: statistics.median(getattr(r, key) for r in rounds) for key in ("p50_ms", "p99_ms", "throughput_rps")}


def vs(run: ServerRun, stock: ServerRun) -> dict[str, float]:
    """run's p50 and p99 over stock's: pooled, and (with rounds) the medians of the rounds'."""
    ratios = {key: getattr(run.load, f"{key}_ms") / getattr(stock.load, f"{key}_ms") for key in ("p50", "p99")}
    if run.round_medians and stock.round_medians:
        ratios.update({f"rounds_{key}": run.round_medians[f"{key}_ms"] / stock.round_medians[f"{key}_ms"]
                       for key in ("p50", "p99")})
    return ratios


def _loaded(server_and_token, model: str, users: int, duration_s: float, where: Path, body, kill_every_s, log):
    """One locust run on a warmed server, killing a pool instance every kill_every_s: (result, instances killed)."""
    from packrat.loadtest import run_locust

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
    """One line per run: config, users, requests, failures, p50/p95/p99, req/s (and kills: "-" without a pool);
    with rounds, the medians of the rounds' p50/p99/req/s; beside stock, p50 and p99 over stock's."""
    from packrat.loadtest import align, load_cells

    rounds, ratios = any(r.round_medians for r in runs), any(r.vs_stock for r in runs)
    head = ["config", "users", "requests", "failures", "p50 ms", "p95 ms", "p99 ms", "req/s"]
    lines = [head + (["kills"] if kills else []) + (["rounds: p50/p99/req/s"] if rounds else [])
             + (["p50 vs stock", "p99 vs stock"] if ratios else []) + (["rounds vs stock"] if rounds and ratios else [])]
    for r in runs:
        users = f"{r.users} ({r.users_pattern})" if r.users_pattern != str(r.users) else str(r.users)
        line = [r.config, users] + load_cells(r.load)
        if kills:
            line.append("-" if r.kills is None else str(r.kills))
        if rounds:
            m = r.round_medians
            line.append(f"{m['p50_ms']:.0f}/{m['p99_ms']:.0f}/{m['throughput_rps']:.1f}" if m else "-")
        if ratios:
            ratio = r.vs_stock or {}
            line += [f"{ratio[key]:.2f}" if key in ratio else "-" for key in ("p50", "p99")]
            if rounds:
                line.append(f"{ratio['rounds_p50']:.2f}/{ratio['rounds_p99']:.2f}" if "rounds_p50" in ratio else "-")
        lines.append(line)
    return align(lines)


def run_server_bench(model: str, batches: list[int], profile: Path, out: Path, duration: float,
                     users=None, as_json: bool = False, *, payload: str | None = None,
                     tokenizer: Path | None = None, kill_every: float | None = None, rounds: int = 1,
                     graph_mode: str | None = None, stock_runtime: str | None = None, warmup_s: float = WARMUP_S,
                     configs=SERVER_CONFIGS, max_batch_delay_ms: int = 100) -> list[ServerRun]:
    """server_bench for every batch size: the tables (or JSON), latency plots and OUT/server-bench.json; the runs."""
    from packrat.loadtest import plot_latency_distributions
    from packrat.codec.payloads import natural_payload
    from packrat.models.modes import served

    payload = payload or natural_payload(model)
    users = list(users or [BATCH_USERS])
    runs = []
    for batch in batches:
        batch_runs = server_bench(model, batch, profile, out / f"B{batch}", duration_s=duration, users=users,
                                  payload=payload, tokenizer=tokenizer, kill_every_s=kill_every,
                                  rounds=rounds, graph_mode=served(graph_mode), stock_runtime=stock_runtime,
                                  warmup_s=warmup_s, configs=configs,
                                  max_batch_delay_ms=max_batch_delay_ms, log=(lambda *_: None) if as_json else print)
        runs += batch_runs
        png = plot_latency_distributions(latency_rows(batch_runs), out / f"latency-B{batch}.png")
        if not as_json:
            counts = ", ".join(f"{p}={n}" if p != str(n) else p for n, p in users_for_batch(users, batch))
            each = (f"{duration:.0f} s each" if rounds == 1 else
                    f"{rounds} interleaved rounds of {duration:.0f} s each, pooled")
            each += f", maxBatchDelay {max_batch_delay_ms} ms"
            print(f"\n{model}, batch size {batch}, payload {payload}, users {counts}, {each} "
                  f"(locust runs on the same {cpu_budget().cores} cores as the server)")
            if kill_every is not None:
                print(f"kill -9 one pool instance every {kill_every:g} s during each run "
                      f"(stock has no pool: kills -)")
            print(format_server_results(batch_runs, kills=kill_every is not None))
            print(f"latency distributions: {png}")
    report = {"model": model, "payload": payload, "users": [str(p) for p in users], "kill_every_s": kill_every,
              "duration_s": duration, "rounds": rounds, "max_batch_delay_ms": max_batch_delay_ms, "runs": runs}
    write_json(out / "server-bench.json", report)
    if as_json:
        print(json.dumps(json.loads((out / "server-bench.json").read_text()), indent=2))
    return runs


# ---- a step load (`packrat bench --shape step`) ------------------------------------------------

def step_bench(model: str, batch: int, profile_path: Path, out_dir: Path, *, low: int = 1, cycles: int = 10,
               step_s: float = 12.0, warmup_s: float = 6.0, max_batch_delay_ms: int = 50,
               payload: str | None = None, tokenizer: Path | None = None, log=print) -> dict:
    """A low → high → low load on the packrat handler reconfiguring, and with each plan fixed."""
    from packrat.loadtest import plot_timeline, run_locust
    from packrat.loadtest.env import STEP_SECONDS, STEP_USERS
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
                                env={STEP_USERS.name: users, STEP_SECONDS.name: str(step_s)})
            status = torchserve.handler_status(server)
        switches = [r for r in status["reconfigurations"] if r["started_at"] >= (result.start_time or 0)]
        markers = [(r["started_at"] + r["seconds"], f"B={r['to_batch']}") for r in switches]
        png = plot_timeline(result.history, out_dir / f"timeline-{name}.png", markers)
        results[name] = {"load": result, "reconfigurations": switches, "timeline": str(png),
                         **switch_figures(result, switches)}
    return results


def switch_figures(result, switches: list[dict]) -> dict:
    """Switch durations, and each switch's p99 against the new plan's steady p99, from locust's history."""
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
