"""Overload benchmark (issues 56 and 64): one model served by one real server, offered more than it
can serve, measured as its users would meet it.

    packrat bench overload [--model resnet50] [--engine kserve|torchserve] [--batch-size 4]
                           [--payload raw|json|jpeg|text|v2-json|v2-binary] [--factor 3]
                           [--duration 20] [--capacity-s 10] [--runs 1] [--slow] [--json OUT]
    packrat bench overload --soak MINUTES [--soak-every 300] [--sample-every 30] [...]

The model is served as `packrat serve` serves it (the packrat handler, the plan for batch size B,
no reconfiguration), by packrat's KServe server (--engine kserve, the default) or by real
TorchServe (--engine torchserve), with the deadline --request-timeout-s (default 2 s), the queue
bound --max-queue and the admission rule --admission: predicted (a request is refused 503 at once
unless the pool predicts its answer within its deadline) or queue (the fixed bound alone, the old
behaviour). The body is --payload: v2-json and v2-binary are KServe v2 inference requests (JSON
numbers under "data"; the binary tensor extension, as tritonclient sends it), POSTed to
/v2/models/NAME/infer on the KServe server and to /predictions/NAME on TorchServe; the others
(raw tensor bytes, {"inputs": numbers}, a photo, text) go to /predictions/NAME.

The server is started once; then, with --slow, one CPU-bound process per core of the server's
instances, pinned to it, from before the warm-up to the end (killed on any exit): the machine
serves slower than its profile says; --warmup s of closed-loop load, not counted; then --runs
times (default 1), one after the other:

  capacity  closed loop for --capacity-s s with B locust users, then with 2B: capacity is the
            larger rate of answers 200 (only 200s count: a refusal retried is no capacity), the
            p50 before is that run's, and its users are the run's users. Closed-loop users
            answered 503 wait its Retry-After (at most 5 s) before their next request, as a
            client that honours it does: 2B users (a batch queued behind the running one) may
            meet refusals where a round and a queued one pass the deadline, and retried at once
            those would only load the client and the front end
  overload  open loop at --factor × capacity requests per second for --duration s, sent whatever
            the answers take: rate × (deadline + 1 s) users (at least B), each paced at
            rate / users from a random start. The client waits the deadline + 5 s, so the
            server's own answer (200, 503, 504) is what is recorded; requests in flight at the
            end are waited for. Meanwhile the server's liveness and readiness are probed every
            0.5 s from a thread, each probe on a new connection as a kubelet's: KServe
            /v2/health/live, /v2/health/ready and /v2/models/NAME/ready; TorchServe /ping (on
            the inference port)
  after     closed loop again with the capacity run's users: its p50

Every request is logged (packrat.loadtest.requestlog) with its status and latency, and a request
with no whole HTTP answer with its client error's class, by errno: reset (ECONNRESET, EPIPE, closed
before the answer), refused (ECONNREFUSED), timeout (the client's) or other. Rates count the answers
200 that arrived within the phase's whole seconds (locust's run time), from its first request. The
server's counters (the pool's health: answered, refused, expired, admitted, refused_late,
predicted_wait_ms, whichever it has) are read after each phase.

Per run (a row of a markdown table, every figure in --json): the capacity runs' rates (B and 2B),
the users chosen, capacity and p50 before; during the overload the rate offered and sent, requests
by status (200, 503, 504, other statuses) and client errors by class, answers 200 per second and
their ratio to capacity, the 503s' and the 200s' p50/p99, the 504s' share of the admitted
(everything not answered 503: 504 / (200 + 504 + other + client errors)), the slowest health
probe; p50 after and after / before. Then the verdicts of each run, against the issue's targets:

  only 200 or 503   504s at most 1 % of the admitted; no other status and no client error (each
                    class named)
  served            answers 200 per second during the overload at least 0.85 × capacity
  refused fast      the 503s' p99 at most 50 ms (no 503 at all passes, and says so)
  recovered         p50 after at most 1.1 × p50 before
  health in time    every liveness and readiness probe answered 200 within 1 s

and overall: each verdict passed in every run. A run with no answer at all fails every verdict.

Soak (--soak MINUTES, instead of the runs): after the warm-up and one capacity measurement (B and
2B, as above), open loop at 0.8 × capacity for MINUTES; every --soak-every s (default 300) a
burst of a second open loop, (--factor - 0.8) × capacity more (--factor × capacity in all)
for --duration s; every --soak-every s, half an interval after the bursts, SIGKILL of one pool
instance process of the server (the longest-lived: round robin over its slots); the health
probes throughout; every --sample-every s (default 30) the server's process tree (the KServe
server, or TorchServe's Java, and all under it): its memory as PSS (the pages it alone holds, and
its share of those it shares: the pool's shared memory counted once), its open files, and the
bytes of the /dev/shm segments it maps or its processes own. Verdicts:

  every request answered    200, 503 or 504 only, no client error, the kill windows included
  504 rare outside kills    504s at most 1 % of the admitted, outside the kill windows (a kill to
                            the deadline + 10 s after it: a request in flight then or sent within
                            is the kill's); the share inside is said
  instances killed          each kill found a process to kill (thread instances cannot be: say
                            --instance-kind process)
  no upward slope: PSS, open files, /dev/shm
                            over the steady samples of the soak's last two thirds (20 of 30
                            minutes; not those in a burst, until its last requests' deadline, nor
                            in a kill's window: the open files count the users' connections, a
                            killed instance respawns), the least-squares rise (slope × that span)
                            at most twice its standard error (the samples' own noise about the
                            line) × the span, plus one unit of resolution: 1 % of the mean PSS,
                            one open file, no /dev/shm byte; fewer than 3 samples there fails
  health in time            as above, over the whole soak

Locust runs on the same cores as the server: on a small machine its own work is part of the load,
more so at high rates. Progress goes to stderr.
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
    """One locust run, every request logged and waited for: the records. Closed loop (no rate),
    a 503's Retry-After is waited (at most RETRY_AFTER_MAX_S)."""
    return logged_load(target.url, model, users, duration_s, where, token=target.token, payload=body.payload,
                       timeout_s=client_timeout_s, rate=rate, stop_timeout_s=client_timeout_s, path=body.path,
                       header_length=body.header_length,
                       retry_after_s=None if rate is not None else RETRY_AFTER_MAX_S)


def build_archive(args, run_dir: Path) -> Path:
    """The model's archive as the chaos bench builds it (the packrat handler, the plan for B, no
    reconfiguration), with the deadline, the queue bound and the admission rule."""
    from packrat.bench.servers import config_archive
    from packrat.profiling.default_profile import resolve_profile

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
    """The server started (and slowed, with --slow) and warmed up: (target, the request body, its
    status after the start, the slowing cores)."""
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
