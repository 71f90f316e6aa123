"""Overload benchmark (issues 56 and 64): one model served by one real server, offered more than it
can serve, measured as its users would meet it.

    packrat bench overload [--model resnet50] [--engine kserve|torchserve] [--batch-size 4]
                           [--payload raw|json|jpeg|text|v2-json|v2-binary] [--factor 3]
                           [--duration 20] [--capacity-s 10] [--runs 1] [--slow] [--json OUT]
    packrat bench overload --soak MINUTES [--soak-every 300] [--sample-every 30] [...]

The server is started once (the plan for B, fixed), warmed up, then --runs times:

  capacity  closed loop, B locust users, then with 2B: the larger rate of answers 200; a user
            answered 503 waits its Retry-After (at most 5 s)
  overload  open loop at --factor × capacity for --duration s; liveness and readiness probed
            every 0.5 s (KServe /v2/health/live, /v2/health/ready; TorchServe /ping)
  after     closed loop again: its p50

A request with no whole answer is a client error by errno: reset (ECONNRESET, EPIPE),
refused (ECONNREFUSED), timeout or other. Verdicts per run, and over the runs:

  only 200 or 503   504s at most 1 % of the admitted; no other status, no client error
  served            answers 200 per second at least 0.85 × capacity
  refused fast      the 503s' p99 at most 50 ms
  recovered         p50 after at most 1.1 × p50 before
  health in time    every probe answered 200 within 1 s

--soak MINUTES instead: 0.8 × capacity with bursts to --factor × capacity and a pool instance
killed every --soak-every s; the server's PSS, open files and /dev/shm bytes sampled; verdicts:
every request answered, 504 rare outside kills, instances killed, no upward slope of each
resource, health in time. --payload v2-json and v2-binary send KServe v2 requests. Locust runs on
the same cores as the server. docs/load-testing.md says it in full.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from packrat.bench.faults import cpu_hogs
from packrat.bench.harness import log, raise_open_files
from packrat.bench.overload_report import best_capacity, closed_notes, closed_summary, health_verdict, \
    overall_verdicts, overload_summary, probe_summary, verdicts
from packrat.bench.resources import cpu_delta, refusal_cost, server_cpu
from packrat.bench.results import ratio
from packrat.bench.servers import Body, HealthProbes, Target, counter_delta, counters, instance_cores, \
    request_body, serving, status_or_none
from packrat.bench.users import logged_load, open_loop_users

if TYPE_CHECKING:  # the load test and the servers come with run(): `packrat --help` stays light
    from packrat.loadtest.requestlog import RequestRecord

PAYLOADS = ("raw", "json", "jpeg", "text", "v2-json", "v2-binary")
USERS_PER_BATCH = (1, 2)  # the capacity runs' users, per B: B (a batch in flight) and 2B (one queued behind it)
RETRY_AFTER_MAX_S = 5.0  # closed-loop users wait a 503's Retry-After, at most this long
WARMUP_S = 15.0  # long enough for a plan of thread instances to move to processes on decoded bodies (tuner.py)
CLIENT_SLACK_S = 5.0  # the client waits the server's deadline and this: the server's answer is recorded
PACE_KEPT = 0.9  # sent below this fraction of the rate offered: a note says the client fell behind


def phase(target: Target, model: str, users: int, duration_s: float, where: Path, body: Body, client_timeout_s: float,
          rate: float | None = None) -> list[RequestRecord]:
    """One locust run, every request logged and waited for; closed loop (no rate) waits a 503's Retry-After."""
    return logged_load(target.url, model, users, duration_s, where, token=target.token, payload=body.payload,
                       timeout_s=client_timeout_s, rate=rate, stop_timeout_s=client_timeout_s, path=body.path,
                       header_length=body.header_length,
                       retry_after_s=None if rate is not None else RETRY_AFTER_MAX_S)


def build_archive(args, run_dir: Path) -> Path:
    """The archive as chaos builds it (fixed plan for B), with the deadline, queue bound and admission rule."""
    from packrat.bench.servers import config_archive
    from packrat.serving.default_profile import resolve_profile

    profile = resolve_profile(args.model, args.profile, batch_sizes=[args.batch_size], input_shape=args.input_shape)
    extra = {"request_timeout_s": args.request_timeout_s, "max_queue": args.max_queue, "admission": args.admission,
             "instance_kind": args.instance_kind}
    if args.input_shape is not None:
        extra["input_shape"] = args.input_shape
    return config_archive(("packrat", "packrat", "auto", extra), args.model, args.batch_size, profile,
                          run_dir / "model_store", tokenizer=args.tokenizer, max_batch_delay_ms=args.max_batch_delay)


def run_dir_of(args) -> Path:
    return (Path(args.out) / f"{args.engine}-{args.admission}{'-slow' if args.slow else ''}"
            f"{'-process' if args.instance_kind == 'process' else ''}{'-soak' if args.soak else ''}").resolve()


@contextmanager
def started(args, run_dir: Path, notes: list[str]):
    """The server started, slowed (--slow), warmed up: (target, body, status after the start, slowing cores)."""
    from packrat.machine.budget import cpu_budget

    mar = build_archive(args, run_dir)
    body = request_body(args.model, args.payload, args.input_shape, args.engine)
    with ExitStack() as stack:
        log(f"starting the {args.engine} server for {args.model} (B = {args.batch_size}, admission {args.admission}, "
            f"deadline {args.request_timeout_s:g} s)")
        target = stack.enter_context(serving(args.engine, args.model, mar, run_dir))
        start = status_or_none(target, notes, "after the start")
        slow_cores: list[int] = []
        if args.slow:
            slow_cores = instance_cores(start) or cpu_budget().topology.cores
            pids = stack.enter_context(cpu_hogs(slow_cores))
            log(f"slowed: CPU-bound processes {pids} on cores {slow_cores}")
        log(f"warm-up: {args.batch_size} users for {args.warmup:g} s")
        phase(target, args.model, args.batch_size, args.warmup, run_dir / "warmup", body,
              args.request_timeout_s + CLIENT_SLACK_S)
        yield target, body, start, slow_cores
        log("stopping the server" + (" and the CPU-bound processes" if args.slow else ""))


def capacity_runs(target: Target, args, body: Body, where: Path) -> tuple[list[dict], int]:
    """Closed loop with B, then 2B users for --capacity-s each: their summaries, and the best's index."""
    client_timeout_s = args.request_timeout_s + CLIENT_SLACK_S
    runs = []
    for users in (per * args.batch_size for per in USERS_PER_BATCH):
        log(f"capacity: {users} users for {args.capacity_s:g} s")
        runs.append(closed_summary(phase(target, args.model, users, args.capacity_s, where / f"before-{users}u", body,
                                         client_timeout_s), args.capacity_s, users))
    best = best_capacity(runs)
    rates = " / ".join(f"{r['rps']:.1f}" for r in runs)
    log(f"capacity: {runs[best]['rps']:.1f} req/s with {runs[best]['users']} users ({rates} req/s)")
    return runs, best


def one_run(n: int, target: Target, args, body: Body, run_dir: Path, open_files: int) -> dict:
    """Capacity (B and 2B), overload (probed), after: run n's figures and verdicts."""
    where = run_dir / f"run{n}"
    client_timeout_s = args.request_timeout_s + CLIENT_SLACK_S
    notes: list[str] = []
    health = {"start": counters(status_or_none(target, notes, "before the capacity runs"))}
    cpu = {"start": server_cpu(run_dir)}
    runs, best = capacity_runs(target, args, body, where)
    before = runs[best]
    users = before["users"]
    health["before"] = counters(status_or_none(target, notes, "after the capacity runs"))
    cpu["before"] = server_cpu(run_dir)
    capacity = before["rps"]
    rate = args.factor * capacity
    open_users = open_loop_users(rate, args.request_timeout_s, args.batch_size)
    records: list = []
    probes: list[dict] = []
    after_records: list = []
    if capacity > 0:
        if open_users + 100 > open_files:
            notes.append(f"{open_users} open-loop users, each with a connection, near the open-file limit "
                         f"({open_files}): some may fail to connect")
        log(f"run {n}: overload: {rate:.1f} req/s ({args.factor:g} × {capacity:.1f}) from {open_users} users for "
            f"{args.duration:g} s, health probed")
        with HealthProbes(target) as prober:
            records = phase(target, args.model, open_users, args.duration, where / "overload", body,
                            client_timeout_s, rate=rate)
        probes = prober.probes
        health["overload"] = counters(status_or_none(target, notes, "after the overload"))
        cpu["overload"] = server_cpu(run_dir)
        log(f"run {n}: after: {users} users for {args.capacity_s:g} s")
        after_records = phase(target, args.model, users, args.capacity_s, where / "after", body, client_timeout_s)
        health["after"] = counters(status_or_none(target, notes, "after the after run"))
    else:
        notes.append(f"no answer 200 in the capacity runs: no overload to offer (see the server's log: {target.logs})")
    overload = overload_summary(records, args.duration, capacity, rate, open_users)
    after = closed_summary(after_records, args.capacity_s, users)
    if "overload" in health:
        health["overload_delta"] = counter_delta(health["before"], health["overload"])
    for closed in runs:
        notes += closed_notes(f"capacity ({closed['users']} users)", closed)
    notes += closed_notes("after", after)
    if overload["sent"] and overload["sent_rps"] < PACE_KEPT * rate:
        notes.append(f"sent {overload['sent_rps']:.1f} req/s of the {rate:.1f} offered: the client could not keep "
                     "the pace (locust shares the cores)")
    found = verdicts(before, overload, after, probes if capacity > 0 else None)
    if capacity <= 0:
        found.append(health_verdict([]))
    cost = (refusal_cost(cpu_delta(cpu["start"], cpu["before"]), cpu_delta(cpu["before"], cpu["overload"]),
                         runs, overload, args.duration) if "overload" in cpu else None)
    for verdict in found:
        log(f"run {n}: {verdict.line()}")
    return {"run": n, "capacity_runs": runs, "before": before, "overload": overload, "after": after,
            "after_over_before": ratio(after["p50_ms"], before["p50_ms"]), "health": health,
            "probes": probe_summary(probes), "cpu": cost, "verdicts": [asdict(v) for v in found],
            "passed": all(v.passed for v in found), "notes": notes}


def config(args, payload: str, slow_cores: Sequence[int], plan, run_dir: Path) -> dict:
    from packrat.machine.budget import cpu_budget
    from packrat.settings import MAX_QUEUE

    return {"model": args.model, "engine": args.engine, "batch": args.batch_size, "payload": payload,
            "request_timeout_s": args.request_timeout_s, "max_queue": args.max_queue, "default_max_queue": MAX_QUEUE,
            "admission": args.admission, "instance_kind": args.instance_kind, "slow": args.slow,
            "slow_cores": list(slow_cores), "factor": args.factor, "duration_s": args.duration,
            "capacity_s": args.capacity_s, "warmup_s": args.warmup, "max_batch_delay_ms": args.max_batch_delay,
            "client_timeout_s": args.request_timeout_s + CLIENT_SLACK_S, "cores": cpu_budget().cores, "plan": plan,
            "run_dir": str(run_dir)}


def with_payload(args):
    """args with --payload resolved: the model's natural one when not given."""
    from packrat.codec.payloads import natural_payload

    if args.payload is None:
        args.payload = natural_payload(args.model, args.input_shape)
    return args


def run(args) -> dict:
    """Serve, slow (--slow), warm up, then --runs times capacity, overload and after: the report."""
    args = with_payload(args)
    run_dir = run_dir_of(args)
    open_files = raise_open_files()
    notes: list[str] = []
    runs = []
    with started(args, run_dir, notes) as (target, body, start, slow_cores):
        for n in range(1, args.runs + 1):
            runs.append(one_run(n, target, args, body, run_dir, open_files))
    overall = overall_verdicts([r["verdicts"] for r in runs])
    return {**config(args, args.payload, slow_cores, (start or {}).get("plan"), run_dir), "runs": runs,
            "verdicts": [asdict(v) for v in overall], "passed": all(v.passed for v in overall), "notes": notes}
