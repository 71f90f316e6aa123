"""Overload benchmark (issue 56): one model served by one real server, offered more than it can serve.

    packrat bench overload [--model resnet50] [--engine kserve|torchserve] [--batch-size 4]
                           [--factor 3] [--duration 20] [--capacity-s 10] [--slow] [--json OUT]

The model is served as `packrat serve` serves it (the packrat handler, the plan for batch size B,
no reconfiguration), by packrat's KServe server (--engine kserve, the default) or by real
TorchServe (--engine torchserve), with the deadline --request-timeout-s (default 2 s), the queue
bound --max-queue and the admission rule --admission: predicted (a request is refused 503 at once
unless the pool predicts its answer within its deadline) or queue (the fixed bound alone, the old
behaviour). Then, one after the other:

  slow      with --slow, one CPU-bound process per core of the server's instances, pinned to it,
            from before the warm-up to the end (killed on any exit): the machine serves slower
            than its profile says
  warm-up   --warmup s of closed-loop load, not counted
  before    closed loop, U = B locust users for --capacity-s s: capacity = answers 200 per
            second, and their p50
  overload  open loop at --factor × capacity requests per second for --duration s, sent whatever
            the answers take: rate × (deadline + 1 s) users (at least B), each paced at
            rate / users from a random start. The client waits the deadline + 5 s, so the
            server's own answer (200, 503, 504) is what is recorded; requests in flight at the
            end are waited for
  after     closed loop again, as before: its p50

Every request is logged (packrat.loadtest.requestlog) with its status and latency. Rates count the
answers 200 that arrived within the phase's whole seconds (locust's run time), from its first
request. The server's counters (the pool's health: answered, refused, expired, admitted,
refused_late, predicted_wait_ms, whichever it has) are read after each phase.

Per run (printed as a markdown table, every figure in --json): capacity and p50 before; during
the overload the rate offered and sent, requests by status (200, 503, 504, other: 0 is no
answer), answers 200 per second and their ratio to capacity, the 503s' and the 200s' p50/p99,
the 504s' share of the admitted (everything not answered 503: 504 / (200 + 504 + other)); p50
after and after / before. Then the verdicts, against the issue's targets:

  only 200 or 503   504s at most 1 % of the admitted, and no other status (no answer included)
  served            answers 200 per second during the overload at least 0.85 × capacity
  refused fast      the 503s' p99 at most 50 ms (no 503 at all passes, and says so)
  recovered         p50 after at most 1.1 × p50 before

A run with no answer at all fails every verdict. Locust runs on the same cores as the server: on
a small machine its own work is part of the load, more so at high rates. Progress goes to stderr.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packrat.bench.harness import fmt_num, log, markdown_table, ratio

if TYPE_CHECKING:  # the load test and the servers come with run(): `packrat --help` stays light
    from packrat.loadtest.requestlog import RequestRecord

ENGINES = ("kserve", "torchserve")
USERS_PER_BATCH = 1  # the closed-loop phases' users: B, a batch in flight (2B queue one: where a round and a
# queued one pass the deadline, every second request is refused and retried at once, and capacity is the refusals')
WARMUP_S = 15.0  # long enough for a plan of thread instances to move to processes on decoded bodies (tuner.py)
CLIENT_SLACK_S = 5.0  # the client waits the server's deadline and this: the server's answer is recorded
PACE_SLACK_S = 1.0  # open-loop users: rate × (deadline + this)
PACE_KEPT = 0.9  # sent below this fraction of the rate offered: a note says the client fell behind
MAX_504_SHARE = 0.01  # of the admitted
MIN_SERVED_RATIO = 0.85  # answers 200 per second under overload over capacity
MAX_503_P99_MS = 50.0
MAX_AFTER_RATIO = 1.1  # p50 after over p50 before
MAIN_STATUSES = ("200", "503", "504")
# A CPU-bound loop that ends when its parent does: a benchmark killed with -9 leaves no spinning orphan.
HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(1_000_000):\n        pass\n"


# ---- pure: counts, percentiles, summaries, verdicts, tables --------------------------------------

def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank q-quantile (0 < q ≤ 1) of `values`; None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def status_classes(records: Iterable[RequestRecord]) -> dict[str, int]:
    """Requests by status: "200", "503", "504", "other" (any other, no answer included) and, of the
    other, "no_answer" (status 0: refused, reset or timed out before an HTTP answer)."""
    counts = Counter(r.status for r in records)
    main = {status: counts.pop(int(status), 0) for status in MAIN_STATUSES}
    return {**main, "other": sum(counts.values()), "no_answer": counts.get(0, 0)}


def by_status(records: Iterable[RequestRecord]) -> dict[str, int]:
    """Requests by HTTP status ("0": no answer), commonest first."""
    return dict(Counter(str(r.status) for r in records).most_common())


def admitted(counts: Mapping[str, int]) -> int:
    """Requests the server did not refuse 503: 200, 504 and any other (no answer included)."""
    return counts["200"] + counts["504"] + counts["other"]


def share_504(counts: Mapping[str, int]) -> float | None:
    """504s over the admitted; None when nothing was admitted."""
    taken = admitted(counts)
    return counts["504"] / taken if taken else None


def run_seconds(duration_s: float) -> int:
    """A phase's length as locust runs it: whole seconds, at least one."""
    return max(1, math.ceil(duration_s))


def answered_within(records: Sequence[RequestRecord], seconds: float, status: int = 200) -> int:
    """Answers of `status` that arrived within `seconds` of the first request's start."""
    if not records:
        return 0
    t0 = min(r.start for r in records)
    return sum(r.status == status and r.end <= t0 + seconds for r in records)


def sent_within(records: Sequence[RequestRecord], seconds: float) -> int:
    """Requests sent within `seconds` of the first one's start."""
    if not records:
        return 0
    t0 = min(r.start for r in records)
    return sum(r.start <= t0 + seconds for r in records)


def open_loop_users(rate_rps: float, request_timeout_s: float, batch: int) -> int:
    """Users enough to send `rate_rps` while every answer takes up to the deadline (and a second
    more): each sends one request per users / rate s. At least the closed loop's B."""
    return max(USERS_PER_BATCH * batch, math.ceil(rate_rps * (request_timeout_s + PACE_SLACK_S)))


def latencies(records: Iterable[RequestRecord], status: int) -> list[float]:
    return [r.response_ms for r in records if r.status == status]


def closed_summary(records: Sequence[RequestRecord], duration_s: float, users: int) -> dict:
    """A closed-loop phase: requests, by status, answers 200 per second (capacity) and their p50/p99."""
    seconds = run_seconds(duration_s)
    ok = latencies(records, 200)
    return {"users": users, "seconds": seconds, "requests": len(records), "by_status": by_status(records),
            "rps": answered_within(records, seconds) / seconds,
            "p50_ms": percentile(ok, 0.50), "p99_ms": percentile(ok, 0.99)}


def overload_summary(records: Sequence[RequestRecord], duration_s: float, capacity_rps: float | None,
                     rate_rps: float, users: int) -> dict:
    """The open-loop phase: what was offered and sent, counts by status, answers 200 per second and
    their ratio to capacity, the 503s' and 200s' p50/p99, and the 504s' share of the admitted."""
    seconds = run_seconds(duration_s)
    counts = status_classes(records)
    served = answered_within(records, seconds) / seconds
    refused, ok = latencies(records, 503), latencies(records, 200)
    return {"rate_rps": rate_rps, "users": users, "seconds": seconds, "sent": len(records),
            "sent_rps": sent_within(records, seconds) / seconds, "counts": counts, "by_status": by_status(records),
            "admitted": admitted(counts), "share_504": share_504(counts), "served_rps": served,
            "served_ratio": served / capacity_rps if capacity_rps else None,
            "p50_503_ms": percentile(refused, 0.50), "p99_503_ms": percentile(refused, 0.99),
            "p50_200_ms": percentile(ok, 0.50), "p99_200_ms": percentile(ok, 0.99)}


@dataclass(frozen=True)
class Verdict:
    name: str
    target: str
    passed: bool
    value: str  # what was measured, in words

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'} {self.name}: {self.value} (target: {self.target})"


def statuses_verdict(counts: Mapping[str, int]) -> Verdict:
    """Only 200 or 503: 504s at most 1 % of the admitted, no other status; no answer at all fails."""
    target = f"504 ≤ {MAX_504_SHARE:.0%} of the admitted, no other status"
    sent = sum(counts[s] for s in MAIN_STATUSES) + counts["other"]
    if sent - counts.get("no_answer", 0) == 0:
        return Verdict("only 200 or 503", target, False,
                       f"no request was answered ({sent} sent)" if sent else "no request was sent")
    share = share_504(counts)
    passed = counts["other"] == 0 and (share or 0.0) <= MAX_504_SHARE
    value = (f"504: {counts['504']} = {share:.1%} of {admitted(counts)} admitted" if share is not None
             else "nothing admitted") + f", other: {counts['other']}"
    if counts.get("no_answer"):
        value += f" ({counts['no_answer']} no answer)"
    return Verdict("only 200 or 503", target, passed, value)


def served_verdict(served_rps: float | None, capacity_rps: float | None) -> Verdict:
    """Answers 200 per second under overload at least 0.85 × capacity."""
    target = f"≥ {MIN_SERVED_RATIO:g} × capacity"
    if not capacity_rps:
        return Verdict("served", target, False, "no capacity measured")
    ratio = (served_rps or 0.0) / capacity_rps
    return Verdict("served", target, ratio >= MIN_SERVED_RATIO,
                   f"{fmt_num(served_rps or 0.0)} req/s of 200 = {ratio:.2f} × capacity {fmt_num(capacity_rps)}")


def refusals_verdict(p99_503_ms: float | None, counts: Mapping[str, int]) -> Verdict:
    """The 503s' p99 at most 50 ms; no 503 passes (said so) when something was answered."""
    target = f"503 p99 ≤ {MAX_503_P99_MS:g} ms"
    answered = sum(counts[s] for s in MAIN_STATUSES) + counts["other"] - counts.get("no_answer", 0)
    if not answered:
        return Verdict("refused fast", target, False, "no request was answered")
    if not counts["503"]:
        return Verdict("refused fast", target, True, "no 503s")
    if p99_503_ms is None:
        return Verdict("refused fast", target, False, f"{counts['503']} 503s without latencies")
    return Verdict("refused fast", target, p99_503_ms <= MAX_503_P99_MS,
                   f"503 p99 {fmt_num(p99_503_ms)} ms over {counts['503']} 503s")


def recovery_verdict(before_p50_ms: float | None, after_p50_ms: float | None) -> Verdict:
    """p50 after the overload at most 1.1 × p50 before."""
    target = f"after p50 ≤ {MAX_AFTER_RATIO:g} × before p50"
    if not before_p50_ms or after_p50_ms is None:
        return Verdict("recovered", target, False,
                       f"no p50 {'before' if not before_p50_ms else 'after'} (no answer 200)")
    ratio = after_p50_ms / before_p50_ms
    return Verdict("recovered", target, ratio <= MAX_AFTER_RATIO,
                   f"p50 {fmt_num(after_p50_ms)} ms after, {fmt_num(before_p50_ms)} ms before: {ratio:.2f}×")


def verdicts(before: Mapping, overload: Mapping, after: Mapping) -> list[Verdict]:
    """The four verdicts of a run, from its phases' summaries."""
    return [statuses_verdict(overload["counts"]), served_verdict(overload["served_rps"], before["rps"]),
            refusals_verdict(overload["p99_503_ms"], overload["counts"]),
            recovery_verdict(before["p50_ms"], after["p50_ms"])]


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


def refusal_cost(cpu_before: Mapping, cpu_over: Mapping, before: Mapping, over: Mapping,
                 duration_s: float | None = None) -> dict:
    """What the server's processes spent, in CPU ms: per answer 200 before the overload and during
    it (front end and instances apart), and per refusal during it: the front end's time beyond
    what its 200s cost before, over the 503s. Refusals that cost the instances nothing leave their
    CPU per 200 where it was. And the cores the rest of the machine took during the overload
    (the client, CPU-bound neighbours), over its `duration_s`."""
    ok_before, ok_over, refused = before["by_status"].get("200", 0), over["counts"]["200"], over["counts"]["503"]
    per_200 = {part: ratio(cpu_before.get(part, 0.0) * 1e3, ok_before) for part in CPU_PARTS}
    during = {part: ratio(cpu_over.get(part, 0.0) * 1e3, ok_over) for part in CPU_PARTS}
    front = per_200["front_end"]
    per_refusal = (ratio(cpu_over.get("front_end", 0.0) * 1e3 - front * ok_over, refused)
                   if front is not None and refused else None)
    others = cpu_over.get("machine", 0.0) - sum(cpu_over.get(part, 0.0) for part in CPU_PARTS)
    return {"cpu_s_before": dict(cpu_before), "cpu_s_overload": dict(cpu_over), "ms_per_200_before": per_200,
            "ms_per_200_overload": during, "front_end_ms_per_503": per_refusal,
            "others_cores_overload": others / duration_s if duration_s else None}


def cost_line(cost: Mapping) -> str:
    before, during = cost["ms_per_200_before"], cost["ms_per_200_overload"]
    refusal = cost["front_end_ms_per_503"]
    others = cost.get("others_cores_overload")
    return (f"CPU per answer 200, before / during the overload: instances {fmt_num(before['instances'])} / "
            f"{fmt_num(during['instances'])} ms, front end {fmt_num(before['front_end'])} / "
            f"{fmt_num(during['front_end'])} ms; a refusal cost the front end about "
            f"{fmt_num(refusal, 2) if refusal is not None else '?'} ms"
            + (f"; the rest of the machine (client, neighbours) took {others:.2f} cores" if others is not None else ""))


TABLE_HEAD = ["engine", "admission", "slow", "capacity req/s", "before p50 ms", "offered req/s", "sent req/s",
              "sent", "200", "503", "504", "other", "200/s", "÷ capacity", "503 p50/p99 ms", "200 p50/p99 ms",
              "504 of admitted", "after p50 ms", "after / before"]


def table_row(report: Mapping) -> list:
    before, over, after = report["before"], report["overload"], report["after"]
    counts, share = over["counts"], over["share_504"]
    engine = report["engine"] + (" (process instances)" if report.get("instance_kind") == "process" else "")
    return [engine, report["admission"], "yes" if report["slow"] else "no", fmt_num(before["rps"]),
            fmt_num(before["p50_ms"]), fmt_num(over["rate_rps"]), fmt_num(over["sent_rps"]), over["sent"],
            counts["200"], counts["503"], counts["504"],
            f"{counts['other']}" + (f" ({counts['no_answer']} no answer)" if counts["no_answer"] else ""),
            fmt_num(over["served_rps"]), fmt_num(over["served_ratio"], 2),
            f"{fmt_num(over['p50_503_ms'])}/{fmt_num(over['p99_503_ms'])}",
            f"{fmt_num(over['p50_200_ms'])}/{fmt_num(over['p99_200_ms'])}",
            "-" if share is None else f"{share:.1%}", fmt_num(after["p50_ms"]), fmt_num(report["after_over_before"], 2)]


def format_table(reports: Sequence[Mapping]) -> str:
    """One row per run: several runs (say, each admission rule) side by side."""
    return markdown_table(TABLE_HEAD, [table_row(r) for r in reports])


def format_report(report: Mapping) -> str:
    """The run's header, its table row, the server's counters over the overload and the verdicts."""
    queue = report["max_queue"] if report["max_queue"] is not None else f"{report['default_max_queue']} (default)"
    out = [f"### overload: {report['model']}, B = {report['batch']}, payload {report['payload']}, deadline "
           f"{report['request_timeout_s']:g} s, max_queue {queue}; {report['factor']:g}× capacity for "
           f"{report['overload']['seconds']} s, capacity over {report['before']['seconds']} s with "
           f"{report['before']['users']} users; {report['overload']['users']} open-loop users"
           + (f"; slowed by {len(report['slow_cores'])} CPU-bound process(es) on cores "
              f"{','.join(map(str, report['slow_cores']))}" if report["slow"] else "")
           + f" (locust on the same {report['cores']} cores)", "", format_table([report]), ""]
    delta = report["health"].get("overload_delta") or {}
    if delta:
        out.append("server counters over the overload: " + ", ".join(f"{k} {v:+d}" for k, v in delta.items() if v)
                   + (f"; predicted_wait_ms at its end: {fmt_num(report['health']['overload'].get('predicted_wait_ms'))}"
                      if "predicted_wait_ms" in report["health"].get("overload", {}) else ""))
        out.append("")
    if report.get("cpu"):
        out += [cost_line(report["cpu"]), ""]
    out += [f"- {Verdict(**v).line()}" for v in report["verdicts"]]
    out += [f"\nnote: {note}" for note in report["notes"]]
    return "\n".join(out)


# ---- processes: the slowing load, the server, the phases -----------------------------------------

@contextmanager
def cpu_hogs(cores: Sequence[int]):
    """One CPU-bound process pinned to each of `cores` while the block runs; killed on any exit."""
    procs: list[subprocess.Popen] = []
    try:
        for core in cores:
            procs.append(subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            os.sched_setaffinity(procs[-1].pid, {core})
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


CPU_PARTS = ("front_end", "instances")


def server_cpu(run_dir: Path) -> dict[str, float]:
    """CPU seconds (user + system) so far of the server in run_dir: its front end (the KServe
    server's process, or TorchServe's Java and Python worker) and its pool instances."""
    import psutil

    from packrat.bench.faults import POOL_MARKER, torchserve_pid

    roots = {p.pid for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])}
    roots |= {pid for pid in (torchserve_pid(run_dir),) if pid is not None}
    seen: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            seen.update((p.pid, p) for p in [root, *root.children(recursive=True)])
        except psutil.Error:
            continue
    totals = dict.fromkeys(CPU_PARTS, 0.0)
    for proc in seen.values():
        try:
            times, part = proc.cpu_times(), "instances" if POOL_MARKER in " ".join(proc.cmdline()) else "front_end"
        except psutil.Error:
            continue
        totals[part] += times.user + times.system
    machine = psutil.cpu_times()
    totals["machine"] = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
    return totals


def cpu_delta(start: Mapping, end: Mapping) -> dict[str, float]:
    return {part: end.get(part, 0.0) - start.get(part, 0.0) for part in (*CPU_PARTS, "machine")}


@dataclass
class Target:
    """A started server, as the phases reach it."""
    url: str
    token: str | None
    status: Callable[[], dict]  # the model's engine status (plan, health, ...)
    logs: Path


@contextmanager
def serving(engine: str, model: str, mar: Path, run_dir: Path):
    """The archive served by `engine` on free loopback ports, its served latencies kept in the run
    dir (a slowed run must not teach the user's); stopped on exit."""
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
            yield Target(server.url, None, lambda: kserve.status(server)[model], server.log)
        finally:
            kserve.stop(server)
    else:
        server = torchserve.start(torchserve.Server(run_dir, model, torchserve.Ports.free(), token_auth=True,
                                                    served_dir=served_dir), mar)
        try:
            yield Target(server.inference_url, server.key("inference"),
                         lambda: torchserve.handler_status(server, model), run_dir / "logs")
        finally:
            torchserve.stop(server)


def build_archive(args, run_dir: Path) -> Path:
    """The model's archive as the chaos bench builds it (the packrat handler, the plan for B, no
    reconfiguration), with the deadline, the queue bound and the admission rule."""
    from packrat.bench.server import config_archive
    from packrat.profiling.default_profile import resolve_profile

    profile = resolve_profile(args.model, args.profile, batch_sizes=[args.batch_size], input_shape=args.input_shape)
    extra = {"request_timeout_s": args.request_timeout_s, "max_queue": args.max_queue, "admission": args.admission,
             "instance_kind": args.instance_kind}
    if args.input_shape is not None:
        extra["input_shape"] = args.input_shape
    return config_archive(("packrat", "packrat", "auto", extra), args.model, args.batch_size, profile,
                          run_dir / "model_store", tokenizer=args.tokenizer, max_batch_delay_ms=args.max_batch_delay)


def status_or_none(target: Target, notes: list[str], when: str) -> dict | None:
    try:
        return target.status()
    except Exception as exc:  # noqa: BLE001 - the figures go on without the server's counters
        notes.append(f"no server status {when}: {exc}")
        return None


def phase(target: Target, model: str, users: int, duration_s: float, where: Path, body, client_timeout_s: float,
          rate: float | None = None) -> list[RequestRecord]:
    """One locust run, every request logged and waited for: the records."""
    from packrat.loadtest import run_locust
    from packrat.loadtest.requestlog import read_request_log

    request_log = where / "requests.tsv"
    run_locust(target.url, model, users, duration_s, where, token=target.token, payload=body,
               timeout_s=client_timeout_s, request_log=request_log, rate=rate, stop_timeout_s=client_timeout_s)
    return read_request_log(request_log)


def raise_open_files() -> int:
    """This process's open-file limit raised to its hard limit (the server and locust inherit it:
    each open-loop user holds a connection); the limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def run(args) -> dict:
    """Serve, slow (--slow), warm up, measure before, overload, after: the report."""
    from packrat.codec.payloads import build_payload, natural_payload
    from packrat.loadtest import run_locust
    from packrat.machine.budget import cpu_budget
    from packrat.settings import MAX_QUEUE

    payload = args.payload or natural_payload(args.model, args.input_shape)
    body = build_payload(args.model, payload, args.input_shape)
    run_dir = (Path(args.out) / f"{args.engine}-{args.admission}{'-slow' if args.slow else ''}"
               f"{'-process' if args.instance_kind == 'process' else ''}").resolve()
    users = USERS_PER_BATCH * args.batch_size
    client_timeout_s = args.request_timeout_s + CLIENT_SLACK_S
    open_files = raise_open_files()
    notes: list[str] = []
    health: dict[str, dict] = {}
    slow_cores: list[int] = []
    mar = build_archive(args, run_dir)
    with ExitStack() as stack:
        log(f"starting the {args.engine} server for {args.model} (B = {args.batch_size}, admission {args.admission}, "
            f"deadline {args.request_timeout_s:g} s)")
        target = stack.enter_context(serving(args.engine, args.model, mar, run_dir))
        start = status_or_none(target, notes, "after the start")
        plan = (start or {}).get("plan")
        if args.slow:
            slow_cores = instance_cores(start) or cpu_budget().topology.cores
            pids = stack.enter_context(cpu_hogs(slow_cores))
            log(f"slowed: CPU-bound processes {pids} on cores {slow_cores}")
        log(f"warm-up: {users} users for {args.warmup:g} s")
        run_locust(target.url, args.model, users, args.warmup, run_dir / "warmup", token=target.token, payload=body,
                   timeout_s=client_timeout_s)
        health["start"] = counters(status_or_none(target, notes, "after the warm-up"))
        log(f"before: {users} users for {args.capacity_s:g} s")
        cpu = {"start": server_cpu(run_dir)}
        before = closed_summary(phase(target, args.model, users, args.capacity_s, run_dir / "before", body,
                                      client_timeout_s), args.capacity_s, users)
        health["before"] = counters(status_or_none(target, notes, "after the capacity run"))
        cpu["before"] = server_cpu(run_dir)
        capacity = before["rps"]
        rate = args.factor * capacity
        open_users = open_loop_users(rate, args.request_timeout_s, args.batch_size)
        records: list = []
        if capacity > 0:
            if open_users + 100 > open_files:
                notes.append(f"{open_users} open-loop users, each with a connection, near the open-file limit "
                             f"({open_files}): some may fail to connect")
            log(f"overload: {rate:.1f} req/s ({args.factor:g} × {capacity:.1f}) from {open_users} users for "
                f"{args.duration:g} s")
            records = phase(target, args.model, open_users, args.duration, run_dir / "overload", body,
                            client_timeout_s, rate=rate)
            health["overload"] = counters(status_or_none(target, notes, "after the overload"))
            cpu["overload"] = server_cpu(run_dir)
            log(f"after: {users} users for {args.capacity_s:g} s")
            after_records = phase(target, args.model, users, args.capacity_s, run_dir / "after", body,
                                  client_timeout_s)
            health["after"] = counters(status_or_none(target, notes, "after the after run"))
        else:
            notes.append("no answer 200 in the capacity run: no overload to offer (see the server's log: "
                         f"{target.logs})")
            after_records = []
        log("stopping the server" + (" and the CPU-bound processes" if args.slow else ""))
    overload = overload_summary(records, args.duration, capacity, rate, open_users)
    after = closed_summary(after_records, args.capacity_s, users)
    if "before" in health and "overload" in health:
        health["overload_delta"] = counter_delta(health["before"], health["overload"])
    for name, closed in (("capacity (before)", before), ("after", after)):
        failed = closed["requests"] - closed["by_status"].get("200", 0)
        if failed:
            notes.append(f"the {name} run had {failed} of {closed['requests']} requests not answered 200 "
                         f"({', '.join(f'{s}: {n}' for s, n in closed['by_status'].items() if s != '200')})")
    if overload["sent"] and overload["sent_rps"] < PACE_KEPT * rate:
        notes.append(f"sent {overload['sent_rps']:.1f} req/s of the {rate:.1f} offered: the client could not keep "
                     "the pace (locust shares the cores)")
    found = verdicts(before, overload, after)
    cost = (refusal_cost(cpu_delta(cpu["start"], cpu["before"]), cpu_delta(cpu["before"], cpu["overload"]),
                         before, overload, args.duration) if "overload" in cpu else None)
    return {
        "model": args.model, "engine": args.engine, "batch": args.batch_size, "payload": payload,
        "request_timeout_s": args.request_timeout_s, "max_queue": args.max_queue, "default_max_queue": MAX_QUEUE,
        "admission": args.admission, "instance_kind": args.instance_kind, "slow": args.slow, "slow_cores": slow_cores, "factor": args.factor,
        "duration_s": args.duration, "capacity_s": args.capacity_s, "warmup_s": args.warmup,
        "max_batch_delay_ms": args.max_batch_delay, "client_timeout_s": client_timeout_s,
        "cores": cpu_budget().cores, "plan": plan, "before": before, "overload": overload, "after": after,
        "after_over_before": ratio(after["p50_ms"], before["p50_ms"]), "health": health,
        "cpu": cost, "verdicts": [asdict(v) for v in found], "passed": all(v.passed for v in found), "notes": notes,
        "run_dir": str(run_dir),
    }
