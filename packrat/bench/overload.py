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

import http.client
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from packrat.bench.harness import fmt_num, log, markdown_table, ratio

if TYPE_CHECKING:  # the load test and the servers come with run(): `packrat --help` stays light
    from packrat.loadtest.requestlog import RequestRecord

ENGINES = ("kserve", "torchserve")
PAYLOADS = ("raw", "json", "jpeg", "text", "v2-json", "v2-binary")
V2_PAYLOADS = ("v2-json", "v2-binary")  # KServe v2 inference requests: /v2/models/NAME/infer on KServe
ERROR_CLASSES = ("reset", "refused", "timeout", "other")  # packrat.loadtest.requestlog's, kept light here
USERS_PER_BATCH = (1, 2)  # the capacity runs' users, per B: B (a batch in flight) and 2B (one queued behind it)
RETRY_AFTER_MAX_S = 5.0  # closed-loop users wait a 503's Retry-After, at most this long
WARMUP_S = 15.0  # long enough for a plan of thread instances to move to processes on decoded bodies (tuner.py)
CLIENT_SLACK_S = 5.0  # the client waits the server's deadline and this: the server's answer is recorded
PACE_SLACK_S = 1.0  # open-loop users: rate × (deadline + this)
PACE_KEPT = 0.9  # sent below this fraction of the rate offered: a note says the client fell behind
MAX_504_SHARE = 0.01  # of the admitted
MIN_SERVED_RATIO = 0.85  # answers 200 per second under overload over capacity
MAX_503_P99_MS = 50.0
MAX_AFTER_RATIO = 1.1  # p50 after over p50 before
MAX_HEALTH_MS = 1000.0  # a liveness or readiness probe's answer, at most
HEALTH_EVERY_S = 0.5  # between one probe's answer and the next, per path
HEALTH_TIMEOUT_S = 5.0  # a probe waits this long: a late answer is measured, not cut at the limit
SOAK_LOAD = 0.8  # the soak's steady rate, × capacity
SOAK_EVERY_S = 300.0  # a burst, and a kill, this often
SAMPLE_EVERY_S = 30.0
SLOPE_SHARE = 2 / 3  # the slopes are fitted over the soak's last two thirds (20 of 30 minutes)
SLOPE_SIGMAS = 2.0  # the rise allowed: this many standard errors of the slope (× the span)
KILL_WINDOW_S = 10.0  # a kill's window: from it to the deadline + this after it
MAIN_STATUSES = ("200", "503", "504")
MIB = 2 ** 20
# A CPU-bound loop that ends when its parent does: a benchmark killed with -9 leaves no spinning orphan.
HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(1_000_000):\n        pass\n"


# ---- pure: counts, percentiles, summaries, verdicts, tables --------------------------------------

def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank q-quantile (0 < q ≤ 1) of `values`; None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def status_classes(records: Iterable[RequestRecord]) -> dict:
    """Requests by outcome: "200", "503", "504", "other" (any other HTTP status), "client_error"
    (no whole HTTP answer: the record's client error class) and, of those, "errors" by class
    (reset, refused, timeout, other)."""
    counts: Counter = Counter()
    errors: Counter = Counter()
    for record in records:
        error = record.client_error
        if error:
            errors[error] += 1
        else:
            counts[str(record.status) if str(record.status) in MAIN_STATUSES else "other"] += 1
    return {**{status: counts[status] for status in MAIN_STATUSES}, "other": counts["other"],
            "client_error": sum(errors.values()),
            "errors": {name: errors[name] for name in ERROR_CLASSES if errors[name]}}


def by_status(records: Iterable[RequestRecord]) -> dict[str, int]:
    """Requests by HTTP status ("0": no answer), commonest first."""
    return dict(Counter(str(r.status) for r in records).most_common())


def answered(counts: Mapping) -> int:
    """Requests with a whole HTTP answer."""
    return sum(counts[s] for s in MAIN_STATUSES) + counts["other"]


def admitted(counts: Mapping) -> int:
    """Requests the server did not refuse 503: 200, 504, any other status and client errors."""
    return counts["200"] + counts["504"] + counts["other"] + counts["client_error"]


def share_504(counts: Mapping) -> float | None:
    """504s over the admitted; None when nothing was admitted."""
    taken = admitted(counts)
    return counts["504"] / taken if taken else None


def fmt_errors(counts: Mapping) -> str:
    """Client errors with their classes: "3 (reset 2, timeout 1)"; "0" for none."""
    errors = counts.get("errors") or {}
    return f"{counts['client_error']}" + (f" ({', '.join(f'{k} {v}' for k, v in errors.items())})" if errors else "")


def run_seconds(duration_s: float) -> int:
    """A phase's length as locust runs it: whole seconds, at least one."""
    return max(1, math.ceil(duration_s))


def answered_within(records: Sequence[RequestRecord], seconds: float, status: int = 200) -> int:
    """Answers of `status` that arrived within `seconds` of the first request's start."""
    if not records:
        return 0
    t0 = min(r.start for r in records)
    return sum(r.status == status and not r.client_error and r.end <= t0 + seconds for r in records)


def sent_within(records: Sequence[RequestRecord], seconds: float) -> int:
    """Requests sent within `seconds` of the first one's start."""
    if not records:
        return 0
    t0 = min(r.start for r in records)
    return sum(r.start <= t0 + seconds for r in records)


def open_loop_users(rate_rps: float, request_timeout_s: float, batch: int) -> int:
    """Users enough to send `rate_rps` while every answer takes up to the deadline (and a second
    more): each sends one request per users / rate s. At least the closed loop's B."""
    return max(batch, math.ceil(rate_rps * (request_timeout_s + PACE_SLACK_S)))


def latencies(records: Iterable[RequestRecord], status: int) -> list[float]:
    return [r.response_ms for r in records if r.status == status and not r.client_error]


def closed_summary(records: Sequence[RequestRecord], duration_s: float, users: int) -> dict:
    """A closed-loop phase: requests, by status, client errors, answers 200 per second (capacity)
    and their p50/p99."""
    seconds = run_seconds(duration_s)
    ok = latencies(records, 200)
    return {"users": users, "seconds": seconds, "requests": len(records), "by_status": by_status(records),
            "client_errors": status_classes(records)["errors"],
            "rps": answered_within(records, seconds) / seconds,
            "p50_ms": percentile(ok, 0.50), "p99_ms": percentile(ok, 0.99)}


def best_capacity(runs: Sequence[Mapping]) -> int:
    """The index of the capacity run with the most answers 200 per second; on a tie the one with
    fewer users (the earlier). -1 when there is none."""
    best = -1
    for i, run in enumerate(runs):
        if best < 0 or run["rps"] > runs[best]["rps"] or (run["rps"] == runs[best]["rps"]
                                                           and run["users"] < runs[best]["users"]):
            best = i
    return best


def overload_summary(records: Sequence[RequestRecord], duration_s: float, capacity_rps: float | None,
                     rate_rps: float, users: int) -> dict:
    """The open-loop phase: what was offered and sent, counts by status and client error, answers
    200 per second and their ratio to capacity, the 503s' and 200s' p50/p99, and the 504s' share
    of the admitted."""
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


def statuses_verdict(counts: Mapping, name: str = "only 200 or 503") -> Verdict:
    """Only 200 or 503: 504s at most 1 % of the admitted, no other status, no client error (each
    class named); nothing answered fails."""
    target = f"504 ≤ {MAX_504_SHARE:.0%} of the admitted, no other status, no client error"
    sent = answered(counts) + counts["client_error"]
    if answered(counts) == 0:
        return Verdict(name, target, False,
                       f"no request was answered ({sent} sent, client errors: {fmt_errors(counts)})" if sent
                       else "no request was sent")
    share = share_504(counts)
    passed = counts["other"] == 0 and counts["client_error"] == 0 and (share or 0.0) <= MAX_504_SHARE
    value = (f"504: {counts['504']} = {share:.1%} of {admitted(counts)} admitted" if share is not None
             else "nothing admitted") + f", other: {counts['other']}, client errors: {fmt_errors(counts)}"
    return Verdict(name, target, passed, value)


def served_verdict(served_rps: float | None, capacity_rps: float | None) -> Verdict:
    """Answers 200 per second under overload at least 0.85 × capacity."""
    target = f"≥ {MIN_SERVED_RATIO:g} × capacity"
    if not capacity_rps:
        return Verdict("served", target, False, "no capacity measured")
    share = (served_rps or 0.0) / capacity_rps
    return Verdict("served", target, share >= MIN_SERVED_RATIO,
                   f"{fmt_num(served_rps or 0.0)} req/s of 200 = {share:.2f} × capacity {fmt_num(capacity_rps)}")


def refusals_verdict(p99_503_ms: float | None, counts: Mapping) -> Verdict:
    """The 503s' p99 at most 50 ms; no 503 passes (said so) when something was answered."""
    target = f"503 p99 ≤ {MAX_503_P99_MS:g} ms"
    if not answered(counts):
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
    share = after_p50_ms / before_p50_ms
    return Verdict("recovered", target, share <= MAX_AFTER_RATIO,
                   f"p50 {fmt_num(after_p50_ms)} ms after, {fmt_num(before_p50_ms)} ms before: {share:.2f}×")


def probe_summary(probes: Sequence[Mapping]) -> dict:
    """Health probes ({"path", "status", "ms", ...}) per path: how many, by status (0: no answer,
    with its class), p50, p99 and max ms, and how many took longer than 1 s."""
    out: dict[str, dict] = {}
    for path in dict.fromkeys(p["path"] for p in probes):
        mine = [p for p in probes if p["path"] == path]
        ms = [p["ms"] for p in mine]
        out[path] = {"probes": len(mine),
                     "by_status": dict(Counter(str(p["status"]) + (f" {p['error']}" if p.get("error") else "")
                                               for p in mine).most_common()),
                     "p50_ms": percentile(ms, 0.50), "p99_ms": percentile(ms, 0.99), "max_ms": max(ms),
                     "late": sum(m > MAX_HEALTH_MS for m in ms)}
    return out


def health_verdict(probes: Sequence[Mapping]) -> Verdict:
    """Every liveness and readiness probe answered 200 within 1 s; no probe at all fails."""
    target = f"liveness and readiness answered 200 within {MAX_HEALTH_MS / 1e3:g} s"
    if not probes:
        return Verdict("health in time", target, False, "no probe was made")
    late = [p for p in probes if p["ms"] > MAX_HEALTH_MS]
    wrong = [p for p in probes if p["status"] != 200]
    slowest = max(probes, key=lambda p: p["ms"])
    value = (f"{len(probes)} probes of {', '.join(dict.fromkeys(p['path'] for p in probes))}: slowest "
             f"{fmt_num(slowest['ms'])} ms ({slowest['path']}), {len(late)} over {MAX_HEALTH_MS:g} ms, "
             f"{len(wrong)} not 200")
    if wrong:
        value += " (" + ", ".join(f"{k}: {v}" for k, v in Counter(
            f"{p['path']} {p['status']}" + (f" {p['error']}" if p.get("error") else "") for p in wrong).items()) + ")"
    return Verdict("health in time", target, not late and not wrong, value)


def verdicts(before: Mapping, overload: Mapping, after: Mapping,
             probes: Sequence[Mapping] | None = None) -> list[Verdict]:
    """A run's verdicts, from its phases' summaries and its health probes (None: not probed, no
    verdict on them)."""
    found = [statuses_verdict(overload["counts"]), served_verdict(overload["served_rps"], before["rps"]),
             refusals_verdict(overload["p99_503_ms"], overload["counts"]),
             recovery_verdict(before["p50_ms"], after["p50_ms"])]
    return found + ([health_verdict(probes)] if probes is not None else [])


def overall_verdicts(runs: Sequence[Sequence[Mapping]]) -> list[Verdict]:
    """Each verdict (by name, in the first run's order) passed in every run: "k of N runs"."""
    names = list(dict.fromkeys(v["name"] for found in runs for v in found))
    out = []
    for name in names:
        mine = [v for found in runs for v in found if v["name"] == name]
        failed = [i + 1 for i, found in enumerate(runs) if any(v["name"] == name and not v["passed"] for v in found)]
        passed = len(mine) - len(failed)
        value = f"{passed} of {len(runs)} runs" + (f" (failed: run {', '.join(map(str, failed))})" if failed else "")
        out.append(Verdict(name, f"{mine[0]['target']}, in every run", not failed and len(mine) == len(runs), value))
    return out


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


def refusal_cost(cpu_before: Mapping, cpu_over: Mapping, before: Sequence[Mapping], over: Mapping,
                 duration_s: float | None = None) -> dict:
    """What the server's processes spent, in CPU ms: per answer 200 before the overload (over every
    closed-loop run `before`, which `cpu_before` spans) and during it (front end and instances apart), and per refusal during it: the front end's time beyond
    what its 200s cost before, over the 503s. Refusals that cost the instances nothing leave their
    CPU per 200 where it was. And the cores the rest of the machine took during the overload
    (the client, CPU-bound neighbours), over its `duration_s`."""
    ok_before = sum(run["by_status"].get("200", 0) for run in before)
    ok_over, refused = over["counts"]["200"], over["counts"]["503"]
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


# ---- pure: the soak's schedule, windows, trends --------------------------------------------------

def soak_schedule(soak_s: float, every_s: float, burst_s: float) -> list[tuple[float, str]]:
    """(seconds from the load's start, "burst" or "kill"), in time order: a burst at every_s,
    2·every_s, ... that ends within the soak; a kill half an interval before each of those and
    after the last, within the soak."""
    if every_s <= 0:
        raise ValueError(f"the soak's interval must be > 0 s, got {every_s}")
    events = [(k * every_s, "burst") for k in range(1, math.floor(soak_s / every_s) + 1)
              if k * every_s + burst_s <= soak_s]
    events += [((k + 0.5) * every_s, "kill") for k in range(math.ceil(soak_s / every_s))
               if (k + 0.5) * every_s < soak_s]
    return sorted(events)


def in_windows(record: RequestRecord, windows: Sequence[tuple[float, float]]) -> bool:
    """Whether the request was in flight during, or sent within, any (start, end) window."""
    return any(record.start <= end and record.end >= start for start, end in windows)


def sample_phase(t_s: float, soak_s: float, events: Sequence[tuple[float, str]], burst_s: float,
                 window_s: float) -> str:
    """What the load was doing at a sample t_s seconds into the soak: "after" (the load ended),
    "burst" (a burst, until its last requests' deadline: burst_s + window_s), "kill" (a kill's
    window, window_s) or "steady". Only steady samples are compared for slopes: a burst's
    connections and a respawning instance are the load's, not a leak."""
    if t_s > soak_s:
        return "after"
    for at, kind in events:
        if at <= t_s <= at + (burst_s + window_s if kind == "burst" else window_s):
            return kind
    return "steady"


def trend(points: Sequence[tuple[float, float]]) -> dict | None:
    """The least-squares line through (t, value) points: its slope per second, the slope's standard
    error (from the points' scatter about the line), the span of t and the mean; None for fewer
    than 3 points or a single t."""
    if len(points) < 3:
        return None
    n = len(points)
    mt, mv = sum(t for t, _ in points) / n, sum(v for _, v in points) / n
    sxx = sum((t - mt) ** 2 for t, _ in points)
    if sxx <= 0:
        return None
    slope = sum((t - mt) * (v - mv) for t, v in points) / sxx
    scatter = sum((v - mv - slope * (t - mt)) ** 2 for t, v in points)
    return {"points": n, "slope_per_s": slope, "se_per_s": math.sqrt(scatter / (n - 2) / sxx),
            "span_s": max(t for t, _ in points) - min(t for t, _ in points), "mean": mv}


RESOURCES = {  # sample key: (what, unit, the rise always allowed: one unit of resolution, in words and from the mean)
    "pss_mib": ("PSS", "MiB", "1 % of the mean", lambda mean: 0.01 * mean),
    "fds": ("open files", "", "one", lambda mean: 1.0),
    "shm_mib": ("/dev/shm", "MiB", "nothing", lambda mean: 0.0),
}


def slope_verdict(key: str, points: Sequence[tuple[float, float]]) -> Verdict:
    """No upward slope of a resource: the fitted rise over the points' span at most SLOPE_SIGMAS
    standard errors of it plus the resource's resolution (RESOURCES)."""
    what, unit, resolution, floor = RESOURCES[key]
    name = f"no upward slope: {what}"
    target = f"fitted rise ≤ {SLOPE_SIGMAS:g} × its standard error + {resolution}"
    line = trend(points)
    if line is None:
        return Verdict(name, target, False, f"{len(points)} sample(s): too few to fit a line")
    rise, noise = line["slope_per_s"] * line["span_s"], SLOPE_SIGMAS * line["se_per_s"] * line["span_s"]
    allowed = noise + floor(line["mean"])
    unit = f" {unit}" if unit else ""
    return Verdict(name, target, rise <= allowed,
                   f"{rise:+.2f}{unit} over {line['span_s'] / 60:.1f} min ({line['points']} samples, mean "
                   f"{line['mean']:.1f}{unit}): allowed {allowed:.2f}{unit}")


def soak_verdicts(counts: Mapping, outside: Mapping, inside: Mapping, kills: Sequence[Mapping], planned_kills: int,
                  samples: Sequence[Mapping], slope_from_s: float, probes: Sequence[Mapping]) -> list[Verdict]:
    """The soak's verdicts (see the module docstring). `counts`: status classes of every request;
    `outside` / `inside`: those outside / inside the kill windows; `samples`: with t_s from the
    load's start and their phase (sample_phase); the slopes over the steady ones at or after
    `slope_from_s`."""
    value = (f"{answered(counts) + counts['client_error']} requests: 200 {counts['200']}, 503 {counts['503']}, "
             f"504 {counts['504']}, other {counts['other']}, client errors {fmt_errors(counts)}")
    every = Verdict("every request answered", "200, 503 or 504 only, no client error",
                    answered(counts) > 0 and counts["other"] == 0 and counts["client_error"] == 0, value)
    share_out, share_in = share_504(outside), share_504(inside)
    rare = Verdict("504 rare outside kills", f"504 ≤ {MAX_504_SHARE:.0%} of the admitted outside the kill windows",
                   share_out is not None and share_out <= MAX_504_SHARE,
                   (f"{outside['504']} = {share_out:.2%} of {admitted(outside)} admitted outside"
                    if share_out is not None else "nothing admitted outside the kill windows")
                   + (f"; inside: {inside['504']} = {share_in:.1%} of {admitted(inside)}"
                      if share_in is not None else ""))
    struck = sum(1 for k in kills if k.get("pid"))
    killed = Verdict("instances killed", "each planned kill struck a pool instance process",
                     struck == planned_kills and planned_kills > 0,
                     f"{struck} of {planned_kills} kills struck" + ("" if struck == planned_kills else
                                                                   " (no instance process found: thread instances? "
                                                                   "--instance-kind process)"))
    window = [s for s in samples if s["t_s"] >= slope_from_s and s.get("phase", "steady") == "steady"]
    slopes = [slope_verdict(key, [(s["t_s"], s[key]) for s in window if s.get(key) is not None]) for key in RESOURCES]
    return [every, rare, killed, *slopes, health_verdict(probes)]


# ---- tables --------------------------------------------------------------------------------------

TABLE_HEAD = ["run", "engine", "admission", "slow", "B / 2B req/s", "users", "capacity req/s", "before p50 ms",
              "offered req/s", "sent req/s", "sent", "200", "503", "504", "other", "client errors", "200/s",
              "÷ capacity", "503 p50/p99 ms", "200 p50/p99 ms", "504 of admitted", "health max ms",
              "after p50 ms", "after / before"]


def table_row(report: Mapping, run: Mapping) -> list:
    before, over, after = run["before"], run["overload"], run["after"]
    counts, share = over["counts"], over["share_504"]
    engine = report["engine"] + (" (process instances)" if report.get("instance_kind") == "process" else "")
    probes = run.get("probes") or {}
    return [run.get("run", 1), engine, report["admission"], "yes" if report["slow"] else "no",
            " / ".join(fmt_num(c["rps"]) for c in run.get("capacity_runs", [before])), before["users"],
            fmt_num(before["rps"]), fmt_num(before["p50_ms"]), fmt_num(over["rate_rps"]), fmt_num(over["sent_rps"]),
            over["sent"], counts["200"], counts["503"], counts["504"], counts["other"], fmt_errors(counts),
            fmt_num(over["served_rps"]), fmt_num(over["served_ratio"], 2),
            f"{fmt_num(over['p50_503_ms'])}/{fmt_num(over['p99_503_ms'])}",
            f"{fmt_num(over['p50_200_ms'])}/{fmt_num(over['p99_200_ms'])}",
            "-" if share is None else f"{share:.1%}",
            fmt_num(max((p["max_ms"] for p in probes.values()), default=None)), fmt_num(after["p50_ms"]),
            fmt_num(run["after_over_before"], 2)]


def format_table(report: Mapping) -> str:
    """One row per run."""
    return markdown_table(TABLE_HEAD, [table_row(report, run) for run in report["runs"]])


def format_report(report: Mapping) -> str:
    """The header, a table row per run, each run's server counters, CPU and verdicts, then the
    verdicts over every run."""
    first = report["runs"][0]
    queue = report["max_queue"] if report["max_queue"] is not None else f"{report['default_max_queue']} (default)"
    out = [f"### overload: {report['model']}, B = {report['batch']}, payload {report['payload']}, deadline "
           f"{report['request_timeout_s']:g} s, max_queue {queue}; {len(report['runs'])} run(s) of "
           f"{report['factor']:g}× capacity for {first['overload']['seconds']} s, capacity the best over "
           f"{first['before']['seconds']} s of {' or '.join(str(c['users']) for c in first.get('capacity_runs', []))}"
           f" users; {first['overload']['users']} open-loop users"
           + (f"; slowed by {len(report['slow_cores'])} CPU-bound process(es) on cores "
              f"{','.join(map(str, report['slow_cores']))}" if report["slow"] else "")
           + f" (locust on the same {report['cores']} cores)", "", format_table(report), ""]
    for run in report["runs"]:
        out.append(f"run {run['run']}:")
        delta = run["health"].get("overload_delta") or {}
        if delta:
            out.append("server counters over the overload: " + ", ".join(f"{k} {v:+d}" for k, v in delta.items() if v)
                       + (f"; predicted_wait_ms at its end: {fmt_num(run['health']['overload'].get('predicted_wait_ms'))}"
                          if "predicted_wait_ms" in run["health"].get("overload", {}) else ""))
        if run.get("cpu"):
            out.append(cost_line(run["cpu"]))
        out += [f"- {Verdict(**v).line()}" for v in run["verdicts"]]
        out += [f"note: {note}" for note in run["notes"]]
        out.append("")
    if len(report["runs"]) > 1:
        out += [f"over {len(report['runs'])} runs:"] + [f"- {Verdict(**v).line()}" for v in report["verdicts"]] + [""]
    out += [f"note: {note}" for note in report["notes"]]
    return "\n".join(out).rstrip("\n")


def format_soak_report(report: Mapping) -> str:
    """The soak's header, its bursts and kills, the resource samples and the verdicts."""
    cap, counts = report["capacity"], report["counts"]
    out = [f"### soak: {report['model']} on {report['engine']}, B = {report['batch']}, payload {report['payload']}, "
           f"deadline {report['request_timeout_s']:g} s; {report['soak_s'] / 60:g} min at {SOAK_LOAD:g} × capacity "
           f"{fmt_num(cap['rps'])} req/s ({cap['users']} users, of "
           f"{' / '.join(fmt_num(c['rps']) for c in report['capacity_runs'])} req/s), a burst to "
           f"{report['factor']:g}× for {report['duration_s']:g} s and a kill every {report['every_s']:g} s"
           + (", slowed" if report["slow"] else "") + f" (locust on the same {report['cores']} cores)", "",
           markdown_table(["requests", "200", "503", "504", "other", "client errors", "504 of admitted outside kills",
                           "inside kills", "200 p50/p99 ms"],
                          [[report["sent"], counts["200"], counts["503"], counts["504"], counts["other"],
                            fmt_errors(counts), _share(report["outside_kills"]), _share(report["inside_kills"]),
                            f"{fmt_num(report['p50_200_ms'])}/{fmt_num(report['p99_200_ms'])}"]]), ""]
    if report["events"]:
        out += [markdown_table(["at s", "event", "pid", "sent", "200", "503", "504", "other", "client errors", "200/s"],
                               [[fmt_num(e["at_s"], 0), e["kind"], e.get("pid") or "-", e["sent"], e["counts"]["200"],
                                 e["counts"]["503"], e["counts"]["504"], e["counts"]["other"], fmt_errors(e["counts"]),
                                 fmt_num(e.get("served_rps"))] for e in report["events"]]), ""]
    if report["samples"]:
        out += [markdown_table(["t s", "load", "PSS MiB", "open files", "/dev/shm MiB", "segments", "processes"],
                               [[fmt_num(s["t_s"], 0), s.get("phase", "-"), fmt_num(s["pss_mib"]),
                                 fmt_num(s["fds"], 0), fmt_num(s["shm_mib"], 2), s["segments"], s["processes"]]
                                for s in report["samples"]]), ""]
    out += [f"- {Verdict(**v).line()}" for v in report["verdicts"]]
    out += [f"\nnote: {note}" for note in report["notes"]]
    return "\n".join(out)


def _share(counts: Mapping) -> str:
    share = share_504(counts)
    return "-" if share is None else f"{share:.2%} of {admitted(counts)}"


# ---- processes: the slowing load, the server, the probes, the phases -----------------------------

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
    server's process, or TorchServe's Java and Python worker) and its pool instances: instance
    processes, and thread instances by their own threads in the front end's process (named
    THREAD_NAME...; a thread that ended meanwhile is the front end's from then on)."""
    import psutil

    from packrat.bench.faults import POOL_MARKER, torchserve_pid
    from packrat.machine.threads import task_cpu
    from packrat.serving.pool.thread_instance import THREAD_NAME

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
            threads = sum(cpu for name, cpu in task_cpu(proc.pid).values()
                          if name.startswith(THREAD_NAME)) if part == "front_end" else 0.0
        except (psutil.Error, OSError):
            continue
        totals[part] += times.user + times.system - threads
        totals["instances"] += threads
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


def status_or_none(target: Target, notes: list[str], when: str) -> dict | None:
    try:
        return target.status()
    except Exception as exc:  # noqa: BLE001 - the figures go on without the server's counters
        notes.append(f"no server status {when}: {exc}")
        return None


def phase(target: Target, model: str, users: int, duration_s: float, where: Path, body: Body, client_timeout_s: float,
          rate: float | None = None) -> list[RequestRecord]:
    """One locust run, every request logged and waited for: the records. Closed loop (no rate),
    a 503's Retry-After is waited (at most RETRY_AFTER_MAX_S)."""
    from packrat.loadtest import run_locust
    from packrat.loadtest.requestlog import read_request_log

    request_log = where / "requests.tsv"
    run_locust(target.url, model, users, duration_s, where, token=target.token, payload=body.payload,
               timeout_s=client_timeout_s, request_log=request_log, rate=rate, stop_timeout_s=client_timeout_s,
               path=body.path, header_length=body.header_length,
               retry_after_s=None if rate is not None else RETRY_AFTER_MAX_S)
    return read_request_log(request_log)


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


class HealthProbes:
    """While active (a with block), each of the target's health paths probed every HEALTH_EVERY_S
    (after the last answer) from a thread of its own; `probes` collects them."""

    def __init__(self, target: Target, every_s: float = HEALTH_EVERY_S):
        self.target, self.every_s = target, every_s
        self.probes: list[dict] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(path,), name=f"probe {path}", daemon=True)
                         for path in target.health_paths]

    def _loop(self, path: str) -> None:
        while not self._stop.is_set():
            self.probes.append(probe(self.target.url, path, self.target.token))
            self._stop.wait(self.every_s)

    def __enter__(self) -> HealthProbes:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def raise_open_files() -> int:
    """This process's open-file limit raised to its hard limit (the server and locust inherit it:
    each open-loop user holds a connection); the limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


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


def closed_notes(name: str, closed: Mapping) -> list[str]:
    failed = closed["requests"] - closed["by_status"].get("200", 0)
    return ([f"the {name} run had {failed} of {closed['requests']} requests not answered 200 "
             f"({', '.join(f'{s}: {n}' for s, n in closed['by_status'].items() if s != '200')}"
             + (f"; client errors {closed['client_errors']}" if closed.get("client_errors") else "") + ")"]
            if failed else [])


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


# ---- the soak ------------------------------------------------------------------------------------

def tree_sample(root_pid: int | None, seen: set[int]) -> dict:
    """The server's process tree now: PSS (MiB), open files, and the /dev/shm segments it maps or
    its processes (any seen so far, in `seen`, which this adds to) own, in MiB. None figures when
    the root is gone."""
    import psutil

    from packrat.bench.chaos import SHM_DIR, mapped_segments, segment_owner, shm_segments

    try:
        root = psutil.Process(root_pid) if root_pid is not None else None
        tree = [root, *root.children(recursive=True)] if root is not None else []
    except psutil.Error:
        tree = []
    pss = fds = 0
    live = []
    for proc in tree:
        try:
            pss += proc.memory_full_info().pss
            fds += proc.num_fds()
            live.append(proc.pid)
        except psutil.Error:
            continue
    seen.update(live)
    names = mapped_segments(live) | {name for name in shm_segments() if segment_owner(name) in seen}
    size = 0
    for name in names:
        try:
            size += (SHM_DIR / name).stat().st_size
        except OSError:  # unlinked meanwhile (still mapped: its pages are in the PSS)
            continue
    found = bool(live)
    return {"time": time.time(), "pss_mib": pss / MIB if found else None, "fds": fds if found else None,
            "shm_mib": size / MIB if found else None, "segments": len(names), "processes": len(live)}


class TreeSampler:
    """While active, a tree_sample every every_s seconds from a thread (and the first at once)."""

    def __init__(self, root_pid: Callable[[], int | None], every_s: float):
        self.root_pid, self.every_s = root_pid, every_s
        self.samples: list[dict] = []
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak sampler", daemon=True)

    def take(self) -> dict:
        sample = tree_sample(self.root_pid(), self.seen)
        self.samples.append(sample)
        log(f"sample: PSS {fmt_num(sample['pss_mib'], 0)} MiB, {fmt_num(sample['fds'], 0)} open files, "
            f"/dev/shm {fmt_num(sample['shm_mib'], 2)} MiB in {sample['segments']} segment(s), "
            f"{sample['processes']} processes")
        return sample

    def _loop(self) -> None:
        self.take()
        while not self._stop.wait(self.every_s):
            self.take()

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def event_figures(event: Mapping, records: Sequence[RequestRecord], burst_s: float, window_s: float) -> dict:
    """A burst's or a kill's requests: those sent in the burst (every stream), or in flight at the
    kill or sent within its window; with a burst's answers 200 per second."""
    start = event["time"]
    end = start + (burst_s if event["kind"] == "burst" else window_s)
    mine = ([r for r in records if start <= r.start < end] if event["kind"] == "burst"
            else [r for r in records if in_windows(r, [(start, end)])])
    figures = {"sent": len(mine), "counts": status_classes(mine)}
    if event["kind"] == "burst":
        figures["served_rps"] = sum(r.status == 200 and not r.client_error for r in mine) / burst_s
    return figures


def run_soak(args) -> dict:
    """Serve, warm up, measure capacity, then the soak: steady load, bursts, kills, samples and
    probes; the report."""
    from packrat.bench.faults import kill_one

    args = with_payload(args)
    run_dir = run_dir_of(args)
    open_files = raise_open_files()
    soak_s, every_s = args.soak * 60.0, args.soak_every
    client_timeout_s = args.request_timeout_s + CLIENT_SLACK_S
    window_s = args.request_timeout_s + KILL_WINDOW_S
    notes: list[str] = []
    events: list[dict] = []
    streams: list[tuple[str, Path]] = []
    with started(args, run_dir, notes) as (target, body, start, slow_cores):
        health = {"start": counters(status_or_none(target, notes, "before the soak"))}
        runs, best = capacity_runs(target, args, body, run_dir)
        capacity = runs[best]["rps"]
        rate, burst_rate = SOAK_LOAD * capacity, max(args.factor - SOAK_LOAD, 0.0) * capacity
        users, burst_users = (open_loop_users(r, args.request_timeout_s, args.batch_size) for r in (rate, burst_rate))
        if users + burst_users + 100 > open_files:
            notes.append(f"{users} + {burst_users} open-loop users near the open-file limit ({open_files})")
        schedule = soak_schedule(soak_s, every_s, args.duration)
        probes: list[dict] = []
        if capacity <= 0:
            notes.append(f"no answer 200 in the capacity runs: no soak (see the server's log: {target.logs})")
            schedule = []
        with ThreadPoolExecutor(max_workers=2) as pool, TreeSampler(target.root_pid, args.sample_every) as sampler, \
                HealthProbes(target) as prober:
            t0 = time.time()
            if capacity > 0:
                log(f"soak: {rate:.1f} req/s ({SOAK_LOAD:g} × {capacity:.1f}) from {users} users for "
                    f"{soak_s:g} s; {len(schedule)} events: "
                    + ", ".join(f"{kind} at {at:g} s" for at, kind in schedule))
                steady = pool.submit(phase, target, args.model, users, soak_s, run_dir / "soak", body,
                                     client_timeout_s, rate)
                streams.append(("soak", run_dir / "soak" / "requests.tsv"))
                bursts = []
                for at, kind in schedule:
                    time.sleep(max(0.0, t0 + at - time.time()))
                    event = {"at_s": at, "kind": kind, "time": time.time()}
                    if kind == "burst":
                        where = run_dir / f"burst{len(bursts) + 1}"
                        log(f"burst at {at:g} s: {burst_rate:.1f} req/s more from {burst_users} users for "
                            f"{args.duration:g} s")
                        bursts.append(pool.submit(phase, target, args.model, burst_users, args.duration, where, body,
                                                  client_timeout_s, burst_rate))
                        streams.append((where.name, where / "requests.tsv"))
                    else:
                        root = target.root_pid()
                        event["pid"] = kill_one(root, skip={e["pid"] for e in events if e.get("pid")}) if root else None
                        log(f"kill at {at:g} s: " + (f"instance {event['pid']} killed" if event["pid"]
                                                     else "no instance process found"))
                    events.append(event)
                steady.result()
                for burst in bursts:
                    burst.result()
            probes = prober.probes
            sampler.take()
        health["end"] = counters(status_or_none(target, notes, "after the soak"))
    from packrat.loadtest.requestlog import read_request_log

    records = [r for _, path in streams for r in read_request_log(path)]
    kill_windows = [(e["time"], e["time"] + window_s) for e in events if e["kind"] == "kill"]
    inside = [r for r in records if in_windows(r, kill_windows)]
    outside = [r for r in records if not in_windows(r, kill_windows)]
    samples = [{**s, "t_s": s["time"] - t0,
                "phase": sample_phase(s["time"] - t0, soak_s, schedule, args.duration, window_s)}
               for s in sampler.samples]
    planned = sum(kind == "kill" for _, kind in schedule)
    found = soak_verdicts(status_classes(records), status_classes(outside), status_classes(inside),
                          [e for e in events if e["kind"] == "kill"], planned, samples, soak_s * (1 - SLOPE_SHARE),
                          probes)
    for verdict in found:
        log(verdict.line())
    ok = latencies(records, 200)
    return {**config(args, args.payload, slow_cores, (start or {}).get("plan"), run_dir), "soak_s": soak_s,
            "every_s": every_s, "sample_every_s": args.sample_every, "capacity_runs": runs,
            "capacity": runs[best], "rate_rps": rate, "users": users, "burst_rate_rps": burst_rate,
            "burst_users": burst_users, "sent": len(records), "counts": status_classes(records),
            "by_status": by_status(records), "outside_kills": status_classes(outside),
            "inside_kills": status_classes(inside), "kill_window_s": window_s,
            "p50_200_ms": percentile(ok, 0.50), "p99_200_ms": percentile(ok, 0.99),
            "events": [{**e, **event_figures(e, records, args.duration, window_s)} for e in events],
            "samples": samples, "slope_from_s": soak_s * (1 - SLOPE_SHARE), "probes": probe_summary(probes),
            "health": {**health, "delta": counter_delta(health["start"], health["end"])},
            "verdicts": [asdict(v) for v in found], "passed": all(v.passed for v in found), "notes": notes}
